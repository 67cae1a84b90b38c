// The GPU suite's calibration step (tests/gpu/run.sh, step `calibration`):
// what each unified-memory primitive costs on this GPU, for the cost models
// (umm/gpu_calibration.h; tests/gpu/calibration.py turns these lines into
// OUTDIR/calibration.json).
//   um_calibration_probe [P1,P2,...]    the probes named (default all), one JSON line each
//   um_calibration_probe --malloc BYTES (P8's second process; not for direct use)
// One managed arena of 2 MiB blocks, preferred-located on the GPU, sized from
// the GPU's free memory (a quarter of it, at most 512 blocks: never more
// managed memory than the GPU has free, which can hang some GPUs). Host time
// is std::chrono around the call; completion is an event recorded after it
// and waited for. Every figure is the median of 5 runs.
//   P1 whether a stream-ordered prefetch (to host, to GPU) or discard blocks
//      its caller while the stream waits behind a 20 ms kernel;
//   P2 one call of N = 1, 4, 16, 64, 256 contiguous blocks against N calls of
//      one block, each way, idle link: host time and completion;
//   P3 256 non-adjacent blocks: cudaMemPrefetchBatchAsync against a loop;
//   P4 duplex: half the blocks out while the other half come in, from two
//      threads and streams, then from one stream;
//   P5 the fault path over 256 host-resident blocks: a kernel that reads
//      every byte, one word per 64 KiB, one word per block;
//   P6 discard: dirty GPU blocks discarded then sent to the host and back;
//      discarded then to the GPU; host blocks through
//      cudaMemDiscardAndPrefetchBatchAsync; a write after a discard reads back;
//   P7 500 x (a 100 us kernel, 2 evictions, 2 prefetches): zicoum's pager
//      pattern today (one stream, evictions after the latest kernel, the
//      kernel after the stream's tail) against a pager thread with two
//      streams; and the host time of one launch;
//   P8 device memory after eviction (cudaMemGetInfo), cuMemCreate /
//      cuMemMap / cuMemSetAccess / cuMemUnmap / cuMemRelease of 2 MiB (a
//      swapped page's trip in and out), a second process's
//      cudaMalloc once the arena is on the host and its free memory after
//      freeing an allocation beyond what was free, then this process's free
//      memory and the time to bring every block back to the GPU;
//   P9 /sys/module/nvidia_uvm/parameters/* and nvidia-smi -q's link (first:
//      it needs no arena).
// Exit 0 when every probe ran, 2 when one failed (its line holds "error").
#include <cuda.h>
#include <cuda_runtime.h>
#include <dirent.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr size_t kBlock = size_t{2} << 20;
constexpr int kRuns = 5;

struct CudaError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void check(cudaError_t e, const char* call, int line) {
  if (e != cudaSuccess) {
    throw CudaError(std::string(call) + " at line " + std::to_string(line) + ": " + cudaGetErrorName(e));
  }
}
#define CHECK(call) check((call), #call, __LINE__)

void check_driver(CUresult r, const char* call, int line) {
  if (r != CUDA_SUCCESS) throw CudaError(std::string(call) + " at line " + std::to_string(line) + ": CUresult " +
                                         std::to_string(static_cast<int>(r)));
}
#define CHECK_DRIVER(call) check_driver((call), #call, __LINE__)

__device__ uint64_t global_ns() {
  uint64_t ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns;
}

__global__ void spin(uint64_t ns) {
  const uint64_t start = global_ns();
  while (global_ns() - start < ns) {
  }
}

__global__ void empty() {}

__global__ void write_words(uint32_t* data, size_t n, uint32_t value) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    data[i] = value + static_cast<uint32_t>(i);
  }
}

// Reads one word every `stride` words of `n`.
__global__ void read_strided(const uint32_t* data, size_t n, size_t stride, uint32_t* sink) {
  uint32_t sum = 0;
  for (size_t i = (blockIdx.x * blockDim.x + threadIdx.x) * stride; i < n; i += size_t{gridDim.x} * blockDim.x * stride) {
    sum += data[i];
  }
  if (sum == 0xdeadbeefu) *sink = sum;  // keeps the reads
}

using Clock = std::chrono::steady_clock;

double us_since(Clock::time_point start) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n == 0 ? 0 : n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// The median of kRuns of `run`, which returns one figure per call.
double median_of(const std::function<double()>& run) {
  std::vector<double> values;
  for (int i = 0; i < kRuns; ++i) values.push_back(run());
  return median(values);
}

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escape[8];
      std::snprintf(escape, sizeof escape, "\\u%04x", c);
      out += escape;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// One JSON line, its members added in order.
