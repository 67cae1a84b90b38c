// TimeShiftScheduler: when may each job start its next iteration, so that the
// memory peaks of the jobs sharing one GPU do not coincide (Zico, ATC'21,
// generalised from two jobs to N). Pure policy: no clock, no sockets; the
// daemon and the simulator drive the same object (docs/scheduling.md).
//
// What it knows, per job: the job's DemandCurve (usage_tracker.h) once
// learned, when its current iteration started, and what it holds. What it
// decides: at an iteration boundary (a "gate"), the earliest start time at
// which the predicted aggregate demand of all jobs stays within the budget
// (less a small headroom) for the whole of the job's next iteration. Delaying
// a start is what shifts a job's phase against the others; each decision
// takes the least delay that fits, so the offsets the jobs settle into are
// the ones of least total delay that this greedy order can find.
//
// Prediction of another job k at a future time t:
//  - k in an iteration that began at s (or is planned to begin at s): the
//    curve's bin at phase (t - s) / pace while t < s + period * pace, its
//    pace how long its recent iterations took over its period (each new
//    one counts half, kept to 0.5-4): co-running
//    jobs share the GPU's compute, and run slower than their curves. 1 for
//    a UM job, whose paging cost models its longer iterations. The asking
//    job's own iteration is placed at its pace too;
//  - afterwards, and for a job between iterations: the curve's end level
//    (what it holds while waiting for its next gate), less what a UM job
//    pages out there (gate_paging()); what k holds now if more, only where
//    k is already past its end (overrun) or between iterations: in the
//    middle of an iteration it says nothing of the end. Its next iteration will
//    pass its own gate, which sees this job's plan; whoever asks first is
//    placed first, so no job is counted twice and none is starved for long;
//  - k still learning (no curve): what it holds now.
//
// If no start within the horizon (until every other job's current iteration
// has ended, where waiting longer cannot help, and at most max_delay_periods
// of the job's own period) fits, the earliest within the budget itself (its
// headroom spent) is returned, or where none is, the start with the
// smallest predicted peak (fits = false either way): the hard budget in the
// ledger still holds, and its deadlock rule serves one job when all wait.
//
// A job in Unified Memory mode (its PagingCost known) has one more way to
// fit when nothing fits as it is: capping its resident bytes, paging the
// rest, its iteration longer by PagingCost::stretch_at(cap). Each candidate
// start is tried at the largest cap that fits beside the others (the capped
// iteration's bins placed where its longer time puts them), at or above the
// job's floor and costing at most max_stretch; the one predicted to end
// first is taken (fits = true, with its cap). A capped job is predicted at
// its curve clipped to the cap, over its longer iteration. Caps are only the
// fallback: where a start fits as it is, the decision is the same as for
// an ordinary job (docs/scheduling.md says what capping first cost).
// Cost: a decision is O(N * C + H * B) for N jobs, B = kDemandBins, H the
// candidate starts (at most max_candidates) and C = H + B cells: tens of
// microseconds, once per iteration per job. Chunk requests never consult it.
//
// Not thread-safe: the owner serialises calls (the daemon's loop, the
// simulator's event loop).
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "demand_curve.h"
#include "job_id.h"
#include "paging_cost.h"

namespace zico::sharing {

struct SchedulerOptions {
  // Fraction of the budget plans leave free for prediction error.
  double headroom = 0.02;
  // A decision delays a start by at most this many of the job's own
  // periods: past that the job starts (at the least predicted overflow) and
  // the ledger's claims and hard budget govern. Keeps one job with a long
  // (or lying) period from holding others for long, and keeps jobs out of a
  // convoy: with two periods, three jobs of different periods settled into
  // waiting for each other's whole iterations, a cycle of 51.6 ms against
  // iterations of 31-40 ms (0.77 x unlimited); over a sweep of budgets
  // (docs/benchmarks.md) one period never fell below 0.9 x unlimited, two
  // did in 14 of 306 runs.
  uint64_t max_delay_periods = 1;
  // A job whose first decision at each of this many gates in a row delayed
  // it by more than half its period is stuck behind the others' planned
  // starts: its next decision looks only half a period ahead (and, if
  // nothing fits there, starts at the least predicted overflow, paced by the
  // ledger). Three copies of resnet50 settled into each waiting 18.8 ms of a
  // 20.8 ms period at every gate, a third of a 39.6 ms cycle apart, where a
  // third of 20.8 ms fits: 0.79 x unlimited, 0.98 with this. 0: never.
  uint32_t stuck_gates = 2;
  // Start times tried per decision at most: the grid is coarsened beyond.
  size_t max_candidates = 1024;
  // A new curve re-plans only when it differs by more than this fraction
  // (materially_different()): small drifts would move every gate.
  double replan_tolerance = 0.05;
  // A UM job is capped only where its iteration would run at most this many
  // times its time in memory; otherwise it starts uncapped at the least
  // overflow like any job. 1: only where the paging planner hides the
  // paging entirely. A cap slows the whole iteration of the job it caps,
  // and where that is the job the run's makespan waits for, the run loses
  // more than the others gain: over the band (docs/benchmarks.md) 1.1 lost
  // more than 1 % against ordinary jobs in 4 runs on a 25 GB/s link and 15
  // on 55 GB/s (down to 0.86x), for one gain; on the runs that lost, 1 loses
  // nothing and keeps that gain at 55 GB/s. Taken as at most 8.
  double max_stretch = 1.0;
};

struct StartDecision {
  uint64_t start_ns = 0;        // when the job should begin (>= the asking time)
  uint64_t predicted_peak = 0;  // aggregate bytes predicted over its iteration if it does
  bool fits = true;             // predicted_peak <= the budget less headroom
  // A UM job's resident cap for the iteration (0: none) and its predicted
  // iteration time over its time in memory at that cap.
  uint64_t cap_bytes = 0;
  double stretch = 1.0;
};

class TimeShiftScheduler {
 public:
  explicit TimeShiftScheduler(SchedulerOptions options = {});

