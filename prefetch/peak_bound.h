// The peak bound: a lower bound on the steady iteration that sees why
// training pages out in two waves.
//
// Take the op at which the most bytes are live in the last iteration (the
// end of the forward pass). Live data there that does not fit the budget is
// on the host. A use puts a block's data on the GPU (an op runs on resident
// pages; a unified-memory page migrates, it is not copied), so:
// - of the pages holding data at the peak (a live block on them holds data)
//   and used since the iteration began, all but the room's worth were
//   copied to the host after that use: the time up to the peak is at least
//   those bytes over the device-to-host bandwidth, and at least the compute
//   before it. Pages last used near the end of the previous iteration (the
//   optimizer step) count too, less the compute that ran after their use
//   there (copies may overlap it): the bound takes the best prefix of pages
//   by that slack;
// - of the pages holding data at the peak and used after it, all but the
//   room's worth must come back after it: the time from the peak on is at
//   least those bytes over the host-to-device bandwidth, and its compute.
// The room is the budget's pages less the peak op's pages that hold no data
// yet (its outputs, first used there: they are on the GPU during the op).
// Whole pages, as paging moves them, so the bound holds for any policy that
// pages with the stream's page size; Belady's bound (belady_bound.h) holds
// too, and an iteration is at least the larger of the two.
#pragma once

#include <cstdint>

#include "access_stream.h"
#include "transfer_model.h"

namespace zico::prefetch {

struct PeakBound {
  uint64_t before_ns = 0;   // from the iteration's start to the peak op
  uint64_t after_ns = 0;    // from the peak op to the iteration's end
  uint64_t out_bytes = 0;   // bytes beyond the room at the peak that were on the GPU since
  uint64_t in_bytes = 0;    // bytes that must come back after it
  [[nodiscard]] uint64_t iteration_ns() const { return before_ns + after_ns; }
};

// Over the stream's last iteration, with `budget_bytes` of GPU memory.
[[nodiscard]] PeakBound peak_bound(const AccessStream& stream, uint64_t budget_bytes, const TransferModel& model);

}  // namespace zico::prefetch
