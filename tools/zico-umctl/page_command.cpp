#include "page_command.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "command_args.h"
#include "exit_status.h"
#include "gpu_calibration.h"
#include "host_link.h"
#include "json_writer.h"
#include "paging_plot.h"
#include "paging_study.h"
#include "sizes.h"
#include "text_table.h"
#include "trace_reader.h"
#include "trace_stream.h"
#include "transfer_model.h"

namespace zico::umctl {
namespace {

constexpr const char* kCommand = "page";

constexpr const char* kUsage =
    "Usage: zico-umctl page [--json] [--plot FILE.svg] (--budget SIZE | --oversubscription R)\n"
    "                       [--policy um|deepum|autoswap|zico|all] [--page-size SIZE]\n"
    "                       [--host-bandwidth SIZE/s] [--calibration FILE] [--iterations N] TRACE\n"
    "Simulate one training job (TRACE, docs/trace-format.md) on a GPU whose memory is capped\n"
    "below what the job needs: pages move between host and GPU under a paging policy, on a\n"
    "virtual clock with an H100 PCIe Gen5 transfer model (prefetch/transfer_model.h).\n"
    "\n"
    "  --budget SIZE           the GPU memory the job may hold; at least the pages of its\n"
    "                          largest op (a smaller one is refused, naming the least)\n"
    "  --oversubscription R    instead: the budget is the job's peak live bytes / R, R > 1\n"
    "  --policy P              um: plain CUDA Unified Memory (fault on demand, the driver\n"
    "                            evicts the least recently migrated page, dead data written back)\n"
    "                          deepum: DeepUM's correlation prefetching, pre-eviction, invalidation\n"
    "                          autoswap: SINGA AutoSwap's swap plan (duration x size of absence)\n"
    "                          zico: zicoum's planner (next-use eviction, prefetch as early as\n"
    "                            the budget allows, discard of dead pages)\n"
    "                          all (default): every policy, side by side\n"
    "  --page-size SIZE        the paging unit, a power of two from 4KiB to 1GiB (default 2MiB,\n"
    "                          the UM block; 64KiB models finer faults)\n"
    "  --host-bandwidth SIZE/s the host link each way (default 55GB/s, PCIe Gen5, as\n"
    "                          zico-umctl simulate and ZICO_HOST_BANDWIDTH; 25GB/s for Gen4);\n"
    "                          the fault path's rate scales with it\n"
    "  --calibration FILE      the transfer model's figures from a GPU's calibration file (the\n"
    "                          GPU suite's calibration.json, docs/gpu-report.md; as\n"
    "                          ZICO_GPU_CALIBRATION); --host-bandwidth, also given, wins over\n"
    "                          its link rates\n"
    "  --iterations N          run the trace's first N iterations, N >= 2 (default: all)\n"
    "  --plot FILE.svg         resident bytes and transfers over the steady iteration, one\n"
    "                          panel per policy\n"
    "  --json                  machine-readable output on stdout, an object keyed by policy\n"
    "\n"
    "The header gives the oversubscription three ways: peak live bytes / budget; the pages\n"
    "those bytes occupy at their peak / budget (blocks share pages and leave parts of them\n"
    "empty: paging moves whole pages); every page the blocks ever use / budget (what a policy\n"
    "that leaves the pages of freed blocks on the GPU until it needs the room, as um does,\n"
    "fills).\n"
    "Per policy, of the steady (last) iteration: its time, that time / the in-memory time\n"
    "(no budget) and / the lower bound (the largest of: compute; the bytes Belady's optimal\n"
    "replacement must fetch / H2D bandwidth; the bytes that must leave before the peak of\n"
    "live memory / D2H bandwidth plus those that must come back after it / H2D bandwidth;\n"
    "the iteration cut at op starts into segments, each at least its compute and the bytes\n"
    "that must cross the link inside it, summed over the cuts that give the most),\n"
    "bytes moved each way, faults, time stalled, and the most bytes resident over the run\n"
    "(never above the budget).\n"
    "\n"
    "SIZE is %s.\n"
    "Exit status: 0, 1 if the plot could not be written, 2 for a usage error or an invalid trace.\n";

struct Options {
  bool json = false;
  std::string plot;
  std::optional<uint64_t> budget;
  std::optional<double> oversubscription;
  std::vector<std::string> policies;
  uint64_t page_bytes = uint64_t{2} << 20;
  std::optional<double> host_bytes_per_s;
  std::optional<GpuCalibration> calibration;
  uint32_t iterations = 0;
  std::string trace;
};

std::string seconds_text(uint64_t ns) {
  char text[32];
  const double s = static_cast<double>(ns) / 1e9;
  if (s < 1) {
    std::snprintf(text, sizeof text, "%.2f ms", s * 1e3);
  } else {
    std::snprintf(text, sizeof text, "%.3f s", s);
  }
  return text;
}

std::string ratio_text(uint64_t a, uint64_t b) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2fx", b == 0 ? 0.0 : static_cast<double>(a) / static_cast<double>(b));
  return text;
}

// "2", "1.5": a ratio as a user would write it.
std::string ratio_value(double r) {
  char text[32];
  std::snprintf(text, sizeof text, "%.4g", r);
  return text;
}

// The budget --oversubscription R gives.
uint64_t budget_for(uint64_t peak_live_bytes, double r) {
  return static_cast<uint64_t>(static_cast<double>(peak_live_bytes) / r);
}

// A size as an option takes it, exact: "34MiB", "6000MiB".
std::string size_argument(uint64_t bytes) {
  for (const auto& [shift, unit] : {std::pair{30, "GiB"}, std::pair{20, "MiB"}, std::pair{10, "KiB"}}) {
    if (bytes % (uint64_t{1} << shift) == 0) return std::to_string(bytes >> shift) + unit;
  }
  return std::to_string(bytes);
}

// A budget below the largest op's pages: what would hold them, in the form
// the user gave the budget.
std::string least_budget_hint(const Options& options, const prefetch::StreamFacts& facts) {
  const uint64_t least = uint64_t{facts.max_op_pages} * options.page_bytes;
  std::string readable = format_size(least);
  std::erase(readable, ' ');
  const std::string argument = size_argument(least);
  const std::string size = argument + (readable == argument ? "" : " (" + format_size(least) + ")");
  if (options.budget) return "; the least budget that holds them is --budget " + size;
  // The largest ratio, to two decimals, whose budget still holds them.
  double r = std::floor(static_cast<double>(facts.peak_live_bytes) / static_cast<double>(least) * 100) / 100;
  while (r > 1 && budget_for(facts.peak_live_bytes, r) < least) r -= 0.01;
  if (r <= 1) {
    return "; no ratio above 1 holds them: they need " + size + ", more than the peak live bytes, " +
           format_size(facts.peak_live_bytes);
  }
  return "; the largest ratio that holds them is --oversubscription " + ratio_value(r) + " (budget " +
         format_size(budget_for(facts.peak_live_bytes, r)) + ")";
}

// 0: print the help and exit 0; -1: parsed; otherwise the usage error's exit.
int parse(int argc, char** argv, Options* options) {
  std::string budget, oversubscription, policy, page_size, iterations, bandwidth, calibration;
  ArgReader args(argc, argv);
  while (args.next()) {
    if (args.flag("--help") || args.flag("-h")) return 0;
    if (args.flag("--json")) {
      options->json = true;
    } else if (args.option("--budget", &budget) || args.option("--oversubscription", &oversubscription) ||
               args.option("--policy", &policy) || args.option("--page-size", &page_size) ||
               args.option("--iterations", &iterations) || args.option("--plot", &options->plot) ||
               args.option("--host-bandwidth", &bandwidth) || args.option("--calibration", &calibration)) {
      continue;
    } else if (args.unknown_option()) {
      return usage_error(kCommand, "unknown option '" + std::string(args.current()) + "'");
    } else if (options->trace.empty()) {
      options->trace = args.current();
    } else {
      return usage_error(kCommand, "one trace at a time; '" + std::string(args.current()) + "' is a second");
    }
  }
  if (!args.error().empty()) return usage_error(kCommand, args.error());

  if (budget.empty() == oversubscription.empty()) {
    return usage_error(kCommand, "give exactly one of --budget SIZE and --oversubscription R");
  }
  if (!budget.empty()) {
    const std::optional<uint64_t> bytes = parse_size(budget);
    if (!bytes || *bytes == 0) {
      return usage_error(kCommand, size_above_zero_error("--budget", budget));
    }
    options->budget = *bytes;
  } else {
    const std::optional<double> r = parse_seconds(oversubscription);  // the same plain decimal form
    if (!r || !std::isfinite(*r) || *r <= 1) {
      return usage_error(kCommand, "--oversubscription '" + oversubscription +
                                       "' is not a ratio above 1; expected peak live bytes / budget, e.g. 1.5 or 2");
    }
    options->oversubscription = *r;
  }
  if (policy.empty() || policy == "all") {
    options->policies.assign(std::begin(prefetch::kPolicyNames), std::end(prefetch::kPolicyNames));
  } else if (std::find(std::begin(prefetch::kPolicyNames), std::end(prefetch::kPolicyNames), policy) !=
             std::end(prefetch::kPolicyNames)) {
    options->policies = {policy};
  } else {
    return usage_error(kCommand,
                       "--policy '" + policy + "' is not a policy; expected um, deepum, autoswap, zico or all");
  }
  if (!page_size.empty()) {
    const std::optional<uint64_t> bytes = parse_size(page_size);
    if (!bytes || *bytes < 4096 || *bytes > (uint64_t{1} << 30) || (*bytes & (*bytes - 1)) != 0) {
      return usage_error(kCommand, "--page-size '" + page_size + "' is not a power of two from 4KiB to 1GiB");
    }
    options->page_bytes = *bytes;
  }
  if (!bandwidth.empty()) {
    const std::optional<uint64_t> rate = parse_rate(bandwidth);
    if (!rate) return usage_error(kCommand, "--host-bandwidth '" + bandwidth + "' is not a rate; expected " + kRateForm);
    options->host_bytes_per_s = static_cast<double>(*rate);
  }
  if (!calibration.empty()) {
    GpuCalibration figures;
    std::string error;
    if (!read_gpu_calibration_file(calibration, &figures, &error).is_ok()) {
      return usage_error(kCommand, "--calibration '" + calibration + "': " + error);
    }
    options->calibration = std::move(figures);
  }
  if (!iterations.empty()) {
    const std::optional<uint64_t> n = parse_decimal(iterations);
    if (!n || *n < 2 || *n > 1000000) {
      return usage_error(kCommand, "--iterations '" + iterations + "' is not a whole number from 2 to 1000000");
    }
    options->iterations = static_cast<uint32_t>(*n);
  }
  if (options->trace.empty()) return usage_error(kCommand, "no trace given");
  if (!options->plot.empty() && !options->plot.ends_with(".svg")) {
    return usage_error(kCommand, "--plot '" + options->plot + "' must name an .svg file");
  }
  return -1;
}

void print_text(const page::PagingStudy& s) {
  const auto over = [&](uint64_t bytes) { return static_cast<double>(bytes) / static_cast<double>(s.budget_bytes); };
  std::printf("%s: peak live %s, on %s of %s pages, of %s the blocks ever use; budget %s: oversubscribed %.2fx by "
              "the live bytes, %.2fx by their pages, %.2fx by all pages; largest op %s\n",
              s.name.c_str(), format_size(s.peak_live_bytes).c_str(), format_size(s.peak_live_page_bytes).c_str(),
              format_size(s.page_bytes).c_str(), format_size(s.range_bytes).c_str(), format_size(s.budget_bytes).c_str(),
              over(s.peak_live_bytes), over(s.peak_live_page_bytes), over(s.range_bytes),
              format_size(s.largest_op_bytes).c_str());
  std::printf("  steady iteration in memory %s; lower bound %s (Belady fetches %s; around the peak %s must\n"
              "  leave before it and %s come back after it; phase by phase, %u segments take %s, copying %s in\n"
              "  and %s out)\n",
              seconds_text(s.in_memory_iteration_ns).c_str(), seconds_text(s.lower_bound_iteration_ns).c_str(),
              format_size(s.lower_bound_fetch_bytes).c_str(), format_size(s.peak.out_bytes).c_str(),
              format_size(s.peak.in_bytes).c_str(), s.segments.segments, seconds_text(s.segments.iteration_ns).c_str(),
              format_size(s.segments.in_bytes).c_str(), format_size(s.segments.out_bytes).c_str());
  using Align = TextTable::Align;
  TextTable table({{"POLICY", Align::kLeft},
                   {"ITERATION", Align::kRight},
                   {"/IN-MEMORY", Align::kRight},
                   {"/BOUND", Align::kRight},
                   {"H2D", Align::kRight},
                   {"D2H", Align::kRight},
                   {"FAULTS", Align::kRight},
                   {"STALL", Align::kRight},
                   {"PEAK RESIDENT", Align::kRight}});
  for (const page::PolicySummary& p : s.policies) {
    table.add_row({p.policy, seconds_text(p.iteration_ns), ratio_text(p.iteration_ns, s.in_memory_iteration_ns),
                   ratio_text(p.iteration_ns, s.lower_bound_iteration_ns), format_size(p.h2d_bytes),
                   format_size(p.d2h_bytes), std::to_string(p.faults), seconds_text(p.stall_ns),
                   format_size(p.peak_resident_bytes)});
  }
  std::fputs(table.render("  ").c_str(), stdout);
}

void print_json(const page::PagingStudy& s) {
  JsonWriter w;
  w.begin_object();
  for (const page::PolicySummary& p : s.policies) {
    w.key(p.policy);
    w.begin_object();
    w.field("trace", s.name);
    w.field("iteration_s", static_cast<double>(p.iteration_ns) / 1e9);
    w.field("in_memory_iteration_s", static_cast<double>(s.in_memory_iteration_ns) / 1e9);
    w.field("lower_bound_iteration_s", static_cast<double>(s.lower_bound_iteration_ns) / 1e9);
    w.field("belady_fetch_bytes", s.lower_bound_fetch_bytes);
    w.field("segment_bound_iteration_s", static_cast<double>(s.segments.iteration_ns) / 1e9);
    w.field("budget_bytes", s.budget_bytes);
    w.field("host_bytes_per_s", s.host_bytes_per_s);
    w.field("peak_live_bytes", s.peak_live_bytes);
    w.field("peak_live_page_bytes", s.peak_live_page_bytes);
    w.field("range_bytes", s.range_bytes);
    w.field("page_bytes", s.page_bytes);
    w.field("peak_resident_bytes", p.peak_resident_bytes);
    w.field("faults", p.faults);
    w.field("h2d_bytes", p.h2d_bytes);
    w.field("d2h_bytes", p.d2h_bytes);
    w.field("stall_s", static_cast<double>(p.stall_ns) / 1e9);
    w.field("refused_decisions", p.refused_decisions);
    w.end_object();
  }
  w.end_object();
  std::printf("%s\n", w.text().c_str());
}

}  // namespace

