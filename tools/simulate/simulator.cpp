#include "simulator.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>

#include "invalid_argument.h"
#include "ledger.h"
#include "sizes.h"
#include "step_recorder.h"
#include "time_shift_scheduler.h"
#include "usage_tracker.h"

namespace zico::simulate {
namespace {

using sharing::JobId;
using sharing::Ledger;
using sharing::LedgerAction;

// Trace positions are integers reached by floating-point steps; closer than
// this (ns) counts as there.
constexpr double kEpsilonNs = 1e-3;
constexpr double kNsPerSecond = 1e9;
// The unlimited policy's ledger budget: more chunks than any run can ask for,
// with room left so the ledger's sums cannot overflow.
constexpr uint64_t kUnlimitedChunks = UINT64_MAX / 4;
// The longest a job waits at its gate for Ledger::may_start, as in the
// daemon.
constexpr double kMaxBlockedNs = static_cast<double>(sharing::Ledger::kMaxGateBlockNs);

enum class Phase : uint8_t {
  kQueued,    // not launched (its plan's cap) or admitted (static, sequential) yet
  kRunning,
  kWaiting,   // for a ledger grant
  kGate,      // zico: held at an iteration gate until `wake`
  kSwapOut,   // yielded: saving its memory until `wake`
  kSwapWait,  // yielded: everything given back, waiting for the grant of its whole need
  kSwapIn,    // yielded: restoring until `wake`
  kParked,    // parked at its gate: everything given back, waiting for kResume
  kDone,
  kFailed,
};

struct Job {
  const JobModel* model = nullptr;
  JobId id = 0;
  Phase phase = Phase::kQueued;
  int64_t segment = -1;  // -1: the prologue, else the iteration
  std::vector<ReplayEvent> events;
  size_t next = 0;         // the next event of the segment
  uint64_t length_ns = 0;  // the segment's trace time
  double pos = 0;          // trace ns into the segment
  uint64_t live = 0;       // bytes
  uint64_t held = 0;       // chunks
  uint64_t reservation = 0;  // static, sequential: chunks
  double since = 0;          // when the current phase began
  double wake = 0;           // kGate, kSwapOut, kSwapIn
  double gate_arrival = 0;
  // kGate: Ledger::may_start said no; it asks again as things change, and
  // wakes kMaxBlockedNs after blocked_since to start regardless.
  bool blocked = false;
  double blocked_since = 0;
  double last_iteration_end = 0;
  uint64_t next_request = 1;
  uint64_t pending_request = 0;
  uint64_t swapped_chunks = 0;
  bool parking = false;  // kPark: back to its gate after the swap in
  // Unified Memory: the cost of capping it (known for a UM job), the cap
  // in force (chunks, 0: none), the stretch it runs at, and the gate's
  // decision for the iteration it will start.
  const sharing::PagingCost* paging = nullptr;
  uint64_t cap = 0;
  double stretch = 1.0;
  bool capped_this_iteration = false;
  uint64_t planned_cap_bytes = 0;
  double paging_ns = 0;  // time its paging added so far
  // At its gate: chunks being paged out for a reclaim until gate_paged_at,
  // and chunks paged out, brought back in when it starts.
  uint64_t gate_paging = 0;
  double gate_paged_at = 0;
  uint64_t gate_paged = 0;
  std::unique_ptr<sharing::UsageTracker> tracker;  // zico
  double stalled_ns = 0;          // time in stall phases that have ended
  uint64_t last_progress_ns = 0;  // the latest time the tracker was given
  uint64_t curve_version = 0;
  JobResult result;

  Job(const JobModel& m, JobId job_id) : model(&m), id(job_id) {}

  [[nodiscard]] double target() const {
    return next < events.size() ? static_cast<double>(events[next].offset_ns) : static_cast<double>(length_ns);
  }
  [[nodiscard]] bool active() const { return phase != Phase::kDone && phase != Phase::kFailed; }
  [[nodiscard]] bool pages() const { return paging != nullptr; }
};

// Phases in which a job does not run for want of memory or its turn.
bool stalled(Phase phase) {
  switch (phase) {
    case Phase::kQueued:
    case Phase::kWaiting:
    case Phase::kGate:
    case Phase::kSwapOut:
    case Phase::kSwapWait:
    case Phase::kSwapIn:
    case Phase::kParked: return true;
    default: return false;
  }
}

class Engine {
 public:
  Engine(const std::vector<JobModel>& models, const SimulationOptions& options)
      : options_(options), timeline_(models.size(), options.max_timeline_points) {
    const bool ledger = uses_ledger();
    for (size_t i = 0; i < models.size(); ++i) {
      jobs_.push_back(std::make_unique<Job>(models[i], static_cast<JobId>(i + 1)));
      Job& j = *jobs_.back();
      j.result.name = models[i].name;
      j.result.utilization = options.utilization.value_or(models[i].utilization);
      j.result.solo_iter_s = static_cast<double>(models[i].steady_period_ns) / kNsPerSecond;
      j.reservation = chunks_for(models[i].peak_bytes);
      if (options.policy == Policy::kZico) j.tracker = std::make_unique<sharing::UsageTracker>();
      const bool pageable_policy = options.policy == Policy::kZico || options.policy == Policy::kFcfs;
      if (pageable_policy && i < options.paging.size() && options.paging[i].known()) j.paging = &options.paging[i];
      j.result.um = j.paging != nullptr;
    }
    if (options.policy != Policy::kUnlimited) budget_steps_ = options.budget;
    budget_bytes_ = budget_steps_.empty() ? 0 : budget_steps_.front().bytes;
    next_step_ = budget_steps_.empty() ? 0 : 1;
    if (ledger) {
      (void)ledger_.add_gpu(budget_steps_.empty() ? kUnlimitedChunks : budget_bytes_ / options.chunk_bytes,
                            options.chunk_bytes);
    }
    if (options.policy == Policy::kZico) scheduler_.set_budget(budget_bytes_ / options.chunk_bytes * options.chunk_bytes);
    if (options.launch_plan) plan_ = *options.launch_plan;
    if (plan_.order.empty()) {
      for (uint32_t i = 0; i < models.size(); ++i) plan_.order.push_back(i);
    }
  }