class Line {
 public:
  explicit Line(const char* probe) { text_ = "{\"probe\": " + json_string(probe); }
  Line& num(const char* key, double value) {
    char text[64];
    std::snprintf(text, sizeof text, "%.6g", value);
    return raw(key, text);
  }
  // Exact, where num's 6 digits would round a byte count of tens of GB by up to 50 MB.
  Line& integer(const char* key, long long value) { return raw(key, std::to_string(value)); }
  Line& flag(const char* key, bool value) { return raw(key, value ? "true" : "false"); }
  Line& str(const char* key, const std::string& value) { return raw(key, json_string(value)); }
  Line& raw(const char* key, const std::string& json) {
    text_ += std::string(", ") + json_string(key) + ": " + json;
    return *this;
  }
  void print() const { std::printf("%s}\n", text_.c_str()); std::fflush(stdout); }

 private:
  std::string text_;
};

cudaMemLocation on_gpu() { return cudaMemLocation{cudaMemLocationTypeDevice, 0}; }
cudaMemLocation on_host() { return cudaMemLocation{cudaMemLocationTypeHost, 0}; }

struct Arena {
  char* base = nullptr;  // 2 MiB-aligned
  size_t blocks = 0;
  cudaStream_t stream = nullptr, other = nullptr, compute = nullptr;
  cudaEvent_t done = nullptr;
  uint32_t* sink = nullptr;

  char* block(size_t i) const { return base + i * kBlock; }
  // Blocks [first, first + n) to `where` in one call, then waited for.
  void move(size_t first, size_t n, cudaMemLocation where) const {
    CHECK(cudaMemPrefetchAsync(block(first), n * kBlock, where, 0, stream));
    CHECK(cudaStreamSynchronize(stream));
  }
  // Writes blocks [first, first + n) on the GPU: resident there, holding data.
  void dirty(size_t first, size_t n) const {
    write_words<<<264, 512, 0, stream>>>(reinterpret_cast<uint32_t*>(block(first)), n * kBlock / 4, 1);
    CHECK(cudaGetLastError());
    CHECK(cudaStreamSynchronize(stream));
  }
  // Completion of what `stream` holds now, in microseconds since `start`.
  double complete(Clock::time_point start, cudaStream_t s) const {
    CHECK(cudaEventRecord(done, s));
    CHECK(cudaEventSynchronize(done));
    return us_since(start);
  }
};

// --- P1 ---------------------------------------------------------------------------
void p1(const Arena& a) {
  constexpr uint64_t kSpinNs = 20'000'000;
  cudaEvent_t busy;
  CHECK(cudaEventCreateWithFlags(&busy, cudaEventDisableTiming));
  a.dirty(0, 1);
  a.move(1, 1, on_host());
  // Host time of `call` while a.stream waits behind a 20 ms kernel on another stream.
  const auto behind_kernel = [&](const std::function<void()>& call) {
    spin<<<1, 1, 0, a.compute>>>(kSpinNs);
    CHECK(cudaGetLastError());
    CHECK(cudaEventRecord(busy, a.compute));
    CHECK(cudaStreamWaitEvent(a.stream, busy, 0));
    const auto start = Clock::now();
    call();
    const double us = us_since(start);
    CHECK(cudaDeviceSynchronize());
    return us;
  };
  const double to_host = median_of([&] {
    a.move(0, 1, on_gpu());
    return behind_kernel([&] { CHECK(cudaMemPrefetchAsync(a.block(0), kBlock, on_host(), 0, a.stream)); });
  });
  const double to_gpu = median_of([&] {
    a.move(1, 1, on_host());
    return behind_kernel([&] { CHECK(cudaMemPrefetchAsync(a.block(1), kBlock, on_gpu(), 0, a.stream)); });
  });
  const double discard = median_of([&] {
    a.dirty(2, 1);
    void* ptr = a.block(2);
    size_t size = kBlock;
    return behind_kernel([&] { CHECK(cudaMemDiscardBatchAsync(&ptr, &size, 1, 0, a.stream)); });
  });
  CHECK(cudaEventDestroy(busy));
  // Half the kernel's time: the call waited for it.
  const double blocks_us = static_cast<double>(kSpinNs) / 2e3;
  Line("P1")
      .num("spin_us", static_cast<double>(kSpinNs) / 1e3)
      .num("to_host_call_us", to_host)
      .num("to_gpu_call_us", to_gpu)
      .num("discard_call_us", discard)
      .flag("to_host_blocks", to_host > blocks_us)
      .flag("to_gpu_blocks", to_gpu > blocks_us)
      .flag("discard_blocks", discard > blocks_us)
      .print();
}

