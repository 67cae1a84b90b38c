#include "replay_command.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "caching_model.h"
#include "json_writer.h"
#include "lifetime_plan.h"
#include "memory_plot.h"
#include "planned_target.h"
#include "plot_file.h"
#include "replay.h"
#include "sim_targets.h"
#include "sizes.h"
#include "trace_reader.h"

namespace zico::umctl {
namespace {

constexpr const char* kUsage =
    "Usage: zico-umctl replay [--json] [--summary] [--plot-dir DIR] TRACE...\n"
    "Replay memory traces (docs/trace-format.md) against zicoum's allocator and, in the same\n"
    "run, two baselines: one mapping per allocation (naive) and a model of PyTorch's caching\n"
    "allocator; then zicoum with a lifetime plan learned from one iteration.\n"
    "\n"
    "  --json          machine-readable output on stdout\n"
    "  --summary       per-iteration peak memory and its persistent/transient split\n"
    "  --plot-dir DIR  write DIR/<trace>.svg, memory over time by category\n"
    "\n"
    "Fragmentation is peak mapped / peak live, live counting requested bytes. An allocation an\n"
    "allocator refuses (out of memory) is counted in its \"failed\" column and left out of its\n"
    "figures. Exit status: 0; 1 if an allocation failed (the output is complete) or a trace\n"
    "could not be replayed; 2 for a usage error or an invalid trace.\n";

struct Options {
  bool json = false;
  bool summary = false;
  std::string plot_dir;
  std::vector<std::string> traces;
};

struct PlanOutcome {
  replay::LifetimePlan plan;
  std::vector<uint32_t> planned_iterations;
  uint64_t steady_peak_live = 0;
  uint64_t steady_peak_mapped = 0;
  uint64_t online_steady_peak_mapped = 0;
  uint64_t planned_allocations = 0;
  uint64_t mismatched = 0;
  uint64_t busy = 0;
};

struct TraceOutcome {
  const trace::Trace* trace = nullptr;
  std::string path;  // as given, as simulate's JSON names its traces
  std::vector<replay::ReplayResult> results;  // naive, pytorch-caching, zicoum
  PlanOutcome plan;
  bool has_plan = false;

