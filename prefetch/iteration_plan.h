// IterationPlan: what the zico planner will move during one iteration, and
// when it may start.
//
// Built from a learned iteration on the assumption that it repeats: Belady's
// replacements (min_replacement.h) over three copies of it, keeping the
// middle one's, when the first copy has brought the residency to where it
// stands in a steady loop. Each replacement is a fetch of a page for the op
// that needs it and, when the budget is full, the eviction of a victim that
// no op uses between the victim's last use and that need. So the pair can be
// issued right after that last use: as early as the budget allows, with the
// fewest bytes moved that any policy can move, and the copy engines busy for
// as long as the iteration lets them be. A pair whose victim was last used in
// the previous iteration is issued then (a negative issue position).
#pragma once

#include <cstdint>
#include <vector>

#include "learned_iteration.h"

namespace zico::prefetch {

inline constexpr PageId kNoPage = UINT32_MAX;

struct PlannedFetch {
  int64_t issue = 0;      // issue before the op at this position starts (may be < 0: the iteration before)
  uint32_t need = 0;      // the op that needs the page
  PageId page = 0;
  PageId victim = kNoPage;  // kNoPage: a slot is free
};

class IterationPlan {
 public:
  // `slots`: pages the budget holds. Replaces the previous plan.
  void build(const LearnedIteration& learned, uint32_t slots, uint32_t page_count);
  void clear() {
    fetches_.clear();
    by_need_.clear();
  }

  // By issue position, then need.
  [[nodiscard]] const std::vector<PlannedFetch>& fetches() const { return fetches_; }
  // Indices into fetches(), by need.
  [[nodiscard]] const std::vector<uint32_t>& by_need() const { return by_need_; }

 private:
  std::vector<PlannedFetch> fetches_;
  std::vector<uint32_t> by_need_;
};

}  // namespace zico::prefetch
