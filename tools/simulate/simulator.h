// The discrete-event simulator: training jobs, each replayed from a trace
// (job_model.h), sharing one virtual GPU under a memory policy, on a virtual
// clock. It runs the node manager's own pure policies (sharing/ledger.h,
// sharing/time_shift_scheduler.h, sharing/usage_tracker.h), so what it reports
// is what zico-umd would decide, on a GPU with the modelling assumptions below.
//
// Jobs. Job j replays its trace's prologue, iteration 0, then steady
// iterations up to `iterations` in all. Its events sit at trace-time offsets;
// an iteration ends at its period (the trace's), and iteration n+1's mark
// follows at once.
//
// Compute: processor sharing. Job j is busy a fraction u_j of its solo time
// (JobModel::utilization: 1.0 for traces whose ops are serialised estimates;
// SimulationOptions::utilization overrides it). At any moment the running
// jobs (not stalled on memory, a gate, a swap or a queue) all advance through
// their trace time at rate 1 / max(1, sum of their u). Two jobs at u = 1 each
// run at half speed; at u = 0.5 neither slows down. Stalled jobs use no
// compute.
//
// Memory: whole chunks (2 MiB, the daemon's default). A job holds
// ceil(live bytes / chunk) chunks, i.e. its allocator packs perfectly and
// caches nothing: an allocation that raises the need asks for the difference,
// a free gives the excess back at once. Held bytes are chunks * chunk size.
//
// Policies:
//  - unlimited: no budget; every request is granted: the reference for the
//    same launch plan search as the others (zico can exceed it slightly
//    where its gate staggers iterations that would otherwise overlap).
//  - fcfs: the Ledger alone, as zico-umd without time shifting. A request
//    granted at once continues; otherwise the job stalls until kGrant. kDeny
//    (the job's need can never fit) fails the job, which leaves. kReclaim is
//    answered with nothing (a perfectly packing job has no idle chunk).
//    kYield (deadlock: every holder waits) stops the victim, which swaps out
//    all it holds (held bytes / host bandwidth, PCIe Gen4 by default), gives
//    it all back, asks for its whole need again, and when granted swaps in
//    (the same time again) and continues.
//  - zico: fcfs plus the TimeShiftScheduler's gate. Each job feeds a
//    UsageTracker its allocations, frees and iteration marks on its progress
//    clock: the virtual time less all the time the job has stalled so far
//    (gate, ledger waits, swaps, queueing), which stands still while it
//    stalls and never goes back. Learned periods and curves so measure the
//    iteration's own running time (compute sharing included, as a real job's
//    GPU-progress clock would), not the stalls that happened to fall in it.
//    Each new curve goes to the scheduler. At each iteration mark the job
//    asks plan_start(); a later start_ns holds it at its gate (keeping its
//    memory, using no compute) until then. The tracker learns the mark when
//    the job reaches its gate, before it asks, as zico_mark_iteration does
//    (the wait is a stall its progress clock leaves out), so the gate plans
//    with the iteration just ended; the scheduler gets the actual start on
//    the virtual clock (started()), which is the one its plans are in.
//    Whenever the scheduler re-plans (budget, job set or a curve changed) the
//    plans of the jobs waiting at their gates are cleared (unplan()) and they
//    ask again, oldest first, and move their wake-up. Claims (ledger.h): with each
//    request, and when an iteration starts, the job's claim is set from its
//    tracker's outlook (remaining_peak_bytes, in chunks) and its curve's end
//    level; at its gate it is between iterations. When its start time comes
//    the job asks Ledger::may_start with the claim of the iteration it would
//    begin (next_iteration_peak_bytes); told no, it waits at its gate,
//    unplanned, asking again whenever anything changes, for at most 1 s
//    (counted from the end of any turn in progress), then starts anyway. As
//    the daemon learns claims from its jobs. Turns (ledger.h): a job told no
//    gives the ledger that claim's peak; kPark swaps a job at its gate out
//    like a yield (counted as one, its wait as gate time) and it waits there
//    for kResume, then asks for its whole need, swaps it back in and asks
//    may_start again.
//  - static: each job reserves its whole peak (rounded up to chunks) for its
//    lifetime, what users do today, launched by the best plan a careful
//    operator could make (below). A job is admitted as soon as its
//    reservation fits the budget less the running jobs' and the plan's cap
//    allows, and a job that does not fit yet lets later ones that do go
//    first (backfill). A reservation above every budget still to come fails
//    the job at once. Running jobs never wait for memory; held is the
//    reservation.
//  - sequential: one job at a time, in the order given, alone on the GPU.
//    Held is the job's need.
//
// Launch plans (every policy but sequential). When jobs start is the
// operator's choice, not the memory policy's, and with compute sharing it
// matters: at u = 0.5 two jobs side by side run at full speed and a third
// slows all three, so holding the third back until one ends can finish
// sooner, when it keeps the longest job at full speed. A plan is a launch order and a cap on the jobs
// running at once; a job starts when every job before it in the order has
// started (static: or been passed over, backfill) and fewer than the cap
// run. Every policy gets the same choice: simulate() tries every order of
// up to 4 jobs (beyond, the given order and the order by largest peak) with
// every cap, the given order launched all together first, and keeps the
// plan that fails fewest jobs, then keeps the budget, then has the most
// iterations per second, then the shorter makespan (a tie keeps the earlier
// plan). SimulationOptions::launch_plan runs one plan instead;
// SimulationOptions::launch_together runs the first alone (for zico: the
// time-shift scheduler alone, as zico-umd runs what is started). Under
// unlimited, fcfs and zico a queued job holds nothing and is unknown to the
// ledger and the scheduler until it starts; the ledger ages jobs in the
// order they start.
//
// Unified Memory jobs (SimulationOptions::paging: a job with a known
// PagingCost, sharing/paging_cost.h). Under zico and fcfs such a job's
// memory can leave the GPU while it runs: what it holds is its resident
// bytes, at most its cap, and it pages the rest:
//  - what the budget itself can never hold: its cap is the budget, if that
//    holds its largest op (PagingCost::floor_bytes; below, the ledger
//    refuses it like any job);
//  - where the gate capped its iteration (the scheduler's fallback when no
//    start fits as it is, time_shift_scheduler.h): the ledger counts it at
//    its worth floor (the least cap costing at most
//    SchedulerOptions::max_stretch; Ledger::set_pageable), it takes no
//    turns, and a request not granted at once is cancelled and the job runs
//    on capped at what it holds, if that is at least its worth floor;
//  - asked back (kReclaim) while it runs: what it holds above its floor
//    after a budget cut left the GPU above the budget, otherwise, in a
//    capped iteration, above its worth floor;
//  - under zico, at its gate, where no kernel of its runs: up to what its
//    link moves in one of its steady periods (each way takes at most an
//    iteration; Ledger::set_gate_paging, and the
//    scheduler predicts it that much lower there). Asked, it pages out over
//    bytes / link time and answers when done; it starts only then, and
//    first asks for what it paged out and pages it back in (a swap in,
//    counted in swap_s; JobResult::gate_page_outs counts the gates).
// While capped at c the job advances through its trace time
// PagingCost::stretch_at(c) times slower (compute sharing on top, its
// kernels spread over the longer time); the paging's transfers use the copy
// engines, not compute, so they do not slow the other jobs. The stretch is
// spread evenly over the rest of the iteration (a live pager's stalls
// gather around its peak) and comes from one job paging alone on the link;
// neither the concentration nor two jobs paging at once contending for the
// link is modelled. The other policies run UM jobs as ordinary ones.
//
// A budget schedule (steps at virtual times, the first at 0) changes the
// budget of the ledger and of the scheduler as it goes; static and sequential
// apply it to the admission of jobs not yet started only.
//
// Outputs, at the virtual-time granularity of events: per job, iterations
// done, failure and reason, mean iteration time (when its last iteration
// ended, over the iterations), the solo steady period, the delay (time not
// running for memory or its launch: gate, ledger waits, swaps, queueing), the most it held
// and the yields it took. Aggregate: makespan, iterations per second, the peak
// of the sum held, and the budget check: budget_exceeded is set when the sum
// held rises while above the budget (a grant past it); being above it right
// after a shrink, while held comes down, is the lag, measured as
// over_budget_s (total) and longest_over_budget_s (how fast held follows a
// shrink).
//
// Simplifications, so results are read as bounds on policy rather than
// predictions: no allocator fragmentation or caching, swaps use a fixed
// bandwidth each and do not contend, compute sharing is ideal, and trace
// timings are the trace's.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "job_model.h"
#include "paging_cost.h"
#include "status.h"