  // The trace's own live bytes: a replay that refused no allocation (a
  // refused block is not live in the replay that refused it).
  [[nodiscard]] const replay::ReplayResult& live() const {
    for (const replay::ReplayResult& r : results) {
      if (r.failed_allocations == 0) return r;
    }
    return results.front();
  }
};

int usage_error(const std::string& message) {
  std::fprintf(stderr, "zico-umctl replay: %s\nTry 'zico-umctl replay --help'.\n", message.c_str());
  return 2;
}

std::string ratio(uint64_t numerator, uint64_t denominator) {
  if (denominator == 0) return "-";
  char text[32];
  std::snprintf(text, sizeof text, "%.3f", static_cast<double>(numerator) / static_cast<double>(denominator));
  return text;
}

// The iteration the plan observes: the second when there are three or more,
// because the first one also creates the optimizer state.
uint32_t observed_iteration(const trace::Trace& trace) { return trace.iteration_starts.size() >= 3 ? 1 : 0; }

Status run_all(const trace::Trace& trace, TraceOutcome* outcome, std::string* error) {
  outcome->trace = &trace;
  using Factory = std::function<Status(std::unique_ptr<replay::ReplayTarget>*)>;
  const std::vector<Factory> factories = {
      [&](auto* out) {
        std::unique_ptr<replay::NaiveTarget> t;
        ZICO_RETURN_IF_ERROR(replay::NaiveTarget::create(&t, error));
        *out = std::move(t);
        return Status::ok();
      },
      [&](auto* out) {
        *out = std::make_unique<replay::CachingAllocatorModel>();
        return Status::ok();
      },
      [&](auto* out) {
        std::unique_ptr<replay::ZicoumTarget> t;
        ZICO_RETURN_IF_ERROR(replay::ZicoumTarget::create(&t, error));
        *out = std::move(t);
        return Status::ok();
      },
  };
  for (const Factory& make : factories) {
    std::unique_ptr<replay::ReplayTarget> target;
    ZICO_RETURN_IF_ERROR(make(&target));
    replay::ReplayResult result;
    ZICO_RETURN_IF_ERROR(replay::replay(trace, *target, &result, error));
    outcome->results.push_back(std::move(result));
  }

  const uint32_t observed = observed_iteration(trace);
  if (trace.iteration_starts.size() < 2) return Status::ok();  // nothing left to serve from a plan
  std::unique_ptr<replay::PlannedTarget> planned;
  ZICO_RETURN_IF_ERROR(replay::PlannedTarget::create(replay::plan_iteration(trace, observed), &planned, error));
  replay::ReplayResult result;
  ZICO_RETURN_IF_ERROR(replay::replay(trace, *planned, &result, error));
  PlanOutcome& plan = outcome->plan;
  plan.plan = planned->plan();
  plan.planned_allocations = planned->planned_allocations();
  plan.mismatched = planned->mismatched();
  plan.busy = planned->busy();
  const replay::ReplayResult& online = outcome->results.back();
  // Steady state: the first planned iteration still holds blocks from before
  // the switch, so it counts only when it is the only planned one.
  const uint32_t steady = observed + 2 < result.iterations.size() ? observed + 2 : observed + 1;
  for (uint32_t i = steady; i < result.iterations.size(); ++i) {
    plan.planned_iterations.push_back(i);
    plan.steady_peak_live = std::max(plan.steady_peak_live, result.iterations[i].peak_live_bytes);
    plan.steady_peak_mapped = std::max(plan.steady_peak_mapped, result.iterations[i].peak_mapped_bytes);
    plan.online_steady_peak_mapped = std::max(plan.online_steady_peak_mapped, online.iterations[i].peak_mapped_bytes);
  }
  outcome->has_plan = true;
  return Status::ok();
}

void print_text(const TraceOutcome& o, bool summary) {
  const trace::Trace& t = *o.trace;
  const auto model = t.meta.count("model") ? t.meta.at("model") : std::string("?");
  std::printf("%s (%s): %zu iterations, %zu blocks, %zu ops, peak live %s\n", model.c_str(), t.name.c_str(),
              t.iteration_starts.size(), t.blocks.size(), t.ops.size(), format_size(o.live().peak_live_bytes).c_str());
  if (summary) {
    std::printf("  %-10s %14s %14s %14s\n", "iteration", "peak live", "persistent", "transient");
    for (size_t i = 0; i < o.live().iterations.size(); ++i) {
      const replay::IterationResult& it = o.live().iterations[i];
      std::printf("  %-10zu %14s %14s %14s\n", i, format_size(it.peak_live_bytes).c_str(),
                  format_size(it.persistent_bytes).c_str(), format_size(it.transient_bytes).c_str());
    }
  }
  std::printf("  %-16s %14s %8s %11s %11s %10s %7s\n", "allocator", "peak mapped", "frag", "maps", "unmaps", "cpu/op",
              "failed");
  for (const replay::ReplayResult& r : o.results) {
    std::printf("  %-16s %14s %8s %11llu %11llu %8.0f ns %7llu\n", r.target.c_str(),
                format_size(r.peak_mapped_bytes).c_str(), ratio(r.peak_mapped_bytes, r.peak_live_bytes).c_str(),
                static_cast<unsigned long long>(r.map_calls), static_cast<unsigned long long>(r.unmap_calls),
                r.ns_per_operation(), static_cast<unsigned long long>(r.failed_allocations));
  }
  if (o.has_plan) {
    const PlanOutcome& p = o.plan;
    std::printf("  lifetime plan from iteration %u: region %s for transient peak %s (%s); %llu served from it, "
                "%llu fell back (%llu changed size or order, %llu found the range in use)\n",
                p.plan.observed_iteration, format_size(p.plan.arena_bytes).c_str(),
                format_size(p.plan.lower_bound_bytes).c_str(), ratio(p.plan.arena_bytes, p.plan.lower_bound_bytes).c_str(),
                static_cast<unsigned long long>(p.planned_allocations),
                static_cast<unsigned long long>(p.mismatched + p.busy), static_cast<unsigned long long>(p.mismatched),
                static_cast<unsigned long long>(p.busy));
    std::printf("  steady state (iterations %u-%u): peak live %s, mapped %s (frag %s); online allocator in the same "
                "iterations %s (frag %s)\n",
                p.planned_iterations.front(), p.planned_iterations.back(), format_size(p.steady_peak_live).c_str(), format_size(p.steady_peak_mapped).c_str(),
                ratio(p.steady_peak_mapped, p.steady_peak_live).c_str(), format_size(p.online_steady_peak_mapped).c_str(),
                ratio(p.online_steady_peak_mapped, p.steady_peak_live).c_str());
  }
}

void write_json(const std::vector<TraceOutcome>& outcomes) {
  JsonWriter json;
  json.begin_object();
  json.key("traces");
  json.begin_array();
  for (const TraceOutcome& o : outcomes) {
    const trace::Trace& t = *o.trace;
    json.begin_object();
    json.field("trace", o.path);
    json.field("model", t.meta.count("model") ? t.meta.at("model") : "");
    json.field("iterations_count", static_cast<uint64_t>(t.iteration_starts.size()));
    json.field("blocks", static_cast<uint64_t>(t.blocks.size()));
    json.field("ops", static_cast<uint64_t>(t.ops.size()));
    json.field("peak_live_bytes", o.live().peak_live_bytes);
    json.key("iterations");
    json.begin_array();
    for (const replay::IterationResult& it : o.live().iterations) {
      json.begin_object();
      json.field("peak_live_bytes", it.peak_live_bytes);
      json.field("persistent_bytes", it.persistent_bytes);
      json.field("transient_bytes", it.transient_bytes);
      json.end_object();
    }
    json.end_array();
    json.key("allocators");
    json.begin_array();
    for (const replay::ReplayResult& r : o.results) {
      json.begin_object();
      json.field("name", r.target);
      json.field("peak_live_bytes", r.peak_live_bytes);
      json.field("peak_mapped_bytes", r.peak_mapped_bytes);
      json.field("fragmentation", r.fragmentation());
      json.field("map_calls", r.map_calls);
      json.field("unmap_calls", r.unmap_calls);
      json.field("failed_allocations", r.failed_allocations);
      json.field("cpu_seconds", r.cpu_seconds);
      json.field("cpu_ns_per_op", r.ns_per_operation());
      json.end_object();
    }
    json.end_array();
    if (o.has_plan) {
      const PlanOutcome& p = o.plan;
      json.key("lifetime_plan");
      json.begin_object();
      json.field("observed_iteration", static_cast<uint64_t>(p.plan.observed_iteration));
      json.key("steady_iterations");
      json.begin_array();
      for (uint32_t i : p.planned_iterations) json.value(static_cast<uint64_t>(i));
      json.end_array();
      json.field("region_bytes", p.plan.arena_bytes);
      json.field("lower_bound_bytes", p.plan.lower_bound_bytes);
      json.field("planned_allocations", p.planned_allocations);
      json.field("fallbacks_changed", p.mismatched);
      json.field("fallbacks_in_use", p.busy);
      json.field("peak_live_bytes", p.steady_peak_live);
      json.field("peak_mapped_bytes", p.steady_peak_mapped);
      json.field("fragmentation", p.steady_peak_live == 0 ? 0.0
                                                          : static_cast<double>(p.steady_peak_mapped) /
                                                                static_cast<double>(p.steady_peak_live));
      json.field("online_peak_mapped_bytes", p.online_steady_peak_mapped);
      json.end_object();
    }
    json.end_object();
  }
  json.end_array();
  json.end_object();
  std::printf("%s\n", json.text().c_str());
}

}  // namespace

int run_replay(int argc, char** argv) {
  Options options;
  for (int i = 0; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (arg == "--json") {
      options.json = true;
    } else if (arg == "--summary") {
      options.summary = true;
    } else if (arg == "--plot-dir") {
      if (i + 1 == argc) return usage_error("--plot-dir needs a directory");
      options.plot_dir = argv[++i];
    } else if (arg.starts_with("--plot-dir=")) {
      options.plot_dir = arg.substr(11);
    } else if (arg.starts_with("-")) {
      return usage_error("unknown option '" + arg + "'");
    } else {
      options.traces.push_back(arg);
    }
  }
  if (options.traces.empty()) return usage_error("no trace given");

  // Load everything first: a bad file stops the run before any work.
  std::vector<trace::Trace> traces(options.traces.size());
  for (size_t i = 0; i < traces.size(); ++i) {
    std::string error;
    if (!trace::read_trace_file(options.traces[i], &traces[i], &error).is_ok()) {
      std::fprintf(stderr, "zico-umctl replay: %s\n", error.c_str());
      return 2;
    }
  }
  std::vector<TraceOutcome> outcomes(traces.size());
  for (size_t i = 0; i < traces.size(); ++i) {
    outcomes[i].path = options.traces[i];
    std::string error;
    if (!run_all(traces[i], &outcomes[i], &error).is_ok()) {
      std::fprintf(stderr, "zico-umctl replay: %s\n", error.c_str());
      return 1;
    }
    if (!options.plot_dir.empty()) {
      const std::string base = traces[i].name.substr(0, traces[i].name.find('.'));
      const std::string path = options.plot_dir + "/" + base + ".svg";
      if (!plot::write_plot_file(path, replay::memory_plot_svg(traces[i], replay::PlotOptions{}), &error)) {
        std::fprintf(stderr, "zico-umctl replay: %s\n", error.c_str());
        return 1;
      }
    }
    if (!options.json) print_text(outcomes[i], options.summary);
  }
  if (options.json) write_json(outcomes);
  // Figures without the refused blocks are no success: say which, and fail.
  int status = 0;
  for (const TraceOutcome& o : outcomes) {
    for (const replay::ReplayResult& r : o.results) {
      if (r.failed_allocations == 0) continue;
      std::fprintf(stderr, "zico-umctl replay: %s: %llu allocation%s failed under %s (out of memory)\n",
                   o.path.c_str(), static_cast<unsigned long long>(r.failed_allocations),
                   r.failed_allocations == 1 ? "" : "s", r.target.c_str());
      status = 1;
    }
  }
  return status;
}

}  // namespace zico::umctl
