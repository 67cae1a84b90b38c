// The segment bound: a lower bound on the steady iteration that sees phases
// where many pages are used in little compute (an optimizer step that reads
// every parameter, gradient and moment in a few ops).
//
// Cut the iteration at the starts of some of its ops (the pivots). At the
// start of pivot op a, the GPU holds a's pages and at most the room beside
// them (the budget's pages less a's): a page moving in or out holds its
// slot too. So, between the starts of consecutive pivots a and b:
// - in: every page a later op up to and including b uses, not one of a's,
//   that held data before a started, is either in the room at a or copied
//   in after a started and before the first op that uses it starts (the
//   room keeps those needed first);
// - out: every page an op from a up to b (excluded) used that still holds
//   a live block's data at b's start, not one of b's, is either in the room
//   at b or was copied out after its last use there ended (the room keeps
//   those used last).
// So the segment takes at least its compute, and for each op k in it, the
// copies in that k and the ops before it need, then the compute from k on;
// and the compute up to k, then the copies out of the pages used at k or
// later. The segments tile the iteration (its mark and its end act as
// pivots using no pages), so the iteration takes at least their sum,
// whichever pivots are chosen. The bound picks them by dynamic programming
// over the ops. Both directions are counted at their full rates, each alone.
//
// The peak bound (peak_bound.h) is one pivot with slack carried from the
// previous iteration; this one chains many, each without slack. Neither
// implies the other: an iteration is at least the larger.
#pragma once

#include <cstdint>

#include "access_stream.h"
#include "transfer_model.h"

namespace zico::prefetch {

struct SegmentBound {
  uint64_t iteration_ns = 0;  // the sum of the chosen segments' lower bounds
  uint32_t segments = 0;      // how many segments the best chain has
  uint64_t in_bytes = 0;      // bytes the chain's segments must copy in
  uint64_t out_bytes = 0;     // and out
};

// Over the stream's last iteration, with `budget_bytes` of GPU memory.
// Segments span at most `max_segment_ops` ops (0: derived from the stream's
// size so that the search stays near 10^8 page visits); fewer candidates
// only loosen the bound, never break it.
[[nodiscard]] SegmentBound segment_bound(const AccessStream& stream, uint64_t budget_bytes,
                                         const TransferModel& model, uint32_t max_segment_ops = 0);

}  // namespace zico::prefetch
