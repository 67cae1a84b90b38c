#include "segment_bound.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace zico::prefetch {
namespace {

constexpr size_t kNever = SIZE_MAX;
constexpr uint64_t kSearchPageVisits = 100'000'000;

uint64_t transfer_ns(uint64_t bytes, double per_s) {
  return static_cast<uint64_t>(std::floor(static_cast<double>(bytes) / per_s * 1e9));
}

}  // namespace

SegmentBound segment_bound(const AccessStream& stream, uint64_t budget_bytes, const TransferModel& model,
                           uint32_t max_segment_ops) {
  const size_t mark = stream_facts(stream).steady_first_event;
  const size_t blocks = stream.blocks.size();

  // Each block's first use (an event index, over the whole stream).
  std::vector<size_t> first_use(blocks, kNever);
  // The last iteration's ops; positions: 0 the mark, k the start of op k - 1,
  // n + 1 the iteration's end. frees_after[p]: the blocks freed after
  // position p and before the next one.
  std::vector<size_t> op_event;
  std::vector<std::vector<uint32_t>> frees_after(1);
  for (size_t i = 0; i < stream.events.size(); ++i) {
    const StreamEvent& e = stream.events[i];
    if (e.kind == StreamEvent::Kind::kFree && i > mark) frees_after.back().push_back(e.index);
    if (e.kind != StreamEvent::Kind::kOp) continue;
    for (const uint32_t b : stream.op_blocks(stream.ops[e.index])) first_use[b] = std::min(first_use[b], i);
    if (i > mark) {
      op_event.push_back(i);
      frees_after.emplace_back();
    }
  }
  const size_t n = op_event.size();
  SegmentBound bound;
  if (n == 0) return bound;
  const auto op_at = [&](size_t position) -> const StreamOp& {
    return stream.ops[stream.events[op_event[position - 1]].index];
  };
  const auto starts_at = [&](size_t position) { return position == 0 ? mark : op_event[position - 1]; };

  // For each page an op uses, when the oldest of the op's blocks on it was
  // first used: the page held data from then on (indexed like page_refs).
  std::vector<size_t> data_since(stream.page_refs.size(), kNever);
  std::vector<size_t> oldest_on_page(stream.page_count, kNever);
  for (size_t position = 1; position <= n; ++position) {
    const StreamOp& op = op_at(position);
    for (const uint32_t b : stream.op_blocks(op)) {
      const BlockExtent& block = stream.blocks[b];
      for (PageId page = stream.first_page(block); page <= stream.last_page(block); ++page) {
        oldest_on_page[page] = std::min(oldest_on_page[page], first_use[b]);
      }
    }
    for (uint32_t r = op.first_ref; r < op.first_ref + op.ref_count; ++r) {
      data_since[r] = oldest_on_page[stream.page_refs[r]];
      oldest_on_page[stream.page_refs[r]] = kNever;
    }
  }

  std::vector<uint64_t> compute_before(n + 1, 0);  // compute of ops 0 .. k - 1
  for (size_t k = 0; k < n; ++k) {
    compute_before[k + 1] = compute_before[k] + stream.ops[stream.events[op_event[k]].index].duration_ns;
  }
  const uint64_t budget_pages = budget_bytes / stream.page_bytes;
  const auto room_at = [&](size_t position) -> uint64_t {
    if (position == 0 || position == n + 1) return budget_pages;
    const uint64_t own = op_at(position).ref_count;
    return budget_pages > own ? budget_pages - own : 0;
  };
  size_t reach = max_segment_ops;
  if (reach == 0) {
    const uint64_t refs = std::max<uint64_t>(1, stream.page_refs.size() * n / std::max<size_t>(1, stream.ops.size()));
    reach = static_cast<size_t>(std::max<uint64_t>(8, kSearchPageVisits / refs));
  }
  reach = std::min(reach, n + 1);

  // Compute from the iteration's start to the start of position p.
  const auto before = [&](size_t position) -> int64_t {
    return position == 0 ? 0 : static_cast<int64_t>(compute_before[position - 1]);
  };
  const auto copy_in_ns = [&](uint64_t pages, uint64_t room) -> int64_t {
    return static_cast<int64_t>(transfer_ns((pages > room ? pages - room : 0) * stream.page_bytes, model.h2d_bytes_per_s));
  };

  // best[p]: the largest sum over chains of segments from the mark to p.
  struct Chain {
    uint64_t ns = 0, in_bytes = 0, out_bytes = 0;
    uint32_t segments = 0;
  };
  std::vector<Chain> best(n + 2);
  // Per page, for the segments from the current a: whether it is among the
  // pages to bring in, how many live blocks used since a it holds, and its
  // last use since a (in last_use_count while it holds any). Per position:
  // how many such pages were last used there.
  std::vector<uint32_t> in_stamp(stream.page_count, 0), block_stamp(blocks, 0), holders(stream.page_count, 0);
  std::vector<uint32_t> last_use(stream.page_count, 0), last_use_count(n + 2, 0);
  std::vector<PageId> touched;
  for (size_t a = 0; a <= n; ++a) {
    const uint32_t stamp = static_cast<uint32_t>(a + 1);
    const size_t last_b = std::min(a + reach, n + 1);
    uint64_t in_pages = 0, out_pages = 0;  // out: pages holding a live block used since a
    int64_t in_slack = INT64_MIN;           // max over k of (copying what k and earlier need in) - before(k)
    const auto join = [&](size_t position) {
      const StreamOp& op = op_at(position);
      for (const uint32_t b : stream.op_blocks(op)) {
        if (block_stamp[b] == stamp) continue;
        block_stamp[b] = stamp;
        const BlockExtent& block = stream.blocks[b];
        for (PageId page = stream.first_page(block); page <= stream.last_page(block); ++page) {
          if (holders[page]++ == 0) {
            ++out_pages;
            touched.push_back(page);
            last_use[page] = static_cast<uint32_t>(position);
            ++last_use_count[position];
          }
        }
      }
      for (const PageId page : stream.pages(op)) {
        if (holders[page] == 0 || last_use[page] == position) continue;
        --last_use_count[last_use[page]];
        last_use[page] = static_cast<uint32_t>(position);
        ++last_use_count[position];
      }
    };
    const auto leave = [&](size_t position) {
      for (const uint32_t b : frees_after[position]) {
        if (block_stamp[b] != stamp) continue;
        const BlockExtent& block = stream.blocks[b];
        for (PageId page = stream.first_page(block); page <= stream.last_page(block); ++page) {
          if (--holders[page] == 0) {
            --out_pages;
            --last_use_count[last_use[page]];
          }
        }
      }
    };
    // The least time from a's start to b's start in which every page beyond
    // b's room leaves, each after its last use: the pages last used at k or
    // later cannot start before op k ends. b's own pages stay.
    const auto out_ns = [&](size_t b, uint64_t leaving) -> int64_t {
      const uint64_t room = room_at(b);
      int64_t ns = before(b) - before(a);
      if (leaving <= room) return ns;
      if (b <= n) {
        for (const PageId page : stream.pages(op_at(b))) {
          if (holders[page] > 0) --last_use_count[last_use[page]];
        }
      }
      uint64_t later = 0;
      for (size_t k = b; k-- > a;) {
        later += last_use_count[k];
        const auto copy = static_cast<int64_t>(
            transfer_ns((later > room ? later - room : 0) * stream.page_bytes, model.d2h_bytes_per_s));
        ns = std::max(ns, before(k + 1) - before(a) + copy);
      }
      if (b <= n) {
        for (const PageId page : stream.pages(op_at(b))) {
          if (holders[page] > 0) ++last_use_count[last_use[page]];
        }
      }
      return ns;
    };

    if (a > 0) {
      for (const PageId page : stream.pages(op_at(a))) in_stamp[page] = stamp;  // on the GPU at a's start
      join(a);
    }
    leave(a);
    const size_t start = starts_at(a);
    for (size_t b = a + 1; b <= last_b; ++b) {
      uint64_t leaving = out_pages;
      if (b <= n) {
        // The pages b needs that held data before a started arrive after
        // a's start and before b's: with those of earlier ops, beyond a's
        // room, they bound the time to b's start.
        const StreamOp& op = op_at(b);
        for (uint32_t r = op.first_ref; r < op.first_ref + op.ref_count; ++r) {
          const PageId page = stream.page_refs[r];
          if (holders[page] > 0) --leaving;  // on the GPU at b's start anyway
          if (in_stamp[page] != stamp && data_since[r] < start) {
            in_stamp[page] = stamp;
            ++in_pages;
          }
        }
        in_slack = std::max(in_slack, copy_in_ns(in_pages, room_at(a)) - before(b));
      }
      const int64_t in_ns = in_slack == INT64_MIN ? 0 : in_slack + before(b);
      const uint64_t in_bytes = (in_pages > room_at(a) ? in_pages - room_at(a) : 0) * stream.page_bytes;
      const uint64_t out_bytes = (leaving > room_at(b) ? leaving - room_at(b) : 0) * stream.page_bytes;
      // The out time is at most the compute plus every copy: skip its scan
      // when even that would not lengthen the best chain to b.
      const int64_t at_most = before(b) - before(a) + static_cast<int64_t>(transfer_ns(out_bytes, model.d2h_bytes_per_s));
      const int64_t known = std::max(before(b) - before(a), in_ns);
      if (best[a].ns + static_cast<uint64_t>(std::max(known, at_most)) >= best[b].ns) {
        const auto ns = static_cast<uint64_t>(std::max(known, out_ns(b, leaving)));
        if (best[a].ns + ns >= best[b].ns) {
          best[b] = {best[a].ns + ns, best[a].in_bytes + in_bytes, best[a].out_bytes + out_bytes,
                     best[a].segments + 1};
        }
      }
      if (b <= n) {
        join(b);
        leave(b);
      }
    }
    for (const PageId page : touched) holders[page] = 0;
    touched.clear();
    std::fill(last_use_count.begin() + static_cast<ptrdiff_t>(a), last_use_count.begin() + static_cast<ptrdiff_t>(last_b) + 1, 0);
  }
  bound.iteration_ns = best[n + 1].ns;
  bound.segments = best[n + 1].segments;
  bound.in_bytes = best[n + 1].in_bytes;
  bound.out_bytes = best[n + 1].out_bytes;
  return bound;
}

}  // namespace zico::prefetch
