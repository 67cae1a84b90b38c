// NvmeStore throughput on SimDriver: save (evict) and load (restore) of a
// working set far larger than the staging buffers, in eviction-sized batches.
//
//   nvme_store_bench [--dir DIR] [--total-mib 512] [--chunk-mib 2] [--batch 32]
//                    [--queue-depth 32] [--staging 4] [--io-kib 512] [--repeat 3]
//
// Each repetition saves every chunk (in batches of --batch), then loads them
// all back; the time of each phase is wall time around the save() / load()
// calls only (slots are reserved, so the file is fallocated, beforehand, as a
// running job's file would be after its first evictions). Prints the median
// of the repetitions as `key=value` lines for tests/bench/nvme_vs_fio.sh,
// after checking every byte once. "Device" copies are host memcpy on the
// calling thread here (SimDriver), so this measures the disk path plus the
// store's CPU work (staging copy, XXH3), not a PCIe link.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "nvme_store.h"
#include "sim_driver.h"

namespace {

using namespace zico;

struct Args {
  std::string dir = "/var/tmp/zicoum-bench";
  size_t total_mib = 512;
  size_t chunk_mib = 2;
  size_t batch = 32;
  uint32_t queue_depth = 32;
  uint32_t staging = 4;
  size_t io_kib = 512;
  int repeat = 3;
};

bool parse(int argc, char** argv, Args* args) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i];
    const char* value = argv[i + 1];
    const auto number = std::strtoull(value, nullptr, 10);
    if (key == "--dir") {
      args->dir = value;
    } else if (key == "--total-mib") {
      args->total_mib = number;
    } else if (key == "--chunk-mib") {
      args->chunk_mib = number;
    } else if (key == "--batch") {
      args->batch = number;
    } else if (key == "--queue-depth") {
      args->queue_depth = static_cast<uint32_t>(number);
    } else if (key == "--staging") {
      args->staging = static_cast<uint32_t>(number);
    } else if (key == "--io-kib") {
      args->io_kib = number;
    } else if (key == "--repeat") {
      args->repeat = static_cast<int>(number);
    } else {
      return false;
    }
  }
  return argc % 2 == 1 && args->chunk_mib > 0 && args->total_mib >= args->chunk_mib && args->batch > 0 &&
         args->repeat > 0;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

int fail(const char* what, const Status& status, const std::string& why = {}) {
  std::fprintf(stderr, "nvme_store_bench: %s: %s %s\n", what, status.message().c_str(), why.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (!parse(argc, argv, &args)) {
    std::fprintf(stderr,
                 "usage: nvme_store_bench [--dir DIR] [--total-mib N] [--chunk-mib N] [--batch N] "
                 "[--queue-depth N] [--staging N] [--io-kib N] [--repeat N]\n");
    return 2;
  }
  const size_t chunk = args.chunk_mib << 20;
  const size_t count = args.total_mib / args.chunk_mib;

  SimOptions sim;
  sim.granularity = chunk;
  sim.capacity = chunk * (count + 1);
  SimDriver driver(sim);
  VaRange reservation;
  if (Status s = driver.reserve(DeviceId{0}, chunk * count, 0, &reservation); !s.is_ok()) return fail("reserve", s);
  std::vector<void*> device;
  for (size_t i = 0; i < count; ++i) {
    PhysHandle handle;
    const VaRange range{reservation.base + i * chunk, chunk};
    Status s = driver.create(DeviceId{0}, chunk, &handle);
    if (s.is_ok()) s = driver.map(range, handle);
    if (s.is_ok()) s = driver.set_access(DeviceId{0}, range);
    if (s.is_ok()) s = driver.release(handle);
    if (!s.is_ok()) return fail("map", s);
    device.push_back(range.ptr());
    auto* words = static_cast<uint64_t*>(range.ptr());
    for (size_t w = 0; w < chunk / 8; ++w) words[w] = (i << 32) ^ w * 0x9E3779B97F4A7C15ull;
  }
  StreamHandle stream;
  if (Status s = driver.stream_create(DeviceId{0}, &stream); !s.is_ok()) return fail("stream", s);

  NvmeStoreOptions options;
  options.directory = args.dir;
  options.queue_depth = args.queue_depth;
  options.staging_buffers = args.staging;
  options.io_bytes = args.io_kib << 10;
  options.job_tag = "bench";
  std::unique_ptr<NvmeStore> store;
  std::string why;
  if (Status s = NvmeStore::create(driver, DeviceId{0}, chunk, options, &store, &why); !s.is_ok()) {
    return fail("create", s, why);
  }
  std::vector<ChunkTransfer> transfers(count);
  for (size_t i = 0; i < count; ++i) {
    if (Status s = store->reserve_slot(&transfers[i].slot); !s.is_ok()) return fail("reserve_slot", s);
    transfers[i].device = device[i];
  }

  using Clock = std::chrono::steady_clock;
  std::vector<double> write_rates, read_rates;
  const double bytes = static_cast<double>(chunk * count);
  for (int r = 0; r < args.repeat; ++r) {
    auto start = Clock::now();
    for (size_t i = 0; i < count; i += args.batch) {
      const std::span<const ChunkTransfer> batch(transfers.data() + i, std::min(args.batch, count - i));
      if (Status s = store->save(batch, stream); !s.is_ok()) return fail("save", s, store->last_error());
    }
    write_rates.push_back(bytes / std::chrono::duration<double>(Clock::now() - start).count());
    if (r == args.repeat - 1) {
      for (void* p : device) std::memset(p, 0, chunk);  // the last load must really bring the data back
    }
    start = Clock::now();
    for (size_t i = 0; i < count; i += args.batch) {
      const std::span<const ChunkTransfer> batch(transfers.data() + i, std::min(args.batch, count - i));
      if (Status s = store->load(batch, stream); !s.is_ok()) return fail("load", s, store->last_error());
    }
    read_rates.push_back(bytes / std::chrono::duration<double>(Clock::now() - start).count());
  }
  for (size_t i = 0; i < count; ++i) {
    const auto* words = static_cast<const uint64_t*>(device[i]);
    for (size_t w = 0; w < chunk / 8; ++w) {
      if (words[w] != ((i << 32) ^ w * 0x9E3779B97F4A7C15ull)) {
        std::fprintf(stderr, "nvme_store_bench: chunk %zu word %zu came back wrong\n", i, w);
        return 1;
      }
    }
  }
  const NvmeStoreCounters& c = store->counters();
  std::printf("chunk_bytes=%zu\nchunks=%zu\nbatch=%zu\nqueue_depth=%u\nstaging_buffers=%u\nio_bytes=%zu\n", chunk,
              count, args.batch, args.queue_depth, args.staging, args.io_kib << 10);
  std::printf("fixed_buffers=%d\nshort_transfers=%llu\n", store->fixed_buffers() ? 1 : 0,
              static_cast<unsigned long long>(c.short_transfers));
  std::printf("write_MBps=%.0f\nread_MBps=%.0f\n", median(write_rates) / 1e6, median(read_rates) / 1e6);
  return 0;
}