// --- P2 ---------------------------------------------------------------------------
// "[[to_host, to_gpu], ...]", one pair per entry of P2's block counts.
std::string pairs(const std::vector<double>& to_host, const std::vector<double>& to_gpu) {
  std::string text = "[";
  for (size_t i = 0; i < to_host.size(); ++i) {
    char pair[80];
    std::snprintf(pair, sizeof pair, "%s[%.6g, %.6g]", i == 0 ? "" : ", ", to_host[i], to_gpu[i]);
    text += pair;
  }
  return text + "]";
}

void p2(const Arena& a) {
  // Medians, [direction: 0 to the host, 1 to the GPU][figure][entry of counts].
  std::vector<double> figures[2][4];
  std::string counts = "[";
  for (const size_t n : {1, 4, 16, 64, 256}) {
    if (n > a.blocks) break;
    counts += (counts.size() > 1 ? ", " : "") + std::to_string(n);
    for (const int direction : {0, 1}) {
      const bool to_host = direction == 0;
      const cudaMemLocation where = to_host ? on_host() : on_gpu();
      const auto before = [&] {
        if (to_host) {
          a.dirty(0, n);
        } else {
          a.move(0, n, on_host());
        }
      };
      std::vector<double> runs[4];  // one call: host, done; n calls of a block: host, done
      for (int run = 0; run < kRuns; ++run) {
        before();
        auto start = Clock::now();
        CHECK(cudaMemPrefetchAsync(a.block(0), n * kBlock, where, 0, a.stream));
        runs[0].push_back(us_since(start));
        runs[1].push_back(a.complete(start, a.stream));
        before();
        start = Clock::now();
        for (size_t i = 0; i < n; ++i) CHECK(cudaMemPrefetchAsync(a.block(i), kBlock, where, 0, a.stream));
        runs[2].push_back(us_since(start));
        runs[3].push_back(a.complete(start, a.stream));
      }
      for (int f = 0; f < 4; ++f) figures[direction][f].push_back(median(runs[f]));
    }
  }
  Line("P2")
      .raw("blocks", counts + "]")
      .str("lists", "[to_host, to_gpu] per entry of blocks, microseconds")
      .raw("one_call_host_us", pairs(figures[0][0], figures[1][0]))
      .raw("one_call_done_us", pairs(figures[0][1], figures[1][1]))
      .raw("per_block_calls_host_us", pairs(figures[0][2], figures[1][2]))
      .raw("per_block_calls_done_us", pairs(figures[0][3], figures[1][3]))
      .num("block_bytes", kBlock)
      .print();
}

// --- P3 ---------------------------------------------------------------------------
void p3(const Arena& a) {
  const size_t count = std::min<size_t>(256, a.blocks / 2);
  std::vector<void*> ptrs;
  std::vector<size_t> sizes(count, kBlock);
  for (size_t i = 0; i < count; ++i) ptrs.push_back(a.block(2 * i));  // every other block: no two adjacent
  Line line("P3");
  line.num("ranges", static_cast<double>(count));
  for (const bool to_host : {true, false}) {
    cudaMemLocation where = to_host ? on_host() : on_gpu();
    const auto before = [&] {
      if (to_host) {
        a.dirty(0, 2 * count);
      } else {
        a.move(0, 2 * count, on_host());
      }
    };
    std::vector<double> batch_host, batch_done, loop_host, loop_done;
    std::string batch_error;
    for (int run = 0; run < kRuns; ++run) {
      before();
      auto start = Clock::now();
      size_t first = 0;
      const cudaError_t e =
          cudaMemPrefetchBatchAsync(ptrs.data(), sizes.data(), count, &where, &first, 1, 0, a.stream);
      batch_host.push_back(us_since(start));
      if (e != cudaSuccess) {
        batch_error = cudaGetErrorName(e);
        (void)cudaGetLastError();
        break;
      }
      batch_done.push_back(a.complete(start, a.stream));
      before();
      start = Clock::now();
      for (size_t i = 0; i < count; ++i) CHECK(cudaMemPrefetchAsync(ptrs[i], kBlock, where, 0, a.stream));
      loop_host.push_back(us_since(start));
      loop_done.push_back(a.complete(start, a.stream));
    }
    const std::string dir = to_host ? "to_host_" : "to_gpu_";
    if (!batch_error.empty()) {
      line.str((dir + "batch_error").c_str(), batch_error);
    } else {
      line.num((dir + "batch_host_us").c_str(), median(batch_host))
          .num((dir + "batch_done_us").c_str(), median(batch_done))
          .num((dir + "loop_host_us").c_str(), median(loop_host))
          .num((dir + "loop_done_us").c_str(), median(loop_done));
    }
  }
  line.print();
}

