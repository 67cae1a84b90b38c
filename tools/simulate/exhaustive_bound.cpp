#include "exhaustive_bound.h"

#include <algorithm>
#include <array>

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
  if (curves.empty() || curves.size() > kMaxBoundJobs) {
    return invalid(error, "the exhaustive bound takes 1 to " + std::to_string(kMaxBoundJobs) + " jobs, not " +
                              std::to_string(curves.size()));
  }
  uint64_t cycle = 0;
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
    cycle = std::max(cycle, c.period_ns);
  }

  std::vector<Cells> cells;
  ExhaustiveBound bound;
  bound.cycle_ns = cycle;
  for (const PeriodicCurve& c : curves) {
    cells.push_back(cell_maxima(c, cycle));
    bound.sum_of_peaks_bytes += *std::max_element(cells.back().begin(), cells.back().end());
  }
  // Job j at offset slot s: cycle cell k shows its cell k - s * kCellsPerSlot.
  const auto at = [&](size_t j, size_t slot, size_t k) {
    return cells[j][(k + kEvalCells - slot * kCellsPerSlot) % kEvalCells];
  };

  // The first two jobs' sum for every slot of job 1, then job 2 on top.
  const size_t slots1 = curves.size() >= 2 ? kOffsetSlots : 1;
  const size_t slots2 = curves.size() >= 3 ? kOffsetSlots : 1;
  std::vector<Cells> pair(slots1);
  for (size_t s1 = 0; s1 < slots1; ++s1) {
    for (size_t k = 0; k < kEvalCells; ++k) pair[s1][k] = cells[0][k] + (curves.size() >= 2 ? at(1, s1, k) : 0);
  }
  uint64_t best = UINT64_MAX;
  size_t best1 = 0;
  size_t best2 = 0;
  for (size_t s1 = 0; s1 < slots1; ++s1) {
    for (size_t s2 = 0; s2 < slots2; ++s2) {
      uint64_t peak = 0;
      for (size_t k = 0; k < kEvalCells && peak < best; ++k) {
        peak = std::max(peak, pair[s1][k] + (curves.size() >= 3 ? at(2, s2, k) : 0));
      }
      if (s1 == 0 && s2 == 0) {
        // The search stops early only below `best`: the aligned peak is exact.
        bound.aligned_peak_bytes = peak;
      }
      if (peak < best) {
        best = peak;
        best1 = s1;
        best2 = s2;
      }
    }
  }
  bound.peak_bytes = best;
  const auto offset = [cycle](size_t slot) {
    return cycle * slot / kOffsetSlots;
  };
  bound.offsets_ns.push_back(0);
  if (curves.size() >= 2) bound.offsets_ns.push_back(offset(best1));
  if (curves.size() >= 3) bound.offsets_ns.push_back(offset(best2));
  *out = std::move(bound);
  return Status::ok();
}

}  // namespace zico::simulate