int run_page(int argc, char** argv) {
  Options options;
  const int parsed = parse(argc, argv, &options);
  if (parsed == 0) {
    std::printf(kUsage, kSizeForm);
    return kExitOk;
  }
  if (parsed != -1) return parsed;

  trace::Trace trace;
  std::string error;
  if (!trace::read_trace_file(options.trace, &trace, &error).is_ok()) {
    std::fprintf(stderr, "zico-umctl page: %s\n", error.c_str());
    return kExitUsage;
  }
  const uint32_t recorded = static_cast<uint32_t>(trace.iteration_starts.size());
  if (options.iterations > recorded) {
    std::fprintf(stderr, "zico-umctl page: --iterations %u is more than the %u iterations %s holds\n",
                 options.iterations, recorded, options.trace.c_str());
    return kExitUsage;
  }
  prefetch::AccessStream stream;
  if (!page::build_access_stream(trace, options.page_bytes, options.iterations, &stream, &error)) {
    std::fprintf(stderr, "zico-umctl page: %s\n", error.c_str());
    return kExitUsage;
  }
  const prefetch::StreamFacts facts = prefetch::stream_facts(stream);
  const uint64_t budget =
      options.budget ? *options.budget : budget_for(facts.peak_live_bytes, *options.oversubscription);
  page::PagingStudy study;
  prefetch::TransferModel model;
  if (options.calibration) model = with_calibration(model, *options.calibration);
  if (options.host_bytes_per_s) model = on_host_link(model, *options.host_bytes_per_s);
  if (!page::study_paging(stream, budget, model, options.policies, !options.plot.empty(), &study, &error)) {
    const std::string what = options.budget ? "--budget " + format_size(budget)
                                            : "--oversubscription " + ratio_value(*options.oversubscription) +
                                                  " (budget " + format_size(budget) + ")";
    const bool below_largest_op = budget / options.page_bytes < facts.max_op_pages;
    std::fprintf(stderr, "zico-umctl page: %s: %s%s\n", what.c_str(), error.c_str(),
                 below_largest_op ? least_budget_hint(options, facts).c_str() : "");
    return kExitUsage;
  }
  if (options.json) {
    print_json(study);
  } else {
    print_text(study);
  }
  if (!options.plot.empty()) {
    if (!page::write_paging_plot(study, options.plot, &error)) {
      std::fprintf(stderr, "zico-umctl page: %s\n", error.c_str());
      return kExitFailed;
    }
    if (!options.json) std::printf("  plot: %s\n", options.plot.c_str());
  }
  return kExitOk;
}

}  // namespace zico::umctl