  SimulationResult run() {
    if (uses_ledger()) (void)launch();
    for (;;) {
      settle();
      if (std::none_of(jobs_.begin(), jobs_.end(), [](const auto& j) { return j->active(); })) break;
      if (!step()) {
        for (auto& j : jobs_) {
          if (j->active()) fail(*j, "stuck: no job can make progress (a simulator bug)");
        }
        break;
      }
    }
    return finish_result();
  }

 private:
  [[nodiscard]] bool uses_ledger() const {
    return options_.policy == Policy::kUnlimited || options_.policy == Policy::kFcfs ||
           options_.policy == Policy::kZico;
  }
  [[nodiscard]] bool zico() const { return options_.policy == Policy::kZico; }
  [[nodiscard]] uint64_t chunks_for(uint64_t bytes) const {
    return bytes / options_.chunk_bytes + (bytes % options_.chunk_bytes != 0 ? 1 : 0);
  }
  [[nodiscard]] uint64_t now_ns() const { return static_cast<uint64_t>(now_); }
  [[nodiscard]] double seconds(double ns) const { return ns / kNsPerSecond; }

  // --- time --------------------------------------------------------------

  // Moves the clock to the next thing that happens. False if nothing will.
  bool step() {
    double running_load = 0;
    for (const auto& j : jobs_) {
      // A paging job's kernels are spread over its stretched time.
      if (j->phase == Phase::kRunning) running_load += j->result.utilization / j->stretch;
    }
    const double slowdown = std::max(1.0, running_load);
    double next = std::numeric_limits<double>::infinity();
    for (const auto& j : jobs_) {
      if (j->phase == Phase::kRunning) {
        next = std::min(next, now_ + std::max(0.0, j->target() - j->pos) * slowdown * j->stretch);
      } else if (j->phase == Phase::kGate || j->phase == Phase::kSwapOut || j->phase == Phase::kSwapIn) {
        next = std::min(next, j->wake);
      }
      if (j->gate_paging != 0) next = std::min(next, j->gate_paged_at);
    }
    if (next_step_ < budget_steps_.size()) next = std::min(next, static_cast<double>(budget_steps_[next_step_].at_ns));
    const uint64_t ledger_due = uses_ledger() ? ledger_.next_due_ns(now_ns()) : UINT64_MAX;
    if (ledger_due != UINT64_MAX) next = std::min(next, static_cast<double>(ledger_due));
    if (!std::isfinite(next)) return false;
    next = std::max(next, now_);
    const double dt = next - now_;
    for (auto& j : jobs_) {
      if (j->phase != Phase::kRunning) continue;
      // The job that set `next` lands exactly on its target, whatever the rounding.
      const double target = j->target();
      const bool arrives = now_ + std::max(0.0, target - j->pos) * slowdown * j->stretch <= next;
      j->pos += dt / (slowdown * j->stretch);
      j->paging_ns += dt * (1.0 - 1.0 / j->stretch);
      if (arrives || j->pos >= target - kEpsilonNs) j->pos = target;
    }
    now_ = next;

    while (next_step_ < budget_steps_.size() && static_cast<double>(budget_steps_[next_step_].at_ns) <= now_) {
      apply_budget(budget_steps_[next_step_++].bytes);
    }
    std::vector<Job*> due;
    for (auto& j : jobs_) {
      if ((j->phase == Phase::kGate || j->phase == Phase::kSwapOut || j->phase == Phase::kSwapIn) &&
          j->wake <= now_ + kEpsilonNs) {
        due.push_back(j.get());
      }
    }
    for (auto& j : jobs_) {
      if (j->gate_paging != 0 && j->gate_paged_at <= now_ + kEpsilonNs) gate_paged_out(*j);
    }
    std::stable_sort(due.begin(), due.end(), [](const Job* a, const Job* b) { return a->wake < b->wake; });
    for (Job* j : due) wake(*j);
    if (ledger_due <= now_ns()) pump();  // a park ends, or a turn
    return true;
  }

  // Lets everything that can happen at the current time happen.
  void settle() {
    for (bool progress = true; progress;) {
      progress = false;
      for (auto& j : jobs_) {
        if (j->phase == Phase::kRunning && j->pos >= j->target() - kEpsilonNs) {
          advance(*j);
          progress = true;
        }
      }
      if (zico() && scheduler_.plan_generation() != generation_) {
        replan();
        progress = true;
      }
      if (zico() && start_unblocked()) progress = true;
      if (uses_ledger() && launch()) progress = true;
      if (!uses_ledger() && admit()) progress = true;
    }
  }

  void enter(Job& j, Phase phase) {
    switch (j.phase) {
      case Phase::kQueued: j.result.queue_s += seconds(now_ - j.since); break;
      case Phase::kWaiting:
      case Phase::kSwapWait: j.result.wait_s += seconds(now_ - j.since); break;
      case Phase::kGate: j.result.gate_s += seconds(now_ - j.since); break;
      case Phase::kSwapOut:
      case Phase::kSwapIn: j.result.swap_s += seconds(now_ - j.since); break;
      case Phase::kParked: j.result.gate_s += seconds(now_ - j.since); break;
      default: break;
    }
    if (stalled(j.phase)) j.stalled_ns += now_ - j.since;
    j.phase = phase;
    j.since = now_;
  }

