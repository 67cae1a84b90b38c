#include "exhaustive_bound.h"

#include <algorithm>
#include <array>
#include <optional>

#include "invalid_argument.h"

namespace zico::simulate {
namespace {

constexpr size_t kCellsPerSlot = kEvalCells / kOffsetSlots;
static_assert(kEvalCells % kOffsetSlots == 0, "offsets must fall on cell boundaries");

using Cells = std::array<uint64_t, kEvalCells>;

// t <= cycle; cycles up to 2^53 ns (104 days) cannot overflow.
size_t cell_of(uint64_t t, uint64_t cycle) {
  const auto cell = static_cast<size_t>(t * kEvalCells / cycle);
  return std::min(cell, kEvalCells - 1);
}

// Each cell's most bytes for a curve idling at its end level up to `cycle`.
// A step that lasts no time still counts in its cell: the simulated jobs do
// hold it for that instant.
Cells cell_maxima(const PeriodicCurve& curve, uint64_t cycle) {
  Cells cells{};
  const auto& steps = curve.steps;
  for (size_t i = 0; i < steps.size(); ++i) {
    const uint64_t from = steps[i].first;
    const uint64_t to = i + 1 < steps.size() ? steps[i + 1].first : cycle;
    const size_t first = cell_of(from, cycle);
    const size_t last = to > from ? cell_of(to - 1, cycle) : first;
    for (size_t c = first; c <= last; ++c) cells[c] = std::max(cells[c], steps[i].second);
  }
  return cells;
}

Status check_curves(const std::vector<PeriodicCurve>& curves, std::string* error) {
  if (curves.empty() || curves.size() > kMaxBoundJobs) {
    return invalid(error, "the exhaustive bound takes 1 to " + std::to_string(kMaxBoundJobs) + " jobs, not " +
                              std::to_string(curves.size()));
  }
  for (size_t j = 0; j < curves.size(); ++j) {
    const PeriodicCurve& c = curves[j];
    if (c.period_ns == 0) return invalid(error, "curve " + std::to_string(j) + " has a period of 0");
    if (c.steps.empty() || c.steps.front().first != 0) {
      return invalid(error, "curve " + std::to_string(j) + " does not start at offset 0");
    }
    for (size_t i = 1; i < c.steps.size(); ++i) {
      if (c.steps[i].first < c.steps[i - 1].first || c.steps[i].first > c.period_ns) {
        return invalid(error, "curve " + std::to_string(j) + ": offsets must not decrease or pass the period");
      }
    }
  }
  return Status::ok();
}

uint64_t longest_period(const std::vector<PeriodicCurve>& curves) {
  uint64_t longest = 0;
  for (const PeriodicCurve& c : curves) longest = std::max(longest, c.period_ns);
  return longest;
}

struct OffsetSearch {
  uint64_t peak = UINT64_MAX;  // UINT64_MAX: nothing within `fit`
  size_t slot1 = 0;
  size_t slot2 = 0;
  uint64_t aligned_peak = 0;  // every offset 0; exact only without `fit`
};

// Every offset combination of the jobs at `cycle`. Without `fit`, the one
// with the least peak; with it, the first whose peak is at most *fit.
OffsetSearch search_offsets(const std::vector<Cells>& cells, std::optional<uint64_t> fit) {
  // Job j at offset slot s: cycle cell k shows its cell k - s * kCellsPerSlot.
  const auto at = [&](size_t j, size_t slot, size_t k) {
    return cells[j][(k + kEvalCells - slot * kCellsPerSlot) % kEvalCells];
  };
  // The first two jobs' sum for every slot of job 1, then job 2 on top.
  const size_t slots1 = cells.size() >= 2 ? kOffsetSlots : 1;
  const size_t slots2 = cells.size() >= 3 ? kOffsetSlots : 1;
  std::vector<Cells> pair(slots1);
  for (size_t s1 = 0; s1 < slots1; ++s1) {
    for (size_t k = 0; k < kEvalCells; ++k) pair[s1][k] = cells[0][k] + (cells.size() >= 2 ? at(1, s1, k) : 0);
  }
  OffsetSearch found;
  // A combination stops being evaluated once its peak reaches `best`.
  uint64_t best = fit ? *fit + 1 : UINT64_MAX;
  for (size_t s1 = 0; s1 < slots1; ++s1) {
    for (size_t s2 = 0; s2 < slots2; ++s2) {
      uint64_t peak = 0;
      for (size_t k = 0; k < kEvalCells && peak < best; ++k) {
        peak = std::max(peak, pair[s1][k] + (cells.size() >= 3 ? at(2, s2, k) : 0));
      }
      if (s1 == 0 && s2 == 0) found.aligned_peak = peak;
      if (peak < best) {
        best = peak;
        found = {peak, s1, s2, found.aligned_peak};
        if (fit) return found;
      }
    }
  }
  return found;
}

std::vector<uint64_t> offsets_of(const OffsetSearch& search, size_t jobs, uint64_t cycle) {
  const auto offset = [cycle](size_t slot) {
    return cycle * slot / kOffsetSlots;
  };
  std::vector<uint64_t> offsets{0};
  if (jobs >= 2) offsets.push_back(offset(search.slot1));
  if (jobs >= 3) offsets.push_back(offset(search.slot2));
  return offsets;
}

std::vector<Cells> cells_at(const std::vector<PeriodicCurve>& curves, uint64_t cycle) {
  std::vector<Cells> cells;
  for (const PeriodicCurve& c : curves) cells.push_back(cell_maxima(c, cycle));
  return cells;
}

}  // namespace

PeriodicCurve steady_need_curve(const JobModel& model, uint64_t chunk_bytes) {
  const auto need = [chunk_bytes](uint64_t live) {
    return (live / chunk_bytes + (live % chunk_bytes != 0 ? 1 : 0)) * chunk_bytes;
  };
  std::vector<ReplayEvent> events;
  append_prologue_events(model, &events);
  append_iteration_events(model, 0, &events);
  uint64_t live = 0;
  for (const ReplayEvent& e : events) live = e.kind == ReplayEvent::Kind::kAllocate ? live + e.bytes : live - e.bytes;

  PeriodicCurve curve;
  events.clear();
  append_iteration_events(model, 1, &events);
  curve.period_ns = model.steady_period_ns;
  curve.steps.emplace_back(0, need(live));
  for (const ReplayEvent& e : events) {
    live = e.kind == ReplayEvent::Kind::kAllocate ? live + e.bytes : live - std::min(live, e.bytes);
    curve.period_ns = std::max(curve.period_ns, e.offset_ns);
    if (need(live) != curve.steps.back().second) curve.steps.emplace_back(e.offset_ns, need(live));
  }
  if (curve.period_ns == 0) curve.period_ns = 1;
  return curve;
}

Status exhaustive_bound(const std::vector<PeriodicCurve>& curves, ExhaustiveBound* out, std::string* error) {
  if (Status s = check_curves(curves, error); !s.is_ok()) return s;
  ExhaustiveBound bound;
  bound.cycle_ns = longest_period(curves);
  const std::vector<Cells> cells = cells_at(curves, bound.cycle_ns);
  for (const Cells& c : cells) bound.sum_of_peaks_bytes += *std::max_element(c.begin(), c.end());
  const OffsetSearch best = search_offsets(cells, std::nullopt);
  bound.peak_bytes = best.peak;
  bound.aligned_peak_bytes = best.aligned_peak;
  bound.offsets_ns = offsets_of(best, curves.size(), bound.cycle_ns);
  *out = std::move(bound);
  return Status::ok();
}

Status least_fitting_cycle(const std::vector<PeriodicCurve>& curves, uint64_t budget_bytes, StretchedCycle* out,
                           std::string* error) {
  if (Status s = check_curves(curves, error); !s.is_ok()) return s;
  StretchedCycle result;
  // While job j is at its peak every other job holds at least the least of
  // its curve, whatever the cycle: past the budget, nothing fits.
  std::vector<std::pair<uint64_t, uint64_t>> least_and_peak;
  uint64_t least_sum = 0;
  for (const PeriodicCurve& c : curves) {
    const auto [lo, hi] = std::minmax_element(c.steps.begin(), c.steps.end(), [](const auto& a, const auto& b) {
      return a.second < b.second;
    });
    least_and_peak.emplace_back(lo->second, hi->second);
    least_sum += lo->second;
  }
  for (const auto& [least, peak] : least_and_peak) {
    const uint64_t at_its_peak = least_sum - least + peak;
    if (at_its_peak > budget_bytes) {
      result.shortfall_bytes = std::max(result.shortfall_bytes, at_its_peak - budget_bytes);
    }
  }
  if (result.shortfall_bytes > 0) {
    *out = std::move(result);
    return Status::ok();
  }
  const uint64_t longest = longest_period(curves);
  uint64_t summed = 0;
  for (const PeriodicCurve& c : curves) summed += c.period_ns;
  for (uint64_t step = 0;; ++step) {
    const uint64_t cycle = longest + longest * step / kStretchStepsPerPeriod;
    if (cycle > summed) break;
    const OffsetSearch fit = search_offsets(cells_at(curves, cycle), budget_bytes);
    if (fit.peak != UINT64_MAX) {
      result.found = true;
      result.cycle_ns = cycle;
      result.peak_bytes = fit.peak;
      result.offsets_ns = offsets_of(fit, curves.size(), cycle);
      break;
    }
  }
  *out = std::move(result);
  return Status::ok();
}

}  // namespace zico::simulate