// --- P4 ---------------------------------------------------------------------------
void p4(const Arena& a) {
  const size_t half = std::min<size_t>(256, a.blocks / 2);
  // Set A (blocks [0, half)) on the GPU holding data, set B ([half, 2 half)) on the host.
  const auto before = [&] {
    a.dirty(0, 2 * half);
    a.move(half, half, on_host());
  };
  const double two_streams = median_of([&] {
    before();
    const auto start = Clock::now();
    std::thread in([&] {
      CHECK(cudaMemPrefetchAsync(a.block(half), half * kBlock, on_gpu(), 0, a.other));
      CHECK(cudaStreamSynchronize(a.other));
    });
    CHECK(cudaMemPrefetchAsync(a.block(0), half * kBlock, on_host(), 0, a.stream));
    CHECK(cudaStreamSynchronize(a.stream));
    in.join();
    return us_since(start);
  });
  const double one_stream = median_of([&] {
    before();
    const auto start = Clock::now();
    CHECK(cudaMemPrefetchAsync(a.block(0), half * kBlock, on_host(), 0, a.stream));
    CHECK(cudaMemPrefetchAsync(a.block(half), half * kBlock, on_gpu(), 0, a.stream));
    return a.complete(start, a.stream);
  });
  Line("P4")
      .num("bytes_each_way", static_cast<double>(half * kBlock))
      .num("two_streams_us", two_streams)
      .num("one_stream_us", one_stream)
      .print();
}

// --- P5 ---------------------------------------------------------------------------
void p5(const Arena& a) {
  const size_t n = std::min<size_t>(256, a.blocks);
  const size_t words = n * kBlock / 4;
  cudaEvent_t start_event, end_event;
  CHECK(cudaEventCreate(&start_event));
  CHECK(cudaEventCreate(&end_event));
  // Kernel time (ms, events) of one pass reading every `stride`-th word of host-resident blocks.
  const auto pass = [&](size_t stride) {
    a.dirty(0, n);
    a.move(0, n, on_host());
    CHECK(cudaEventRecord(start_event, a.stream));
    const size_t touches = (words + stride - 1) / stride;
    const unsigned grid = static_cast<unsigned>(std::min<size_t>(1056, (touches + 255) / 256));
    read_strided<<<grid, 256, 0, a.stream>>>(reinterpret_cast<const uint32_t*>(a.block(0)), words, stride, a.sink);
    CHECK(cudaGetLastError());
    CHECK(cudaEventRecord(end_event, a.stream));
    CHECK(cudaEventSynchronize(end_event));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start_event, end_event));
    return static_cast<double>(ms) * 1e3;
  };
  const double every_byte = median_of([&] { return pass(1); });
  const double per_64k = median_of([&] { return pass((size_t{64} << 10) / 4); });
  const double per_block = median_of([&] { return pass(kBlock / 4); });
  CHECK(cudaEventDestroy(start_event));
  CHECK(cudaEventDestroy(end_event));
  Line("P5")
      .num("blocks", static_cast<double>(n))
      .num("bytes", static_cast<double>(n * kBlock))
      .num("every_byte_us", every_byte)
      .num("word_per_64k_us", per_64k)
      .num("word_per_block_us", per_block)
      .print();
}

