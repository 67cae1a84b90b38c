// trace_job: one training job for zico-demo. It replays a real memory trace
// (tools/traces) through libzicoum's C API in scaled real time: the prologue,
// then N iterations, each begun with zico_mark_iteration() (the node
// manager's iteration gate: it may hold the job back to shift its peak).
//
//   trace_job --trace FILE --iterations N [--time-scale X] [--memory-scale F] [--name NAME]
//   trace_job --ops --trace FILE --iterations N [--time-scale X] [--memory-scale F] [--name NAME]
//
// With --ops the trace's kernels are replayed too, as fast as they go
// (op_replay.h), each for X times its traced duration (a GPU slower or
// faster than the traced one): the way to run a job beyond capacity
// (ZICO_MODE=um). Its
// line reads
//   result name=NAME iterations=N mode=ops clock=modelled|wall first_iter_s=S mean_iter_s=S last_iter_s=S
//          peak_allocated_bytes=B peak_resident_bytes=B peak_over_budget_bytes=B faulted_pages=P
//          prefetched_pages=P evicted_pages=P
// mean_iter_s: the iterations after the first (which the pager learns from);
// last_iter_s: the last one (the steady state, given enough iterations).
//
// Time: an event at trace offset t into its iteration happens X * t wall
// nanoseconds after the iteration began. The job keeps its own progress
// clock, anchored where zico_mark_iteration() returned; time blocked inside
// zico_malloc moves the anchor (the job's work is late by that much, it does
// not run faster afterwards). The iteration ends its period after it began,
// then the next one is marked. Memory: each block gets max(1, round(bytes * F))
// bytes.
//
// Every block gets a pattern in its first and last 8 bytes, derived from this
// process and the block, checked when it is freed: the memory is real, and no
// other job writes it. Under ZICO_BACKEND=cuda the bytes go through the CUDA
// driver (cuMemcpy), otherwise the pointers are host memory (SimDriver).
//
// Output, on success, one line on stdout:
//   result name=NAME iterations=N elapsed_s=S iteration_s=S mean_iter_s=S delay_s=S
//          gate_wait_s=S malloc_wait_s=S late_s=S ideal_iter_s=S peak_allocated_bytes=B peak_mapped_bytes=B
// elapsed_s: the whole run; iteration_s: from the first mark to the end of
// the last iteration; delay_s = gate_wait_s (in zico_mark_iteration) +
// malloc_wait_s (in zico_malloc); late_s: how far behind schedule the replay
// itself fell (CPU time), summed at iteration ends; ideal_iter_s: the mean
// iteration with no delay; the peaks: zico_get_stats() of device 0.
// Exit: 0; 1 when a block's pattern is wrong or an allocation fails (the
// message names the job, the block and the iteration); 2 for bad usage,
// including a trace that cannot be read or replayed (as zico-umctl's
// commands and zico-demo).
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <cuda.h>

#include <zicoum/zicoum.h>

#include "job_model.h"
#include "op_replay.h"
#include "trace_reader.h"

