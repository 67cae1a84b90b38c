#include "access_stream.h"

#include <algorithm>
#include <vector>

namespace zico::prefetch {

StreamFacts stream_facts(const AccessStream& stream) {
  StreamFacts facts;
  uint64_t live = 0;
  uint64_t compute = 0;
  // Blocks share pages: a page holds live bytes while any of its blocks lives.
  std::vector<uint32_t> live_blocks_on(stream.page_count, 0);
  uint32_t live_pages = 0;
  for (size_t i = 0; i < stream.events.size(); ++i) {
    const StreamEvent& e = stream.events[i];
    switch (e.kind) {
      case StreamEvent::Kind::kAllocate: {
        const BlockExtent& block = stream.blocks[e.index];
        live += block.bytes;
        facts.peak_live_bytes = std::max(facts.peak_live_bytes, live);
        for (PageId page = stream.first_page(block); block.bytes != 0 && page <= stream.last_page(block); ++page) {
          if (live_blocks_on[page]++ == 0) ++live_pages;
        }
        facts.peak_live_pages = std::max(facts.peak_live_pages, live_pages);
        break;
      }
      case StreamEvent::Kind::kFree: {
        const BlockExtent& block = stream.blocks[e.index];
        live -= block.bytes;
        for (PageId page = stream.first_page(block); block.bytes != 0 && page <= stream.last_page(block); ++page) {
          if (--live_blocks_on[page] == 0) --live_pages;
        }
        break;
      }
      case StreamEvent::Kind::kOp: {
        const StreamOp& op = stream.ops[e.index];
        facts.max_op_pages = std::max(facts.max_op_pages, op.ref_count);
        compute += op.duration_ns;
        break;
      }
      case StreamEvent::Kind::kIteration:
        facts.steady_first_event = i;
        compute = 0;
        break;
    }
  }
  facts.steady_compute_ns = compute;
  return facts;
}

std::string stream_error(const AccessStream& stream) {
  if (stream.page_bytes == 0) return "page size 0";
  std::vector<uint8_t> block_state(stream.blocks.size(), 0);  // 0 new, 1 live, 2 freed
  std::vector<uint32_t> live_blocks_on(stream.page_count, 0);
  uint32_t marks = 0;
  size_t op_count = 0;
  for (const StreamEvent& e : stream.events) {
    switch (e.kind) {
      case StreamEvent::Kind::kAllocate:
      case StreamEvent::Kind::kFree: {
        if (e.index >= stream.blocks.size()) return "block " + std::to_string(e.index) + " out of range";
        const bool allocate = e.kind == StreamEvent::Kind::kAllocate;
        uint8_t& state = block_state[e.index];
        if (state != (allocate ? 0 : 1)) {
          return "block " + std::to_string(e.index) + (allocate ? " allocated twice" : " freed while not live");
        }
        state = allocate ? 1 : 2;
        const BlockExtent& b = stream.blocks[e.index];
        if (b.bytes == 0 || b.offset + b.bytes > uint64_t{stream.page_count} * stream.page_bytes) {
          return "block " + std::to_string(e.index) + " is empty or lies beyond the last page";
        }
        for (PageId p = stream.first_page(b); p <= stream.last_page(b); ++p) {
          if (allocate) {
            ++live_blocks_on[p];
          } else {
            --live_blocks_on[p];
          }
        }
        break;
      }
      case StreamEvent::Kind::kOp: {
        if (e.index >= stream.ops.size()) return "op " + std::to_string(e.index) + " out of range";
        ++op_count;
        const StreamOp& op = stream.ops[e.index];
        if (size_t{op.first_ref} + op.ref_count > stream.page_refs.size() ||
            size_t{op.first_block} + op.block_count > stream.block_refs.size()) {
          return "op " + std::to_string(e.index) + " refers past the end of its lists";
        }
        const std::span<const PageId> pages = stream.pages(op);
        for (size_t i = 0; i < pages.size(); ++i) {
          if (pages[i] >= stream.page_count) return "op " + std::to_string(e.index) + " uses a page out of range";
          if (i > 0 && pages[i] <= pages[i - 1]) return "op " + std::to_string(e.index) + " pages not sorted";
          if (live_blocks_on[pages[i]] == 0) {
            return "op " + std::to_string(e.index) + " uses page " + std::to_string(pages[i]) + " with no live block";
          }
        }
        for (const uint32_t block : stream.op_blocks(op)) {
          if (block >= stream.blocks.size() || block_state[block] != 1) {
            return "op " + std::to_string(e.index) + " uses block " + std::to_string(block) + " that is not live";
          }
        }
        break;
      }
      case StreamEvent::Kind::kIteration:
        if (e.index != marks) return "iteration mark " + std::to_string(e.index) + " out of sequence";
        ++marks;
        break;
    }
  }
  if (marks != stream.iterations) return "iteration count does not match the marks";
  if (op_count == 0) return "no ops";
  return {};
}

}  // namespace zico::prefetch
