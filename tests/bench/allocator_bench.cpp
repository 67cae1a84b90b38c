// Benchmarks of DeviceAllocator on SimDriver.
//
//   BM_CachedMallocFree/<bytes>  one allocate + deallocate pair per iteration
//       of a size the stream already has cached: 4096 takes the small-class
//       (slab) path, 8388608 the large (span) path. threads:2 runs two threads
//       on one shared allocator, each on its own stream. Time is per pair.
//   BM_DnnSequence/<impl>  replays a DNN training trace (dnn_trace.h) on a
//       fresh allocator per iteration: naive (one mapping per allocation) and
//       zicoum. Counters: peak_live_bytes (requested bytes live at once),
//       peak_rounded_bytes (the same after the allocator's size rounding),
//       peak_mapped_bytes (physical memory behind them), frag_ratio (mapped
//       over live), time_per_op (wall-clock seconds per allocate or free,
//       allocator creation and teardown excluded), driver_maps
//       (chunk maps per replay) and, on zicoum, time_vs_naive.
//
// The process exits non-zero when zicoum's frag_ratio on the trace exceeds
// kMaxFragRatio or a replay fails: that is a deterministic memory target, so
// `ctest -L bench` checks it. Timings are reported, never asserted.
//
// The simulated device is 64 GiB; its memory is never touched, so memfd
// pages cost nothing.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "device_allocator.h"
#include "dnn_trace.h"
#include "naive_allocator.h"
#include "sim_driver.h"

