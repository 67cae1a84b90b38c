#include "simulate_command.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "budget_search.h"
#include "command_args.h"
#include "exhaustive_bound.h"
#include "exit_status.h"
#include "gpu_calibration.h"
#include "host_link.h"
#include "job_model.h"
#include "json_writer.h"
#include "paging_cost_curve.h"
#include "plot_file.h"
#include "simulator.h"
#include "sizes.h"
#include "text_table.h"
#include "timeline_plot.h"
#include "transfer_model.h"
#include "trace_reader.h"

namespace zico::umctl {
namespace {

using simulate::Policy;

constexpr const char* kCommand = "simulate";

constexpr const char* kUsage =
    "Usage: zico-umctl simulate [--json] (--budget SIZE | --budget-schedule T:SIZE,...)\n"
    "                           [--policy POLICY] [--iterations N] [--utilization U]\n"
    "                           [--host-bandwidth SIZE/s] [--calibration FILE] [--mode vmm|um]\n"
    "                           [--launch best|together] [--plot FILE.svg] TRACE...\n"
    "       zico-umctl simulate [--json] --find-budget R [--iterations N] [--utilization U]\n"
    "                           [--host-bandwidth SIZE/s] [--launch best|together] [--plot FILE.svg] TRACE...\n"
    "Simulate training jobs sharing one GPU: each TRACE (docs/trace-format.md) is one job,\n"
    "replayed for N iterations on a virtual clock; the jobs share compute (processor sharing)\n"
    "and a memory budget under a policy. The policies run zico-umd's own ledger and time-shift\n"
    "scheduler (tools/simulate/simulator.h describes the model).\n"
    "\n"
    "  --budget SIZE              the GPU memory the jobs share\n"
    "  --budget-schedule T:SIZE,...\n"
    "                             a budget that changes over time, e.g. 0s:40GiB,5s:24GiB,10s:40GiB\n"
    "                             (first at 0s, times increasing); instead of --budget\n"
    "  --policy POLICY            zico (default): the ledger and the time-shift gate\n"
    "                             fcfs: the ledger alone (first come, first served)\n"
    "                             static: each job reserves its peak (later jobs that fit go ahead\n"
    "                             of one that does not)\n"
    "                             sequential: one job at a time\n"
    "                             unlimited: no budget (needs no --budget)\n"
    "                             all: every policy, side by side, with throughput ratios\n"
    "                             (\"failed\" where a policy failed a job: it did less work)\n"
    "  --iterations N             iterations per job, 1 to 100000 (default 20)\n"
    "  --utilization U            the busy fraction of every job, in (0, 1]; default: each\n"
    "                             trace's (1 for serialised-op traces: two jobs at 1 share the\n"
    "                             GPU at half speed each, at 0.5 neither slows down)\n"
    "  --host-bandwidth SIZE/s    swap speed after a yield, and paging's link in um mode\n"
    "                             (default 55GB/s, PCIe Gen5, as zico-umctl page and\n"
    "                             ZICO_HOST_BANDWIDTH; 25GB/s for Gen4)\n"
    "  --calibration FILE         a GPU's calibration file (the GPU suite's calibration.json,\n"
    "                             docs/gpu-report.md; as ZICO_GPU_CALIBRATION): paging's transfer\n"
    "                             model in um mode takes its figures, and the swaps its slower link\n"
    "                             rate; --host-bandwidth, also given, wins over its link rates\n"
    "  --mode vmm|um              vmm (default): jobs hold what they allocate (ZICO_MODE=vmm)\n"
    "                             um: jobs in Unified Memory (ZICO_MODE=um); under zico and fcfs\n"
    "                             a job may run with part of its memory paged out, slower by\n"
    "                             what its trace costs the paging planner at that cap\n"
    "                             (zico-umctl page); the traces need access records\n"
    "  --launch best|together     when the jobs start, under every policy but sequential:\n"
    "                             best (default; with --find-budget, together): the plan (launch\n"
    "                             order and a cap on jobs at once) that fails fewest jobs, keeps the\n"
    "                             budget and has the most throughput, the same search for each\n"
    "                             policy (at u = 0.5 a third job slows two that ran at full speed,\n"
    "                             so holding it back can finish sooner; its wait counts as delay);\n"
    "                             together: every job at once, in the order given (static: each\n"
    "                             as it fits; zico: the time-shift scheduler alone, as zico-umd\n"
    "                             runs what is started). With --policy all and best, zico\n"
    "                             launched together is reported too\n"
    "  --find-budget R            instead of a budget and policy: the least budget found at which\n"
    "                             zico keeps the jobs at R x their unlimited throughput, R in\n"
    "                             (0, 1], between the largest job's own peak and unlimited's: 16\n"
    "                             steps upwards, then bisection to 0.5 %% of unlimited's peak (the\n"
    "                             throughput is not monotone in the budget, so a lower one may\n"
    "                             also meet R); every budget tried is listed, with the exhaustive\n"
    "                             bound for 2-3 jobs\n"
    "  --plot FILE.svg            memory held per job over time; with --policy all, one file per\n"
    "                             policy, FILE-POLICY.svg; with --find-budget, zico's run there\n"
    "  --json                     machine-readable output on stdout: the policy's result, or\n"
    "                             with --policy all an object keyed by policy\n"
    "\n"
    "Per job: iterations done, mean iteration time (its end over its iterations), the solo\n"
    "steady iteration, delay (time stalled for memory: gates, grants, swaps, queueing) and the\n"
    "most it held. Aggregate: makespan, iterations per second, peak held, and whether the\n"
    "budget was ever exceeded (above it only while held follows a shrink does not count; that\n"
    "lag is reported). With 2 or 3 jobs, zico is compared with the exhaustive fixed-offset\n"
    "bound: the lowest peak of the steady iterations shifted against each other. On a budget\n"
    "below it, also the shortest cycle (the jobs idling between iterations) at which fixed\n"
    "offsets fit, or by how much a job's peak and the others' least exceed the budget.\n"
    "\n"
    "SIZE is %s.\nT is %s.\n"
    "Exit status: 0; 1 if a job failed (under zico with --policy all; the output is complete)\n"
    "or a plot could not be written; 2 for a usage error or an invalid trace.\n";

constexpr uint32_t kMaxIterations = 100000;
// --find-budget stops bisecting at this fraction of unlimited's peak.
constexpr double kFindBudgetResolution = 0.005;

struct Options {
  bool json = false;
  std::vector<Policy> policies;
  bool all = false;
  std::vector<simulate::BudgetStep> budget;
  simulate::SimulationOptions sim;
  std::string plot;
  std::vector<std::string> traces;
  std::optional<double> find_budget;  // the throughput target of --find-budget
  bool um = false;                    // --mode um
  std::optional<GpuCalibration> calibration;
  bool host_bandwidth_given = false;  // --host-bandwidth, which wins over the calibration's link
};


struct Outcome {
  simulate::SimulationResult result;
  std::optional<simulate::ExhaustiveBound> bound;  // zico with 2-3 jobs
  // zico with 2-3 jobs and a fixed budget below the bound's peak.
  std::optional<simulate::StretchedCycle> stretched;
  // zico with --policy all and the best plan: every job launched at once.
  std::optional<simulate::SimulationResult> together;
};

std::string duration(double seconds) {
  char text[32];
  if (seconds < 1) {
    std::snprintf(text, sizeof text, "%.1f ms", seconds * 1e3);
  } else {
    std::snprintf(text, sizeof text, "%.3f s", seconds);
  }
  return text;
}

std::string number(double value, const char* format) {
  char text[32];
  std::snprintf(text, sizeof text, format, value);
  return text;
}

std::string budget_text(const std::vector<simulate::BudgetStep>& budget) {
  if (budget.empty()) return "no budget";
  if (budget.size() == 1) return "budget " + format_size(budget.front().bytes);
  std::string text = "budget";
  for (size_t i = 0; i < budget.size(); ++i) {
    text += (i == 0 ? " " : ", then ") + format_size(budget[i].bytes) + " at " +
            number(static_cast<double>(budget[i].at_ns) / 1e9, "%g") + " s";
  }
  return text;
}

// --- arguments -------------------------------------------------------------

// "0s:40GiB,5s:24GiB": *error names the part that is wrong.
bool parse_schedule(const std::string& text, uint64_t chunk, std::vector<simulate::BudgetStep>* out,
                    std::string* error) {
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t comma = text.find(',', begin);
    const std::string entry = text.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin);
    begin = comma == std::string::npos ? text.size() + 1 : comma + 1;
    const size_t colon = entry.find(':');
    if (colon == std::string::npos) {
      *error = "--budget-schedule entry '" + entry + "' is not TIME:SIZE; expected e.g. 0s:40GiB,5s:24GiB";
      return false;
    }
    const std::string time_text = entry.substr(0, colon);
    const std::string size_text = entry.substr(colon + 1);
    const std::optional<uint64_t> at = parse_duration_ns(time_text);
    if (!at) {
      *error = "--budget-schedule time '" + time_text + "' is not a duration; expected " + kDurationForm;
      return false;
    }
    const std::optional<uint64_t> bytes = parse_size(size_text);
    if (!bytes) {
      *error = size_error("--budget-schedule size", size_text);
      return false;
    }
    if (*bytes < chunk) {
      *error = "--budget-schedule size '" + size_text + "' is below one chunk (" + format_size(chunk) + ")";
      return false;
    }
    if (out->empty() && *at != 0) {
      *error = "--budget-schedule must start at 0s, not at '" + time_text + "'";
      return false;
    }
    if (!out->empty() && *at <= out->back().at_ns) {
      *error = "--budget-schedule times must increase: '" + time_text + "' comes after " +
               number(static_cast<double>(out->back().at_ns) / 1e9, "%g") + " s";
      return false;
    }
    out->push_back({*at, *bytes});
  }
  return true;
}