  // Bytes the jobs together may hold. Changing it is a re-plan.
  void set_budget(uint64_t bytes);
  [[nodiscard]] uint64_t budget() const { return budget_; }

  // A new job starts out learning (no curve). Adding or removing is a re-plan.
  void add_job(JobId job);
  void remove_job(JobId job);
  [[nodiscard]] bool has_job(JobId job) const { return jobs_.count(job) != 0; }
  [[nodiscard]] size_t job_count() const { return jobs_.size(); }

  // The job's learned curve (an unknown curve puts it back to learning). A
  // re-plan when it differs materially from the one in use.
  void set_curve(JobId job, const DemandCurve& curve);
  // What it costs the job to run capped (a UM job); an empty cost makes it
  // an ordinary job again. A re-plan. False (nothing changes) for an
  // unknown job or a cost that is not valid (PagingCost::invalid).
  bool set_paging_cost(JobId job, const PagingCost& cost);
  // A UM job that can page out up to `bytes` at its gate (what its link
  // moves in one of its periods, gate_paging_bytes). It pages there only
  // while peak_shortfall() is above 0, and is then predicted at that much
  // less between iterations (gate_paging() says how much it pages now).
  void set_gate_paging(JobId job, uint64_t bytes);
  // What the job pages out at its gate now: its set_gate_paging bytes while
  // the jobs cannot co-run without moving memory (peak_shortfall() > 0) or
  // some job is still learning, otherwise 0. The owner tells the ledger the
  // same (Ledger::set_gate_paging) before each of its decisions.
  [[nodiscard]] uint64_t gate_paging(JobId job) const;
  // By how much some job's peak and the least levels of all the others
  // exceed the budget (curves' bins): the memory that must leave the GPU
  // at that job's peak, every iteration, for it to run beside the others,
  // since no placement of their iterations needs less. Where it is 0 the
  // gates do not page: a schedule may co-run the jobs with nothing moved
  // (at worst a longer cycle), and where none does they take turns as
  // ordinary jobs; paging there cost each start a page-in and lost more
  // than it saved (docs/scheduling.md §8). Unknown, and 0,
  // while the budget is 0 (unlimited), a job has no curve, or a job has
  // only its first curve and has not yet started two iterations on it (a
  // first iteration is often unlike the rest): the gates page meanwhile.
  [[nodiscard]] uint64_t peak_shortfall() const { return peak_shortfall_; }
  // What the job holds now (used for jobs still learning).
  void set_held(JobId job, uint64_t bytes);

  // The gate: the job is ready to begin an iteration at now_ns. Jobs still
  // learning, and all jobs while the budget is 0 (unlimited), start at once.
  // The decision is remembered as the job's planned start, so later
  // decisions for other jobs see it, until started() or a new ask.
  [[nodiscard]] StartDecision plan_start(JobId job, uint64_t now_ns);
  // The job began its iteration at start_ns (after any delay).
  void started(JobId job, uint64_t start_ns);
  // Forgets the job's planned or current iteration: it is predicted at its
  // end level until it asks or starts again (a re-plan of waiting jobs
  // clears all their plans first, so none is placed around a stale one).
  void unplan(JobId job);

  // Moves on every re-plan (budget, job set, a changed curve). A caller
  // holding jobs at their gates asks again for each of them, oldest first:
  // a larger budget releases them earlier, a smaller one may delay them.
  [[nodiscard]] uint64_t plan_generation() const { return generation_; }

  // The predicted aggregate bytes at time t (for tests and plots).
  [[nodiscard]] uint64_t predicted_bytes(uint64_t t) const;

 private:
  struct Job {
    DemandCurve curve;
    bool in_iteration = false;  // started (or planned to start) at `start_ns`
    uint64_t start_ns = 0;
    uint64_t held = 0;
    bool asked = false;         // asked at its current gate (cleared when it starts)
    uint32_t long_delays = 0;   // gates in a row whose first decision delayed it > half a period
    PagingCost paging;          // known for a UM job
    uint64_t cap = 0;           // the planned or current iteration's cap (0: none)
    double stretch = 1.0;       // and its predicted stretch
    uint64_t gate_paging = 0;   // what it can page out at its gate (set_gate_paging)
    uint64_t paged_at_gate = 0; // what it pages there now (gate_paging())
    uint32_t starts_on_curve = 0;  // iterations started since its curve was set
    uint32_t curves_set = 0;       // known curves set in a row
    double pace = 1.0;             // its iterations' length over its curve's period, lately (0.5-4)
  };
  // How many times its curve's period the job's iteration lasts: a cap's
  // stretch, and an ordinary job's pace.
  [[nodiscard]] static double slowness(const Job& job);
  // Recomputes peak_shortfall_ and each job's paged_at_gate: a change of
  // what any job pages at its gate is a re-plan.
  void refresh_gate_paging();
  // The most bytes job `job` is predicted to hold within [from, to), asked at now_ns.
  [[nodiscard]] static uint64_t predicted_max(const Job& job, uint64_t now_ns, uint64_t from, uint64_t to);
  // Its planned or current iteration's length (a capped one runs longer).
  [[nodiscard]] static uint64_t iteration_ns(const Job& job);

  SchedulerOptions options_;
  uint64_t budget_ = 0;
  uint64_t generation_ = 0;
  std::map<JobId, Job> jobs_;
  uint64_t peak_shortfall_ = 0;
  std::vector<uint64_t> scratch_;  // the others' aggregate, per bin of the deciding job
};

}  // namespace zico::sharing
