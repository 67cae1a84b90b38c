// Pointer tables: device memory that holds addresses of other blocks.
//
// A kernel can reach blocks through pointers kept in device memory (batched
// GEMMs' pointer arrays, a multi-tensor kernel's table of tensors) that its
// launch does not name. Such a table usually reaches the device by a copy
// from the host, which zicoum observes, and whose bytes the host still holds
// when the copy is made: the words among them that are addresses in the
// arena name the blocks the table reaches (the pager names those blocks for
// every kernel that names the table: UmPager::on_pointer_table).
//
// A copy of data (activations, token ids) holds few words that happen to
// fall in the arena's addresses, so a table must be mostly addresses:
// at least one word in kTableShare of those read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "types.h"

namespace zico::prefetch {

// The largest copy from the host read for addresses (a table of 8192
// blocks): larger ones are data.
inline constexpr size_t kTableBytesRead = size_t{64} << 10;
// At least one word in this many read must be an address in the arena.
inline constexpr size_t kTableShare = 8;

// The addresses in `arena` among the 8-byte words of `bytes` (the host's
// copy of what lands at `destination` on the device; its first
// kTableBytesRead; words aligned as they will be there), each once, sorted,
// into *out; nothing when they are too few to make a table.
// May throw bad_alloc.
void arena_addresses(std::span<const std::byte> bytes, uintptr_t destination, VaRange arena,
                     std::vector<uintptr_t>* out);

}  // namespace zico::prefetch