// 0: print the help and exit 0; -1: parsed; otherwise the usage error's exit.
int parse(int argc, char** argv, Options* options) {
  std::string budget, schedule, policy, iterations, utilization, bandwidth, find_budget, mode, launch, calibration;
  ArgReader args(argc, argv);
  while (args.next()) {
    if (args.flag("--help") || args.flag("-h")) return 0;
    if (args.flag("--json")) {
      options->json = true;
    } else if (args.option("--budget", &budget) || args.option("--budget-schedule", &schedule) ||
               args.option("--policy", &policy) || args.option("--iterations", &iterations) ||
               args.option("--utilization", &utilization) || args.option("--host-bandwidth", &bandwidth) ||
               args.option("--plot", &options->plot) || args.option("--find-budget", &find_budget) ||
               args.option("--mode", &mode) || args.option("--launch", &launch) ||
               args.option("--calibration", &calibration)) {
      continue;
    } else if (args.unknown_option()) {
      return usage_error(kCommand, "unknown option '" + std::string(args.current()) + "'");
    } else {
      options->traces.emplace_back(args.current());
    }
  }
  if (!args.error().empty()) return usage_error(kCommand, args.error());

  simulate::SimulationOptions& sim = options->sim;
  if (!mode.empty() && mode != "vmm" && mode != "um") {
    return usage_error(kCommand, "--mode '" + mode + "' is not a mode; expected vmm or um");
  }
  options->um = mode == "um";
  if (!launch.empty() && launch != "best" && launch != "together") {
    return usage_error(kCommand, "--launch '" + launch + "' is not a launch; expected best or together");
  }
  // zico-umd does not plan launches: the budget it needs is for the jobs
  // as they are started.
  sim.launch_together = launch == "together" || (!find_budget.empty() && launch.empty());
  if (!find_budget.empty()) {
    const std::optional<double> r = parse_seconds(find_budget);  // the same plain decimal form
    if (!r || *r <= 0 || *r > 1) {
      return usage_error(kCommand, "--find-budget '" + find_budget +
                                       "' is not in (0, 1]; expected a share of unlimited's throughput such as 0.95");
    }
    if (!budget.empty() || !schedule.empty()) {
      return usage_error(kCommand,
                         "--find-budget searches for the budget; give it without --budget or --budget-schedule");
    }
    if (!policy.empty()) {
      return usage_error(kCommand, "--find-budget runs zico against unlimited; give it without --policy");
    }
    if (mode == "um") {
      return usage_error(kCommand, "--find-budget searches from the largest job's own peak up, for ordinary "
                                   "jobs; give it without --mode um");
    }
    options->find_budget = *r;
  }
  if (policy.empty() || policy == "all") {
    options->all = policy == "all";
    options->policies = options->all ? std::vector<Policy>{Policy::kUnlimited, Policy::kSequential, Policy::kStatic,
                                                           Policy::kFcfs, Policy::kZico}
                                     : std::vector<Policy>{Policy::kZico};
  } else if (const std::optional<Policy> p = simulate::parse_policy(policy)) {
    options->policies = {*p};
  } else {
    return usage_error(kCommand, "--policy '" + policy + "' is not a policy; expected zico, fcfs, static, "
                                 "sequential, unlimited or all");
  }
  if (!iterations.empty()) {
    const std::optional<uint64_t> n = parse_decimal(iterations);
    if (!n || *n < 1 || *n > kMaxIterations) {
      return usage_error(kCommand, "--iterations '" + iterations + "' is not a whole number from 1 to " +
                                       std::to_string(kMaxIterations));
    }
    sim.iterations = static_cast<uint32_t>(*n);
  }
  if (!utilization.empty()) {
    const std::optional<double> u = parse_seconds(utilization);  // the same plain decimal form
    if (!u || *u <= 0 || *u > 1) {
      return usage_error(kCommand, "--utilization '" + utilization +
                                       "' is not in (0, 1]; expected a decimal number such as 0.5 or 1");
    }
    sim.utilization = *u;
  }
  if (!bandwidth.empty()) {
    const std::optional<uint64_t> rate = parse_rate(bandwidth);
    if (!rate) return usage_error(kCommand, "--host-bandwidth '" + bandwidth + "' is not a rate; expected " + kRateForm);
    sim.host_bytes_per_second = static_cast<double>(*rate);
    options->host_bandwidth_given = true;
  }
  if (!calibration.empty()) {
    GpuCalibration figures;
    std::string error;
    if (!read_gpu_calibration_file(calibration, &figures, &error).is_ok()) {
      return usage_error(kCommand, "--calibration '" + calibration + "': " + error);
    }
    if (!options->host_bandwidth_given) {
      const prefetch::TransferModel link = with_calibration(prefetch::TransferModel{}, figures);
      sim.host_bytes_per_second = std::min(link.h2d_bytes_per_s, link.d2h_bytes_per_s);
    }
    options->calibration = std::move(figures);
  }
  if (!budget.empty() && !schedule.empty()) {
    return usage_error(kCommand, "give --budget or --budget-schedule, not both");
  }
  if (!budget.empty()) {
    const std::optional<uint64_t> bytes = parse_size(budget);
    if (!bytes || *bytes == 0) return usage_error(kCommand, size_above_zero_error("--budget", budget));
    if (*bytes < sim.chunk_bytes) {
      return usage_error(kCommand, "--budget '" + budget + "' is below one chunk (" + format_size(sim.chunk_bytes) + ")");
    }
    options->budget = {{0, *bytes}};
  } else if (!schedule.empty()) {
    std::string error;
    if (!parse_schedule(schedule, sim.chunk_bytes, &options->budget, &error)) return usage_error(kCommand, error);
  } else if (!options->find_budget && (options->all || options->policies.front() != Policy::kUnlimited)) {
    return usage_error(kCommand, std::string("policy ") +
                                     (options->all ? "all" : simulate::to_string(options->policies.front())) +
                                     " needs --budget SIZE or --budget-schedule T:SIZE,...");
  }
  if (options->traces.empty()) return usage_error(kCommand, "no trace given");
  if (!options->plot.empty() && options->plot.size() > 4 && !options->plot.ends_with(".svg")) {
    return usage_error(kCommand, "--plot '" + options->plot + "' must name an .svg file");
  }
  return -1;
}

