#include "lifetime_plan.h"

#include <algorithm>
#include <numeric>

namespace zico::replay {
namespace {

struct Interval {
  size_t slot = 0;
  uint64_t bytes = 0;  // rounded to kPlanAlign
  size_t born = 0;     // event positions within the trace
  size_t dies = 0;
};

uint64_t round_up(uint64_t value) { return (value + kPlanAlign - 1) / kPlanAlign * kPlanAlign; }

}  // namespace

LifetimePlan plan_iteration(const trace::Trace& trace, uint32_t iteration) {
  LifetimePlan plan;
  plan.observed_iteration = iteration;
  if (iteration >= trace.iteration_starts.size()) return plan;
  const size_t first = trace.iteration_starts[iteration];
  const size_t last =
      iteration + 1 < trace.iteration_starts.size() ? trace.iteration_starts[iteration + 1] : trace.events.size();

  // Slots in allocation order; lifetimes as event positions.
  std::vector<Interval> intervals;
  std::vector<size_t> slot_of_block(trace.blocks.size(), SIZE_MAX);
  uint64_t live = 0;
  for (size_t e = first; e < last; ++e) {
    const trace::Event& event = trace.events[e];
    if (event.kind == trace::Event::Kind::kAllocate) {
      const trace::Block& block = trace.blocks[event.index];
      slot_of_block[event.index] = plan.slots.size();
      plan.slots.push_back({block.bytes, !block.persistent(), 0});
      if (!block.persistent()) {
        intervals.push_back({plan.slots.size() - 1, round_up(block.bytes), e, 0});
        live += block.bytes;
        plan.lower_bound_bytes = std::max(plan.lower_bound_bytes, live);
      }
    } else if (event.kind == trace::Event::Kind::kFree && slot_of_block[event.index] != SIZE_MAX &&
               plan.slots[slot_of_block[event.index]].planned) {
      live -= trace.blocks[event.index].bytes;
      // The matching interval is usually recent: search from the back.
      auto it = std::find_if(intervals.rbegin(), intervals.rend(),
                             [&](const Interval& i) { return i.slot == slot_of_block[event.index]; });
      it->dies = e;
    }
  }

  // Largest first; each at the lowest offset clear of every placed block it coexists with.
  std::vector<size_t> order(intervals.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return intervals[a].bytes > intervals[b].bytes; });
  struct Placed {
    uint64_t offset, end;
    size_t born, dies;
  };
  std::vector<Placed> placed;
  std::vector<const Placed*> conflicts;
  for (size_t index : order) {
    const Interval& interval = intervals[index];
    conflicts.clear();
    for (const Placed& p : placed) {
      if (p.born < interval.dies && interval.born < p.dies) conflicts.push_back(&p);
    }
    std::sort(conflicts.begin(), conflicts.end(), [](const Placed* a, const Placed* b) { return a->offset < b->offset; });
    uint64_t offset = 0;
    for (const Placed* p : conflicts) {
      if (offset + interval.bytes <= p->offset) break;
      offset = std::max(offset, p->end);
    }
    placed.push_back({offset, offset + interval.bytes, interval.born, interval.dies});
    plan.slots[interval.slot].offset = offset;
    plan.arena_bytes = std::max(plan.arena_bytes, offset + interval.bytes);
  }
  return plan;
}

}  // namespace zico::replay