// --- P6 ---------------------------------------------------------------------------
void p6(const Arena& a) {
  const size_t n = std::min<size_t>(128, a.blocks);
  void* ptr = a.block(0);
  size_t size = n * kBlock;
  const auto discard = [&] { CHECK(cudaMemDiscardBatchAsync(&ptr, &size, 1, 0, a.stream)); };
  // (a) dirty on the GPU, discarded, to the host (a copy or not?), then back (a copy: the discard revoked).
  std::vector<double> out_after_discard, back_after_discard, in_after_discard, discard_and_prefetch, discard_call;
  for (int run = 0; run < kRuns; ++run) {
    a.dirty(0, n);
    auto start = Clock::now();
    discard();
    discard_call.push_back(us_since(start));
    CHECK(cudaStreamSynchronize(a.stream));
    start = Clock::now();
    CHECK(cudaMemPrefetchAsync(ptr, size, on_host(), 0, a.stream));
    out_after_discard.push_back(a.complete(start, a.stream));
    start = Clock::now();
    CHECK(cudaMemPrefetchAsync(ptr, size, on_gpu(), 0, a.stream));
    back_after_discard.push_back(a.complete(start, a.stream));
    // (b) dirty on the GPU, discarded, to the GPU.
    a.dirty(0, n);
    discard();
    start = Clock::now();
    CHECK(cudaMemPrefetchAsync(ptr, size, on_gpu(), 0, a.stream));
    in_after_discard.push_back(a.complete(start, a.stream));
    // (c) dirty blocks on the host, discarded and prefetched to the GPU in one call.
    a.dirty(0, n);
    a.move(0, n, on_host());
    cudaMemLocation where = on_gpu();
    size_t first = 0;
    start = Clock::now();
    CHECK(cudaMemDiscardAndPrefetchBatchAsync(&ptr, &size, 1, &where, &first, 1, 0, a.stream));
    discard_and_prefetch.push_back(a.complete(start, a.stream));
  }
  // (d) discarded, then written by a kernel: the CPU reads the kernel's words.
  a.dirty(0, n);
  discard();
  write_words<<<264, 512, 0, a.stream>>>(reinterpret_cast<uint32_t*>(ptr), size / 4, 7);
  CHECK(cudaGetLastError());
  CHECK(cudaStreamSynchronize(a.stream));
  const uint32_t* words = reinterpret_cast<const uint32_t*>(ptr);
  bool written = true;
  for (size_t i = 0; i < size / 4; i += 1021) written = written && words[i] == 7 + static_cast<uint32_t>(i);
  // The reference: the same blocks, not discarded, each way.
  const double out_plain = median_of([&] {
    a.dirty(0, n);
    const auto start = Clock::now();
    CHECK(cudaMemPrefetchAsync(ptr, size, on_host(), 0, a.stream));
    return a.complete(start, a.stream);
  });
  const double in_plain = median_of([&] {
    a.move(0, n, on_host());
    const auto start = Clock::now();
    CHECK(cudaMemPrefetchAsync(ptr, size, on_gpu(), 0, a.stream));
    return a.complete(start, a.stream);
  });
  Line("P6")
      .num("blocks", static_cast<double>(n))
      .num("discard_call_us", median(discard_call))
      .num("to_host_plain_us", out_plain)
      .num("to_gpu_plain_us", in_plain)
      .num("discarded_to_host_us", median(out_after_discard))
      .num("then_to_gpu_us", median(back_after_discard))
      .num("discarded_on_gpu_to_gpu_us", median(in_after_discard))
      .num("discard_and_prefetch_from_host_us", median(discard_and_prefetch))
      .flag("write_after_discard_reads_back", written)
      .print();
}

// --- P7 ---------------------------------------------------------------------------
void p7(const Arena& a) {
  constexpr int kKernels = 500;
  constexpr uint64_t kKernelNs = 100'000;
  const size_t window = std::min<size_t>(256, a.blocks / 2);
  const size_t ring = 2 * window;
  std::vector<cudaEvent_t> launched(kKernels), fetched(kKernels), evicted(kKernels);
  for (int k = 0; k < kKernels; ++k) {
    CHECK(cudaEventCreateWithFlags(&launched[k], cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&fetched[k], cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&evicted[k], cudaEventDisableTiming));
  }
  // Blocks [0, window) on the GPU; step k evicts the window's two oldest and fetches the two after it.
  const auto reset = [&] {
    a.dirty(0, ring);
    a.move(window, ring - window, on_host());
  };
  const auto evict = [&](int k, cudaStream_t s) {
    for (size_t i = 0; i < 2; ++i) {
      CHECK(cudaMemPrefetchAsync(a.block((2 * k + i) % ring), kBlock, on_host(), 0, s));
    }
  };
  const auto fetch = [&](int k, cudaStream_t s) {
    for (size_t i = 0; i < 2; ++i) {
      CHECK(cudaMemPrefetchAsync(a.block((window + 2 * k + i) % ring), kBlock, on_gpu(), 0, s));
    }
  };
  // Today: one pager stream; the first eviction after a launch waits for the latest kernel, the
  // kernel waits for the stream's tail.
  double today_launch_thread = 0;
  const double today = median_of([&] {
    reset();
    const auto start = Clock::now();
    for (int k = 0; k < kKernels; ++k) {
      if (k > 0) CHECK(cudaStreamWaitEvent(a.stream, launched[k - 1], 0));
      evict(k, a.stream);
      fetch(k, a.stream);
      CHECK(cudaEventRecord(fetched[k], a.stream));
      CHECK(cudaStreamWaitEvent(a.compute, fetched[k], 0));
      spin<<<1, 1, 0, a.compute>>>(kKernelNs);
      CHECK(cudaGetLastError());
      CHECK(cudaEventRecord(launched[k], a.compute));
    }
    today_launch_thread = us_since(start);
    CHECK(cudaDeviceSynchronize());
    return us_since(start);
  });
  // Proposed: a pager thread, evictions on one stream after their blocks' last use (two kernels
  // back), prefetches on another after the evictions that make their room; the launching thread
  // only waits on each kernel's own prefetches.
  double thread_launch_thread = 0;
  const double pager_thread = median_of([&] {
    reset();
    std::atomic<int> issued{0}, launches{0};
    const auto start = Clock::now();
    std::thread pager([&] {
      for (int k = 0; k < kKernels; ++k) {
        if (k >= 2) {
          while (launches.load(std::memory_order_acquire) < k - 1) std::this_thread::yield();
          CHECK(cudaStreamWaitEvent(a.other, launched[k - 2], 0));
        }
        evict(k, a.other);
        CHECK(cudaEventRecord(evicted[k], a.other));
        CHECK(cudaStreamWaitEvent(a.stream, evicted[k], 0));
        fetch(k, a.stream);
        CHECK(cudaEventRecord(fetched[k], a.stream));
        issued.store(k + 1, std::memory_order_release);
      }
    });
    for (int k = 0; k < kKernels; ++k) {
      while (issued.load(std::memory_order_acquire) <= k) std::this_thread::yield();
      CHECK(cudaStreamWaitEvent(a.compute, fetched[k], 0));
      spin<<<1, 1, 0, a.compute>>>(kKernelNs);
      CHECK(cudaGetLastError());
      CHECK(cudaEventRecord(launched[k], a.compute));
      launches.store(k + 1, std::memory_order_release);
    }
    thread_launch_thread = us_since(start);
    pager.join();
    CHECK(cudaDeviceSynchronize());
    return us_since(start);
  });
  for (int k = 0; k < kKernels; ++k) {
    CHECK(cudaEventDestroy(launched[k]));
    CHECK(cudaEventDestroy(fetched[k]));
    CHECK(cudaEventDestroy(evicted[k]));
  }
  // The host time of one launch, on an idle stream.
  const double launch = median_of([&] {
    constexpr int kLaunches = 1000;
    const auto start = Clock::now();
    for (int i = 0; i < kLaunches; ++i) empty<<<1, 1, 0, a.compute>>>();
    const double us = us_since(start) / kLaunches;
    CHECK(cudaGetLastError());
    CHECK(cudaStreamSynchronize(a.compute));
    return us;
  });
  Line("P7")
      .num("kernels", kKernels)
      .num("kernel_us", static_cast<double>(kKernelNs) / 1e3)
      .num("ideal_us", static_cast<double>(kKernels) * static_cast<double>(kKernelNs) / 1e3)
      .num("today_us", today)
      .num("today_launch_thread_us", today_launch_thread)
      .num("pager_thread_us", pager_thread)
      .num("pager_thread_launch_thread_us", thread_launch_thread)
      .num("launch_us", launch)
      .print();
}

