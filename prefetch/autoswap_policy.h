// AutoSwapPolicy: SINGA's AutoSwap (Zhang et al., arXiv 1903.06631), as a
// policy.
//
// AutoSwap plans whole tensors (blocks), once it has seen an iteration:
// - Candidates are blocks of at least kMinBlockBytes, each absence between two
//   uses (also from the last use of an iteration to the first of the next, for
//   blocks that live across it) long enough to swap the block out and in
//   again.
// - Each absence is scored by its area, duration of absence x size (AOA, one
//   of AutoSwap's scores), and picked greedily, best first, while the load
//   curve (live bytes per op, in-memory timeline) exceeds the budget, each
//   pick lowering the curve where the block is away (stick-to-limit mode);
//   a pick that lowers no point above the budget is skipped.
// - At run time the plan is a table indexed by the op's position in the
//   iteration: swap out at the end of the last use before the absence, swap
//   in at the op that starts when the copy must begin to finish before the
//   next use (the absence's end minus the swap-in time, on the in-memory
//   timeline).
// Blocks freed are discarded (AutoSwap manages explicit memory: a freed block
// is never copied). Until the first plan, and for whatever the plan misses,
// pages fault in on demand. AutoSwap thinks in tensor bytes, not pages: where
// blocks share a page its plan may not free what it counted (and the page is
// moved once, not once per block).
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "paging_policy.h"

namespace zico::prefetch {

class AutoSwapPolicy final : public PagingPolicy {
 public:
  static constexpr uint64_t kMinBlockBytes = uint64_t{1} << 20;

  AutoSwapPolicy(const Residency& residency, const TransferModel& model);
  [[nodiscard]] const char* name() const override { return "autoswap"; }

  void on_allocate(uint32_t block, const BlockExtent& extent, Decisions* out) override;
  void on_free(uint32_t block, const BlockExtent& extent, std::span<const PageId> dead, Decisions* out) override;
  void on_op_start(const OpView& op, Decisions* out) override;
  void on_op_end(const OpView& op, Decisions* out) override;
  void on_iteration(uint32_t n, Decisions* out) override;

 private:
  struct PageRange {
    PageId first = 0;
    PageId last = 0;
  };
  // What the iteration in progress did, for the next plan.
  struct Recording {
    std::vector<uint64_t> durations;                  // per op
    std::vector<std::vector<uint32_t>> op_blocks;     // per op
    std::vector<std::pair<uint32_t, bool>> changes;   // (block, allocated?) in order
    std::vector<uint32_t> change_op;                  // the op position each change came before
    std::unordered_map<uint32_t, BlockExtent> extents;  // every block live in it
    std::vector<uint32_t> live_at_start;              // blocks live when it began
  };

  void plan(const Recording& r);
  [[nodiscard]] PageRange pages_of(const BlockExtent& extent) const;
  static void add_pages(std::vector<PageRange>* ranges, PageRange range);

  const Residency& residency_;
  const TransferModel& model_;
  std::unordered_map<uint32_t, BlockExtent> live_;
  Recording recording_;
  bool recording_started_ = false;
  uint32_t position_ = 0;  // op position in the iteration in progress
  // The plan, by op position: swap-ins at the start, swap-outs at the end.
  std::vector<std::vector<PageRange>> in_at_start_;
  std::vector<std::vector<PageRange>> out_at_end_;
};

}  // namespace zico::prefetch