namespace {

using Clock = std::chrono::steady_clock;
using zico::simulate::ReplayEvent;

constexpr auto kSleepThreshold = std::chrono::microseconds(200);
constexpr size_t kPatternBytes = 8;

int usage_error(const std::string& message) {
  std::fprintf(stderr,
               "trace_job: %s\nusage: trace_job [--ops] --trace FILE --iterations N [--time-scale X] "
               "[--memory-scale F] [--name NAME]\n",
               message.c_str());
  return 2;
}

// "0.25", "1/256": a positive fraction (or, for time, >= 0).
bool parse_scale(std::string_view text, double* out) {
  const std::string s(text);
  char* end = nullptr;
  const size_t slash = s.find('/');
  double value = 0;
  if (slash == std::string::npos) {
    value = std::strtod(s.c_str(), &end);
    if (s.empty() || *end != '\0') return false;
  } else {
    const std::string num = s.substr(0, slash);
    const std::string den = s.substr(slash + 1);
    const double n = std::strtod(num.c_str(), &end);
    if (num.empty() || *end != '\0') return false;
    const double d = std::strtod(den.c_str(), &end);
    if (den.empty() || *end != '\0' || !(d > 0)) return false;
    value = n / d;
  }
  if (!std::isfinite(value) || value < 0) return false;
  *out = value;
  return true;
}

// Reads and writes the ends of blocks: directly on the sim backend, through
// the CUDA driver on a GPU (zicoum's pointers are device memory there).
class BlockAccess {
 public:
  bool open(std::string* why) {
    const char* backend = std::getenv("ZICO_BACKEND");
    if (backend != nullptr && std::strcmp(backend, "sim") == 0) return true;
    void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      *why = "ZICO_BACKEND is not sim and libcuda.so.1 cannot be loaded";
      return false;
    }
    const auto symbol = [&](const char* name) { return ::dlsym(lib, name); };
    auto init = reinterpret_cast<CUresult (*)(unsigned)>(symbol("cuInit"));
    auto device_get = reinterpret_cast<CUresult (*)(CUdevice*, int)>(symbol("cuDeviceGet"));
    auto retain = reinterpret_cast<CUresult (*)(CUcontext*, CUdevice)>(symbol("cuDevicePrimaryCtxRetain"));
    auto set_current = reinterpret_cast<CUresult (*)(CUcontext)>(symbol("cuCtxSetCurrent"));
    to_device_ = reinterpret_cast<CUresult (*)(CUdeviceptr, const void*, size_t)>(symbol("cuMemcpyHtoD_v2"));
    to_host_ = reinterpret_cast<CUresult (*)(void*, CUdeviceptr, size_t)>(symbol("cuMemcpyDtoH_v2"));
    CUdevice device = 0;
    CUcontext context = nullptr;
    if (init == nullptr || device_get == nullptr || retain == nullptr || set_current == nullptr ||
        to_device_ == nullptr || to_host_ == nullptr || init(0) != CUDA_SUCCESS || device_get(&device, 0) != CUDA_SUCCESS ||
        retain(&context, device) != CUDA_SUCCESS || set_current(context) != CUDA_SUCCESS) {
      *why = "cannot set up the CUDA driver to check block contents";
      return false;
    }
    cuda_ = true;
    return true;
  }

  bool write(void* ptr, size_t offset, const uint8_t* bytes, size_t n) const {
    auto* at = static_cast<uint8_t*>(ptr) + offset;
    if (!cuda_) {
      std::memcpy(at, bytes, n);
      return true;
    }
    return to_device_(reinterpret_cast<CUdeviceptr>(at), bytes, n) == CUDA_SUCCESS;
  }
  bool read(const void* ptr, size_t offset, uint8_t* bytes, size_t n) const {
    const auto* at = static_cast<const uint8_t*>(ptr) + offset;
    if (!cuda_) {
      std::memcpy(bytes, at, n);
      return true;
    }
    return to_host_(bytes, reinterpret_cast<CUdeviceptr>(at), n) == CUDA_SUCCESS;
  }

 private:
  bool cuda_ = false;
  CUresult (*to_device_)(CUdeviceptr, const void*, size_t) = nullptr;
  CUresult (*to_host_)(void*, CUdeviceptr, size_t) = nullptr;
};

struct LiveBlock {
  void* ptr = nullptr;
  uint64_t bytes = 0;
};

uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

class Job {
 public:
  Job(std::string name, double time_scale, double memory_scale)
      : name_(std::move(name)), time_scale_(time_scale), memory_scale_(memory_scale) {
    tag_ = mix(static_cast<uint64_t>(::getpid()) * 0x9E3779B97F4A7C15ULL ^ std::hash<std::string>{}(name_));
  }

  bool open(std::string* why) { return access_.open(why); }

  // Replays `events` of one phase (`iteration` -1: the prologue) from `anchor`.
  bool run(const std::vector<ReplayEvent>& events, int64_t iteration, uint64_t period_ns, Clock::time_point anchor) {
    anchor_ = anchor;
    for (const ReplayEvent& event : events) {
      wait_until(scaled(event.offset_ns));
      if (event.kind == ReplayEvent::Kind::kAllocate) {
        if (!allocate(event, iteration)) return false;
      } else if (!release(event.block, iteration)) {
        return false;
      }
    }
    const Clock::time_point end = scaled(period_ns);
    const Clock::time_point now = Clock::now();
    if (now > end) late_ += now - end;
    wait_until(end);
    return true;
  }

