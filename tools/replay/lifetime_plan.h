// LifetimePlan: an offline layout for one iteration's transient blocks.
//
// SmartPool (arXiv 1903.06631) observes that a training iteration repeats
// its allocations, so after seeing one iteration the allocator can solve the
// layout offline: each transient block (born and dead within the iteration)
// has a size and a lifetime; two blocks may share addresses only if their
// lifetimes do not overlap. Placing them optimally is NP-complete (dynamic
// storage allocation); the heuristic here is the paper's: blocks in
// descending size, each at the lowest offset that collides with no already
// placed block whose lifetime overlaps its own (first fit). Cost O(n^2) in
// the number of planned blocks of the iteration.
//
// Blocks that live into the next iteration and die there (gradients: made in
// backward, dropped by the next zero_grad) are planned too, as the paper
// places cross-iteration blocks: their lifetime wraps around, from their birth
// to the end of the iteration and from its start to their death, measured in
// the next iteration. Leaving them to the online allocator scatters them
// across chunks that the plan's region can no longer share.
//
// Later iterations are served by allocation ordinal: the n-th allocation of
// an iteration takes the n-th slot of the plan if its size matches.
#pragma once

#include <cstdint>
#include <vector>

#include "trace.h"

namespace zico::replay {

inline constexpr uint64_t kPlanAlign = 512;

struct PlanSlot {
  uint64_t bytes = 0;  // requested size seen in the observed iteration
  bool planned = false;  // transient or wrapping, so it has an offset
  uint64_t offset = 0;
};

struct LifetimePlan {
  uint32_t observed_iteration = 0;
  uint64_t arena_bytes = 0;      // the region the plan needs
  uint64_t lower_bound_bytes = 0;  // peak of the planned blocks' live bytes: no layout needs less
  std::vector<PlanSlot> slots;     // one per allocation of the iteration, in order
};

// Plans `iteration` of `trace`; an iteration with no transient blocks gives
// an empty plan.
[[nodiscard]] LifetimePlan plan_iteration(const trace::Trace& trace, uint32_t iteration);

}  // namespace zico::replay
