// DemandCurve: how much memory one job holds over one iteration, as the
// time-shift scheduler sees it.
//
// An iteration of `period_ns` is cut into kDemandBins equal bins; each bin
// holds the most bytes live at any moment inside it (so the curve never
// under-states demand, and two curves added bin by bin bound the real sum).
// Phase 0 is the start of an iteration: the explicit hint
// (zico_mark_iteration, the trace's `i` record) or, without hints, the
// trough of the detected period (usage_tracker.h).
//
// The bytes are split into three classes, measured at the curve's peak:
//  - persistent: live across an iteration boundary (weights, optimizer
//    state); the floor a job keeps while it waits between iterations;
//  - transient: born and dead within the iteration (activations);
//  - workspace: transient blocks shorter-lived than a small fraction of the
//    period (kernel scratch), the first thing to give back under pressure.
//
// Fixed size on purpose: the node client sends it to zico-umd in one message
// and the scheduler compares curves bin by bin without allocating.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace zico::sharing {

inline constexpr size_t kDemandBins = 128;

struct DemandCurve {
  uint64_t period_ns = 0;  // 0: no pattern learned yet
  std::array<uint64_t, kDemandBins> bins{};
  uint64_t persistent_bytes = 0;  // at the peak
  uint64_t transient_bytes = 0;   // at the peak, workspace excluded
  uint64_t workspace_bytes = 0;   // at the peak
  uint64_t end_bytes = 0;         // live when the iteration ended: held while it waits for the next

  [[nodiscard]] bool known() const { return period_ns > 0; }
  [[nodiscard]] uint64_t bin_ns() const { return period_ns / kDemandBins > 0 ? period_ns / kDemandBins : 1; }
  // The bin holding `phase_ns` (ns since the iteration began); phases at or
  // past the period fall in the last bin.
  [[nodiscard]] size_t bin_of(uint64_t phase_ns) const;
  [[nodiscard]] uint64_t peak() const;
  [[nodiscard]] uint64_t trough() const;
  // The most bytes over the bins from the one holding `phase_ns` to the end.
  [[nodiscard]] uint64_t max_from(uint64_t phase_ns) const;
};

// True if `next` differs enough from `previous` that plans made on `previous`
// are stale: a pattern appeared or vanished, the period moved by more than
// `tolerance` (a fraction), or the peak or any bin moved by more than
// `tolerance` of the larger peak.
[[nodiscard]] bool materially_different(const DemandCurve& previous, const DemandCurve& next, double tolerance);

}  // namespace zico::sharing
