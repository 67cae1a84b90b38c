#include "time_shift_scheduler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <utility>

namespace zico::sharing {
namespace {

uint64_t add_saturating(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

// The least a job holds over a cycle: in its iteration, or resting at its
// gate between iterations.
uint64_t least_level(const DemandCurve& curve) { return std::min(curve.trough(), curve.end_bytes); }

// Starts on an unchanged curve after which it is trusted (refresh_gate_paging).
constexpr uint32_t kStartsToTrustCurve = 2;

// The most SchedulerOptions::max_stretch is taken as.
constexpr double kMaxStretch = 8.0;

// A job's pace is kept within these: one iteration stalled for long (a
// suspend, a debugger) must not make the job look gone for many periods.
constexpr double kLeastPace = 0.5;
constexpr double kMostPace = 4.0;

// What a capped start is weighed on: the job's curve and paging cost, the
// others' predicted aggregate per cell of `step` ns, and the limit.
struct CappedSearch {
  const DemandCurve& curve;
  const PagingCost& paging;
  const std::vector<uint64_t>& others;  // per cell
  uint64_t step = 0;
  uint64_t limit = 0;
  double max_stretch = 1.0;

  // The others' most over bin b of an iteration starting at cell d and
  // lasting `stretch` times its period.
  [[nodiscard]] uint64_t over(size_t d, size_t b, double stretch) const {
    const double width = static_cast<double>(curve.bin_ns()) * stretch;
    const size_t first = d + static_cast<size_t>(static_cast<double>(b) * width / static_cast<double>(step));
    const size_t last = d + static_cast<size_t>((static_cast<double>(b + 1) * width - 1) / static_cast<double>(step));
    uint64_t most = 0;
    for (size_t c = first; c <= last && c < others.size(); ++c) most = std::max(most, others[c]);
    return most;
  }

  // The largest cap under which the iteration started at cell d, running
  // `stretch` times its period, fits beside the others.
  [[nodiscard]] uint64_t largest_cap(size_t d, double stretch) const {
    uint64_t cap = UINT64_MAX;
    for (size_t b = 0; b < kDemandBins; ++b) {
      const uint64_t room = limit - std::min(limit, over(d, b, stretch));
      if (curve.bins[b] > room) cap = std::min(cap, room);
    }
    return cap;
  }
};

struct CappedStart {
  size_t cell = 0;
  uint64_t cap_bytes = 0;
  double stretch = 1.0;
  uint64_t peak = 0;  // predicted aggregate
};

// Of the candidate starts, the capped one predicted to end first: at each,
// the largest cap that fits (at least the floor, below the peak, costing at
// most max_stretch), found again where the longer iteration's bins fall
// until it holds (a few rounds; a start where it does not is passed over).
std::optional<CappedStart> earliest_capped_end(const CappedSearch& search, size_t candidates) {
  std::optional<CappedStart> best;
  double best_end = 0;
  const auto period = static_cast<double>(search.curve.period_ns);
  for (size_t d = 0; d < candidates; ++d) {
    const double start = static_cast<double>(d * search.step);
    if (best && start + period >= best_end) break;  // a cap never shortens an iteration
    uint64_t cap = search.largest_cap(d, 1.0);
    double stretch = 1.0;
    for (int round = 0; round < 4 && cap >= search.paging.floor_bytes; ++round) {
      const double longer = search.paging.stretch_at(cap);
      if (longer == stretch || longer > search.max_stretch) break;
      stretch = longer;
      cap = std::min(cap, search.largest_cap(d, stretch));
    }
    // A cap at or above the peak caps nothing: that start does not fit.
    if (cap < search.paging.floor_bytes || cap >= search.curve.peak()) continue;
    stretch = search.paging.stretch_at(cap);
    if (stretch > search.max_stretch) continue;
    const double end = start + period * stretch;
    if (best && end >= best_end) continue;
    uint64_t peak = 0;
    for (size_t b = 0; b < kDemandBins; ++b) {
      peak = std::max(peak, add_saturating(std::min(search.curve.bins[b], cap), search.over(d, b, stretch)));
    }
    if (peak > search.limit) continue;
    best = CappedStart{d, cap, stretch, peak};
    best_end = end;
  }
  return best;
}

}  // namespace

TimeShiftScheduler::TimeShiftScheduler(SchedulerOptions options) : options_(options) {}

void TimeShiftScheduler::set_budget(uint64_t bytes) {
  if (bytes == budget_) return;
  budget_ = bytes;
  ++generation_;
  refresh_gate_paging();
}

void TimeShiftScheduler::add_job(JobId job) {
  if (jobs_.emplace(job, Job{}).second) ++generation_;
  refresh_gate_paging();
}

void TimeShiftScheduler::remove_job(JobId job) {
  if (jobs_.erase(job) != 0) ++generation_;
  refresh_gate_paging();
}

void TimeShiftScheduler::set_curve(JobId job, const DemandCurve& curve) {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return;
  if (materially_different(it->second.curve, curve, options_.replan_tolerance)) ++generation_;
  // The pace was measured against the old period: a tracker that learned
  // the slower iterations as the new period leaves the same length.
  Job& j = it->second;
  j.pace = j.curve.known() && curve.known()
                 ? std::clamp(j.pace * static_cast<double>(j.curve.period_ns) / static_cast<double>(curve.period_ns),
                              kLeastPace, kMostPace)
                 : 1.0;
  j.curve = curve;
  j.starts_on_curve = 0;
  j.curves_set = curve.known() ? j.curves_set + 1 : 0;
  refresh_gate_paging();
}

bool TimeShiftScheduler::set_paging_cost(JobId job, const PagingCost& cost) {
  auto it = jobs_.find(job);
  if (it == jobs_.end() || !cost.invalid().empty()) return false;
  it->second.paging = cost;
  ++generation_;
  return true;
}

void TimeShiftScheduler::set_gate_paging(JobId job, uint64_t bytes) {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return;
  it->second.gate_paging = bytes;
  refresh_gate_paging();
}

uint64_t TimeShiftScheduler::gate_paging(JobId job) const {
  auto it = jobs_.find(job);
  return it == jobs_.end() ? 0 : it->second.paged_at_gate;
}

void TimeShiftScheduler::refresh_gate_paging() {
  // While job j peaks, every other job holds at least the least of its
  // curve, whatever the offsets or the cycle's length.
  uint64_t least_sum = 0;
  bool learning = false;
  for (const auto& [id, job] : jobs_) {
    // A curve is trusted once it is not the job's first, or once the job
    // has started two iterations on it (a curve that stays the same is not
    // sent again). A first curve is the first iteration's, often unlike
    // the others (an optimizer's state appears at its first step): bert_base's
    // peaked 9 % lower and its least level was a third. Judged on it, the
    // gates stopped paging for bert_base+resnet50 at summed peaks / 1.6
    // (which needs it on the next curves), and the pair ran at 0.52 x what
    // paging from the start gives (simulated, 55 GB/s).
    if (!job.curve.known() || (job.curves_set < 2 && job.starts_on_curve < kStartsToTrustCurve)) learning = true;
    least_sum = add_saturating(least_sum, least_level(job.curve));
  }
  uint64_t shortfall = 0;
  if (budget_ != 0 && !learning) {
    for (const auto& [id, job] : jobs_) {
      const uint64_t at_its_peak = add_saturating(least_sum - least_level(job.curve), job.curve.peak());
      if (at_its_peak > budget_) shortfall = std::max(shortfall, at_its_peak - budget_);
    }
  }
  peak_shortfall_ = shortfall;
  // While a job learns, nobody knows: the gates page as they can, since a
  // learner's climb has no plan to fit into.
  const bool pages = learning || shortfall > 0;
  for (auto& [id, job] : jobs_) {
    const uint64_t paged = pages ? job.gate_paging : 0;
    if (job.paged_at_gate != paged) ++generation_;
    job.paged_at_gate = paged;
  }
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
  // The second start on one curve: the iteration after the one it came from
  // did not change it (a changed curve arrives before its next gate).
  uint32_t& starts = it->second.starts_on_curve;
  if (starts < kStartsToTrustCurve && ++starts == kStartsToTrustCurve) refresh_gate_paging();
}

void TimeShiftScheduler::unplan(JobId job) {
  auto it = jobs_.find(job);
  if (it != jobs_.end()) it->second.in_iteration = false;
}

uint64_t TimeShiftScheduler::predicted_max(const Job& job, uint64_t now_ns, uint64_t from, uint64_t to) {
  const DemandCurve& curve = job.curve;
  if (!curve.known()) return job.held;
  // A UM job between iterations runs no kernel: part of what it holds there
  // can be paged out for another job's iteration (gate_paging()).
  const auto resting = [&](uint64_t level) { return level - std::min(level, job.paged_at_gate); };
  // Between iterations, and waiting for a planned start, a job keeps what it holds.
  const uint64_t holding = resting(std::max(curve.end_bytes, job.held));
  if (!job.in_iteration) return holding;
  const uint64_t end = job.start_ns + iteration_ns(job);
  uint64_t most = 0;
  if (from < job.start_ns) most = holding;
  // Past its iteration's end a job is at its end level. What it holds now,
  // in the middle of its iteration, says nothing about then; only a job
  // already past its end (overrun: stalled on memory, or slowed down) keeps
  // what it holds until it really ends. Predicted at what it held mid-way, a
  // job at its peak looked as if it stayed there, and the others' starts
  // waited for it: three jobs at busy fraction 0.25 fell into a convoy at
  // 0.79 x unlimited at the bound's peak, and 0.91 without (docs/benchmarks.md).
  if (to > end) most = std::max(most, now_ns >= end ? holding : resting(curve.end_bytes));
  const uint64_t lo = std::max(from, job.start_ns);
  const uint64_t hi = std::min(to, end);
  if (lo < hi) {
    // A capped UM job runs through its curve more slowly, holding at most its cap.
    const auto phase = [&](uint64_t t) {
      const uint64_t since = t - job.start_ns;
      return static_cast<uint64_t>(static_cast<double>(since) / slowness(job));
    };
    const size_t first = curve.bin_of(phase(lo));
    const size_t last = curve.bin_of(phase(hi - 1));
    uint64_t in_iteration = 0;
    for (size_t b = first; b <= last; ++b) in_iteration = std::max(in_iteration, curve.bins[b]);
    most = std::max(most, job.cap == 0 ? in_iteration : std::min(in_iteration, job.cap));
  }
  return most;
}

uint64_t TimeShiftScheduler::iteration_ns(const Job& job) {
  return static_cast<uint64_t>(static_cast<double>(job.curve.period_ns) * slowness(job));
}

double TimeShiftScheduler::slowness(const Job& job) {
  return (job.cap == 0 ? 1.0 : job.stretch) * (job.paging.known() ? 1.0 : job.pace);
}

uint64_t TimeShiftScheduler::predicted_bytes(uint64_t t) const {
  uint64_t sum = 0;
  for (const auto& [id, job] : jobs_) sum = add_saturating(sum, predicted_max(job, t, t, t + 1));
  return sum;
}

StartDecision TimeShiftScheduler::plan_start(JobId job_id, uint64_t now_ns) {
  StartDecision decision{now_ns, 0, true};
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return decision;
  Job& job = it->second;
  // The first ask after a start ends an iteration the job really ran: how
  // long it took against its curve's period is its pace, which the others'
  // decisions predict it at. Jobs sharing the GPU's compute run slower than
  // their curves say; predicted at their curves' length, they ended later
  // than planned, the starts planned after them met the hard budget, and
  // three jobs at busy fraction 0.5 waited there 8-15 ms an iteration
  // (mobilenet_v2 + nasnetalarge x 2 at summed peaks / 1.6: 0.90 x
  // unlimited, 0.97 with the pace). A UM job has none (slowness()): its
  // paging cost models how much longer its iterations run, and its stalls
  // come where its pages come in, not spread over the iteration. Spread as
  // a pace they cost bert_base + gpt2 as UM jobs at summed peaks / 1.45 on
  // a 55 GB/s link 0.96 -> 0.26 x unlimited, the gates planning around
  // capped iterations that were not as long as predicted.
  if (!job.asked && job.in_iteration && job.curve.known() && !job.paging.known() && now_ns > job.start_ns) {
    // Ordinary jobs are never capped: the period alone is what it ran against.
    const double took = static_cast<double>(now_ns - job.start_ns) / static_cast<double>(job.curve.period_ns);
    job.pace = std::clamp(0.5 * job.pace + 0.5 * took, kLeastPace, kMostPace);
  }
  // A new ask replaces the job's earlier plan.
  job.in_iteration = false;
  job.cap = 0;
  job.stretch = 1.0;
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
    horizon_end = std::max(horizon_end, other.start_ns + iteration_ns(other));
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
  // A capped UM iteration lasts up to max_stretch periods.
  // At most kMaxStretch: a capped iteration's cells are allocated up front.
  const double max_stretch = job.paging.known() ? std::clamp(options_.max_stretch, 1.0, kMaxStretch) : 1.0;
  // The job's own iteration is placed at its pace, as the others will predict it.
  const double own_pace = slowness(job);
  const double bin_width = static_cast<double>(curve.bin_ns()) * own_pace;
  const size_t cells = candidates + static_cast<size_t>(std::ceil(static_cast<double>(kDemandBins) * max_stretch * own_pace));

  // The others' predicted aggregate, cell by cell on this job's bin grid
  // anchored at now: each cell holds the sum of the others' maxima over it,
  // which never under-states the real sum.
  scratch_.assign(cells, 0);
  for (const auto& [id, other] : jobs_) {
    if (id == job_id) continue;
    for (size_t c = 0; c < cells; ++c) {
      const uint64_t from = now_ns + c * step;
      scratch_[c] = add_saturating(scratch_[c], predicted_max(other, now_ns, from, from + step));
    }
  }

  const uint64_t limit =
      static_cast<uint64_t>(static_cast<double>(budget_) * std::clamp(1.0 - options_.headroom, 0.0, 1.0));
  uint64_t best_peak = std::numeric_limits<uint64_t>::max();
  size_t best = 0;
  // The earliest start within the budget itself, its headroom spent: where
  // no start keeps the headroom, it is taken rather than the start of least
  // predicted peak. At the bound's peak, where nothing keeps the headroom,
  // waiting for the least peak delayed gpt2_medium beside gpt2 at every
  // gate (0.88 x unlimited, 0.96 with this; docs/benchmarks.md).
  std::optional<std::pair<size_t, uint64_t>> within_budget;
  for (size_t d = 0; d < candidates; ++d) {
    uint64_t peak = 0;
    // Cut short above the best peak so far: until a start within the budget
    // is found, that best is above the budget too, so no such start is missed.
    for (size_t b = 0; b < kDemandBins && peak <= best_peak; ++b) {
      // Bin b of a start at cell d covers [d*step + b*bin, +bin): with a
      // coarsened grid that is cell d + b*bin/step, and maybe the next.
      const size_t first = d + static_cast<size_t>(static_cast<double>(b) * bin_width / static_cast<double>(step));
      const size_t last =
          d + static_cast<size_t>((static_cast<double>(b + 1) * bin_width - 1) / static_cast<double>(step));
      uint64_t others = 0;
      for (size_t c = first; c <= last && c < cells; ++c) others = std::max(others, scratch_[c]);
      peak = std::max(peak, add_saturating(curve.bins[b], others));
    }
    if (peak <= limit) {  // the earliest start that fits: the least delay
      best = d;
      best_peak = peak;
      break;
    }
    if (!within_budget && peak <= budget_) within_budget = {d, peak};
    if (peak < best_peak) {  // ties keep the earlier start
      best_peak = peak;
      best = d;
    }
  }
  if (best_peak > limit && within_budget) {
    best = within_budget->first;
    best_peak = within_budget->second;
  }

  // Nothing fits as it is: a UM job may fit capped, paging the rest, where
  // that ends its iteration before the earliest uncapped start within the
  // budget would (spending the headroom costs nothing if the prediction
  // holds; a cap costs its paging for certain).
  const bool fits = best_peak <= limit;
  std::optional<CappedStart> capped;
  if (!fits && job.paging.known()) {
    // A UM job has no pace (slowness()): its capped iteration is its curve stretched.
    const CappedSearch search{curve, job.paging, scratch_, step, limit, max_stretch};
    capped = earliest_capped_end(search, candidates);
    const auto period = static_cast<double>(curve.period_ns);
    if (capped && best_peak <= budget_ &&
        static_cast<double>(capped->cell * step) + period * capped->stretch >=
            static_cast<double>(best * step) + period) {
      capped.reset();
    }
  }
  if (capped) {
    best = capped->cell;
    best_peak = capped->peak;
    decision.cap_bytes = capped->cap_bytes;
    decision.stretch = capped->stretch;
  }

  decision.start_ns = now_ns + best * step;
  // Counted once per gate: a re-plan asks again for the same one.
  if (!job.asked) job.long_delays = best * step > curve.period_ns / 2 ? job.long_delays + 1 : 0;
  job.asked = true;
  decision.predicted_peak = best_peak;
  decision.fits = fits || capped.has_value();
  // Remembered as planned, so that decisions for other jobs made before it
  // starts leave room for it.
  job.in_iteration = true;
  job.start_ns = decision.start_ns;
  job.cap = decision.cap_bytes;
  job.stretch = decision.stretch;
  return decision;
}

}  // namespace zico::sharing
