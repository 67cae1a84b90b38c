#include "peak_bound.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace zico::prefetch {

PeakBound peak_bound(const AccessStream& stream, uint64_t budget_bytes, const TransferModel& model) {
  const StreamFacts facts = stream_facts(stream);
  const size_t start = facts.steady_first_event;
  const size_t blocks = stream.blocks.size();
  // Pass 1, the whole stream: which blocks are live and hold data when the
  // last iteration starts, where its peak is, and each block's last use.
  std::vector<bool> live(blocks, false), has_data(blocks, false), born_here(blocks, false);
  std::vector<size_t> last_use(blocks, 0);
  uint64_t live_bytes = 0, peak_bytes = 0;
  size_t peak = stream.events.size();
  for (size_t i = 0; i < stream.events.size(); ++i) {
    const StreamEvent& e = stream.events[i];
    if (e.kind == StreamEvent::Kind::kAllocate) {
      live[e.index] = true;
      live_bytes += stream.blocks[e.index].bytes;
      if (i >= start) born_here[e.index] = true;
    } else if (e.kind == StreamEvent::Kind::kFree) {
      live[e.index] = false;
      live_bytes -= stream.blocks[e.index].bytes;
    } else if (e.kind == StreamEvent::Kind::kOp && i >= start) {
      for (const uint32_t b : stream.op_blocks(stream.ops[e.index])) last_use[b] = i;
      if (live_bytes > peak_bytes) {
        peak_bytes = live_bytes;
        peak = i;
      }
    }
  }
  PeakBound bound;
  if (peak == stream.events.size()) return bound;

  // Pass 2: the state at the peak op, and the compute on either side.
  std::fill(live.begin(), live.end(), false);
  uint64_t compute_before = 0, compute_after = 0;
  for (size_t i = 0; i < stream.events.size(); ++i) {
    const StreamEvent& e = stream.events[i];
    if (i < peak) {
      if (e.kind == StreamEvent::Kind::kAllocate) live[e.index] = true;
      if (e.kind == StreamEvent::Kind::kFree) live[e.index] = false;
      if (e.kind == StreamEvent::Kind::kOp) {
        for (const uint32_t b : stream.op_blocks(stream.ops[e.index])) has_data[b] = true;
        if (i >= start) compute_before += stream.ops[e.index].duration_ns;
      }
    } else if (e.kind == StreamEvent::Kind::kOp) {
      compute_after += stream.ops[e.index].duration_ns;
    }
  }
  // Room for live data at the peak: the budget's whole pages.
  const uint64_t room = budget_bytes / stream.page_bytes * stream.page_bytes;
  uint64_t made_here = 0, needed_after = 0;
  for (size_t b = 0; b < blocks; ++b) {
    if (!live[b] || !has_data[b]) continue;
    if (born_here[b]) made_here += stream.blocks[b].bytes;
    if (last_use[b] >= peak) needed_after += stream.blocks[b].bytes;
  }
  auto ns = [](uint64_t bytes, double per_s) {
    return static_cast<uint64_t>(std::floor(static_cast<double>(bytes) / per_s * 1e9));
  };
  bound.out_bytes = made_here > room ? made_here - room : 0;
  bound.in_bytes = needed_after > room ? needed_after - room : 0;
  bound.before_ns = std::max(compute_before, ns(bound.out_bytes, model.d2h_bytes_per_s));
  bound.after_ns = std::max(compute_after, ns(bound.in_bytes, model.h2d_bytes_per_s));
  return bound;
}

}  // namespace zico::prefetch
