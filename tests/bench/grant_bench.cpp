// grant_bench: what borrowing a chunk from zico-umd costs, against the bare
// transport it rides on, measured in the same run.
//
//   baseline  a request/response over a Unix SOCK_SEQPACKET socket whose
//             response carries one descriptor (SCM_RIGHTS), received and closed
//   grant-1   one chunk through the real daemon and client: Request -> Grant
//             with the chunk's fd -> imported -> mapped and made accessible
//   grant-64  the same for a batch of 64 chunks (one request, one grant message
//             of 64 descriptors)
//
// Between iterations (untimed) the chunks are unmapped and given back. The
// daemon runs in a thread of this process, on SimDriver; the client talks to
// it through the socket exactly as a job would. Prints medians and the two
// ratios the node manager promises (grant-1 / baseline <= 2, grant-64 /
// grant-1 <= 10); exit 0 either way (timings are reported, not asserted).
//
//   grant_bench [ITERATIONS] [--backend sim|cuda]     (default 2000, sim)
//
// With --backend cuda both sides use CudaDriver, so grant-64's per-chunk
// figure is cuMemImportFromShareableHandle + cuMemMap + cuMemSetAccess;
// exit 77 (skip) where no GPU can be opened.
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>
#include <vector>

#include "chunk_source.h"
#include "cuda_driver.h"
#include "daemon.h"
#include "node_client.h"
#include "protocol.h"
#include "sim_driver.h"
#include "wire.h"

namespace {

using Clock = std::chrono::steady_clock;
using zico::Status;

double median_us(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

// The bare transport: a server thread answers each request with one fd.
double bare_round_trip_us(int iterations) {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) std::abort();
  const int memfd = ::memfd_create("grant-bench", MFD_CLOEXEC);
  std::thread server([&] {
    for (;;) {
      zico::proto::Message message;
      std::vector<int> fds;
      std::string why;
      if (zico::wire::receive_message(pair[1], &message, &fds, &why) != zico::wire::Received::kMessage) return;
      const auto& request = std::get<zico::proto::Request>(message);
      zico::proto::Grant grant;
      grant.request_id = request.request_id;
      grant.ids = {1};
      const int fd = ::dup(memfd);  // what the daemon's export does
      (void)zico::wire::send_message(pair[1], grant, std::span(&fd, 1), &why);
      ::close(fd);
    }
  });
  std::vector<double> samples;
  for (int i = 0; i < iterations; ++i) {
    const auto start = Clock::now();
    std::string why;
    (void)zico::wire::send_message(pair[0], zico::proto::Request{static_cast<uint64_t>(i + 1), 0, 1}, {}, &why);
    zico::proto::Message reply;
    std::vector<int> fds;
    (void)zico::wire::receive_message(pair[0], &reply, &fds, &why);
    for (int fd : fds) ::close(fd);
    samples.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
  }
  ::shutdown(pair[0], SHUT_RDWR);
  server.join();
  ::close(pair[0]);
  ::close(pair[1]);
  ::close(memfd);
  return median_us(samples);
}

// Borrow `count` chunks, map them (timed); unmap and give back (untimed).
double grant_us(zico::Driver& driver, zico::ChunkSource& source, zico::VaRange window, size_t chunk, size_t count,
                int iterations) {
  std::vector<double> samples;
  std::vector<zico::SourcedChunk> chunks;
  std::vector<uint64_t> ids;
  for (int i = 0; i < iterations; ++i) {
    chunks.clear();
    const auto start = Clock::now();
    if (!source.obtain(count, zico::Patience::kDefault, &chunks).is_ok()) std::abort();
    for (size_t c = 0; c < count; ++c) {
      const zico::VaRange range{window.base + c * chunk, chunk};
      if (!driver.map(range, chunks[c].handle).is_ok() || !driver.set_access(zico::DeviceId{0}, range).is_ok()) {
        std::abort();
      }
      source.release_handle(chunks[c].handle);
    }
    samples.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
    ids.clear();
    for (size_t c = 0; c < count; ++c) {
      (void)driver.unmap(zico::VaRange{window.base + c * chunk, chunk});
      ids.push_back(chunks[c].id);
    }
    source.give_back(ids);
  }
  return median_us(samples);
}

}  // namespace