  void wake(Job& j) {
    switch (j.phase) {
      case Phase::kGate:
        (void)try_start(j);
        break;
      case Phase::kSwapOut: {
        std::string why;
        if (!ledger_.returned(j.id, 0, j.held, false, now_ns(), &why).is_ok()) {
          fail(j, "ledger refused a return: " + why);
          return;
        }
        set_held(j, 0);
        if (j.parking) {
          enter(j, Phase::kParked);
          pump();
          return;
        }
        const uint64_t need = need_within_budget(j);
        if (!j.active()) return;
        if (need == 0) {
          enter(j, Phase::kRunning);
          return;
        }
        enter(j, Phase::kSwapWait);
        if (zico()) update_claim(j);
        request(j, need);
        break;
      }
      case Phase::kSwapIn:
        if (j.parking) {
          back_to_gate(j);
          break;
        }
        enter(j, Phase::kRunning);
        break;
      default: break;
    }
  }

  void back_to_gate(Job& j) {
    j.parking = false;
    j.blocked = false;
    enter(j, Phase::kGate);
    (void)ledger_.set_between_iterations(j.id, 0);
    j.gate_arrival = now_;
    (void)try_start(j);
  }

  // --- jobs ----------------------------------------------------------------

  void start(Job& j) {
    enter(j, Phase::kRunning);
    j.result.start_s = seconds(now_);
    if (uses_ledger()) {
      std::string why;
      (void)ledger_.add_job(j.id, 0, ++arrivals_);  // its age, as the daemon counts it
      if (!ledger_.open(j.id, 0, 0, &why).is_ok()) {
        fail(j, "ledger refused the job: " + why);
        return;
      }
    }
    if (zico()) scheduler_.add_job(j.id);
    if (zico() && j.pages()) (void)scheduler_.set_paging_cost(j.id, *j.paging);  // validated in simulate()
    if (zico() && j.pages()) {
      // It can page out at its gate what its link moves in one of its
      // periods: out while it waits, back in before it starts, each at most
      // an iteration. The gate says when it does (sync_gate_paging).
      const uint64_t chunks =
          sharing::gate_paging_bytes(options_.host_bytes_per_second, j.model->steady_period_ns) / options_.chunk_bytes;
      scheduler_.set_gate_paging(j.id, chunks * options_.chunk_bytes);
    }
    if (options_.policy == Policy::kStatic) set_held(j, j.reservation);
    load(j, -1);
  }

  void load(Job& j, int64_t segment) {
    j.segment = segment;
    j.events.clear();
    j.next = 0;
    j.pos = 0;
    if (segment < 0) {
      append_prologue_events(*j.model, &j.events);
      j.length_ns = j.model->prologue_ns;
    } else {
      append_iteration_events(*j.model, static_cast<uint32_t>(segment), &j.events);
      j.length_ns = segment == 0 ? j.model->first_period_ns : j.model->steady_period_ns;
    }
    // Events past the period (a trace whose last op ends after its last
    // event) stretch the segment rather than being cut off.
    if (!j.events.empty()) j.length_ns = std::max(j.length_ns, j.events.back().offset_ns);
  }

  // The job has reached its next event or the end of its segment.
  void advance(Job& j) {
    while (j.phase == Phase::kRunning) {
      while (j.next < j.events.size() && static_cast<double>(j.events[j.next].offset_ns) <= j.pos + kEpsilonNs) {
        const ReplayEvent event = j.events[j.next++];
        apply(j, event);
        if (j.phase != Phase::kRunning) return;
      }
      if (j.next < j.events.size() || j.pos + kEpsilonNs < static_cast<double>(j.length_ns)) return;
      if (j.segment >= 0) {
        j.result.iterations += 1;
        j.last_iteration_end = now_;
      }
      uncap(j);
      if (j.segment + 1 >= static_cast<int64_t>(options_.iterations)) {
        complete(j);
        return;
      }
      load(j, j.segment + 1);
      if (!zico()) continue;
      // The tracker learns the mark at the gate, before the job asks (as
      // zico_mark_iteration does): the gate then plans with the iteration
      // just ended, and its claim is that iteration's. A wait at the gate is
      // a stall, which the progress clock leaves out.
      j.tracker->on_iteration(progress_ns(j));
      const uint64_t period = j.tracker->curve().period_ns;
      j.result.longest_learned_iter_s = std::max(j.result.longest_learned_iter_s, seconds(static_cast<double>(period)));
      sync_curve(j);
      const sharing::StartDecision decision = scheduler_.plan_start(j.id, now_ns());
      planned(j, decision);
      if (decision.start_ns > now_ns()) {
        enter_gate(j);
        j.wake = static_cast<double>(decision.start_ns);
        return;
      }
      if (!try_start(j)) return;
    }
  }

  void enter_gate(Job& j) {
    (void)ledger_.set_between_iterations(j.id, 0);
    enter(j, Phase::kGate);
    pump();  // a claim gone may make a waiting request safe
    j.gate_arrival = now_;
    j.result.gate_delays += 1;
  }

  // The job's start time has come: it starts unless the ledger says its
  // iteration should wait (Ledger::may_start: it could leave a job in
  // mid-iteration unable to finish, or one of them is still learning); then
  // it waits at its gate, unplanned, asking again whenever the others
  // change, for at most kMaxBlockedNs (a claim can be wrong) before it starts
  // anyway and the ledger's hard budget governs.
  bool try_start(Job& j) {
    if (j.gate_paging != 0) {
      if (j.phase != Phase::kGate) enter_gate(j);
      j.wake = std::max(j.wake, j.gate_paged_at);
      return false;
    }
    uint64_t peak_bytes = j.tracker->next_iteration_peak_bytes();
    // A UM job the gate capped claims only its cap.
    if (j.pages() && j.planned_cap_bytes != 0) peak_bytes = std::min(peak_bytes, j.planned_cap_bytes);
    const uint64_t peak = peak_bytes == 0 ? 0 : std::max(j.held, chunks_for(peak_bytes));
    sync_gate_paging();
    if (!ledger_.may_start(j.id, 0, peak, chunks_for(j.tracker->curve().end_bytes), now_ns())) {
      if (j.phase != Phase::kGate) enter_gate(j);
      (void)ledger_.set_between_iterations(j.id, 0, peak);
      pump();
      if (j.phase != Phase::kGate) return false;  // parked
      if (!j.blocked) {
        j.blocked = true;
        j.blocked_since = now_;
      }
      // The deadline is compared as it was computed: now_ - blocked_since
      // can round below kMaxBlockedNs at the very wake-up it set, which
      // would wake the job at the same moment forever.
      const double deadline =
          std::max(j.blocked_since, static_cast<double>(ledger_.turn_wait_until_ns(0, now_ns()))) + kMaxBlockedNs;
      if (now_ < deadline) {
        j.wake = deadline;
        scheduler_.unplan(j.id);
        return false;
      }
    }
    j.blocked = false;
    if (j.phase != Phase::kRunning) enter(j, Phase::kRunning);
    start_iteration(j);
    return true;
  }

