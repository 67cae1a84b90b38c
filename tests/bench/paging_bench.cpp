// What a paging policy's decisions cost per op (docs/benchmarks.md).
//
// Each benchmark runs the paging simulator over a committed trace at 2x
// oversubscription (2 MiB pages) with one policy, and times only the calls
// into the policy (every event: allocate, free, op start, faults, op end)
// during the steady (last) iteration, per op of that iteration: the cost a
// long training run pays op after op. The iteration marks, where a policy
// that learns builds its plan, are timed apart: plan_ms is the longest one,
// paid once per change of the job's pattern. `um` decides nothing: its row is
// the empty policy, the cost of the calls and the clock reads themselves, to
// subtract from the others measured in the same run.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>

#include "paging_simulator.h"
#include "trace_reader.h"
#include "trace_stream.h"

namespace zico::page {
namespace {

using Clock = std::chrono::steady_clock;

// Forwards every call, adding the time spent in it to *total_ns.
class TimedPolicy final : public prefetch::PagingPolicy {
 public:
  struct Times {
    uint32_t last_iteration = 0;  // time only the events after this mark
    uint64_t steady_ns = 0;
    uint64_t steady_ops = 0;
    uint64_t longest_mark_ns = 0;
  };
  TimedPolicy(std::unique_ptr<prefetch::PagingPolicy> inner, Times* times) : inner_(std::move(inner)), times_(times) {}
  [[nodiscard]] const char* name() const override { return inner_->name(); }
  void on_allocate(uint32_t block, const prefetch::BlockExtent& extent, prefetch::Decisions* out) override {
    const auto t = Clock::now();
    inner_->on_allocate(block, extent, out);
    add(t);
  }
  void on_free(uint32_t block, const prefetch::BlockExtent& extent, std::span<const prefetch::PageId> dead,
               prefetch::Decisions* out) override {
    const auto t = Clock::now();
    inner_->on_free(block, extent, dead, out);
    add(t);
  }
  void on_op_start(const prefetch::OpView& op, prefetch::Decisions* out) override {
    const auto t = Clock::now();
    inner_->on_op_start(op, out);
    add(t);
    if (steady_) ++times_->steady_ops;
  }
  void on_faults(const prefetch::OpView& op, std::span<const prefetch::PageId> faulted) override {
    const auto t = Clock::now();
    inner_->on_faults(op, faulted);
    add(t);
  }
  void on_op_end(const prefetch::OpView& op, prefetch::Decisions* out) override {
    const auto t = Clock::now();
    inner_->on_op_end(op, out);
    add(t);
  }
  void on_iteration(uint32_t n, prefetch::Decisions* out) override {
    const auto t = Clock::now();
    inner_->on_iteration(n, out);
    times_->longest_mark_ns = std::max(times_->longest_mark_ns, since(t));
    steady_ = n == times_->last_iteration;
  }

 private:
  static uint64_t since(Clock::time_point t) {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t).count());
  }
  void add(Clock::time_point t) {
    if (steady_) times_->steady_ns += since(t);
  }
  std::unique_ptr<prefetch::PagingPolicy> inner_;
  Times* times_;
  bool steady_ = false;
};

const prefetch::AccessStream& stream_of(const std::string& model) {
  static std::map<std::string, prefetch::AccessStream> streams;
  auto [it, fresh] = streams.try_emplace(model);
  if (fresh) {
    trace::Trace trace;
    std::string error;
    const std::string path = std::string(ZICO_SOURCE_DIR) + "/tools/traces/" + model + ".ztrace.gz";
    if (!trace::read_trace_file(path, &trace, &error).is_ok() ||
        !build_access_stream(trace, uint64_t{2} << 20, 0, &it->second, &error)) {
      std::fprintf(stderr, "%s\n", error.c_str());
      std::abort();
    }
  }
  return it->second;
}

void policy_decisions(benchmark::State& state, const std::string& model, const std::string& policy) {
  const prefetch::AccessStream& stream = stream_of(model);
  PagingOptions options;
  options.budget_bytes = prefetch::stream_facts(stream).peak_live_bytes / 2;
  TimedPolicy::Times times;
  times.last_iteration = stream.iterations - 1;
  options.wrap = [&](std::unique_ptr<prefetch::PagingPolicy> inner) {
    return std::make_unique<TimedPolicy>(std::move(inner), &times);
  };
  uint64_t steady_ns = 0;
  uint64_t steady_ops = 0;
  uint64_t longest_mark_ns = 0;
  for (auto _ : state) {
    times = TimedPolicy::Times{stream.iterations - 1};
    PagingResult result;
    std::string error;
    if (!run_paging(stream, policy, options, &result, &error)) {
      state.SkipWithError(error.c_str());
      return;
    }
    state.SetIterationTime(static_cast<double>(times.steady_ns) / 1e9);
    steady_ns += times.steady_ns;
    steady_ops += times.steady_ops;
    longest_mark_ns = std::max(longest_mark_ns, times.longest_mark_ns);
  }
  state.counters["ns_per_op"] = static_cast<double>(steady_ns) / static_cast<double>(std::max<uint64_t>(steady_ops, 1));
  state.counters["plan_ms"] = static_cast<double>(longest_mark_ns) / 1e6;
}

void register_all() {
  for (const char* model : {"resnet50", "gpt2", "nasnetalarge"}) {
    for (const char* policy : {"um", "deepum", "autoswap", "zico"}) {
      benchmark::RegisterBenchmark((std::string("PolicyDecisions/") + model + "/" + policy).c_str(),
                                   [model, policy](benchmark::State& s) { policy_decisions(s, model, policy); })
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
}

}  // namespace
}  // namespace zico::page

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  zico::page::register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
