// ZicoPolicy: zicoum's own paging planner.
//
// Training repeats itself: one iteration's launches, with the same arguments
// at the same addresses, come again in the next. The planner records each
// iteration's access stream (launch identities, the pages each uses, and the
// pages whose blocks all die) and, once a recorded iteration is there, plans
// the next as if it repeats (iteration_plan.h): Belady's replacements, the
// fewest bytes any policy can move, each fetch issued when its slot is free in
// Belady's schedule (with its victim's eviction, right after the victim's
// last use). So pages come in as early as the budget allows, and the two copy
// engines run while compute does. The plan leaves a 64th of the budget (up to
// 64 MiB) spare: the next planned pages that hold data go there before their
// victims leave, so a fetch need not wait for its victim's copy to the host.
// Each prefetch carries its need as its priority, so copies run in the order
// pages are needed.
// Dead pages are discarded and dropped as their last block is freed: no
// write-back, no fetch, and their slots serve the next pages at once.
//
// At run time the plan meets the residency as it is: a planned victim that
// is gone or needed sooner than planned is spared, and a page still missing
// when its op starts is fetched then, making room by next use (the resident
// page used farthest ahead leaves), never by evicting a page the op uses.
//
// Some jobs alternate between two iterations (an allocator whose placements
// settle into a 2-cycle, a model that alternates two kinds of step): when an
// iteration repeats the one two back instead of the last, twice in a row, the
// planner learns the two as one period of two iterations, planned as a
// whole, until it stops repeating. "Repeats" allows the drift below, and a
// period followed to its end through drift is learned again as it ran.
// Iterations come from the marks (on_iteration); a job that gives none has
// its launches' period found instead (period_detector.h), and the first mark
// switches that off for good.
// Each launch is checked against the prediction (same identity, same pages).
// A launch of the predicted kernel (same_kernel, exec_id.h: a block it uses
// may have moved, which changes its ID) whose pages differ is followed on
// while the iteration's differing page references (used where the
// prediction had none, or predicted and not used) are at most one in
// kDriftDivisor of the prediction's references: an allocator's placements drift
// by a page here and there from one iteration to the next (libzicoum's did
// on GPT-2 medium, never repeating with a period of one or two), and such a
// page is just fetched when its op needs it, its next use where the
// prediction uses it next. Any other mismatch switches the rest of the
// iteration to the cold path. Either way the iteration just seen becomes
// the next prediction. The cold path (also the
// first iteration) is demand paging with pre-eviction: least recently
// migrated pages leave early enough that a slot is free for the largest op
// seen so far, so faults do not wait on the driver's own evictions.
//
// Its input is one job's stream; several jobs on one GPU (TENSILE) would be
// planned by merging their streams, which this class does not do yet.
//
// Cost: building a plan runs MIN over three copies of the iteration, once per
// new prediction. Per op: O(its pages x log pages present) to re-key its
// pages, plus the planned fetches that fall due.
#pragma once

#include <cstdint>
#include <vector>

#include "iteration_plan.h"
#include "learned_iteration.h"
#include "next_use_index.h"
#include "period_detector.h"
#include "paging_policy.h"

namespace zico::prefetch {

// At most one page reference in this many, of the prediction's, may drift
// from it in an iteration that is followed (above). With none allowed,
// libzicoum's GPT-2 medium under half its peak never followed its plan: 0.91
// s an iteration against 0.34 s with 1 in 16 (ResNet-50 0.21 s against 0.10
// s; SimDriver's modelled clock); 1 in 64 and 1 in 4 gave the same steady
// iterations on the eight committed traces.
inline constexpr uint64_t kDriftDivisor = 16;

class ZicoPolicy final : public PagingPolicy {
 public:
  ZicoPolicy(const Residency& residency, const TransferModel& model);
  [[nodiscard]] const char* name() const override { return "zico"; }
  // What an op names it fetches, in the cold path too: it knows them.
  [[nodiscard]] bool fetches_named_pages() const override { return true; }

  void on_free(uint32_t block, const BlockExtent& extent, std::span<const PageId> dead, Decisions* out) override;
  void on_op_start(const OpView& op, Decisions* out) override;
  void on_iteration(uint32_t n, Decisions* out) override;
  [[nodiscard]] uint32_t found_iteration_ops() const override { return marked_ ? 0 : detector_.period(); }

  // The iteration in progress follows the prediction so far.
  [[nodiscard]] bool following() const { return following_; }

 private:
  void begin_iteration();
  // The launch is the predicted kernel and its pages drift from the
  // prediction's by little enough to follow on (kDriftDivisor).
  [[nodiscard]] bool drifts_a_little(const OpView& op);
  // Re-keys a drifted op's pages, and the prediction's pages it did not use.
  void rekey_drifted(const OpView& op);
  // The prediction (learned_ and plan_) changed: positions restart.
  void adopt_prediction();
  [[nodiscard]] int64_t available_slots() const;
  void rekey_present_pages(uint64_t after);
  void issue_due(uint64_t now, Decisions* out);
  void issue(const PlannedFetch& fetch, uint64_t need, Decisions* out);
  void fetch_missing(const OpView& op, uint64_t now, Decisions* out);
  void fill_spare_slots(uint64_t now, Decisions* out);
  // Evicts the present page used farthest ahead, if that is after `need`.
  [[nodiscard]] bool make_room(uint64_t need, Decisions* out);
  void evict(PageId page, Decisions* out);
  void pre_evict(Decisions* out);

  const Residency& residency_;
  PeriodDetector detector_;
  bool marked_ = false;  // marks arrive: no detection
  LearnedIteration recording_;
  LearnedIteration learned_;
  IterationPlan plan_;
  // The prediction before learned_, kept in case iterations alternate.
  LearnedIteration previous_;
  IterationPlan previous_plan_;
  uint32_t returns_ = 0;       // iterations in a row that repeated the one two back
  uint32_t period_ = 1;        // iterations per learned period: 2 once they alternate
  bool mid_period_ = false;    // a mark inside a period of two
  bool following_ = false;
  uint64_t pages_drifted_ = 0;  // page references this iteration that differ from the prediction's
  uint64_t iteration_base_ = 0;  // absolute position of this iteration's first op
  uint32_t position_ = 0;        // op position in this iteration
  size_t due_ = 0;       // next planned fetch of this iteration not yet issued
  size_t next_due_ = 0;  // and of the next one (those issued before it begins)
  size_t ahead_ = 0;  // the first planned fetch, by need, of this op or later
  uint32_t max_op_pages_ = 0;
  int64_t slots_ = 0;  // during a call: slots free or freeing, after this call's decisions
  NextUseIndex index_;        // present pages by next use (while following)
  std::vector<PageId> gone_;  // make_room's scratch
  // Stamps per page: pinned by the running op; prefetched or evicted in
  // this call.
  std::vector<uint64_t> pinned_;
  std::vector<uint64_t> prefetched_;
  std::vector<uint64_t> evicted_;
  uint64_t stamp_ = 0;
  uint32_t planned_budget_ = 0;  // the budget plan_ was built for: built again when it changes
  // Slots the plan leaves to fetches ahead of their victims.
  [[nodiscard]] uint32_t spare_pages() const;
  // Builds plan_ for learned_ and the budget as it is now.
  void build_plan();
};

}  // namespace zico::prefetch