  bool release_all(int64_t iteration) {
    for (uint64_t id = 0; id < blocks_.size(); ++id) {
      if (blocks_[id].bytes != 0 && !release(id, iteration)) return false;
    }
    return true;
  }

  Clock::duration malloc_wait() const { return malloc_wait_; }
  Clock::duration late() const { return late_; }

 private:
  Clock::time_point scaled(uint64_t offset_ns) const {
    return anchor_ + std::chrono::nanoseconds(static_cast<int64_t>(static_cast<double>(offset_ns) * time_scale_));
  }
  static void wait_until(Clock::time_point target) {
    if (target - Clock::now() > kSleepThreshold) std::this_thread::sleep_until(target);
  }

  // Byte i of the block's pattern: the same whichever end writes it, so the
  // two ends may overlap in blocks under 16 bytes.
  uint8_t pattern(uint64_t block, size_t i) const {
    return static_cast<uint8_t>(mix(tag_ ^ (block * 0x100000001B3ULL) ^ i) >> 56);
  }
  bool ends(uint64_t block, const LiveBlock& live, bool write, std::string* problem) const {
    const size_t n = std::min<size_t>(kPatternBytes, live.bytes);
    for (const size_t start : {size_t{0}, static_cast<size_t>(live.bytes - n)}) {
      uint8_t want[kPatternBytes];
      for (size_t i = 0; i < n; ++i) want[i] = pattern(block, start + i);
      if (write) {
        if (!access_.write(live.ptr, start, want, n)) {
          *problem = "cannot write it";
          return false;
        }
        continue;
      }
      uint8_t got[kPatternBytes];
      if (!access_.read(live.ptr, start, got, n)) {
        *problem = "cannot read it";
        return false;
      }
      for (size_t i = 0; i < n; ++i) {
        if (got[i] != want[i]) {
          char text[96];
          std::snprintf(text, sizeof text, "byte %zu of %llu reads 0x%02x, written 0x%02x", start + i,
                        static_cast<unsigned long long>(live.bytes), got[i], want[i]);
          *problem = text;
          return false;
        }
      }
    }
    return true;
  }

  bool allocate(const ReplayEvent& event, int64_t iteration) {
    const double scaled_bytes = std::round(static_cast<double>(event.bytes) * memory_scale_);
    const uint64_t bytes = std::max<uint64_t>(1, static_cast<uint64_t>(scaled_bytes));
    void* ptr = nullptr;
    const Clock::time_point start = Clock::now();
    const zico_status_t status = zico_malloc(&ptr, bytes, 0, nullptr);
    const Clock::duration took = Clock::now() - start;
    malloc_wait_ += took;
    anchor_ += took;
    if (status != ZICO_OK) {
      std::fprintf(stderr, "trace_job %s: allocating block %llu (%llu bytes) in %s failed: %s: %s\n", name_.c_str(),
                   static_cast<unsigned long long>(event.block), static_cast<unsigned long long>(bytes),
                   where(iteration).c_str(), zico_status_string(status), zico_last_error());
      return false;
    }
    if (event.block >= blocks_.size()) blocks_.resize(event.block + 1);
    blocks_[event.block] = {ptr, bytes};
    std::string problem;
    if (!ends(event.block, blocks_[event.block], true, &problem)) {
      std::fprintf(stderr, "trace_job %s: block %llu in %s: %s\n", name_.c_str(),
                   static_cast<unsigned long long>(event.block), where(iteration).c_str(), problem.c_str());
      return false;
    }
    return true;
  }