// --- output ----------------------------------------------------------------

// "launched in the order a, b, c; at most 2 at once" (or "; no cap on jobs
// at once": all start together, static's as their reservations fit)
std::string launch_plan_text(const simulate::SimulationResult& r) {
  std::string text = "launched in the order ";
  for (size_t i = 0; i < r.launch_plan.order.size(); ++i) {
    text += (i == 0 ? "" : ", ") + r.jobs[r.launch_plan.order[i]].name;
  }
  text += r.launch_plan.max_running != 0 ? "; at most " + std::to_string(r.launch_plan.max_running) + " at once"
                                         : "; no cap on jobs at once";
  return text;
}

void print_result(const Outcome& o, const std::vector<std::string>& traces) {
  const simulate::SimulationResult& r = o.result;
  std::printf("%s: %zu job%s x %u iterations, %s\n", simulate::to_string(r.policy), r.jobs.size(),
              r.jobs.size() == 1 ? "" : "s", r.iterations, budget_text(r.budget).c_str());
  using Align = TextTable::Align;
  TextTable table({{"JOB", Align::kLeft},
                   {"ITERATIONS", Align::kRight},
                   {"MEAN ITER", Align::kRight},
                   {"SOLO ITER", Align::kRight},
                   {"SLOWDOWN", Align::kRight},
                   {"DELAY", Align::kRight},
                   {"PEAK", Align::kRight},
                   {"YIELDS", Align::kRight}});
  for (const simulate::JobResult& j : r.jobs) {
    table.add_row({j.name, std::to_string(j.iterations) + (j.failed ? " (failed)" : ""),
                   j.iterations > 0 ? duration(j.mean_iter_s) : "-", duration(j.solo_iter_s),
                   j.iterations > 0 && j.solo_iter_s > 0 ? number(j.mean_iter_s / j.solo_iter_s, "%.2fx") : "-",
                   duration(j.delay_s), format_size(j.peak_bytes), std::to_string(j.yields)});
  }
  std::fputs(table.render("  ").c_str(), stdout);
  for (const simulate::JobResult& j : r.jobs) {
    if (!j.um) continue;
    std::printf("  %s (um): %llu of %u iterations ran with part of its memory paged out, which added %s; "
                "paged out at %llu gate%s\n",
                j.name.c_str(), static_cast<unsigned long long>(j.capped_iterations), j.iterations,
                duration(j.paging_s).c_str(), static_cast<unsigned long long>(j.gate_page_outs),
                j.gate_page_outs == 1 ? "" : "s");
  }
  for (size_t i = 0; i < r.jobs.size(); ++i) {
    if (r.jobs[i].failed) std::printf("  %s (%s) failed: %s\n", r.jobs[i].name.c_str(), traces[i].c_str(), r.jobs[i].failure.c_str());
  }
  std::printf("  makespan %s, %.2f iterations/s, peak held %s", duration(r.makespan_s).c_str(), r.aggregate_iters_per_s,
              format_size(r.peak_bytes).c_str());
  // A run whose every job failed kept the budget by doing nothing: that is
  // not a budget kept.
  const bool all_failed = !r.jobs.empty() && r.failed_jobs == r.jobs.size();
  if (all_failed) {
    std::printf(r.jobs.size() == 1 ? "; the job failed" : "; all %zu jobs failed", r.jobs.size());
  } else if (r.failed_jobs != 0) {
    std::printf("; %llu of %zu jobs failed", static_cast<unsigned long long>(r.failed_jobs), r.jobs.size());
  }
  if (!r.budget.empty() && (!all_failed || r.budget_exceeded)) {
    std::printf("; budget %s", r.budget_exceeded ? "EXCEEDED" : "kept");
    if (r.over_budget_s > 0) {
      std::printf(" (above it after shrinks for %s, longest %s)", duration(r.over_budget_s).c_str(),
                  duration(r.longest_over_budget_s).c_str());
    }
  }
  if (r.policy == Policy::kFcfs || r.policy == Policy::kZico) {
    std::printf("; %llu yield%s", static_cast<unsigned long long>(r.yields), r.yields == 1 ? "" : "s");
  }
  std::printf("\n");
  if (r.policy != Policy::kSequential) std::printf("  plan: %s\n", launch_plan_text(r).c_str());
  if (o.bound) {
    const simulate::ExhaustiveBound& b = *o.bound;
    std::string offsets;
    for (const uint64_t ns : b.offsets_ns) {
      offsets += (offsets.empty() ? "" : ", ") + duration(static_cast<double>(ns) / 1e9);
    }
    std::printf("  exhaustive fixed-offset bound (every job side by side, cycle %s): peak %s at offsets %s; "
                "iterations aligned %s, sum of peaks %s\n",
                duration(static_cast<double>(b.cycle_ns) / 1e9).c_str(), format_size(b.peak_bytes).c_str(),
                offsets.c_str(), format_size(b.aligned_peak_bytes).c_str(), format_size(b.sum_of_peaks_bytes).c_str());
  }
  if (o.stretched && o.stretched->found) {
    const simulate::StretchedCycle& s = *o.stretched;
    const double cycle_s = static_cast<double>(s.cycle_ns) / 1e9;
    std::printf("  below the bound: fixed offsets fit the budget from a cycle of %s (%.3fx the longest period), "
                "peak %s, %.2f iterations/s\n",
                duration(cycle_s).c_str(), static_cast<double>(s.cycle_ns) / static_cast<double>(o.bound->cycle_ns),
                format_size(s.peak_bytes).c_str(), static_cast<double>(s.offsets_ns.size()) / cycle_s);
  } else if (o.stretched) {
    if (o.stretched->shortfall_bytes > 0) {
      std::printf("  below the bound: a job's peak and the others' least exceed the budget by %s: no schedule runs "
                  "them side by side without moving that much off the GPU at each of its peaks, or taking turns\n",
                  format_size(o.stretched->shortfall_bytes).c_str());
    } else {
      std::printf("  below the bound: no cycle up to the summed periods lets fixed offsets fit the budget\n");
    }
  }
}