  // Blocked jobs try again, longest waiting first. True if one started.
  bool start_unblocked() {
    std::vector<Job*> blocked;
    for (auto& j : jobs_) {
      if (j->phase == Phase::kGate && j->blocked) blocked.push_back(j.get());
    }
    std::stable_sort(blocked.begin(), blocked.end(),
                     [](const Job* a, const Job* b) { return a->gate_arrival < b->gate_arrival; });
    bool started = false;
    for (Job* j : blocked) started = try_start(*j) || started;
    return started;
  }

  void start_iteration(Job& j) {
    scheduler_.started(j.id, now_ns());
    if (j.pages() && j.planned_cap_bytes != 0) cap_at(j, j.planned_cap_bytes / options_.chunk_bytes);
    update_claim(j);
    if (j.gate_paged != 0) {
      // What it paged out at its gate comes back in before its kernels run,
      // up to its cap. It waits for it as an ordinary job (the ledger's
      // pageable jobs never wait); a grant makes a capped one pageable again.
      const uint64_t need = resident_need(j);
      j.swapped_chunks = std::min(j.gate_paged, need > j.held ? need - j.held : 0);
      j.gate_paged = 0;
      if (j.swapped_chunks == 0) return;
      (void)ledger_.set_pageable(j.id, 0, 0);
      enter(j, Phase::kSwapWait);
      request(j, j.swapped_chunks);
    }
  }

  // A reclaim of a UM job at its gate: it pages out, and answers when done.
  void page_out_at_gate(Job& j, uint64_t chunks) {
    j.result.gate_page_outs += 1;
    j.gate_paging = chunks;
    j.gate_paged_at = now_ + swap_ns(chunks);
  }

  void gate_paged_out(Job& j) {
    const uint64_t chunks = std::min(j.gate_paging, j.held);
    j.gate_paging = 0;
    if (!j.active()) return;
    std::string why;
    if (!ledger_.returned(j.id, 0, chunks, true, now_ns(), &why).is_ok()) {
      fail(j, "ledger refused a return: " + why);
      return;
    }
    set_held(j, j.held - chunks);
    j.gate_paged += chunks;
    pump();
  }

  // --- Unified Memory -------------------------------------------------------

  // Caps a UM job's resident chunks (never below its floor) and gives back
  // what it holds above the cap: its pager evicts that.
  void cap_at(Job& j, uint64_t chunks) {
    chunks = std::max(chunks, floor_chunks(j));
    if (j.cap != 0 && chunks >= j.cap) return;
    set_cap(j, chunks);
    if (j.held > chunks) keep_only(j, chunks);
    if (zico() && j.active()) update_claim(j);  // its claim is no more than the cap now
  }

  // Caps never rise within an iteration: what was paged out stays out
  // until the iteration ends.
  void set_cap(Job& j, uint64_t chunks) {
    j.cap = j.cap != 0 ? std::min(j.cap, chunks) : chunks;
    j.stretch = j.paging->stretch_at(j.cap * options_.chunk_bytes);
    if (!j.capped_this_iteration && j.segment >= 0) {
      j.capped_this_iteration = true;
      j.result.capped_iterations += 1;
    }
  }

  // What a running UM job can give back when the ledger asks: in a capped
  // iteration (pageable to the ledger) or above the budget (after a cut),
  // as much as it is asked, whatever that costs, as zico-umd's UM jobs do
  // (the ledger asks down to the floor it was told first); otherwise nothing.
  // Left below its worth floor, it waits for more as an ordinary job does.
  [[nodiscard]] uint64_t pageable_chunks(const Job& j) const {
    if (!j.pages() || j.phase != Phase::kRunning) return 0;
    const bool over = budget_bytes_ > 0 && total_held_ * options_.chunk_bytes > budget_bytes_;
    return over || j.cap != 0 ? j.held : 0;
  }

  // The gate's decision for a UM job: the cap of the iteration it will
  // start. A capped iteration pages: the ledger counts it at no more than
  // its worth floor (Ledger::set_pageable), and it does not take turns.
  void planned(Job& j, const sharing::StartDecision& decision) {
    if (!j.pages()) return;
    j.planned_cap_bytes = decision.cap_bytes;
    // A job waiting for memory waits as an ordinary job (page_instead_of_waiting).
    if (j.phase == Phase::kWaiting) return;
    (void)ledger_.set_pageable(j.id, 0, decision.cap_bytes != 0 ? worth_floor_chunks(j) : 0);
  }

  void uncap(Job& j) {
    j.cap = 0;
    j.stretch = 1.0;
    j.capped_this_iteration = false;
    j.planned_cap_bytes = 0;
  }

  // The least a UM job can run at: its largest op's pages.
  [[nodiscard]] uint64_t floor_chunks(const Job& j) const {
    return j.pages() ? std::max<uint64_t>(1, chunks_for(j.paging->floor_bytes)) : 0;
  }

  // The least a UM job pages down to for another job's sake: where it runs
  // no slower than the scheduler would cap it (SchedulerOptions::max_stretch;
  // the simulator's scheduler runs with the default options).
  [[nodiscard]] uint64_t worth_floor_chunks(const Job& j) const {
    if (!j.pages()) return 0;
    return std::max(floor_chunks(j), chunks_for(j.paging->least_cap_within(sharing::SchedulerOptions{}.max_stretch)));
  }