int main(int argc, char** argv) {
  int iterations = 2000;
  std::string backend = "sim";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--backend" && i + 1 < argc) {
      backend = argv[++i];
    } else {
      iterations = std::atoi(argv[i]);
    }
  }
  if (iterations < 10 || (backend != "sim" && backend != "cuda")) {
    std::fprintf(stderr, "usage: grant_bench [ITERATIONS >= 10] [--backend sim|cuda]\n");
    return 64;
  }
  // One driver for the daemon's side, one for the job's, as in two processes.
  std::unique_ptr<zico::Driver> daemon_driver;
  std::unique_ptr<zico::Driver> job_driver;
  std::string why;
  if (backend == "sim") {
    daemon_driver = std::make_unique<zico::SimDriver>();
    job_driver = std::make_unique<zico::SimDriver>();
  } else if (!zico::CudaDriver::open(&daemon_driver, &why).is_ok() ||
             !zico::CudaDriver::open(&job_driver, &why).is_ok()) {
    std::printf("skipped: no GPU (%s)\n", why.c_str());
    return 77;
  }
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("grant-bench-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  constexpr size_t kChunk = size_t{2} << 20;

  zico::sharing::DaemonOptions options;
  options.socket_path = (dir / "umd.sock").string();
  options.gpus = {{zico::DeviceId{0}, 256 * kChunk}};
  options.zero_new_chunks = backend == "cuda";
  std::unique_ptr<zico::sharing::Daemon> daemon;
  if (!zico::sharing::Daemon::create(*daemon_driver, options, &daemon, &why).is_ok()) {
    std::fprintf(stderr, "grant_bench: %s\n", why.c_str());
    return 1;
  }
  std::thread serving([&] { (void)daemon->run(false); });

  std::unique_ptr<zico::sharing::NodeClient> client;
  zico::sharing::NodeClientOptions client_options;
  client_options.socket_path = options.socket_path;
  size_t chunk = 0;
  zico::ChunkSource* source = nullptr;
  if (!zico::sharing::NodeClient::connect(*job_driver, client_options, &client, &why).is_ok() ||
      !client->open_gpu(zico::DeviceId{0}, &chunk, &source, &why).is_ok()) {
    std::fprintf(stderr, "grant_bench: %s\n", why.c_str());
    return 1;
  }
  zico::VaRange window;
  if (!job_driver->reserve(zico::DeviceId{0}, 64 * chunk, 0, &window).is_ok()) return 1;

  // Warm up both paths (pool creation, page faults), then measure.
  (void)grant_us(*job_driver, *source, window, chunk, 64, 20);
  const double bare = bare_round_trip_us(iterations);
  const double one = grant_us(*job_driver, *source, window, chunk, 1, iterations);
  const double batch = grant_us(*job_driver, *source, window, chunk, 64, std::max(10, iterations / 10));
  std::printf("backend: %s\n", backend.c_str());
  std::printf("bare request/response with one fd: %8.2f us (median of %d)\n", bare, iterations);
  std::printf("grant of 1 chunk, mapped:           %8.2f us\n", one);
  std::printf("grant of 64 chunks, mapped:         %8.2f us (%.2f us per chunk)\n", batch, batch / 64);
  std::printf("ratio grant-1 / bare:   %.2f (target <= 2)\n", one / bare);
  std::printf("ratio grant-64 / grant-1: %.2f (target <= 10)\n", batch / one);

  client.reset();
  (void)job_driver->unreserve(window);
  daemon->stop();
  serving.join();
  daemon.reset();
  std::filesystem::remove_all(dir);
  return 0;
}