double throughput_ratio(const simulate::SimulationResult& a, const simulate::SimulationResult& b) {
  return b.aggregate_iters_per_s > 0 ? a.aggregate_iters_per_s / b.aggregate_iters_per_s : 0;
}

// "1.23x sequential, 1.10x static, fcfs failed a job": r against each
// simpler policy. A policy that failed a job finished less work sooner: a
// ratio to it would flatter r.
std::string versus_simpler(const simulate::SimulationResult& r, const std::map<Policy, Outcome>& outcomes) {
  std::string text;
  for (const Policy p : {Policy::kSequential, Policy::kStatic, Policy::kFcfs}) {
    const simulate::SimulationResult& other = outcomes.at(p).result;
    if (!text.empty()) text += ", ";
    text += other.failed_jobs != 0 ? std::string(simulate::to_string(p)) + " failed a job"
                                   : number(throughput_ratio(r, other), "%.3fx ") + simulate::to_string(p);
  }
  return text;
}

void print_comparison(const std::map<Policy, Outcome>& outcomes) {
  const simulate::SimulationResult& unlimited = outcomes.at(Policy::kUnlimited).result;
  using Align = TextTable::Align;
  TextTable table({{"POLICY", Align::kLeft},
                   {"MAKESPAN", Align::kRight},
                   {"ITER/S", Align::kRight},
                   {"VS UNLIMITED", Align::kRight},
                   {"PEAK", Align::kRight},
                   {"BUDGET", Align::kLeft},
                   {"YIELDS", Align::kRight},
                   {"FAILED", Align::kRight}});
  for (const Policy p : {Policy::kUnlimited, Policy::kSequential, Policy::kStatic, Policy::kFcfs, Policy::kZico}) {
    const simulate::SimulationResult& r = outcomes.at(p).result;
    // A policy that failed a job finished less work sooner: its ratio would flatter it.
    table.add_row({simulate::to_string(p), duration(r.makespan_s), number(r.aggregate_iters_per_s, "%.2f"),
                   r.failed_jobs != 0 ? "failed" : number(throughput_ratio(r, unlimited), "%.3f"),
                   format_size(r.peak_bytes),
                   r.budget.empty() ? "-" : r.budget_exceeded ? "EXCEEDED" : "kept", std::to_string(r.yields),
                   std::to_string(r.failed_jobs)});
  }
  std::printf("comparison\n%s", table.render("  ").c_str());
  const simulate::SimulationResult& zico = outcomes.at(Policy::kZico).result;
  std::printf("  zico's throughput: %s%s\n", versus_simpler(zico, outcomes).c_str(),
              zico.failed_jobs != 0 ? " (zico failed a job too)" : "");
  // What the plan adds to the time-shift scheduler's own figure.
  if (const std::optional<simulate::SimulationResult>& together = outcomes.at(Policy::kZico).together) {
    std::string alone = "  zico launched all together (the time-shift scheduler alone): " +
                        number(together->aggregate_iters_per_s, "%.2f iterations/s, ");
    alone += together->failed_jobs != 0 ? "it failed a job"
                                        : number(throughput_ratio(*together, unlimited), "%.3fx unlimited, ") +
                                              versus_simpler(*together, outcomes);
    if (together->budget_exceeded) alone += " (it EXCEEDED the budget)";
    std::printf("%s\n", alone.c_str());
  }
}

