// LearnedIteration: one recorded iteration of a job's access stream, and the
// question the zico planner keeps asking of it: when is this page next used?
//
// Positions count ops. An absolute position is iteration x L + position in
// the iteration (L ops per iteration), so a prediction runs on across
// iteration boundaries by assuming the next iteration repeats this one.
// next_use() is a binary search in the page's sorted use positions.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "access_stream.h"

namespace zico::prefetch {

inline constexpr uint64_t kNoUse = UINT64_MAX;

// The pages in one sorted list and not the other, counted both ways: how far
// an op's pages drift from another's.
[[nodiscard]] uint64_t differing_pages(std::span<const PageId> a, std::span<const PageId> b);

class LearnedIteration {
 public:
  // Recording, one op at a time.
  void add_op(uint64_t exec_id, uint64_t duration_ns, std::span<const PageId> pages);
  // The page's last live block was freed before the next op.
  void add_death(PageId page) { deaths_.emplace_back(ops(), page); }
  void clear();
  // Keeps only the last `ops` ops recorded (and the deaths among them): a
  // period found in a longer recording.
  void keep_last(uint32_t ops);
  // Appends `next`'s ops and deaths after this one's: a period of two
  // iterations. Call finish() again afterwards.
  void append(const LearnedIteration& next);
  // Builds the per-page use lists; call once the iteration is complete.
  void finish(uint32_t page_count);

  [[nodiscard]] uint32_t ops() const { return static_cast<uint32_t>(exec_ids_.size()); }
  // Page references over all its ops.
  [[nodiscard]] uint64_t page_refs() const { return refs_.size(); }
  [[nodiscard]] bool empty() const { return exec_ids_.empty(); }
  [[nodiscard]] uint64_t exec_id(uint32_t position) const { return exec_ids_[position]; }
  [[nodiscard]] std::span<const PageId> pages(uint32_t position) const {
    return {refs_.data() + first_ref_[position], first_ref_[position + 1] - first_ref_[position]};
  }
  // (position of the op it came before, page), in order.
  [[nodiscard]] const std::vector<std::pair<uint32_t, PageId>>& deaths() const { return deaths_; }
  // The same exec ids and pages, op by op.
  [[nodiscard]] bool same_as(const LearnedIteration& other) const;
  // The same kernels, op by op (their blocks may have moved: same_kernel
  // in exec_id.h), and the page references that differ (in
  // one and not the other) at most one in `divisor` of this one's.
  [[nodiscard]] bool close_to(const LearnedIteration& other, uint64_t divisor) const;
  // Does op `position` match this launch?
  [[nodiscard]] bool matches(uint32_t position, uint64_t exec_id, std::span<const PageId> pages) const;

  // In-memory time from the start of absolute position `from` to the start
  // of `to` (from <= to), from the recorded durations.
  [[nodiscard]] uint64_t time_between(uint64_t from, uint64_t to) const;

  // The first absolute position after `after` at which `page` is used, or
  // kNoUse if no op of the iteration uses it.
  [[nodiscard]] uint64_t next_use(PageId page, uint64_t after) const;
  // The same for the i-th page of op `position`, in O(1): positions after
  // the start of that op's iteration, from position + 1 to position + L.
  [[nodiscard]] uint32_t next_use_of(uint32_t position, size_t i) const {
    return next_of_ref_[first_ref_[position] + i];
  }

 private:
  std::vector<uint64_t> exec_ids_;
  std::vector<uint64_t> durations_;
  std::vector<uint64_t> start_ns_;  // per position, then the iteration's total (after finish())
  std::vector<uint32_t> first_ref_{0};
  std::vector<PageId> refs_;
  std::vector<std::pair<uint32_t, PageId>> deaths_;
  // Per page, the positions that use it: uses_[use_start_[p] .. use_start_[p + 1]).
  std::vector<uint32_t> use_start_;
  std::vector<uint32_t> uses_;
  std::vector<uint32_t> next_of_ref_;  // per page reference: its page's next use
};

}  // namespace zico::prefetch