// --- P8 ---------------------------------------------------------------------------
template <typename Fn>
Fn driver_entry(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  CHECK(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found));
  if (found != cudaDriverEntryPointSuccess || fn == nullptr) throw CudaError(std::string("no driver entry ") + name);
  return reinterpret_cast<Fn>(fn);
}

size_t free_bytes() {
  size_t free = 0, total = 0;
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaMemGetInfo(&free, &total));
  return free;
}

// P8's second process: one line, what cudaMalloc took with the first one's blocks on the host.
int second_process(size_t evicted) {
  try {
    CHECK(cudaFree(nullptr));
    const size_t free = free_bytes();
    void* ptr = nullptr;
    auto start = Clock::now();
    const bool plain_ok = cudaMalloc(&ptr, evicted) == cudaSuccess;
    const double plain_us = us_since(start);
    if (plain_ok) CHECK(cudaFree(ptr));
    (void)cudaGetLastError();
    // More than is free: served only from the chunks unified memory kept.
    const size_t beyond = free + evicted * 3 / 4;
    start = Clock::now();
    const bool beyond_ok = cudaMalloc(&ptr, beyond) == cudaSuccess;
    const double beyond_us = us_since(start);
    if (beyond_ok) CHECK(cudaFree(ptr));
    (void)cudaGetLastError();
    // Grown by what that allocation took from the first process's retained chunks when freeing
    // it leaves them to the device (a squeeze), unchanged when unified memory takes them back.
    const size_t free_after_beyond = free_bytes();
    Line("P8_second_process")
        .integer("free_bytes", static_cast<long long>(free))
        .integer("plain_bytes", static_cast<long long>(evicted))
        .flag("plain_ok", plain_ok)
        .num("plain_us", plain_us)
        .integer("beyond_free_bytes", static_cast<long long>(beyond))
        .flag("beyond_free_ok", beyond_ok)
        .num("beyond_free_us", beyond_us)
        .integer("free_after_beyond_bytes", static_cast<long long>(free_after_beyond))
        .print();
    return 0;
  } catch (const CudaError& e) {
    Line("P8_second_process").str("error", e.what()).print();
    return 2;
  }
}