void write_result_json(JsonWriter& json, const Outcome& o, const std::vector<std::string>& traces,
                       const std::map<Policy, Outcome>* all, const std::vector<sharing::PagingCost>* paging = nullptr) {
  const simulate::SimulationResult& r = o.result;
  json.begin_object();
  json.field("policy", simulate::to_string(r.policy));
  json.field_or_null("budget_bytes", !r.budget.empty(), r.budget.empty() ? 0 : r.budget.front().bytes);
  json.key("budget_schedule");
  json.begin_array();
  for (const simulate::BudgetStep& step : r.budget) {
    json.begin_object();
    json.field("at_s", static_cast<double>(step.at_ns) / 1e9);
    json.field("bytes", step.bytes);
    json.end_object();
  }
  json.end_array();
  json.field("chunk_bytes", r.chunk_bytes);
  json.field("iterations", static_cast<uint64_t>(r.iterations));
  json.field("makespan_s", r.makespan_s);
  json.field("aggregate_iters_per_s", r.aggregate_iters_per_s);
  json.field("peak_bytes", r.peak_bytes);
  json.key("budget_exceeded");
  json.boolean(r.budget_exceeded);
  json.field("over_budget_s", r.over_budget_s);
  json.field("longest_over_budget_s", r.longest_over_budget_s);
  json.field("yields", r.yields);
  json.field("deadlocks", r.deadlocks);
  json.field("failed_jobs", r.failed_jobs);
  if (all != nullptr) {
    json.field("vs_unlimited", throughput_ratio(r, all->at(Policy::kUnlimited).result));
    if (r.policy == Policy::kZico) {
      json.field("vs_sequential", throughput_ratio(r, all->at(Policy::kSequential).result));
      json.field("vs_static", throughput_ratio(r, all->at(Policy::kStatic).result));
      json.field("vs_fcfs", throughput_ratio(r, all->at(Policy::kFcfs).result));
    }
  }
  if (r.policy != Policy::kSequential) {
    json.key("launch_plan");
    json.begin_object();
    json.key("order");
    json.begin_array();
    for (const uint32_t index : r.launch_plan.order) json.value(std::string_view(r.jobs[index].name));
    json.end_array();
    json.field_or_null("max_running", r.launch_plan.max_running != 0, uint64_t{r.launch_plan.max_running});
    json.end_object();
  }
  if (o.together) {
    json.key("launched_together");
    json.begin_object();
    json.field("makespan_s", o.together->makespan_s);
    json.field("aggregate_iters_per_s", o.together->aggregate_iters_per_s);
    json.field("peak_bytes", o.together->peak_bytes);
    json.key("budget_exceeded");
    json.boolean(o.together->budget_exceeded);
    json.field("yields", o.together->yields);
    json.field("failed_jobs", o.together->failed_jobs);
    if (all != nullptr) {
      for (const Policy p : {Policy::kUnlimited, Policy::kSequential, Policy::kStatic, Policy::kFcfs}) {
        json.field("vs_" + std::string(simulate::to_string(p)), throughput_ratio(*o.together, all->at(p).result));
      }
    }
    json.end_object();
  }
  json.key("jobs");
  json.begin_array();
  for (size_t i = 0; i < r.jobs.size(); ++i) {
    const simulate::JobResult& j = r.jobs[i];
    json.begin_object();
    json.field("name", j.name);
    json.field("trace", traces[i]);
    json.field("utilization", j.utilization);
    json.field("iterations", static_cast<uint64_t>(j.iterations));
    json.key("failed");
    json.boolean(j.failed);
    json.field_or_null("failure", j.failed, std::string_view(j.failure));
    json.field("start_s", j.start_s);
    json.field("end_s", j.end_s);
    json.field("mean_iter_s", j.mean_iter_s);
    json.field("solo_iter_s", j.solo_iter_s);
    json.field("delay_s", j.delay_s);
    json.field("queue_s", j.queue_s);
    json.field("gate_s", j.gate_s);
    json.field("wait_s", j.wait_s);
    json.field("swap_s", j.swap_s);
    json.field("gate_delays", j.gate_delays);
    json.field("longest_learned_iter_s", j.longest_learned_iter_s);
    json.field("peak_bytes", j.peak_bytes);
    json.field("yields", j.yields);
    json.key("um");
    json.boolean(j.um);
    json.field("capped_iterations", j.capped_iterations);
    json.field("paging_s", j.paging_s);
    json.field("gate_page_outs", j.gate_page_outs);
    if (paging != nullptr && i < paging->size() && (*paging)[i].known()) {
      // What its paging costs, as the run used it: {"floor_bytes", "points": [[cap_bytes, stretch]...]}.
      const sharing::PagingCost& cost = (*paging)[i];
      json.key("paging_cost");
      json.begin_object();
      json.field("floor_bytes", cost.floor_bytes);
      json.key("points");
      json.begin_array();
      for (const sharing::PagingCost::Point& point : cost.points) {
        json.begin_array();
        json.value(point.cap_bytes);
        json.value(point.stretch, 4);
        json.end_array();
      }
      json.end_array();
      json.end_object();
    }
    json.end_object();
  }
  json.end_array();
  if (o.bound) {
    const simulate::ExhaustiveBound& b = *o.bound;
    json.key("exhaustive");
    json.begin_object();
    json.field("cycle_s", static_cast<double>(b.cycle_ns) / 1e9);
    json.field("peak_bytes", b.peak_bytes);
    json.key("offsets_s");
    json.begin_array();
    for (const uint64_t ns : b.offsets_ns) json.value(static_cast<double>(ns) / 1e9);
    json.end_array();
    json.field("aligned_peak_bytes", b.aligned_peak_bytes);
    json.field("sum_of_peaks_bytes", b.sum_of_peaks_bytes);
    if (o.stretched) {
      const simulate::StretchedCycle& st = *o.stretched;
      json.key("stretched");
      json.begin_object();
      json.key("found");
      json.boolean(st.found);
      if (st.found) {
        const double cycle_s = static_cast<double>(st.cycle_ns) / 1e9;
        json.field("cycle_s", cycle_s);
        json.field("stretch", static_cast<double>(st.cycle_ns) / static_cast<double>(b.cycle_ns));
        json.field("peak_bytes", st.peak_bytes);
        json.key("offsets_s");
        json.begin_array();
        for (const uint64_t ns : st.offsets_ns) json.value(static_cast<double>(ns) / 1e9);
        json.end_array();
        json.field("iters_per_s", static_cast<double>(st.offsets_ns.size()) / cycle_s);
      } else {
        json.field("shortfall_bytes", st.shortfall_bytes);
      }
      json.end_object();
    }
    json.end_object();
  }
  json.end_object();
}