  // What the job needs resident now: its live bytes, at most its cap.
  [[nodiscard]] uint64_t resident_need(const Job& j) const {
    const uint64_t need = chunks_for(j.live);
    return j.cap != 0 ? std::min(need, j.cap) : need;
  }

  // The same, after a UM job has capped itself at what the budget itself
  // can hold (more, the ledger would deny), if that holds its largest op.
  uint64_t need_within_budget(Job& j) {
    const uint64_t budget_chunks = budget_bytes_ / options_.chunk_bytes;
    if (j.pages() && budget_chunks != 0 && resident_need(j) > budget_chunks && budget_chunks >= floor_chunks(j)) {
      cap_at(j, budget_chunks);
    }
    return resident_need(j);
  }

  // A request of a capped UM iteration the ledger did not grant at once:
  // rather than wait, the job runs on capped at what it holds, if that is at
  // least its worth floor. Below it the job waits as an ordinary job does:
  // the ledger's rules for a pageable job assume it never waits.
  void page_instead_of_waiting(Job& j) {
    if (!j.pages() || j.cap == 0 || j.phase != Phase::kWaiting || j.pending_request == 0) return;
    if (j.held < worth_floor_chunks(j)) {
      (void)ledger_.set_pageable(j.id, 0, 0);
      pump();  // as an ordinary waiter it may complete a deadlock the ledger now breaks
      return;
    }
    (void)ledger_.cancel(j.id, j.pending_request, now_ns());
    j.pending_request = 0;
    cap_at(j, j.held);
    if (j.phase == Phase::kWaiting) enter(j, Phase::kRunning);
    pump();
  }

  // The ledger's claim for the job, from its tracker's outlook (what the
  // daemon learns from the job: at its iteration start and with each
  // request).
  void update_claim(Job& j) {
    const uint64_t remaining = j.tracker->remaining_peak_bytes();
    if (remaining == 0) {
      (void)ledger_.set_claim(j.id, 0, 0, 0);
      return;
    }
    uint64_t peak = std::max(j.held, chunks_for(remaining));
    if (j.cap != 0) peak = std::max(j.held, std::min(peak, j.cap));
    (void)ledger_.set_claim(j.id, 0, peak, chunks_for(j.tracker->curve().end_bytes));
  }

  // The job's progress clock, which its tracker runs on: the virtual time
  // less all the time it has stalled so far, paging included (the
  // scheduler stretches a capped job's curve itself), never decreasing.
  uint64_t progress_ns(Job& j) {
    double stalled_ns = j.stalled_ns + j.paging_ns;
    if (stalled(j.phase)) stalled_ns += now_ - j.since;
    const double progress = std::max(0.0, now_ - stalled_ns);
    j.last_progress_ns = std::max(j.last_progress_ns, static_cast<uint64_t>(progress));
    return j.last_progress_ns;
  }

  void sync_curve(Job& j) {
    if (j.tracker->curve_version() == j.curve_version) return;
    j.curve_version = j.tracker->curve_version();
    scheduler_.set_curve(j.id, j.tracker->curve());
  }

  void apply(Job& j, const ReplayEvent& event) {
    if (event.kind == ReplayEvent::Kind::kAllocate) {
      j.live += event.bytes;
      if (zico()) {
        j.tracker->on_allocate(event.block, event.bytes, progress_ns(j));
        sync_curve(j);
      }
    } else {
      j.live -= std::min(j.live, event.bytes);
      if (zico()) {
        j.tracker->on_free(event.block, progress_ns(j));
        sync_curve(j);
      }
    }
    const uint64_t need = need_within_budget(j);
    if (!j.active()) return;
    switch (options_.policy) {
      case Policy::kStatic: return;  // it holds its reservation throughout
      case Policy::kSequential: set_held(j, need); return;
      default: break;
    }
    if (need > j.held) {
      enter(j, Phase::kWaiting);
      if (zico()) update_claim(j);
      request(j, need - j.held);
      page_instead_of_waiting(j);
    } else if (need < j.held) {
      keep_only(j, need);
    }
  }

  // The job gives back what it holds above `chunks`.
  void keep_only(Job& j, uint64_t chunks) {
    std::string why;
    if (!ledger_.returned(j.id, 0, j.held - chunks, false, now_ns(), &why).is_ok()) {
      fail(j, "ledger refused a return: " + why);
      return;
    }
    set_held(j, chunks);
    pump();
  }

  // The job has entered kWaiting or kSwapWait.
  void request(Job& j, uint64_t chunks) {
    j.pending_request = j.next_request++;
    std::string why;
    if (!ledger_.request(j.id, 0, j.pending_request, chunks, now_ns(), &why).is_ok()) {
      fail(j, "ledger refused a request: " + why);
      return;
    }
    pump();
  }

  // The ledger learns what each UM job pages at its gate now: the gate
  // pages only where the jobs cannot co-run without it (TimeShiftScheduler::
  // peak_shortfall), which a curve, a job's arrival or end, or the budget
  // changes. Before every ledger decision.
  void sync_gate_paging() {
    if (!zico()) return;
    for (const auto& j : jobs_) {
      if (j->pages() && j->active()) {
        (void)ledger_.set_gate_paging(j->id, 0, scheduler_.gate_paging(j->id) / options_.chunk_bytes);
      }
    }
  }

  // Until the ledger has nothing more to say. A reclaim is answered at once
  // (with nothing), so no reclaim stays outstanding and pumping again when
  // a reclaim retry comes due would change nothing: every other decision
  // follows from a change, after which this runs.
  void pump() {
    sync_gate_paging();
    for (;;) {
      const std::vector<LedgerAction> actions = ledger_.pump(now_ns());
      if (actions.empty()) return;
      for (const LedgerAction& action : actions) handle(action);
    }
  }