// The second process's line (run as this program with --malloc), or an error object.
std::string run_second_process(size_t evicted) {
  int fds[2];
  if (::pipe(fds) != 0) return "{\"error\": \"pipe failed\"}";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[1], STDOUT_FILENO);
    ::close(fds[0]);
    ::close(fds[1]);
    const std::string bytes = std::to_string(evicted);
    ::execl("/proc/self/exe", "um_calibration_probe", "--malloc", bytes.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(fds[1]);
  std::string text;
  char buffer[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buffer, sizeof buffer)) > 0) text.append(buffer, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  const size_t last = text.rfind('\n');
  if (last != std::string::npos) text = text.substr(last + 1);
  return text.empty() || text.front() != '{' ? "{\"error\": \"the second process printed no line\"}" : text;
}

void p8(const Arena& a) {
  // (a) what cudaMemGetInfo gains when every block leaves for the host.
  a.dirty(0, a.blocks);
  const size_t resident = free_bytes();
  a.move(0, a.blocks, on_host());
  const size_t evicted = free_bytes();
  // (b) the VMM calls zicoum's vmm mode makes per chunk.
  auto mem_create = driver_entry<decltype(&cuMemCreate)>("cuMemCreate");
  auto mem_release = driver_entry<decltype(&cuMemRelease)>("cuMemRelease");
  auto address_reserve = driver_entry<decltype(&cuMemAddressReserve)>("cuMemAddressReserve");
  auto address_free = driver_entry<decltype(&cuMemAddressFree)>("cuMemAddressFree");
  auto mem_map = driver_entry<decltype(&cuMemMap)>("cuMemMap");
  auto mem_unmap = driver_entry<decltype(&cuMemUnmap)>("cuMemUnmap");
  auto set_access = driver_entry<decltype(&cuMemSetAccess)>("cuMemSetAccess");
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  // A swapped page's trip in and out (ZICO_UM_MEMORY=swap) is all five, each on a fresh chunk.
  CUdeviceptr va = 0;
  CHECK_DRIVER(address_reserve(&va, kBlock, kBlock, 0, 0));
  std::vector<double> create_us, map_us, access_us, unmap_us, release_us;
  for (int run = 0; run < kRuns; ++run) {
    CUmemGenericAllocationHandle handle{};
    auto start = Clock::now();
    CHECK_DRIVER(mem_create(&handle, kBlock, &prop, 0));
    create_us.push_back(us_since(start));
    start = Clock::now();
    CHECK_DRIVER(mem_map(va, kBlock, 0, handle, 0));
    map_us.push_back(us_since(start));
    start = Clock::now();
    CHECK_DRIVER(set_access(va, kBlock, &access, 1));
    access_us.push_back(us_since(start));
    start = Clock::now();
    CHECK_DRIVER(mem_unmap(va, kBlock));
    unmap_us.push_back(us_since(start));
    start = Clock::now();
    CHECK_DRIVER(mem_release(handle));
    release_us.push_back(us_since(start));
  }
  CHECK_DRIVER(address_free(va, kBlock));
  // (c) a second process's cudaMalloc of the evicted amount, and of more than is free.
  const std::string second = run_second_process(a.blocks * kBlock);
  // (d) what this process sees once the second one is gone, and what bringing every block back
  // costs: new chunks to allocate where the second process's allocation took the retained ones.
  const size_t after_second = free_bytes();
  const auto start = Clock::now();
  a.move(0, a.blocks, on_gpu());
  const double back_to_gpu_ms = us_since(start) / 1e3;
  Line("P8")
      .integer("arena_bytes", static_cast<long long>(a.blocks * kBlock))
      .integer("freed_by_eviction_bytes", static_cast<long long>(evicted) - static_cast<long long>(resident))
      .integer("free_after_eviction_bytes", static_cast<long long>(evicted))
      .num("create_us", median(create_us))
      .num("map_us", median(map_us))
      .num("set_access_us", median(access_us))
      .num("unmap_us", median(unmap_us))
      .num("release_us", median(release_us))
      .raw("second_process", second)
      .integer("free_after_second_bytes", static_cast<long long>(after_second))
      .num("back_to_gpu_ms", back_to_gpu_ms)
      .print();
}

// --- P9 ---------------------------------------------------------------------------
std::string trimmed(std::string s) {
  const size_t begin = s.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return "";
  return s.substr(begin, s.find_last_not_of(" \t\r\n") - begin + 1);
}