std::string plot_path(const Options& options, Policy policy) {
  if (!options.all) return options.plot;
  const std::string& path = options.plot;
  const size_t dot = path.size() >= 4 && path.ends_with(".svg") ? path.size() - 4 : path.size();
  return path.substr(0, dot) + "-" + simulate::to_string(policy) + path.substr(dot);
}

bool write_plot(const std::string& path, const simulate::SimulationResult& r) {
  std::vector<simulate::TimelineSeries> series;
  for (const simulate::JobResult& j : r.jobs) series.push_back({j.name, j.held});
  simulate::TimeSteps budget;
  for (const simulate::BudgetStep& step : r.budget) budget.emplace_back(step.at_ns, step.bytes);
  simulate::TimelinePlotOptions plot;
  plot.title = std::string("simulate: ") + simulate::to_string(r.policy) + ", " + budget_text(r.budget);
  std::string error;
  if (!plot::write_plot_file(path, simulate::timeline_plot_svg(series, budget, plot), &error)) {
    std::fprintf(stderr, "zico-umctl simulate: %s\n", error.c_str());
    return false;
  }
  return true;
}

std::vector<simulate::PeriodicCurve> steady_curves(const std::vector<simulate::JobModel>& models, uint64_t chunk) {
  std::vector<simulate::PeriodicCurve> curves;
  for (const simulate::JobModel& m : models) curves.push_back(simulate::steady_need_curve(m, chunk));
  return curves;
}

// The exhaustive fixed-offset bound of 2-3 jobs' steady iterations; none
// for other counts (or curves it refuses).
std::optional<simulate::ExhaustiveBound> bound_of(const std::vector<simulate::JobModel>& models, uint64_t chunk) {
  if (models.size() < 2 || models.size() > simulate::kMaxBoundJobs) return std::nullopt;
  simulate::ExhaustiveBound bound;
  std::string error;
  if (!simulate::exhaustive_bound(steady_curves(models, chunk), &bound, &error).is_ok()) return std::nullopt;
  return bound;
}

