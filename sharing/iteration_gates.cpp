#include "iteration_gates.h"

#include <algorithm>

#include "ledger.h"

namespace zico::sharing {

IterationGates::IterationGates(bool time_shift, SchedulerOptions options)
    : time_shift_(time_shift), options_(options) {}

void IterationGates::add_gpu(uint64_t budget_bytes) {
  gpus_.emplace_back(options_);
  gpus_.back().set_budget(budget_bytes);
}

void IterationGates::set_budget(uint32_t gpu, uint64_t bytes) {
  if (gpu < gpus_.size()) gpus_[gpu].set_budget(bytes);
}

void IterationGates::open(JobId job, uint32_t gpu) {
  if (gpu >= gpus_.size() || gpus_[gpu].has_job(job)) return;
  gpus_[gpu].add_job(job);
}

void IterationGates::remove_job(JobId job) {
  for (TimeShiftScheduler& gpu : gpus_) gpu.remove_job(job);
  std::erase_if(waiting_, [job](const Waiting& w) { return w.job == job; });
}

void IterationGates::detach(JobId job) {
  std::erase_if(waiting_, [job](const Waiting& w) { return w.job == job; });
  for (TimeShiftScheduler& gpu : gpus_) {
    gpu.unplan(job);
    gpu.set_curve(job, DemandCurve{});
  }
}

void IterationGates::set_curve(JobId job, uint32_t gpu, const DemandCurve& curve) {
  if (gpu < gpus_.size()) gpus_[gpu].set_curve(job, curve);
}

void IterationGates::set_gate_paging(JobId job, uint32_t gpu, uint64_t bytes) {
  if (gpu < gpus_.size()) gpus_[gpu].set_gate_paging(job, bytes);
}

uint64_t IterationGates::gate_paging(JobId job, uint32_t gpu) const {
  return gpu < gpus_.size() ? gpus_[gpu].gate_paging(job) : 0;
}

void IterationGates::set_held(JobId job, uint32_t gpu, uint64_t bytes) {
  if (gpu < gpus_.size()) gpus_[gpu].set_held(job, bytes);
}

uint64_t IterationGates::generations() const {
  uint64_t sum = 0;
  for (const TimeShiftScheduler& gpu : gpus_) sum += gpu.plan_generation();
  return sum;
}

uint64_t IterationGates::decide(JobId job, uint64_t now_ns) {
  if (!time_shift_) return now_ns;
  uint64_t start = now_ns;
  for (size_t g = 0; g < gpus_.size(); ++g) {
    if (gpus_[g].has_job(job)) start = std::max(start, gpus_[g].plan_start(job, now_ns).start_ns);
  }
  // Every GPU reserves the one start the job will really take.
  for (size_t g = 0; g < gpus_.size(); ++g) {
    if (gpus_[g].has_job(job)) gpus_[g].started(job, start);
  }
  return start;
}

void IterationGates::arrive(JobId job, uint64_t sequence, uint64_t now_ns) {
  // A gate asked again: its plan was never an iteration the job ran, so no
  // scheduler may take it for one (TimeShiftScheduler's pace).
  if (std::erase_if(waiting_, [job](const Waiting& w) { return w.job == job; }) != 0) {
    for (TimeShiftScheduler& gpu : gpus_) gpu.unplan(job);
  }
  const uint64_t open_ns = decide(job, now_ns);
  waiting_.push_back(Waiting{job, sequence, now_ns, open_ns});
}

std::vector<IterationGates::Opened> IterationGates::due(uint64_t now_ns, GateGuard* guard) {
  if (const uint64_t current = generations(); current != seen_generations_) {
    // A plan changed under the waiting gates: ask again, oldest first, each
    // placed among the older ones' new plans, not around its juniors' old ones.
    // A blocked gate's time has come already: it has no plan to redo.
    for (const Waiting& w : waiting_) {
      if (w.blocked) continue;
      for (TimeShiftScheduler& gpu : gpus_) gpu.unplan(w.job);
    }
    for (Waiting& w : waiting_) {
      if (!w.blocked) w.open_ns = decide(w.job, now_ns);
    }
    seen_generations_ = generations();
  }
  if (!time_shift_) guard = nullptr;
  std::vector<Opened> opened;
  for (size_t i = 0; i < waiting_.size();) {
    Waiting& w = waiting_[i];
    if (w.open_ns > now_ns) {
      ++i;
      continue;
    }
    if (guard != nullptr && w.blocked) w.give_up_ns = give_up_ns(w, now_ns, *guard);
    const bool waited_enough = w.blocked && w.give_up_ns <= now_ns;
    if (guard != nullptr && !waited_enough && !guard->may_start(w.job)) {
      if (!w.blocked) {
        w.blocked = true;
        w.blocked_since_ns = now_ns;
        w.give_up_ns = give_up_ns(w, now_ns, *guard);
        // Not placed: the others are planned around what it holds now.
        for (TimeShiftScheduler& gpu : gpus_) gpu.unplan(w.job);
      }
      ++i;
      continue;
    }
    open_now(w, now_ns, guard);
    opened.push_back(Opened{w.job, w.sequence, now_ns > w.arrived_ns ? now_ns - w.arrived_ns : 0});
    waiting_.erase(waiting_.begin() + static_cast<ptrdiff_t>(i));
  }
  return opened;
}

void IterationGates::open_now(const Waiting& w, uint64_t now_ns, GateGuard* guard) {
  if (now_ns > w.arrived_ns) {
    ++delayed_gates_;
    delay_ns_ += now_ns - w.arrived_ns;
  }
  if (w.blocked) {
    ++blocked_gates_;
    blocked_ns_ += now_ns - w.blocked_since_ns;
  }
  if (guard != nullptr) guard->starting(w.job);
  // It starts now, whatever was planned.
  for (TimeShiftScheduler& gpu : gpus_) {
    if (gpu.has_job(w.job)) gpu.started(w.job, now_ns);
  }
}

uint64_t IterationGates::give_up_ns(const Waiting& w, uint64_t now_ns, GateGuard& guard) {
  // A turn in progress is waited out before the bound starts counting.
  return std::max(w.blocked_since_ns, guard.turn_wait_until_ns(w.job, now_ns)) + Ledger::kMaxGateBlockNs;
}

uint64_t IterationGates::next_due_ns() const {
  uint64_t next = UINT64_MAX;
  for (const Waiting& w : waiting_) {
    next = std::min(next, w.blocked ? w.give_up_ns : w.open_ns);
  }
  return next;
}

bool IterationGates::any_blocked() const {
  return std::any_of(waiting_.begin(), waiting_.end(), [](const Waiting& w) { return w.blocked; });
}

}  // namespace zico::sharing