namespace zico::bench {
namespace {

using replay::NaiveAllocator;

constexpr double kMaxFragRatio = 1.15;
constexpr DeviceId kDevice{0};
constexpr size_t kSimCapacity = size_t{64} << 30;

SimOptions sim_options() {
  SimOptions options;
  options.capacity = kSimCapacity;
  return options;
}

AllocatorOptions allocator_options() {
  AllocatorOptions options;
  options.budget_bytes = kSimCapacity;  // never the limit here
  return options;
}

// --- BM_CachedMallocFree -----------------------------------------------------

// One allocator for every run and thread of the benchmark: the driver outlives it.
struct SharedAllocator {
  SharedAllocator() { status = DeviceAllocator::create(driver, kDevice, allocator_options(), &allocator, &why); }
  SimDriver driver{sim_options()};
  std::unique_ptr<DeviceAllocator> allocator;
  Status status;
  std::string why;
};

SharedAllocator& shared_allocator() {
  static SharedAllocator shared;
  return shared;
}

void BM_CachedMallocFree(benchmark::State& state) {
  SharedAllocator& shared = shared_allocator();
  if (!shared.status.is_ok()) {
    state.SkipWithError(("creating the allocator failed: " + shared.why).c_str());
    return;
  }
  DeviceAllocator& allocator = *shared.allocator;
  const auto bytes = static_cast<size_t>(state.range(0));
  const StreamHandle stream{static_cast<uintptr_t>(state.thread_index()) + 1};
  // Warm-up: afterwards `bytes` sits in this stream's cache.
  void* ptr = nullptr;
  if (!allocator.allocate(bytes, stream, &ptr).is_ok() || !allocator.deallocate(ptr, stream).is_ok()) {
    state.SkipWithError("warm-up allocation failed");
    return;
  }
  for (auto _ : state) {
    const Status allocated = allocator.allocate(bytes, stream, &ptr);
    benchmark::DoNotOptimize(ptr);
    const Status freed = allocator.deallocate(ptr, stream);
    if (!allocated.is_ok() || !freed.is_ok()) {
      state.SkipWithError("cached allocate/deallocate failed");
      break;
    }
  }
}

BENCHMARK(BM_CachedMallocFree)
    ->Arg(4 << 10)
    ->Arg(8 << 20)
    ->Threads(1)
    ->Threads(2)
    ->UseRealTime()
    ->Repetitions(5)
    ->ReportAggregatesOnly(true);

// --- BM_DnnSequence ------------------------------------------------------------

const DnnTrace& dnn_trace() {
  static const DnnTrace trace = make_dnn_trace();
  return trace;
}

size_t peak_live_bytes(const DnnTrace& trace) {
  std::vector<size_t> bytes_of(trace.ids);
  size_t live = 0;
  size_t peak = 0;
  for (const TraceOp& op : trace.ops) {
    if (op.kind == TraceOp::Kind::kAllocate) {
      bytes_of[op.id] = op.bytes;
      live += op.bytes;
      peak = std::max(peak, live);
    } else {
      live -= bytes_of[op.id];
    }
  }
  return peak;
}

// On a failure the blocks still live are left to the allocator's destructor.
template <class Allocator>
Status replay(const DnnTrace& trace, Allocator& allocator, std::vector<void*>& ptrs) {
  const StreamHandle stream{};
  for (const TraceOp& op : trace.ops) {
    if (op.kind == TraceOp::Kind::kAllocate) {
      ZICO_RETURN_IF_ERROR(allocator.allocate(op.bytes, stream, &ptrs[op.id]));
    } else {
      ZICO_RETURN_IF_ERROR(allocator.deallocate(ptrs[op.id], stream));
    }
  }
  return Status::ok();
}

Status make_allocator(SimDriver& driver, std::unique_ptr<DeviceAllocator>* out) {
  std::string why;
  return DeviceAllocator::create(driver, kDevice, allocator_options(), out, &why);
}
Status make_allocator(SimDriver& driver, std::unique_ptr<NaiveAllocator>* out) {
  return NaiveAllocator::create(driver, kDevice, out);
}
size_t peak_mapped_bytes(const DeviceAllocator& allocator) { return allocator.stats().peak_mapped_bytes; }
size_t peak_mapped_bytes(const NaiveAllocator& allocator) { return allocator.peak_mapped_bytes(); }
// Live bytes after the allocator's size rounding: separates rounding from caching.
size_t peak_rounded_bytes(const DeviceAllocator& allocator) { return allocator.stats().peak_allocated_bytes; }
size_t peak_rounded_bytes(const NaiveAllocator& allocator) { return allocator.peak_mapped_bytes(); }

// What the DNN runs measured, read by main() after all benchmarks ran.
struct DnnOutcome {
  bool ran = false;
  std::string error;  // empty: every replay succeeded
  size_t peak_live_bytes = 0;
  size_t peak_mapped_bytes = 0;  // worst replay
  double seconds_per_op = 0;     // last run
};
DnnOutcome& naive_outcome() {
  static DnnOutcome outcome;
  return outcome;
}
DnnOutcome& zicoum_outcome() {
  static DnnOutcome outcome;
  return outcome;
}

double frag_ratio(const DnnOutcome& outcome) {
  return static_cast<double>(outcome.peak_mapped_bytes) / static_cast<double>(outcome.peak_live_bytes);
}

// Each iteration replays the whole trace on a fresh allocator; creating and
// destroying the allocator is not timed.
template <class Allocator>
void BM_DnnSequence(benchmark::State& state, DnnOutcome* outcome, const DnnOutcome* baseline) {
  const DnnTrace& trace = dnn_trace();
  SimDriver driver(sim_options());
  std::vector<void*> ptrs(trace.ids);
  const uint64_t maps_before = driver.counters().maps;
  size_t peak_mapped = 0;
  size_t peak_rounded = 0;
  double replay_seconds = 0;
  for (auto _ : state) {
    state.PauseTiming();
    std::unique_ptr<Allocator> allocator;
    Status status = make_allocator(driver, &allocator);
    state.ResumeTiming();
    if (status.is_ok()) {
      const auto start = std::chrono::steady_clock::now();
      status = replay(trace, *allocator, ptrs);
      replay_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    state.PauseTiming();
    if (allocator) {
      peak_mapped = std::max(peak_mapped, peak_mapped_bytes(*allocator));
      peak_rounded = std::max(peak_rounded, peak_rounded_bytes(*allocator));
    }
    allocator.reset();
    state.ResumeTiming();
    if (!status.is_ok()) {
      outcome->ran = true;
      outcome->error = "replay failed: " + status.message();
      state.SkipWithError(outcome->error.c_str());
      break;
    }
  }
  if (state.iterations() == 0 || !outcome->error.empty()) return;

  const auto iterations = static_cast<double>(state.iterations());
  const auto ops = static_cast<double>(trace.ops.size());
  outcome->ran = true;
  outcome->peak_live_bytes = peak_live_bytes(trace);
  outcome->peak_mapped_bytes = std::max(outcome->peak_mapped_bytes, peak_mapped);
  outcome->seconds_per_op = replay_seconds / (iterations * ops);

  using benchmark::Counter;
  state.counters["peak_live_bytes"] = Counter(static_cast<double>(outcome->peak_live_bytes), Counter::kDefaults,
                                              Counter::kIs1024);
  state.counters["peak_mapped_bytes"] = Counter(static_cast<double>(peak_mapped), Counter::kDefaults,
                                                Counter::kIs1024);
  state.counters["peak_rounded_bytes"] = Counter(static_cast<double>(peak_rounded), Counter::kDefaults,
                                                 Counter::kIs1024);
  state.counters["frag_ratio"] = static_cast<double>(peak_mapped) / static_cast<double>(outcome->peak_live_bytes);
  state.counters["time_per_op"] = outcome->seconds_per_op;  // wall-clock seconds, replay only
  state.counters["driver_maps"] = static_cast<double>(driver.counters().maps - maps_before) / iterations;
  if (baseline != nullptr && baseline->ran && baseline->error.empty() && baseline->seconds_per_op > 0) {
    state.counters["time_vs_naive"] = outcome->seconds_per_op / baseline->seconds_per_op;
  }
}

void register_dnn_benchmarks() {
  // naive first: zicoum's time_vs_naive reads its result.
  benchmark::RegisterBenchmark("BM_DnnSequence/naive", BM_DnnSequence<NaiveAllocator>, &naive_outcome(), nullptr)
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("BM_DnnSequence/zicoum", BM_DnnSequence<DeviceAllocator>, &zicoum_outcome(),
                               &naive_outcome())
      ->Unit(benchmark::kMillisecond);
}

// The process status: a failed replay or zicoum over the fragmentation target fails it.
int dnn_verdict() {
  int status = 0;
  for (const auto& [name, outcome] : {std::pair{"naive", &naive_outcome()}, std::pair{"zicoum", &zicoum_outcome()}}) {
    if (!outcome->error.empty()) {
      std::fprintf(stderr, "BM_DnnSequence/%s: %s\n", name, outcome->error.c_str());
      status = 1;
    }
  }
  const DnnOutcome& zicoum = zicoum_outcome();
  if (!zicoum.ran || !zicoum.error.empty()) return status;
  const double ratio = frag_ratio(zicoum);
  const bool over = ratio > kMaxFragRatio;
  std::fprintf(stderr, "BM_DnnSequence/zicoum: frag_ratio %.4f (peak mapped %zu B / peak live %zu B) %s %.2f\n", ratio,
               zicoum.peak_mapped_bytes, zicoum.peak_live_bytes, over ? "EXCEEDS the target" : "within the target",
               kMaxFragRatio);
  return over ? 1 : status;
}

}  // namespace
}  // namespace zico::bench

// BENCHMARK_MAIN, plus the exit status of the fragmentation check.
int main(int argc, char** argv) {
  zico::bench::register_dnn_benchmarks();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return zico::bench::dnn_verdict();
}