// Below the bound's peak, on a budget that does not change: the shortest
// cycle at which fixed offsets fit it (exhaustive_bound.h).
std::optional<simulate::StretchedCycle> stretched_of(const std::vector<simulate::JobModel>& models,
                                                     const simulate::ExhaustiveBound& bound,
                                                     const std::vector<simulate::BudgetStep>& budget,
                                                     uint64_t chunk) {
  if (budget.size() != 1) return std::nullopt;
  const uint64_t budget_bytes = budget.front().bytes / chunk * chunk;  // the ledger counts whole chunks
  if (budget_bytes >= bound.peak_bytes) return std::nullopt;
  simulate::StretchedCycle stretched;
  std::string error;
  if (!simulate::least_fitting_cycle(steady_curves(models, chunk), budget_bytes, &stretched, &error).is_ok()) {
    return std::nullopt;
  }
  return stretched;
}

void print_budget_search(const simulate::BudgetSearch& search, const std::optional<simulate::ExhaustiveBound>& bound) {
  const simulate::SimulationResult& unlimited = search.unlimited;
  if (search.found) {
    std::printf("least budget found for zico at >= %.3gx unlimited: %s (%zu job%s x %u iterations)\n", search.target,
                format_size(search.budget_bytes).c_str(), unlimited.jobs.size(), unlimited.jobs.size() == 1 ? "" : "s",
                unlimited.iterations);
    // The nearest budget below that was tried and fell short, if any.
    uint64_t short_below = 0;
    for (const simulate::BudgetTrial& trial : search.trials) {
      if (!trial.met && trial.budget_bytes < search.budget_bytes) short_below = std::max(short_below, trial.budget_bytes);
    }
    if (search.budget_bytes <= search.largest_job_peak_bytes) {
      std::printf("  (the least any budget can be: the largest job's own peak)\n");
    } else if (short_below != 0) {
      std::printf("  (%s did not meet it; throughput is not monotone in the budget, so a budget below that\n"
                  "  might: every budget tried is listed below)\n",
                  format_size(short_below).c_str());
    }
    const simulate::SimulationResult& z = search.zico;
    std::printf("  zico there: %.3fx unlimited (%.2f vs %.2f iterations/s), peak held %s, budget kept, %llu yield%s\n",
                throughput_ratio(z, unlimited), z.aggregate_iters_per_s, unlimited.aggregate_iters_per_s,
                format_size(z.peak_bytes).c_str(), static_cast<unsigned long long>(z.yields), z.yields == 1 ? "" : "s");
    if (z.launch_plan.max_running != 0) std::printf("  plan: %s\n", launch_plan_text(z).c_str());
  } else {
    const simulate::BudgetTrial& top = search.trials.front();
    std::printf("no budget up to unlimited's peak (%s) keeps zico at >= %.3gx unlimited: there it reached %.3fx%s\n",
                format_size(top.budget_bytes).c_str(), search.target, top.vs_unlimited,
                top.failed_jobs > 0 ? ", with a job failed" : "");
  }
  std::printf("  for scale: unlimited's peak %s, the largest job alone %s", format_size(unlimited.peak_bytes).c_str(),
              format_size(search.largest_job_peak_bytes).c_str());
  if (bound) {
    std::printf(", exhaustive fixed-offset bound %s", format_size(bound->peak_bytes).c_str());
    if (search.found) {
      std::printf(" (the budget found is %.3fx it)",
                  static_cast<double>(search.budget_bytes) / static_cast<double>(bound->peak_bytes));
    }
  }
  std::printf("\n  budgets tried, in order (stops at %s apart):\n", format_size(search.resolution_bytes).c_str());
  using Align = TextTable::Align;
  TextTable table({{"BUDGET", Align::kRight},
                   {"VS UNLIMITED", Align::kRight},
                   {"MET", Align::kLeft},
                   {"PEAK", Align::kRight},
                   {"YIELDS", Align::kRight},
                   {"FAILED", Align::kRight}});
  for (const simulate::BudgetTrial& t : search.trials) {
    table.add_row({format_size(t.budget_bytes), t.failed_jobs != 0 ? "failed" : number(t.vs_unlimited, "%.3f"),
                   t.met ? "yes" : t.budget_exceeded ? "no (budget exceeded)" : "no",
                   format_size(t.peak_bytes), std::to_string(t.yields), std::to_string(t.failed_jobs)});
  }
  std::fputs(table.render("    ").c_str(), stdout);
}

void write_budget_search_json(const simulate::BudgetSearch& search,
                              const std::optional<simulate::ExhaustiveBound>& bound,
                              const std::vector<std::string>& traces) {
  JsonWriter json;
  json.begin_object();
  json.field("target_vs_unlimited", search.target);
  json.key("found");
  json.boolean(search.found);
  json.field_or_null("budget_bytes", search.found, search.budget_bytes);
  json.field("resolution_bytes", search.resolution_bytes);
  json.field("largest_job_peak_bytes", search.largest_job_peak_bytes);
  json.key("trials");
  json.begin_array();
  for (const simulate::BudgetTrial& t : search.trials) {
    json.begin_object();
    json.field("budget_bytes", t.budget_bytes);
    json.field("vs_unlimited", t.vs_unlimited);
    json.key("met");
    json.boolean(t.met);
    json.field("peak_bytes", t.peak_bytes);
    json.field("yields", t.yields);
    json.field("failed_jobs", t.failed_jobs);
    json.key("budget_exceeded");
    json.boolean(t.budget_exceeded);
    json.end_object();
  }
  json.end_array();
  json.key("unlimited");
  write_result_json(json, Outcome{search.unlimited, std::nullopt, std::nullopt, std::nullopt}, traces, nullptr);
  json.key("zico");
  if (search.found) {
    write_result_json(json, Outcome{search.zico, bound, std::nullopt, std::nullopt}, traces, nullptr);
  } else {
    json.value(nullptr);
  }
  json.end_object();
  std::printf("%s\n", json.text().c_str());
}