  void handle(const LedgerAction& action) {
    if (action.job == 0 || action.job > jobs_.size()) return;
    Job& j = *jobs_[action.job - 1];
    if (!j.active()) return;
    std::string why;
    switch (action.kind) {
      case LedgerAction::Kind::kGrant:
        set_held(j, j.held + action.chunks);
        if (action.request_id != j.pending_request) return;
        j.pending_request = 0;
        if (j.pages() && j.cap != 0) {
          // Served in part (a pageable request): below its worth floor it
          // asks for the rest and waits as an ordinary job; at or above it,
          // it runs capped at what it holds. Pageable again once it runs.
          if (j.held < resident_need(j) && j.held < worth_floor_chunks(j) && j.phase == Phase::kWaiting) {
            (void)ledger_.set_pageable(j.id, 0, 0);
            request(j, resident_need(j) - j.held);
            return;
          }
          (void)ledger_.set_pageable(j.id, 0, worth_floor_chunks(j));
          if (j.held < resident_need(j)) cap_at(j, j.held);
        }
        if (j.phase == Phase::kWaiting) {
          enter(j, Phase::kRunning);
        } else if (j.phase == Phase::kSwapWait) {
          enter(j, Phase::kSwapIn);
          j.wake = now_ + swap_ns(j.swapped_chunks);
        }
        return;
      case LedgerAction::Kind::kDeny:
        fail(j, "needs " + format_size_apart(chunks_for(j.live) * options_.chunk_bytes, budget_bytes_) +
                    " in iteration " + (j.segment < 0 ? std::string("(prologue)") : std::to_string(j.segment)) +
                    ", more than the budget " + format_size_apart(budget_bytes_, chunks_for(j.live) * options_.chunk_bytes) +
                    " lets it hold (ledger: " + action.reason + ")");
        return;
      case LedgerAction::Kind::kReclaim: {
        // A perfectly packing job has no idle chunk to give; a UM job can
        // page some of what it holds out.
        if (j.pages() && j.phase == Phase::kGate && j.segment >= 0) {
          page_out_at_gate(j, std::min(action.chunks, j.held));
          return;
        }
        const uint64_t give = std::min(action.chunks, pageable_chunks(j));
        (void)ledger_.returned(j.id, 0, give, true, now_ns(), &why);
        if (give != 0) {
          set_cap(j, j.held - give);
          set_held(j, j.held - give);
          if (zico()) update_claim(j);
        }
        return;
      }
      case LedgerAction::Kind::kPark:
        j.parking = true;
        j.blocked = false;
        j.swapped_chunks = j.held;
        j.result.yields += 1;
        scheduler_.unplan(j.id);
        enter(j, Phase::kSwapOut);
        j.wake = now_ + swap_ns(j.held);
        return;
      case LedgerAction::Kind::kResume: {
        const uint64_t need = need_within_budget(j);
        if (!j.active()) return;
        if (need == 0) {
          back_to_gate(j);
          return;
        }
        enter(j, Phase::kSwapWait);
        request(j, need);
        return;
      }
      case LedgerAction::Kind::kYield:
        j.pending_request = 0;
        j.result.yields += 1;
        j.swapped_chunks = j.held;
        enter(j, Phase::kSwapOut);
        j.wake = now_ + swap_ns(j.held);
        return;
    }
  }

  [[nodiscard]] double swap_ns(uint64_t chunks) const {
    return static_cast<double>(chunks * options_.chunk_bytes) / options_.host_bytes_per_second * kNsPerSecond;
  }

  void leave(Job& j) {
    if (uses_ledger()) ledger_.remove_job(j.id);
    if (zico()) scheduler_.remove_job(j.id);
    set_held(j, 0);
    j.live = 0;
    j.result.end_s = seconds(now_);
    if (uses_ledger()) pump();
  }

  void complete(Job& j) {
    enter(j, Phase::kDone);
    leave(j);
  }

  void fail(Job& j, std::string reason) {
    if (!j.active()) return;
    enter(j, Phase::kFailed);
    j.result.failed = true;
    j.result.failure = std::move(reason);
    leave(j);
  }

  // Every job at its gate asks again, oldest first, after all their plans
  // are cleared (none is placed around another's stale plan).
  void replan() {
    generation_ = scheduler_.plan_generation();
    std::vector<Job*> gated;
    for (auto& j : jobs_) {
      if (j->phase == Phase::kGate) gated.push_back(j.get());
    }
    for (Job* j : gated) scheduler_.unplan(j->id);
    std::stable_sort(gated.begin(), gated.end(),
                     [](const Job* a, const Job* b) { return a->gate_arrival < b->gate_arrival; });
    for (Job* j : gated) {
      if (j->phase != Phase::kGate) continue;
      const sharing::StartDecision decision = scheduler_.plan_start(j->id, now_ns());
      planned(*j, decision);
      if (decision.start_ns > now_ns()) {
        j->wake = static_cast<double>(decision.start_ns);
        j->blocked = false;
        continue;
      }
      (void)try_start(*j);
    }
  }

  // unlimited, fcfs, zico: starts queued jobs in the plan's order while
  // fewer than its cap run (memory is the ledger's to give). True if any
  // started.
  bool launch() {
    uint32_t running = 0;
    for (const auto& j : jobs_) running += j->active() && j->phase != Phase::kQueued ? 1 : 0;
    bool changed = false;
    for (const uint32_t index : plan_.order) {
      Job& j = *jobs_[index];
      if (j.phase != Phase::kQueued) continue;
      if (plan_.max_running != 0 && running >= plan_.max_running) break;
      start(j);
      ++running;
      changed = true;
    }
    return changed;
  }

