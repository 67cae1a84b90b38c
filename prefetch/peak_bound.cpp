#include "peak_bound.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

namespace zico::prefetch {
namespace {

constexpr size_t kNone = SIZE_MAX;

uint64_t transfer_ns(uint64_t bytes, double per_s) {
  return static_cast<uint64_t>(std::floor(static_cast<double>(bytes) / per_s * 1e9));
}

}  // namespace

PeakBound peak_bound(const AccessStream& stream, uint64_t budget_bytes, const TransferModel& model) {
  const size_t start = stream_facts(stream).steady_first_event;
  size_t previous_start = kNone;  // the mark before the last one
  for (size_t i = 0; i < start; ++i) {
    if (stream.events[i].kind == StreamEvent::Kind::kIteration) previous_start = i;
  }
  // The peak: the op of the last iteration at whose start the most bytes are live.
  uint64_t live_bytes = 0, peak_bytes = 0;
  size_t peak = kNone;
  for (size_t i = 0; i < stream.events.size(); ++i) {
    const StreamEvent& e = stream.events[i];
    if (e.kind == StreamEvent::Kind::kAllocate) live_bytes += stream.blocks[e.index].bytes;
    if (e.kind == StreamEvent::Kind::kFree) live_bytes -= stream.blocks[e.index].bytes;
    if (e.kind == StreamEvent::Kind::kOp && i >= start && live_bytes > peak_bytes) {
      peak_bytes = live_bytes;
      peak = i;
    }
  }
  PeakBound bound;
  if (peak == kNone) return bound;

  // Each block's state at the peak: live, its last use before it, whether
  // an op uses it after it; and the compute on either side.
  const size_t blocks = stream.blocks.size();
  std::vector<bool> live(blocks, false), used_after(blocks, false);
  std::vector<size_t> last_use(blocks, kNone);
  // Compute of the previous iteration after each of its ops ends, to the mark.
  std::vector<uint64_t> tail_after;
  uint64_t before = 0, after = 0, previous_total = 0;
  for (size_t i = 0; i < stream.events.size(); ++i) {
    const StreamEvent& e = stream.events[i];
    if (i < peak && e.kind == StreamEvent::Kind::kAllocate) live[e.index] = true;
    if (i < peak && e.kind == StreamEvent::Kind::kFree) live[e.index] = false;
    if (e.kind != StreamEvent::Kind::kOp) continue;
    const StreamOp& op = stream.ops[e.index];
    for (const uint32_t b : stream.op_blocks(op)) {
      if (i < peak) {
        last_use[b] = i;
      } else {
        used_after[b] = true;
      }
    }
    if (i >= peak) {
      after += op.duration_ns;
    } else if (i >= start) {
      before += op.duration_ns;
    } else if (previous_start != kNone && i > previous_start) {
      previous_total += op.duration_ns;
    }
  }
  // Slack of a use in the previous iteration: the compute that ran after it
  // there, during which its block could already be copied out.
  std::vector<uint64_t> done_at(stream.events.size(), 0);
  if (previous_start != kNone) {
    uint64_t t = 0;
    for (size_t i = previous_start + 1; i < start; ++i) {
      const StreamEvent& e = stream.events[i];
      if (e.kind == StreamEvent::Kind::kOp) t += stream.ops[e.index].duration_ns;
      done_at[i] = t;
    }
  }

  // Pages, as paging moves them: a page holds data at the peak if a live
  // block on it does; it was on the GPU at each of those blocks' uses, so if
  // it is on the host at the peak it was copied out after the latest of
  // them (its slack: the least of theirs). Room for such pages: the budget's
  // pages less the peak op's pages that hold no data yet (its outputs, first
  // used there), which it needs on the GPU beside whatever data stays.
  constexpr uint64_t kUncounted = UINT64_MAX;
  std::vector<bool> holds_data(stream.page_count, false), needed(stream.page_count, false);
  std::vector<uint64_t> slack_of(stream.page_count, kUncounted);
  for (size_t b = 0; b < blocks; ++b) {
    if (!live[b] || last_use[b] == kNone) continue;  // not live, or no data yet
    uint64_t slack = kUncounted;  // last used too long ago to tell
    if (last_use[b] >= start) {
      slack = 0;
    } else if (previous_start != kNone && last_use[b] > previous_start) {
      slack = previous_total - done_at[last_use[b]];
    }
    const BlockExtent& block = stream.blocks[b];
    for (PageId page = stream.first_page(block); page <= stream.last_page(block); ++page) {
      holds_data[page] = true;
      if (used_after[b]) needed[page] = true;
      slack_of[page] = std::min(slack_of[page], slack);
    }
  }
  uint64_t fresh = 0;
  for (const PageId page : stream.pages(stream.ops[stream.events[peak].index])) {
    if (!holds_data[page]) fresh += stream.page_bytes;
  }
  const uint64_t pages = budget_bytes / stream.page_bytes * stream.page_bytes;
  const uint64_t room = pages > fresh ? pages - fresh : 0;
  std::vector<std::pair<uint64_t, uint64_t>> out;  // (slack ns, bytes)
  uint64_t needed_after = 0;
  for (PageId page = 0; page < stream.page_count; ++page) {
    if (needed[page]) needed_after += stream.page_bytes;
    if (slack_of[page] != kUncounted) out.emplace_back(slack_of[page], stream.page_bytes);
  }
  // Taking the pages of least slack first: each prefix bounds the time
  // before the peak by its bytes beyond the room, less its largest slack.
  std::sort(out.begin(), out.end());
  uint64_t sum = 0, best = 0;
  for (const auto& [slack, bytes] : out) {
    sum += bytes;
    if (sum <= room) continue;
    bound.out_bytes = std::max(bound.out_bytes, sum - room);
    const uint64_t ns = transfer_ns(sum - room, model.d2h_bytes_per_s);
    if (ns > slack) best = std::max(best, ns - slack);
  }
  bound.in_bytes = needed_after > room ? needed_after - room : 0;
  bound.before_ns = std::max(before, best);
  bound.after_ns = std::max(after, transfer_ns(bound.in_bytes, model.h2d_bytes_per_s));
  return bound;
}

}  // namespace zico::prefetch