int run_find_budget(const std::vector<simulate::JobModel>& models, const Options& options) {
  simulate::BudgetSearch search;
  std::string error;
  if (!simulate::least_budget(models, options.sim, *options.find_budget, kFindBudgetResolution, &search, &error)
           .is_ok()) {
    std::fprintf(stderr, "zico-umctl simulate: %s\n", error.c_str());
    return kExitUsage;
  }
  const std::optional<simulate::ExhaustiveBound> bound = bound_of(models, options.sim.chunk_bytes);
  if (!options.plot.empty() && search.found && !write_plot(options.plot, search.zico)) return kExitFailed;
  if (options.json) {
    write_budget_search_json(search, bound, options.traces);
  } else {
    print_budget_search(search, bound);
  }
  return kExitOk;
}

// Paging runs on the same link as the simulator's swaps: the transfer
// model's copy and fault-path rates scaled to --host-bandwidth, or the
// calibration's figures (with --host-bandwidth too: then moved to its rate).
page::PagingCostOptions paging_cost_options(const Options& options) {
  page::PagingCostOptions cost;
  if (options.calibration) cost.model = with_calibration(cost.model, *options.calibration);
  if (!options.calibration || options.host_bandwidth_given) {
    cost.model = on_host_link(cost.model, options.sim.host_bytes_per_second);
  }
  return cost;
}

}  // namespace

int run_simulate(int argc, char** argv) {
  Options options;
  if (const int status = parse(argc, argv, &options); status >= 0) {
    if (status == 0) std::printf(kUsage, kSizeForm, kDurationForm);
    return status;
  }

  // Every trace is loaded and modelled before anything runs.
  std::vector<simulate::JobModel> models(options.traces.size());
  std::map<std::string, int> seen;
  for (size_t i = 0; i < options.traces.size(); ++i) {
    trace::Trace trace;
    std::string error;
    if (!trace::read_trace_file(options.traces[i], &trace, &error).is_ok() ||
        !simulate::build_job_model(trace, &models[i], &error).is_ok()) {
      std::fprintf(stderr, "zico-umctl simulate: %s\n", error.c_str());
      return kExitUsage;
    }
    // The same model twice gets "#2", so tables and legends tell them apart.
    if (const int n = ++seen[models[i].name]; n > 1) models[i].name += " #" + std::to_string(n);
    if (options.um) {
      sharing::PagingCost& cost = options.sim.paging.emplace_back();
      if (!page::measure_paging_cost(trace, paging_cost_options(options), &cost, &error)) {
        std::fprintf(stderr, "zico-umctl simulate: --mode um: %s\n", error.c_str());
        return kExitUsage;
      }
      // The paging simulator runs the ops back to back; the job's trace time
      // also holds its gaps, which paging does not lengthen.
      for (sharing::PagingCost::Point& point : cost.points) {
        point.stretch = 1 + (point.stretch - 1) * models[i].utilization;
      }
    }
  }

  if (options.find_budget) return run_find_budget(models, options);

  std::map<Policy, Outcome> outcomes;
  for (const Policy policy : options.policies) {
    simulate::SimulationOptions sim = options.sim;
    sim.policy = policy;
    if (policy != Policy::kUnlimited) sim.budget = options.budget;
    Outcome& o = outcomes[policy];
    std::string error;
    if (!simulate::simulate(models, sim, &o.result, &error).is_ok()) {
      std::fprintf(stderr, "zico-umctl simulate: %s\n", error.c_str());
      return kExitUsage;
    }
    if (policy == Policy::kZico && options.all && !sim.launch_together) {
      simulate::SimulationOptions together = sim;
      together.launch_together = true;
      if (!simulate::simulate(models, together, &o.together.emplace(), &error).is_ok()) {
        std::fprintf(stderr, "zico-umctl simulate: %s\n", error.c_str());
        return kExitUsage;
      }
    }
    if (policy == Policy::kZico) {
      o.bound = bound_of(models, sim.chunk_bytes);
      if (o.bound) o.stretched = stretched_of(models, *o.bound, sim.budget, sim.chunk_bytes);
    }
    if (!options.plot.empty() && !write_plot(plot_path(options, policy), o.result)) return kExitFailed;
  }

  // A job that failed (under the policy asked, or zico's among all) is the
  // run's verdict: a script must not read it as a success.
  const Outcome& judged = options.all ? outcomes.at(Policy::kZico) : outcomes.begin()->second;
  const int verdict = judged.result.failed_jobs > 0 ? kExitFailed : kExitOk;
  if (options.json) {
    JsonWriter json;
    if (options.all) {
      json.begin_object();
      for (const Policy p : options.policies) {
        json.key(simulate::to_string(p));
        write_result_json(json, outcomes.at(p), options.traces, &outcomes, &options.sim.paging);
      }
      json.end_object();
    } else {
      write_result_json(json, outcomes.begin()->second, options.traces, nullptr, &options.sim.paging);
    }
    std::printf("%s\n", json.text().c_str());
    return verdict;
  }
  for (size_t i = 0; i < options.policies.size(); ++i) {
    if (i > 0) std::printf("\n");
    print_result(outcomes.at(options.policies[i]), options.traces);
  }
  if (options.all) {
    std::printf("\n");
    print_comparison(outcomes);
  }
  return verdict;
}

}  // namespace zico::umctl
