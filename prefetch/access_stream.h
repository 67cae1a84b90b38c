// AccessStream: one job's use of GPU memory as the paging planners see it.
//
// Memory is a range of pages (the UM block, 2 MiB by default; 64 KiB models
// finer faults) numbered densely from the job's lowest address. Blocks are
// the allocations laid out in that range; an op (one kernel) uses a set of
// pages, the pages of every block it reads or writes. Events come in program
// order: allocate, free, op, iteration mark. The planners' own interface
// (paging_policy.h) is fed the same events one at a time; this struct holds a
// whole recorded stream, for the simulator, the lower bound and tests.
//
// The UM runtime builds these events from the arena's addresses and the
// launches it observes; tools build them from a trace (tools/page).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace zico::prefetch {

using PageId = uint32_t;

struct BlockExtent {
  uint64_t offset = 0;  // bytes from the start of page 0
  uint64_t bytes = 0;
};

// The pages a block overlaps, [first_page, last_page], and its bytes on one
// of them, for pages of `page_bytes`.
[[nodiscard]] inline PageId first_page(const BlockExtent& block, uint64_t page_bytes) {
  return static_cast<PageId>(block.offset / page_bytes);
}
[[nodiscard]] inline PageId last_page(const BlockExtent& block, uint64_t page_bytes) {
  return static_cast<PageId>((block.offset + block.bytes - 1) / page_bytes);
}
[[nodiscard]] inline uint64_t bytes_on_page(const BlockExtent& block, uint64_t page_bytes, PageId page) {
  const uint64_t lo = std::max(block.offset, uint64_t{page} * page_bytes);
  const uint64_t hi = std::min(block.offset + block.bytes, (uint64_t{page} + 1) * page_bytes);
  return hi > lo ? hi - lo : 0;
}

struct StreamOp {
  uint64_t exec_id = 0;      // the launch's identity: kernel and arguments, hashed
  uint64_t duration_ns = 0;  // compute time with every page resident
  uint32_t first_ref = 0;    // its pages are page_refs[first_ref, first_ref + ref_count)
  uint32_t ref_count = 0;
  uint32_t first_block = 0;  // its blocks are block_refs[first_block, first_block + block_count)
  uint32_t block_count = 0;
};

struct StreamEvent {
  enum class Kind : uint8_t { kAllocate, kFree, kOp, kIteration };
  Kind kind = Kind::kAllocate;
  uint32_t index = 0;  // block, op or iteration number
};

struct AccessStream {
  std::string name;
  uint64_t page_bytes = 0;
  uint32_t page_count = 0;
  std::vector<BlockExtent> blocks;
  std::vector<StreamOp> ops;
  std::vector<PageId> page_refs;     // per op: sorted, no repeats
  std::vector<uint32_t> block_refs;  // per op: the blocks it reads or writes, no repeats
  std::vector<StreamEvent> events;
  uint32_t iterations = 0;  // iteration marks in `events`

  [[nodiscard]] std::span<const PageId> pages(const StreamOp& op) const {
    return {page_refs.data() + op.first_ref, op.ref_count};
  }
  [[nodiscard]] std::span<const uint32_t> op_blocks(const StreamOp& op) const {
    return {block_refs.data() + op.first_block, op.block_count};
  }
  // The pages a block overlaps: [first, last]; its bytes on `page`.
  [[nodiscard]] PageId first_page(const BlockExtent& block) const { return prefetch::first_page(block, page_bytes); }
  [[nodiscard]] PageId last_page(const BlockExtent& block) const { return prefetch::last_page(block, page_bytes); }
  [[nodiscard]] uint64_t bytes_on_page(const BlockExtent& block, PageId page) const {
    return prefetch::bytes_on_page(block, page_bytes, page);
  }
};

// Facts about a stream that bound what any budget can do.
struct StreamFacts {
  uint64_t peak_live_bytes = 0;      // the most block bytes live at once
  uint32_t peak_live_pages = 0;      // the most pages holding live bytes at once: what paging moves
  uint32_t max_op_pages = 0;         // the largest single op's working set, in pages
  uint64_t steady_compute_ns = 0;    // op time of the last iteration (the in-memory time)
  size_t steady_first_event = 0;     // where the last iteration's mark is in `events`
};
[[nodiscard]] StreamFacts stream_facts(const AccessStream& stream);

// Empty when the stream is well formed (every id in range, pages sorted and
// inside page_count, frees of live blocks, ops using pages of live blocks
// only... enough for the simulator to trust it); else what is wrong.
[[nodiscard]] std::string stream_error(const AccessStream& stream);

}  // namespace zico::prefetch
