#include "lifetime_plan.h"

#include <algorithm>
#include <numeric>

namespace zico::replay {
namespace {

// A lifetime in event positions of the observed iteration, [born, dies);
// a wrapping block also occupies [first, wraps_to).
struct Interval {
  size_t slot = 0;
  uint64_t bytes = 0;  // rounded to kPlanAlign
  size_t born = 0;
  size_t dies = 0;
  size_t wraps_to = 0;  // 0: no wrap
};

bool overlap(size_t a_begin, size_t a_end, size_t b_begin, size_t b_end) { return a_begin < b_end && b_begin < a_end; }

bool coexist(const Interval& a, const Interval& b, size_t first) {
  if (overlap(a.born, a.dies, b.born, b.dies)) return true;
  if (a.wraps_to != 0 && overlap(first, a.wraps_to, b.born, b.dies)) return true;
  if (b.wraps_to != 0 && overlap(first, b.wraps_to, a.born, a.dies)) return true;
  return a.wraps_to != 0 && b.wraps_to != 0;  // both hold the iteration's start
}

uint64_t round_up(uint64_t value) { return (value + kPlanAlign - 1) / kPlanAlign * kPlanAlign; }

}  // namespace

LifetimePlan plan_iteration(const trace::Trace& trace, uint32_t iteration) {
  LifetimePlan plan;
  plan.observed_iteration = iteration;
  const auto& starts = trace.iteration_starts;
  if (iteration >= starts.size()) return plan;
  const size_t first = starts[iteration];
  const size_t last = iteration + 1 < starts.size() ? starts[iteration + 1] : trace.events.size();
  const size_t next_last = iteration + 2 < starts.size() ? starts[iteration + 2] : trace.events.size();

  // Slots in allocation order; lifetimes as event positions.
  std::vector<Interval> intervals;
  std::vector<size_t> interval_of_block(trace.blocks.size(), SIZE_MAX);
  for (size_t e = first; e < last; ++e) {
    const trace::Event& event = trace.events[e];
    if (event.kind == trace::Event::Kind::kAllocate) {
      const trace::Block& block = trace.blocks[event.index];
      const bool wraps = block.free_iteration == iteration + 1 && iteration + 1 < starts.size();
      const bool planned = !block.persistent() || wraps;
      plan.slots.push_back({block.bytes, planned, 0});
      if (planned) {
        interval_of_block[event.index] = intervals.size();
        intervals.push_back({plan.slots.size() - 1, round_up(block.bytes), e, last, 0});
      }
    } else if (event.kind == trace::Event::Kind::kFree && interval_of_block[event.index] != SIZE_MAX) {
      intervals[interval_of_block[event.index]].dies = e;
    }
  }
  // Deaths in the next iteration, mapped back onto this one's positions.
  for (size_t e = last; e < next_last; ++e) {
    const trace::Event& event = trace.events[e];
    if (event.kind != trace::Event::Kind::kFree || interval_of_block[event.index] == SIZE_MAX) continue;
    intervals[interval_of_block[event.index]].wraps_to = std::min(first + (e - last) + 1, last);
  }

  // The lower bound: the most bytes of planned blocks ever live at once.
  std::vector<std::pair<size_t, int64_t>> changes;
  for (const Interval& i : intervals) {
    changes.emplace_back(i.born, static_cast<int64_t>(i.bytes));
    changes.emplace_back(i.dies, -static_cast<int64_t>(i.bytes));
    if (i.wraps_to != 0) {
      changes.emplace_back(first, static_cast<int64_t>(i.bytes));
      changes.emplace_back(i.wraps_to, -static_cast<int64_t>(i.bytes));
    }
  }
  std::sort(changes.begin(), changes.end());  // frees (negative) before births at the same position
  int64_t live = 0;
  for (const auto& [position, delta] : changes) {
    live += delta;
    plan.lower_bound_bytes = std::max(plan.lower_bound_bytes, static_cast<uint64_t>(live));
  }

  // Largest first; each at the lowest offset clear of every placed block it coexists with.
  std::vector<size_t> order(intervals.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return intervals[a].bytes > intervals[b].bytes; });
  struct Placed {
    uint64_t offset, end;
    size_t interval;
  };
  std::vector<Placed> placed;
  std::vector<const Placed*> conflicts;
  for (size_t index : order) {
    const Interval& interval = intervals[index];
    conflicts.clear();
    for (const Placed& p : placed) {
      if (coexist(intervals[p.interval], interval, first)) conflicts.push_back(&p);
    }
    std::sort(conflicts.begin(), conflicts.end(), [](const Placed* a, const Placed* b) { return a->offset < b->offset; });
    uint64_t offset = 0;
    for (const Placed* p : conflicts) {
      if (offset + interval.bytes <= p->offset) break;
      offset = std::max(offset, p->end);
    }
    placed.push_back({offset, offset + interval.bytes, index});
    plan.slots[interval.slot].offset = offset;
    plan.arena_bytes = std::max(plan.arena_bytes, offset + interval.bytes);
  }
  return plan;
}

}  // namespace zico::replay