  bool release(uint64_t block, int64_t iteration) {
    if (block >= blocks_.size() || blocks_[block].bytes == 0) {
      std::fprintf(stderr, "trace_job %s: the model frees block %llu in %s, which is not live\n", name_.c_str(),
                   static_cast<unsigned long long>(block), where(iteration).c_str());
      return false;
    }
    LiveBlock& live = blocks_[block];
    std::string problem;
    if (!ends(block, live, false, &problem)) {
      std::fprintf(stderr, "trace_job %s: block %llu freed in %s does not hold its pattern: %s\n", name_.c_str(),
                   static_cast<unsigned long long>(block), where(iteration).c_str(), problem.c_str());
      return false;
    }
    if (const zico_status_t status = zico_free(live.ptr, nullptr); status != ZICO_OK) {
      std::fprintf(stderr, "trace_job %s: freeing block %llu in %s failed: %s: %s\n", name_.c_str(),
                   static_cast<unsigned long long>(block), where(iteration).c_str(), zico_status_string(status),
                   zico_last_error());
      return false;
    }
    live = {};
    return true;
  }

  static std::string where(int64_t iteration) {
    return iteration < 0 ? std::string("the prologue") : "iteration " + std::to_string(iteration);
  }

  std::string name_;
  double time_scale_;
  double memory_scale_;
  uint64_t tag_ = 0;
  BlockAccess access_;
  std::vector<LiveBlock> blocks_;  // by replay block id; bytes 0: not live
  Clock::time_point anchor_{};
  Clock::duration malloc_wait_{};
  Clock::duration late_{};
};

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