namespace zico::simulate {

enum class Policy : uint8_t { kUnlimited, kFcfs, kZico, kStatic, kSequential };

[[nodiscard]] const char* to_string(Policy policy);
// "unlimited", "fcfs", "zico", "static", "sequential".
[[nodiscard]] std::optional<Policy> parse_policy(std::string_view text);

// The budget from `at_ns` on, until the next step.
struct BudgetStep {
  uint64_t at_ns = 0;
  uint64_t bytes = 0;
};

inline constexpr uint64_t kDefaultChunkBytes = uint64_t{2} << 20;
inline constexpr double kPcieGen4BytesPerSecond = 25e9;
// The default host link, each way: PCIe Gen5 x16, as the paging planners'
// transfer model (prefetch/transfer_model.h) and ZICO_HOST_BANDWIDTH have it.
inline constexpr double kPcieGen5BytesPerSecond = 55e9;

// When jobs start (every policy but sequential): job indices in launch
// order (each once), and the most jobs running at once (0: no cap).
struct LaunchPlan {
  std::vector<uint32_t> order;
  uint32_t max_running = 0;
};

struct SimulationOptions {
  Policy policy = Policy::kZico;
  // Steps in increasing time, the first at 0, each at least one chunk.
  // Ignored by kUnlimited; required by every other policy.
  std::vector<BudgetStep> budget;
  uint32_t iterations = 20;            // per job, >= 1
  std::optional<double> utilization;   // in (0, 1]: every job's, instead of its model's
  double host_bytes_per_second = kPcieGen5BytesPerSecond;
  uint64_t chunk_bytes = kDefaultChunkBytes;
  // Moments kept in the held-bytes timelines (JobResult::held), all jobs'
  // together: each is a time and what every job held from then on. Beyond,
  // the timelines are reduced jointly (step_recorder.h): per time bucket the
  // moment of the largest sum and the one the bucket ended on, so stacked
  // they show only states the jobs were in, and the peak of the sum.
  size_t max_timeline_points = size_t{1} << 16;
  // All but kSequential: run this plan instead of searching for the best
  // one, or with launch_together (and no plan), launch every job at once in
  // the given order (static: each admitted when it fits).
  std::optional<LaunchPlan> launch_plan;
  bool launch_together = false;
  // By job index: a known cost makes that job a Unified Memory job (see
  // above); missing or empty entries are ordinary (VMM) jobs.
  std::vector<sharing::PagingCost> paging;
};

// (virtual ns, bytes held from then on)
using Steps = std::vector<std::pair<uint64_t, uint64_t>>;

struct JobResult {
  std::string name;
  double utilization = 1.0;
  uint32_t iterations = 0;  // completed
  bool failed = false;
  std::string failure;  // why, when failed
  double start_s = 0;   // when it began its prologue
  double end_s = 0;     // when its last iteration ended, or it failed
  double mean_iter_s = 0;  // end_s / iterations (0 without one)
  double solo_iter_s = 0;  // the model's steady period
  // Time not running for memory, by cause; delay_s is their sum.
  double delay_s = 0;
  double queue_s = 0;   // before its launch (the plan's cap) or admission (static, sequential)
  double gate_s = 0;    // zico: held at its iteration gates (parked too)
  double wait_s = 0;    // waiting for the ledger's grant (after a yield too)
  double swap_s = 0;    // swapping out and back in after yields and parks, paging in after a gate
  uint64_t peak_bytes = 0;  // the most it held
  uint64_t yields = 0;       // parks (zico) included
  uint64_t gate_delays = 0;  // iterations that started later than asked
  // Unified Memory jobs: iterations that ran capped (from the gate or a
  // request not granted at once), and the time its paging added.
  bool um = false;
  uint64_t capped_iterations = 0;
  double paging_s = 0;
  // zico: the gates at which it paged out part of what it held there for
  // another job's iteration (bringing it back in is in swap_s).
  uint64_t gate_page_outs = 0;
  // zico: the longest period among the curves its tracker learned (0 if it
  // learned none). On the progress clock this is the iteration's running
  // time, at most solo_iter_s times the compute slowdown: stalls inside an
  // iteration do not lengthen it.
  double longest_learned_iter_s = 0;
  // Its held bytes over time. Every job's timeline changes at moments shared
  // with the others (see max_timeline_points), so summing them at each time
  // gives a sum the jobs really held; a reduced timeline may miss the job's
  // own peak, which peak_bytes keeps.
  Steps held;
};

struct SimulationResult {
  Policy policy = Policy::kZico;
  uint64_t chunk_bytes = 0;
  uint32_t iterations = 0;   // asked per job
  std::vector<BudgetStep> budget;  // empty for kUnlimited
  std::vector<JobResult> jobs;
  double makespan_s = 0;
  double aggregate_iters_per_s = 0;
  uint64_t peak_bytes = 0;
  bool budget_exceeded = false;
  double over_budget_s = 0;
  double longest_over_budget_s = 0;
  uint64_t yields = 0;
  uint64_t deadlocks = 0;
  uint64_t failed_jobs = 0;
  LaunchPlan launch_plan;  // all but kSequential: the plan that ran
};

// Runs `jobs` (job j gets id j + 1) under `options`. Errors
// (kInvalidArgument, *error says which option is wrong): no jobs, a missing
// or malformed budget, iterations 0, a utilization outside (0, 1], a
// bandwidth or chunk size of 0, a launch plan that is not an order of the jobs,
// more paging costs than jobs or one that is not valid (PagingCost::invalid).
[[nodiscard]] Status simulate(const std::vector<JobModel>& jobs, const SimulationOptions& options,
                              SimulationResult* out, std::string* error);

}  // namespace zico::simulate
