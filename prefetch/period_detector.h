// PeriodDetector: finds a training loop's iteration in its stream of
// launches when the program marks none (no zico_mark_iteration, no trace
// marks).
//
// A steady training loop launches the same kernels on the same tensors in
// the same order every iteration, so its execution IDs repeat with the
// iteration's length as period. For each launch, the distance back to the
// last launch with the same ID is a candidate period; the detector follows
// the few most recent candidates and counts, for each, how many launches in
// a row equal the one a period earlier. A candidate whose run covers a
// whole period (so the last two periods are identical) and is at least
// `min_period` launches is the period: the smallest such one is taken.
// Loops inside an iteration rarely repeat their IDs, because their tensors
// differ. Once found, every `period` launches is a boundary; the first
// launch that differs from the one a period earlier drops it, and the search
// starts again.
//
// Cost per launch: O(candidates) plus a hash lookup; memory: the last
// 2 x max_period IDs.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace zico::prefetch {

class PeriodDetector {
 public:
  explicit PeriodDetector(uint32_t min_period = 8, uint32_t max_period = 1u << 16);

  // Adds the next launch; true when an iteration begins with it.
  [[nodiscard]] bool add(uint64_t exec_id);
  // The period in launches, 0 while none is known.
  [[nodiscard]] uint32_t period() const { return period_; }

 private:
  static constexpr size_t kCandidates = 8;
  [[nodiscard]] uint64_t at(uint64_t index) const { return history_[index % history_.size()]; }

  uint32_t min_period_;
  uint32_t max_period_;
  std::vector<uint64_t> history_;  // ring of the last 2 x max_period IDs
  uint64_t count_ = 0;             // launches seen
  std::unordered_map<uint64_t, uint64_t> last_seen_;  // ID -> its last launch index
  struct Candidate {
    uint32_t period = 0;
    uint32_t run = 0;  // launches in a row equal to the one a period earlier
  };
  std::array<Candidate, kCandidates> candidates_{};
  size_t next_slot_ = 0;
  uint32_t period_ = 0;
  uint64_t phase_ = 0;  // a boundary falls on launches with index % period_ == phase_
};

}  // namespace zico::prefetch
