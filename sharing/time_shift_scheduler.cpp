#include "time_shift_scheduler.h"

#include <algorithm>
#include <limits>

namespace zico::sharing {
namespace {

uint64_t add_saturating(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

}  // namespace

TimeShiftScheduler::TimeShiftScheduler(SchedulerOptions options) : options_(options) {}

void TimeShiftScheduler::set_budget(uint64_t bytes) {
  if (bytes == budget_) return;
  budget_ = bytes;
  ++generation_;
}

void TimeShiftScheduler::add_job(JobId job) {
  if (jobs_.emplace(job, Job{}).second) ++generation_;
}

void TimeShiftScheduler::remove_job(JobId job) {
  if (jobs_.erase(job) != 0) ++generation_;
}

void TimeShiftScheduler::set_curve(JobId job, const DemandCurve& curve) {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return;
  if (materially_different(it->second.curve, curve, options_.replan_tolerance)) ++generation_;
  it->second.curve = curve;
}

void TimeShiftScheduler::set_held(JobId job, uint64_t bytes) {
  auto it = jobs_.find(job);
  if (it != jobs_.end()) it->second.held = bytes;
}

void TimeShiftScheduler::started(JobId job, uint64_t start_ns) {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return;
  it->second.in_iteration = true;
  it->second.start_ns = start_ns;
  it->second.asked = false;
}

void TimeShiftScheduler::unplan(JobId job) {
  auto it = jobs_.find(job);
  if (it != jobs_.end()) it->second.in_iteration = false;
}

uint64_t TimeShiftScheduler::predicted_max(const Job& job, uint64_t from, uint64_t to) {
  const DemandCurve& curve = job.curve;
  if (!curve.known()) return job.held;
  // Past its iteration a job is at its end level, unless it still holds
  // more: then it has overrun (stalled on memory, or slowed down) and will
  // keep what it holds until it really ends.
  const uint64_t idle = std::max(curve.end_bytes, job.held);
  if (!job.in_iteration) return idle;
  const uint64_t end = job.start_ns + curve.period_ns;
  uint64_t most = 0;
  // Before its (planned) start the job waits at its end level.
  if (from < job.start_ns) most = idle;
  if (to > end) most = std::max(most, idle);
  const uint64_t lo = std::max(from, job.start_ns);
  const uint64_t hi = std::min(to, end);
  if (lo < hi) {
    const size_t first = curve.bin_of(lo - job.start_ns);
    const size_t last = curve.bin_of(hi - 1 - job.start_ns);
    for (size_t b = first; b <= last; ++b) most = std::max(most, curve.bins[b]);
  }
  return most;
}

uint64_t TimeShiftScheduler::predicted_bytes(uint64_t t) const {
  uint64_t sum = 0;
  for (const auto& [id, job] : jobs_) sum = add_saturating(sum, predicted_max(job, t, t + 1));
  return sum;
}

StartDecision TimeShiftScheduler::plan_start(JobId job_id, uint64_t now_ns) {
  StartDecision decision{now_ns, 0, true};
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return decision;
  Job& job = it->second;
  // A new ask replaces the job's earlier plan.
  job.in_iteration = false;
  if (budget_ == 0 || !job.curve.known()) {
    decision.predicted_peak = predicted_bytes(now_ns);
    return decision;
  }

  const DemandCurve& curve = job.curve;
  // Waiting past the moment every other job has finished its current (or
  // planned) iteration cannot lower the others' demand any further; nor is
  // a job held longer than a few of its own periods.
  uint64_t horizon_end = now_ns;
  for (const auto& [id, other] : jobs_) {
    if (id == job_id || !other.in_iteration || !other.curve.known()) continue;
    horizon_end = std::max(horizon_end, other.start_ns + other.curve.period_ns);
  }
  uint64_t longest_delay =
      curve.period_ns > UINT64_MAX / std::max<uint64_t>(options_.max_delay_periods, 1)
          ? UINT64_MAX
          : curve.period_ns * options_.max_delay_periods;
  const bool stuck = options_.stuck_gates != 0 && job.long_delays >= options_.stuck_gates;
  if (stuck) longest_delay = std::min(longest_delay, curve.period_ns / 2);
  horizon_end = std::min(horizon_end, now_ns + std::min(longest_delay, UINT64_MAX - now_ns));
  // The grid is the job's own bins, coarsened if the horizon holds more
  // candidate starts than a decision may try.
  const uint64_t max_candidates = std::max<size_t>(options_.max_candidates, 1);
  const uint64_t step = std::max(curve.bin_ns(), (horizon_end - now_ns) / max_candidates + 1);
  const size_t candidates = static_cast<size_t>((horizon_end - now_ns + step - 1) / step) + 1;
  const size_t cells = candidates + kDemandBins;

  // The others' predicted aggregate, cell by cell on this job's bin grid
  // anchored at now: each cell holds the sum of the others' maxima over it,
  // which never under-states the real sum.
  scratch_.assign(cells, 0);
  for (const auto& [id, other] : jobs_) {
    if (id == job_id) continue;
    for (size_t c = 0; c < cells; ++c) {
      const uint64_t from = now_ns + c * step;
      scratch_[c] = add_saturating(scratch_[c], predicted_max(other, from, from + step));
    }
  }

  const uint64_t limit =
      static_cast<uint64_t>(static_cast<double>(budget_) * std::clamp(1.0 - options_.headroom, 0.0, 1.0));
  uint64_t best_peak = std::numeric_limits<uint64_t>::max();
  size_t best = 0;
  for (size_t d = 0; d < candidates; ++d) {
    uint64_t peak = 0;
    for (size_t b = 0; b < kDemandBins && peak <= best_peak; ++b) {
      // Bin b of a start at cell d covers [d*step + b*bin, +bin): with a
      // coarsened grid that is cell d + b*bin/step, and maybe the next.
      const size_t first = d + static_cast<size_t>(b * curve.bin_ns() / step);
      const size_t last = d + static_cast<size_t>(((b + 1) * curve.bin_ns() - 1) / step);
      uint64_t others = 0;
      for (size_t c = first; c <= last && c < cells; ++c) others = std::max(others, scratch_[c]);
      peak = std::max(peak, add_saturating(curve.bins[b], others));
    }
    if (peak <= limit) {  // the earliest start that fits: the least delay
      best = d;
      best_peak = peak;
      break;
    }
    if (peak < best_peak) {  // ties keep the earlier start
      best_peak = peak;
      best = d;
    }
  }

  decision.start_ns = now_ns + best * step;
  // Counted once per gate: a re-plan asks again for the same one.
  if (!job.asked) job.long_delays = best * step > curve.period_ns / 2 ? job.long_delays + 1 : 0;
  job.asked = true;
  decision.predicted_peak = best_peak;
  decision.fits = best_peak <= limit;
  // Remembered as planned, so that decisions for other jobs made before it
  // starts leave room for it.
  job.in_iteration = true;
  job.start_ns = decision.start_ns;
  return decision;
}

}  // namespace zico::sharing
