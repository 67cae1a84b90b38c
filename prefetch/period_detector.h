// PeriodDetector: finds a training loop's iteration in its stream of
// launches when the program marks none (no zico_mark_iteration, no trace
// marks).
//
// A steady training loop launches the same kernels on the same tensors in
// the same order every iteration, so its execution IDs repeat with the
// iteration as period. For each launch, the launch back to the last one with
// the same ID starts a candidate: an alignment of the launches from here on
// with those from there on. The detector follows the few most promising
// candidates; each launch lines up with the next launch of the period before
// or, stepping over up to kMaxSkip launches there, with one a little after
// it. A launch that lines up with nothing is a miss: a stray (a logging or
// metric kernel at irregular places), or a launch whose ID changed (a block
// placed elsewhere, exec_id.h). A candidate that misses more than kSlack
// plus one in kMatchesPerMiss of its matches is dropped. The first candidate
// whose launches line up with a whole period (at least `min_period`
// launches; the smallest if several do at once) is the period: the launch
// that lines up with the one that began the period before begins an
// iteration, and so on from then on, until the period followed misses too
// much (the loop changed) and the search starts again. Since IDs name the
// blocks kernels use (exec_id.h), a loop inside an iteration (the layers of
// a model) rarely repeats its IDs; one that does is taken for the iteration.
//
// Cost per launch: O(candidates x kMaxSkip) and a hash lookup while
// searching, O(kMaxSkip) once found; memory: the last 2 x max_period IDs.
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
  // Launches in the last iteration (strays included), 0 while none is known.
  [[nodiscard]] uint32_t period() const { return period_; }

 private:
  static constexpr size_t kCandidates = 8;
  static constexpr uint64_t kMaxSkip = 3;
  static constexpr uint32_t kSlack = 2;
  static constexpr uint32_t kMatchesPerMiss = 2;
  static constexpr uint64_t kNoMatch = UINT64_MAX;

  // Launches lined up with those a period before.
  struct Alignment {
    bool live = false;
    uint64_t begin = 0;  // the launch the period being lined up began with
    uint64_t next = 0;   // the launch a period before the next one
    uint32_t matched = 0;
    uint32_t missed = 0;
  };

  [[nodiscard]] uint64_t at(uint64_t index) const { return history_[index % history_.size()]; }
  // Lines launch `index` up in `a`: the launch a period before it, or
  // kNoMatch (a miss). `previous`: the ID's last launch before, if any.
  uint64_t line_up(Alignment* a, uint64_t index, uint64_t exec_id, uint64_t previous) const;
  // Whether `a` may be followed on after launch `index`.
  [[nodiscard]] bool holds(const Alignment& a, uint64_t index) const;
  // Whether launch `index`, lined up with `counterpart` after `from`, begins
  // the period after the one `a` lines up.
  [[nodiscard]] static bool closes(const Alignment& a, uint64_t from, uint64_t counterpart) {
    return counterpart != kNoMatch && from <= a.begin && a.begin <= counterpart;
  }
  // A new candidate: launch `index` lined up with `last`, its ID's last launch.
  void search(uint64_t index, uint64_t last);

  uint32_t min_period_;
  uint32_t max_period_;
  std::vector<uint64_t> history_;  // ring of the last 2 x max_period IDs
  uint64_t count_ = 0;             // launches seen
  std::unordered_map<uint64_t, uint64_t> last_seen_;  // ID -> its last launch index
  std::array<Alignment, kCandidates> candidates_{};
  Alignment found_;   // the period followed, while period_ != 0
  uint32_t period_ = 0;
};

}  // namespace zico::prefetch