  // static, sequential: starts queued jobs while they fit, in the plan's
  // order (static, with backfill and the plan's cap) or the given one
  // (sequential, one at a time). True if anything changed.
  bool admit() {
    bool changed = false;
    uint64_t future_budget = budget_bytes_;
    for (size_t s = next_step_; s < budget_steps_.size(); ++s) future_budget = std::max(future_budget, budget_steps_[s].bytes);
    for (auto& j : jobs_) {
      if (j->phase == Phase::kQueued && j->reservation * options_.chunk_bytes > future_budget) {
        fail(*j, "peak " + format_size(j->reservation * options_.chunk_bytes) + " exceeds budget " +
                     format_size(future_budget));
        changed = true;
      }
    }
    uint64_t reserved = 0;
    uint32_t running = 0;
    for (const auto& j : jobs_) {
      if (j->active() && j->phase != Phase::kQueued) {
        reserved += j->reservation;
        ++running;
      }
    }
    const bool sequential = options_.policy == Policy::kSequential;
    const uint32_t cap = sequential ? 1 : plan_.max_running;
    const uint64_t budget_chunks = budget_bytes_ / options_.chunk_bytes;
    for (const uint32_t index : plan_.order) {
      Job& j = *jobs_[index];
      if (j.phase != Phase::kQueued) continue;
      if (cap != 0 && running >= cap) break;
      if (reserved + j.reservation > budget_chunks) {
        if (sequential) break;
        continue;  // backfill: a later job that fits goes first
      }
      reserved += j.reservation;
      ++running;
      start(j);
      changed = true;
    }
    return changed;
  }

  // --- accounting ----------------------------------------------------------

  void set_held(Job& j, uint64_t chunks) {
    if (chunks == j.held) return;
    const bool rising = chunks > j.held;
    total_held_ = total_held_ - j.held + chunks;
    j.held = chunks;
    const uint64_t bytes = chunks * options_.chunk_bytes;
    j.result.peak_bytes = std::max(j.result.peak_bytes, bytes);
    timeline_.record(now_ns(), j.id - 1, bytes);
    if (zico()) scheduler_.set_held(j.id, bytes);
    peak_bytes_ = std::max(peak_bytes_, total_held_ * options_.chunk_bytes);
    check_budget(rising);
  }

  void apply_budget(uint64_t bytes) {
    budget_bytes_ = bytes;
    const uint64_t chunks = bytes / options_.chunk_bytes;
    if (uses_ledger()) {
      std::string why;
      (void)ledger_.set_budget(0, chunks, &why);  // no job has a minimum here
    }
    if (zico()) scheduler_.set_budget(chunks * options_.chunk_bytes);
    check_budget(false);
    if (uses_ledger()) pump();
  }

  // Above the budget is the lag after a shrink; held rising while above it
  // is a breach, except for static and sequential jobs admitted before the
  // shrink, which by design keep what they were admitted with.
  void check_budget(bool rising) {
    const bool over = budget_bytes_ > 0 && total_held_ * options_.chunk_bytes > budget_bytes_;
    if (over && rising) {
      const bool admitted_before_shrink =
          over_ && over_after_shrink_ &&
          (options_.policy == Policy::kStatic || options_.policy == Policy::kSequential);
      if (!admitted_before_shrink) budget_exceeded_ = true;
    }
    if (over && !over_) {
      over_ = true;
      over_since_ = now_;
      over_after_shrink_ = !rising;
    } else if (!over && over_) {
      close_over_stretch();
    }
  }

  void close_over_stretch() {
    const double stretch = seconds(now_ - over_since_);
    over_budget_s_ += stretch;
    longest_over_budget_s_ = std::max(longest_over_budget_s_, stretch);
    over_ = false;
  }

  SimulationResult finish_result() {
    if (over_) close_over_stretch();
    SimulationResult r;
    r.policy = options_.policy;
    r.chunk_bytes = options_.chunk_bytes;
    r.iterations = options_.iterations;
    r.budget = budget_steps_;
    if (options_.policy != Policy::kSequential) r.launch_plan = plan_;
    uint64_t iterations = 0;
    std::vector<Steps> held = timeline_.finish();
    for (auto& j : jobs_) {
      JobResult& result = j->result;
      result.held = std::move(held[j->id - 1]);
      result.delay_s = result.queue_s + result.gate_s + result.wait_s + result.swap_s;
      result.paging_s = seconds(j->paging_ns);
      result.mean_iter_s = result.iterations > 0 ? seconds(j->last_iteration_end) / result.iterations : 0;
      r.makespan_s = std::max(r.makespan_s, result.end_s);
      r.yields += result.yields;
      r.failed_jobs += result.failed ? 1 : 0;
      iterations += result.iterations;
      r.jobs.push_back(std::move(result));
    }
    r.aggregate_iters_per_s = r.makespan_s > 0 ? static_cast<double>(iterations) / r.makespan_s : 0;
    r.peak_bytes = peak_bytes_;
    r.budget_exceeded = budget_exceeded_;
    r.over_budget_s = over_budget_s_;
    r.longest_over_budget_s = longest_over_budget_s_;
    if (uses_ledger()) r.deadlocks = ledger_.gpu(0).deadlocks;
    return r;
  }

