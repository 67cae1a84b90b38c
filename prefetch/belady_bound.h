// The paging lower bound: the fewest bytes any policy must bring to the GPU.
//
// Belady's MIN (evict the page used farthest in the future, among those the
// op does not use: min_replacement.h) makes the fewest fetches of any
// replacement policy on a known stream, and prefetching cannot do better
// than the fewest fetches, only hide them. A page whose blocks all died and
// were discarded holds nothing: its next touch populates it for free. Each
// life of a page (from its first touch until all its blocks are freed) is
// therefore a separate item, whose first reference costs nothing.
//
// With per-direction bandwidth B, an iteration cannot be faster than
// max(its compute, bytes MIN fetches in it / B).
#pragma once

#include <cstdint>
#include <vector>

#include "access_stream.h"

namespace zico::prefetch {

// Bytes MIN fetches in each iteration (index: iteration number; ops before
// the first mark count in iteration 0) with `budget_pages` page slots.
[[nodiscard]] std::vector<uint64_t> belady_fetch_bytes(const AccessStream& stream, uint32_t budget_pages);

}  // namespace zico::prefetch
