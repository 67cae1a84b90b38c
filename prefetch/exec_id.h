// Execution IDs: what names an op from one iteration to the next, for the
// paging policies and the period detector (period_detector.h).
//
// An op the caller names itself (zico_op_begin's op_id, a trace's op) has
// the caller's ID. A kernel launch, copy or memset observed in UM mode is
// named by the pager from two halves: the high 32 bits are the kernel's
// (its function and launch shape, or a copy's kind and size, hashed), the
// low 32 bits the blocks it uses, each by its start's offset in the arena,
// in the order its parameters name them. Without the blocks, every layer of
// a model built of identical layers (a transformer) would launch the same
// IDs, and a launch stream without marks would look one layer long.
//
// Block starts, not the pointers a kernel is given: a pointer inside a block
// (a view, a slice) may move within it from one iteration to the next while
// the kernel still uses the same block, and the pager pages whole blocks.
// Offsets in the arena, not addresses, so that the ID does not depend on
// where the arena was mapped. A block the allocator places elsewhere the
// next iteration (zicoum's allocator puts a few a page away, docs/
// benchmarks.md) changes the low half only: same_kernel() still holds, the
// zico planner follows its plan through that drift (zico_policy.h), and the
// period detector takes the launch for a stray one.
#pragma once

#include <cstdint>

namespace zico::prefetch {

// What the ID an op is announced with names.
enum class GivenId : uint8_t {
  kOp,      // the op across iterations (zico_op_begin's op_id, a trace's): taken as it is
  kKernel,  // the kernel only (a launch's function and shape, a copy's kind and size): its blocks are added
};

// Folds `value` into `hash` (boost's hash_combine with a 64-bit constant).
[[nodiscard]] constexpr uint64_t mix_id(uint64_t hash, uint64_t value) {
  return hash ^ (value + 0x9e3779b97f4a7c15ULL + (hash << 6) + (hash >> 2));
}

// Folds the next block's start offset into the blocks' hash (start it at 0).
[[nodiscard]] constexpr uint64_t add_block(uint64_t blocks, uint64_t start_offset) {
  return mix_id(blocks, start_offset);
}

// Spreads every bit of `hash` over all 64 (splitmix64's finalizer): mix_id
// leaves its high bits to few of the inputs' bits, and each half of an ID
// keeps only 32.
[[nodiscard]] constexpr uint64_t spread(uint64_t hash) {
  hash = (hash ^ (hash >> 30)) * 0xbf58476d1ce4e5b9ULL;
  hash = (hash ^ (hash >> 27)) * 0x94d049bb133111ebULL;
  return hash ^ (hash >> 31);
}

// A kernel's ID at its blocks: the kernel's hash above, the blocks' below.
[[nodiscard]] constexpr uint64_t exec_id_at(uint64_t kernel, uint64_t blocks) {
  return (spread(kernel) & 0xffff'ffff'0000'0000ULL) | (spread(blocks) >> 32);
}

// The same kernel, on the same blocks or not. For IDs the caller chose, a
// comparison of their high halves, all but as strict as equality.
[[nodiscard]] constexpr bool same_kernel(uint64_t a, uint64_t b) { return (a >> 32) == (b >> 32); }

}  // namespace zico::prefetch