void p9() {
  std::string parameters = "{";
  const char* folder = "/sys/module/nvidia_uvm/parameters";
  if (DIR* dir = ::opendir(folder)) {
    std::vector<std::string> names;
    while (const dirent* entry = ::readdir(dir)) {
      if (entry->d_name[0] != '.') names.emplace_back(entry->d_name);
    }
    ::closedir(dir);
    std::sort(names.begin(), names.end());
    for (const std::string& name : names) {
      std::string value;
      if (std::FILE* f = std::fopen((std::string(folder) + "/" + name).c_str(), "r")) {
        char buffer[256];
        while (std::fgets(buffer, sizeof buffer, f) != nullptr) value += buffer;
        std::fclose(f);
      }
      parameters += (parameters.size() > 1 ? ", " : "") + json_string(name) + ": " + json_string(trimmed(value));
    }
  }
  // nvidia-smi -q: the product, and the "GPU Link Info" section as "Sub.Key": value.
  std::string link = "{", product;
  if (std::FILE* smi = ::popen("nvidia-smi -q -i 0 2>/dev/null", "r")) {
    char buffer[512];
    size_t section_indent = std::string::npos;
    std::string sub;
    while (std::fgets(buffer, sizeof buffer, smi) != nullptr) {
      const std::string line = buffer;
      const size_t indent = line.find_first_not_of(' ');
      if (indent == std::string::npos) continue;
      const size_t colon = line.find(':');
      const std::string key = trimmed(line.substr(0, colon));
      const std::string value = colon == std::string::npos ? "" : trimmed(line.substr(colon + 1));
      if (key == "Product Name" && product.empty()) product = value;
      if (key == "GPU Link Info") {
        section_indent = indent;
        continue;
      }
      if (section_indent == std::string::npos) continue;
      if (indent <= section_indent) {
        section_indent = std::string::npos;
        continue;
      }
      if (value.empty()) {
        sub = key;
      } else {
        link += (link.size() > 1 ? ", " : "") + json_string(sub.empty() ? key : sub + "." + key) + ": " +
                json_string(value);
      }
    }
    ::pclose(smi);
  }
  Line("P9").str("product", product).raw("uvm_parameters", parameters + "}").raw("link", link + "}").print();
}

bool wanted(const std::string& only, const char* probe) {
  if (only.empty()) return true;
  const std::string list = "," + only + ",";
  return list.find(std::string(",") + probe + ",") != std::string::npos;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--malloc") == 0) return second_process(std::strtoull(argv[2], nullptr, 10));
  if (argc > 2 || (argc == 2 && argv[1][0] == '-')) {
    std::printf("usage: um_calibration_probe [P1,P2,...]\n");
    return 2;
  }
  const std::string only = argc == 2 ? argv[1] : "";
  // First, and without the arena: the environment is worth having when the probes cannot run.
  if (wanted(only, "P9")) p9();
  Arena a;
  char* data = nullptr;
  try {
    int concurrent = 0;
    CHECK(cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, 0));
    if (!concurrent) throw CudaError("this GPU has no concurrent managed access: prefetches and discards fail");
    // A quarter of the free memory, at most 512 blocks and at least 64.
    a.blocks = std::min<size_t>(512, free_bytes() / 4 / kBlock);
    if (a.blocks < 64) throw CudaError("less than 512 MiB of the GPU is free");
    CHECK(cudaMallocManaged(&data, (a.blocks + 1) * kBlock));
    a.base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(data) + kBlock - 1) / kBlock * kBlock);
    CHECK(cudaMemAdvise(a.base, a.blocks * kBlock, cudaMemAdviseSetPreferredLocation, on_gpu()));
    CHECK(cudaStreamCreateWithFlags(&a.stream, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&a.other, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&a.compute, cudaStreamNonBlocking));
    CHECK(cudaEventCreateWithFlags(&a.done, cudaEventDisableTiming));
    CHECK(cudaMalloc(&a.sink, sizeof(uint32_t)));
  } catch (const CudaError& e) {
    Line("setup").str("error", e.what()).print();
    return 2;
  }
  Line("setup").num("arena_blocks", static_cast<double>(a.blocks)).num("block_bytes", kBlock).print();
  const std::pair<const char*, std::function<void()>> probes[] = {
      {"P1", [&] { p1(a); }}, {"P2", [&] { p2(a); }}, {"P3", [&] { p3(a); }},
      {"P4", [&] { p4(a); }}, {"P5", [&] { p5(a); }}, {"P6", [&] { p6(a); }},
      {"P7", [&] { p7(a); }}, {"P8", [&] { p8(a); }}};
  int status = 0;
  for (const auto& [name, probe] : probes) {
    if (!wanted(only, name)) continue;
    try {
      const auto start = Clock::now();
      probe();
      std::fprintf(stderr, "%s: %.1f s\n", name, us_since(start) / 1e6);
    } catch (const CudaError& e) {
      Line(name).str("error", e.what()).print();
      (void)cudaGetLastError();
      status = 2;
    }
  }
  return status;
}