int run_ops(const std::string& trace_path, std::string name, uint32_t iterations, double time_scale,
            double memory_scale) {
  zico::trace::Trace trace;
  std::string error;
  if (!zico::trace::read_trace_file(trace_path, &trace, &error).is_ok()) {
    std::fprintf(stderr, "trace_job: %s\n", error.c_str());
    return 2;
  }
  if (name.empty()) {
    const auto model = trace.meta.find("model");
    name = model != trace.meta.end() && !model->second.empty() ? model->second : "job";
  }
  zico::demo::OpReplayResult r;
  if (!zico::demo::replay_ops(trace, iterations, time_scale, memory_scale, &r, &error)) {
    std::fprintf(stderr, "trace_job %s: %s\n", name.c_str(), error.c_str());
    return r.unusable_trace ? 2 : 1;
  }
  std::printf(
      "result name=%s iterations=%u mode=ops clock=%s first_iter_s=%.6f mean_iter_s=%.6f last_iter_s=%.6f "
      "peak_allocated_bytes=%llu "
      "peak_resident_bytes=%llu peak_over_budget_bytes=%llu faulted_pages=%llu prefetched_pages=%llu "
      "evicted_pages=%llu\n",
      name.c_str(), r.iterations, r.modelled ? "modelled" : "wall", r.first_iteration_s, r.steady_iteration_s,
      r.last_iteration_s,
      static_cast<unsigned long long>(r.peak_allocated_bytes), static_cast<unsigned long long>(r.peak_resident_bytes),
      static_cast<unsigned long long>(r.peak_over_budget_bytes), static_cast<unsigned long long>(r.faulted_pages), static_cast<unsigned long long>(r.prefetched_pages),
      static_cast<unsigned long long>(r.evicted_pages));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string trace_path;
  std::string name;
  long iterations = -1;
  double time_scale = 1;
  double memory_scale = 1;
  bool ops = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::printf("usage: trace_job [--ops] --trace FILE --iterations N [--time-scale X] [--memory-scale F] [--name NAME]\n");
      return 0;
    }
    if (arg == "--ops") {
      ops = true;
      continue;
    }
    if (i + 1 >= argc) return usage_error(std::string(arg) + " needs a value");
    const std::string value = argv[++i];
    if (arg == "--trace") {
      trace_path = value;
    } else if (arg == "--name") {
      if (value.empty() || value.size() > 64 ||
          value.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") != std::string::npos) {
        return usage_error("--name '" + value + "' is not valid; expected 1-64 letters, digits, '_', '.' or '-'");
      }
      name = value;
    } else if (arg == "--iterations") {
      char* end = nullptr;
      iterations = std::strtol(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || iterations < 1 || iterations > 1000000) {
        return usage_error("--iterations '" + value + "' is not valid; expected an integer from 1 to 1000000");
      }
    } else if (arg == "--time-scale") {
      if (!parse_scale(value, &time_scale)) {
        return usage_error("--time-scale '" + value + "' is not valid; expected a number >= 0 such as 10 or 1/2");
      }
    } else if (arg == "--memory-scale") {
      if (!parse_scale(value, &memory_scale) || memory_scale <= 0 || memory_scale > 1) {
        return usage_error("--memory-scale '" + value + "' is not valid; expected a fraction in (0, 1] such as 0.25 or 1/256");
      }
    } else {
      return usage_error("unknown option '" + std::string(arg) + "'");
    }
  }
  if (trace_path.empty() || iterations < 0) return usage_error("--trace and --iterations are required");
  // zico-umd and zico-umctl show the job by this name (read at the first allocation).
  if (!name.empty()) setenv("ZICO_JOB_NAME", name.c_str(), 1);

  if (ops) return run_ops(trace_path, name, static_cast<uint32_t>(iterations), time_scale, memory_scale);

  const Clock::time_point begin = Clock::now();
  zico::trace::Trace trace;
  zico::simulate::JobModel model;
  std::string error;
  if (!zico::trace::read_trace_file(trace_path, &trace, &error).is_ok() ||
      !zico::simulate::build_job_model(trace, &model, &error).is_ok()) {
    std::fprintf(stderr, "trace_job: %s\n", error.c_str());
    return 2;
  }
  if (name.empty()) name = model.name;
  trace = {};

  Job job(name, time_scale, memory_scale);
  if (!job.open(&error)) {
    std::fprintf(stderr, "trace_job %s: %s\n", name.c_str(), error.c_str());
    return 1;
  }
  std::vector<ReplayEvent> events;
  zico::simulate::append_prologue_events(model, &events);
  if (!job.run(events, -1, model.prologue_ns, Clock::now())) return 1;

  Clock::duration gate_wait{};
  const Clock::time_point first_mark = Clock::now();
  for (long n = 0; n < iterations; ++n) {
    events.clear();
    zico::simulate::append_iteration_events(model, static_cast<uint32_t>(n), &events);
    const Clock::time_point asked = Clock::now();
    if (const zico_status_t status = zico_mark_iteration(); status != ZICO_OK) {
      std::fprintf(stderr, "trace_job %s: zico_mark_iteration before iteration %ld failed: %s: %s\n", name.c_str(), n,
                   zico_status_string(status), zico_last_error());
      return 1;
    }
    const Clock::time_point started = Clock::now();
    gate_wait += started - asked;
    if (!job.run(events, n, n == 0 ? model.first_period_ns : model.steady_period_ns, started)) return 1;
  }
  const Clock::time_point last_end = Clock::now();
  if (!job.release_all(iterations - 1)) return 1;
  const Clock::time_point end = Clock::now();

  zico_stats_t stats{};
  stats.struct_size = sizeof stats;
  (void)zico_get_stats(0, &stats);
  const double iteration_s = seconds(last_end - first_mark);
  const double ideal_iter_s = static_cast<double>(model.first_period_ns + (iterations - 1) * model.steady_period_ns) *
                              time_scale / 1e9 / static_cast<double>(iterations);
  std::printf(
      "result name=%s iterations=%ld elapsed_s=%.6f iteration_s=%.6f mean_iter_s=%.6f delay_s=%.6f gate_wait_s=%.6f "
      "malloc_wait_s=%.6f late_s=%.6f ideal_iter_s=%.6f peak_allocated_bytes=%llu peak_mapped_bytes=%llu\n",
      name.c_str(), iterations, seconds(end - begin), iteration_s, iteration_s / static_cast<double>(iterations),
      seconds(gate_wait + job.malloc_wait()), seconds(gate_wait), seconds(job.malloc_wait()), seconds(job.late()),
      ideal_iter_s, static_cast<unsigned long long>(stats.peak_allocated_bytes),
      static_cast<unsigned long long>(stats.peak_mapped_bytes));
  return 0;
}