  const SimulationOptions& options_;
  LaunchPlan plan_;  // launches (sequential uses its order)
  std::vector<std::unique_ptr<Job>> jobs_;
  StackRecorder timeline_;  // what each job holds (series j: job j + 1)
  Ledger ledger_;
  sharing::TimeShiftScheduler scheduler_;
  uint64_t generation_ = 0;
  uint64_t arrivals_ = 0;  // jobs launched so far: the ledger's arrival order
  double now_ = 0;
  std::vector<BudgetStep> budget_steps_;
  size_t next_step_ = 0;
  uint64_t budget_bytes_ = 0;  // in force now; 0: none
  uint64_t total_held_ = 0;    // chunks
  uint64_t peak_bytes_ = 0;
  bool budget_exceeded_ = false;
  bool over_ = false;
  bool over_after_shrink_ = false;
  double over_since_ = 0;
  double over_budget_s_ = 0;
  double longest_over_budget_s_ = 0;
};

}  // namespace

const char* to_string(Policy policy) {
  switch (policy) {
    case Policy::kUnlimited: return "unlimited";
    case Policy::kFcfs: return "fcfs";
    case Policy::kZico: return "zico";
    case Policy::kStatic: return "static";
    case Policy::kSequential: return "sequential";
  }
  return "?";
}

std::optional<Policy> parse_policy(std::string_view text) {
  for (const Policy p : {Policy::kUnlimited, Policy::kFcfs, Policy::kZico, Policy::kStatic, Policy::kSequential}) {
    if (text == to_string(p)) return p;
  }
  return std::nullopt;
}

namespace {

// Whether `a` is a better outcome than `b`: fewer jobs failed, then the
// budget kept, then more iterations per second, then the shorter makespan.
// (A failed job stops the clock early: on throughput alone a plan that
// launches a job into a budget it cannot fit would win.)
bool better(const SimulationResult& a, const SimulationResult& b) {
  if (a.failed_jobs != b.failed_jobs) return a.failed_jobs < b.failed_jobs;
  if (a.budget_exceeded != b.budget_exceeded) return !a.budget_exceeded;
  constexpr double kTolerance = 1e-9;
  if (a.aggregate_iters_per_s > b.aggregate_iters_per_s * (1 + kTolerance)) return true;
  if (a.aggregate_iters_per_s < b.aggregate_iters_per_s * (1 - kTolerance)) return false;
  return a.makespan_s < b.makespan_s * (1 - kTolerance);
}

// The policy (any but sequential) with its best launch plan: the given order
// all together first, then every order of up to 4 jobs (beyond, the given
// order and the order by largest peak) with every cap.
SimulationResult best_launch(const std::vector<JobModel>& jobs, const SimulationOptions& options) {
  constexpr size_t kSearchAllOrdersUpTo = 4;
  std::vector<uint32_t> given(jobs.size());
  std::iota(given.begin(), given.end(), 0u);
  std::vector<std::vector<uint32_t>> orders;
  std::vector<uint32_t> order = given;
  if (jobs.size() <= kSearchAllOrdersUpTo) {
    do {
      orders.push_back(order);
    } while (std::next_permutation(order.begin(), order.end()));
  } else {
    orders.push_back(order);
    std::stable_sort(order.begin(), order.end(),
                     [&](uint32_t a, uint32_t b) { return jobs[a].peak_bytes > jobs[b].peak_bytes; });
    orders.push_back(order);
  }
  // Under the ledger's policies a launch waits for nothing but the cap, so
  // the jobs launched at the start all start at once: one plan per set of
  // them (launched, and aged by the ledger, in job order) and order of the
  // rest. Static admits by memory too, so its order matters throughout.
  const bool only_the_cap_waits = options.policy != Policy::kStatic;
  std::vector<LaunchPlan> plans{LaunchPlan{given, 0}};
  for (const std::vector<uint32_t>& o : orders) {
    for (uint32_t cap = 1; cap <= jobs.size(); ++cap) {
      LaunchPlan plan{o, cap == jobs.size() ? 0 : cap};
      if (only_the_cap_waits) std::sort(plan.order.begin(), plan.order.begin() + cap);
      const bool tried = std::any_of(plans.begin(), plans.end(), [&](const LaunchPlan& p) {
        return p.order == plan.order && p.max_running == plan.max_running;
      });
      if (!tried) plans.push_back(std::move(plan));
    }
  }
  SimulationOptions candidate = options;
  std::optional<SimulationResult> best;
  for (LaunchPlan& plan : plans) {
    candidate.launch_plan = std::move(plan);
    Engine engine(jobs, candidate);
    SimulationResult result = engine.run();
    if (!best || better(result, *best)) best = std::move(result);
  }
  return std::move(*best);
}

}  // namespace

Status simulate(const std::vector<JobModel>& jobs, const SimulationOptions& options, SimulationResult* out,
                std::string* error) {
  if (jobs.empty()) return invalid(error, "no jobs to simulate");
  if (options.iterations == 0) return invalid(error, "iterations must be at least 1");
  if (options.utilization && !(*options.utilization > 0 && *options.utilization <= 1)) {
    return invalid(error, "utilization must be in (0, 1]");
  }
  if (!(options.host_bytes_per_second > 0) || !std::isfinite(options.host_bytes_per_second)) {
    return invalid(error, "host bandwidth must be positive");
  }
  if (options.chunk_bytes == 0) return invalid(error, "chunk size must be positive");
  if (options.policy != Policy::kUnlimited) {
    if (options.budget.empty()) return invalid(error, std::string("policy ") + to_string(options.policy) + " needs a budget");
    if (options.budget.front().at_ns != 0) return invalid(error, "the budget schedule must start at 0");
    for (size_t i = 0; i < options.budget.size(); ++i) {
      if (options.budget[i].bytes < options.chunk_bytes) {
        return invalid(error, "budget " + format_size(options.budget[i].bytes) + " is below one chunk (" +
                                  format_size(options.chunk_bytes) + ")");
      }
      if (i > 0 && options.budget[i].at_ns <= options.budget[i - 1].at_ns) {
        return invalid(error, "budget schedule times must increase strictly");
      }
    }
  }
  if (options.paging.size() > jobs.size()) {
    return invalid(error, std::to_string(options.paging.size()) + " paging costs for " + std::to_string(jobs.size()) +
                              " jobs");
  }
  for (size_t i = 0; i < options.paging.size(); ++i) {
    if (const std::string why = options.paging[i].invalid(); !why.empty()) {
      return invalid(error, "job " + std::to_string(i) + " (" + jobs[i].name + "): " + why);
    }
  }
  if (options.launch_plan) {
    std::vector<uint32_t> order = options.launch_plan->order;
    std::sort(order.begin(), order.end());
    for (uint32_t i = 0; i < order.size(); ++i) {
      if (order[i] != i || order.size() != jobs.size()) {
        return invalid(error, "the launch plan's order must name every job once (indices 0 to " +
                                  std::to_string(jobs.size() - 1) + ")");
      }
    }
  }
  if (options.policy != Policy::kSequential && !options.launch_plan && !options.launch_together) {
    *out = best_launch(jobs, options);
    return Status::ok();
  }
  Engine engine(jobs, options);
  *out = engine.run();
  return Status::ok();
}

}  // namespace zico::simulate
