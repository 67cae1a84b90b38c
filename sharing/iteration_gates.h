// IterationGates: zico-umd's side of the time-shift schedule. One
// TimeShiftScheduler per GPU, and the jobs held at their iteration gates.
//
// A job announces each iteration boundary (kIterationMark) and waits for
// kProceed. A job uses one or more GPUs; it may start when every GPU's
// scheduler agrees, so its start is the latest of their decisions. Decisions
// are remembered as planned starts (the scheduler reserves them), and are
// taken again, oldest first, whenever a plan changes under them: a budget
// set with zico-umctl, a job arriving or leaving, a new curve.
//
// A gate whose time has come opens only if its GateGuard agrees (the daemon:
// Ledger::may_start on every GPU of the job, with the claim the job sent for
// the iteration it would begin). A gate the guard refuses is *blocked*: it
// waits, its plans withdrawn on every GPU (no other job is placed around a
// start it does not take), and is asked again at every later due(), oldest
// first, until the guard agrees or Ledger::kMaxGateBlockNs has passed since
// it was first refused (a claim can be wrong), or since a turn in progress
// ends (GateGuard::turn_wait_until_ns); then it opens regardless. Its time
// has come already, so a re-plan leaves it as it is.
//
// With time shift off (zico-umd --schedule fcfs) every gate opens at once
// and no guard is asked, so jobs need not know which schedule the daemon runs.
//
// Pure, like the schedulers: time is passed in; the daemon sends the
// kProceed messages for what due() returns, arms a timer for next_due_ns(),
// and calls due() again after anything that can change its guard's answer.
#pragma once

#include <cstdint>
#include <vector>

#include "demand_curve.h"
#include "job_id.h"
#include "time_shift_scheduler.h"

namespace zico::sharing {

// Decides whether a job whose gate time has come may start its iteration.
class GateGuard {
 public:
  virtual ~GateGuard() = default;
  // Asked for each gate whose time has come, oldest first.
  [[nodiscard]] virtual bool may_start(JobId job) = 0;
  // The job's gate opens now (agreed or not): what it starts takes effect
  // before the next gate is asked.
  virtual void starting(JobId job) = 0;
  // Until when the job waits for turns rather than for a claim
  // (Ledger::turn_wait_until_ns; 0: no turn in progress): a refused gate's
  // one-second bound counts from then.
  [[nodiscard]] virtual uint64_t turn_wait_until_ns(JobId /*job*/, uint64_t /*now_ns*/) { return 0; }
};

class IterationGates {
 public:
  IterationGates(bool time_shift, SchedulerOptions options);

  [[nodiscard]] bool time_shift() const { return time_shift_; }
  // GPUs are numbered 0, 1, ... in the order added; budgets in bytes.
  void add_gpu(uint64_t budget_bytes);
  void set_budget(uint32_t gpu, uint64_t bytes);

  void open(JobId job, uint32_t gpu);
  // Forgets the job everywhere, its waiting gate included.
  void remove_job(JobId job);
  // The job cannot be told anything (its connection is gone while its
  // process lives): its waiting gate goes, and it is counted at what it
  // holds, since no plan of its own can be followed.
  void detach(JobId job);
  void set_curve(JobId job, uint32_t gpu, const DemandCurve& curve);
  void set_held(JobId job, uint32_t gpu, uint64_t bytes);
  void set_gate_paging(JobId job, uint32_t gpu, uint64_t bytes);
  // What it pages at its gate on `gpu` now (TimeShiftScheduler::gate_paging).
  [[nodiscard]] uint64_t gate_paging(JobId job, uint32_t gpu) const;

  struct Opened {
    JobId job = 0;
    uint64_t sequence = 0;
    uint64_t waited_ns = 0;  // from its arrival to now: the delay the schedule (or its guard) imposed
  };
  // The job reached the iteration boundary `sequence` at now_ns. A gate
  // already waiting for the job is replaced (the job asked again).
  void arrive(JobId job, uint64_t sequence, uint64_t now_ns);
  // The gates that open at or before now_ns, in the order they were asked,
  // those `guard` refuses excepted (see above; nullptr: none refused); each
  // job is told its iteration started then. Re-plans first if a scheduler's
  // plan changed since the last call.
  [[nodiscard]] std::vector<Opened> due(uint64_t now_ns, GateGuard* guard = nullptr);
  // When the next waiting gate opens (for a blocked one: when its wait
  // runs out); UINT64_MAX when none waits.
  [[nodiscard]] uint64_t next_due_ns() const;
  [[nodiscard]] size_t waiting() const { return waiting_.size(); }
  // Gates whose time has come that the guard refused: due() should be
  // called again whenever its answer may have changed.
  [[nodiscard]] bool any_blocked() const;
  // Gates that were held back, ever, and for how long in all.
  [[nodiscard]] uint64_t delayed_gates() const { return delayed_gates_; }
  [[nodiscard]] uint64_t delay_ns() const { return delay_ns_; }
  // Of those, the gates the guard held back, and for how long in all (from
  // its first refusal to the opening).
  [[nodiscard]] uint64_t blocked_gates() const { return blocked_gates_; }
  [[nodiscard]] uint64_t blocked_ns() const { return blocked_ns_; }

 private:
  struct Waiting {
    JobId job = 0;
    uint64_t sequence = 0;
    uint64_t arrived_ns = 0;
    uint64_t open_ns = 0;
    bool blocked = false;        // the guard refused it; unplanned
    uint64_t blocked_since_ns = 0;
    uint64_t give_up_ns = 0;     // blocked: when it opens regardless
  };
  // When blocked `w` opens regardless, asked at now_ns.
  static uint64_t give_up_ns(const Waiting& w, uint64_t now_ns, GateGuard& guard);
  // Opens `w` at now_ns: counts it and tells the schedulers it started.
  void open_now(const Waiting& w, uint64_t now_ns, GateGuard* guard);
  // The latest start every GPU the job uses agrees to, asked at now_ns.
  uint64_t decide(JobId job, uint64_t now_ns);
  [[nodiscard]] uint64_t generations() const;

  bool time_shift_;
  SchedulerOptions options_;
  std::vector<TimeShiftScheduler> gpus_;
  std::vector<Waiting> waiting_;          // in arrival order
  uint64_t seen_generations_ = 0;
  uint64_t delayed_gates_ = 0;
  uint64_t delay_ns_ = 0;
  uint64_t blocked_gates_ = 0;
  uint64_t blocked_ns_ = 0;
};

}  // namespace zico::sharing
