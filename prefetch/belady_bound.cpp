#include "belady_bound.h"

#include <algorithm>

#include "min_replacement.h"

namespace zico::prefetch {
namespace {

constexpr uint32_t kNone = UINT32_MAX;

// Adds or removes a block's bytes on each page it overlaps; `died` collects
// the pages left without live bytes.
void count_live(const AccessStream& s, const BlockExtent& block, bool add, std::vector<uint64_t>* live,
                std::vector<PageId>* died) {
  for (PageId page = s.first_page(block); page <= s.last_page(block); ++page) {
    const uint64_t bytes = s.bytes_on_page(block, page);
    if (add) {
      (*live)[page] += bytes;
    } else {
      (*live)[page] -= bytes;
      if ((*live)[page] == 0) died->push_back(page);
    }
  }
}

}  // namespace

std::vector<uint64_t> belady_fetch_bytes(const AccessStream& stream, uint32_t budget_pages) {
  // The reference string: one item per page life, and the iteration of each op.
  MinReplacement min;
  std::vector<uint32_t> op_iteration;
  std::vector<uint32_t> life(stream.page_count, kNone);
  std::vector<uint64_t> live(stream.page_count, 0);
  std::vector<PageId> died;
  std::vector<uint32_t> items;
  uint32_t lives = 0;
  uint32_t iteration = 0;
  bool marked = false;
  for (const StreamEvent& e : stream.events) {
    switch (e.kind) {
      case StreamEvent::Kind::kAllocate: count_live(stream, stream.blocks[e.index], true, &live, &died); break;
      case StreamEvent::Kind::kFree:
        died.clear();
        count_live(stream, stream.blocks[e.index], false, &live, &died);
        for (const PageId page : died) {
          if (life[page] != kNone) min.add_release(life[page]);
          life[page] = kNone;
        }
        break;
      case StreamEvent::Kind::kIteration:
        if (marked) ++iteration;
        marked = true;
        break;
      case StreamEvent::Kind::kOp:
        items.clear();
        for (const PageId page : stream.pages(stream.ops[e.index])) {
          if (life[page] == kNone) life[page] = lives++;
          items.push_back(life[page]);
        }
        min.add_op(items);
        op_iteration.push_back(iteration);
        break;
    }
  }
  std::vector<uint64_t> fetched(size_t{iteration} + 1, 0);
  min.run(lives, budget_pages, [&](const MinReplacement::Miss& miss) {
    if (!miss.first_touch) fetched[op_iteration[miss.op]] += stream.page_bytes;
  });
  return fetched;
}

}  // namespace zico::prefetch
