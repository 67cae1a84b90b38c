// Size classes for small blocks.
//
// Blocks up to kSmallMax bytes are rounded to a class and packed into pages
// of one class each (DeviceAllocator cuts chunks into pages), so many small
// tensors share one physical chunk and a class that holds a single block
// costs one page, not one chunk. Larger blocks are placed best-fit. Classes
// grow by quarter steps per power of two (512, 768, 1 KiB, 1.25 KiB, ...), so
// rounding wastes at most 25% and on average ~10%; every class is a multiple
// of 256 bytes, the alignment cudaMalloc guarantees. Lookup is one table read.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace zico {

inline constexpr size_t kMinBlock = 512;
inline constexpr size_t kSmallMax = size_t{64} << 10;
inline constexpr size_t kSmallPageMax = size_t{256} << 10;  // pages hold >= 4 blocks
inline constexpr size_t kBlockAlign = 256;

namespace detail {

inline constexpr size_t kMaxClasses = 64;

struct ClassTable {
  std::array<uint32_t, kMaxClasses> size{};
  std::array<uint64_t, kMaxClasses> reciprocal{};  // ceil(2^32 / size)
  size_t count = 0;
  // class index for each size in kBlockAlign steps: index = ceil(bytes / 256)
  std::array<uint8_t, kSmallMax / kBlockAlign + 1> by_quantum{};
};

constexpr ClassTable make_class_table() {
  ClassTable t;
  t.size[t.count++] = kMinBlock;
  for (size_t power = kMinBlock; power < kSmallMax; power *= 2) {
    for (size_t step = 1; step <= 4; ++step) {
      size_t s = power + step * (power / 4);
      s = (s + kBlockAlign - 1) / kBlockAlign * kBlockAlign;
      if (s > t.size[t.count - 1]) t.size[t.count++] = static_cast<uint32_t>(s);
    }
  }
  for (size_t c = 0; c < t.count; ++c) t.reciprocal[c] = ((uint64_t{1} << 32) + t.size[c] - 1) / t.size[c];
  size_t cls = 0;
  for (size_t q = 0; q < t.by_quantum.size(); ++q) {
    while (t.size[cls] < q * kBlockAlign) ++cls;
    t.by_quantum[q] = static_cast<uint8_t>(cls);
  }
  return t;
}

inline constexpr ClassTable kClassTable = make_class_table();

}  // namespace detail

inline constexpr size_t kNumSizeClasses = detail::kClassTable.count;

// Requires 0 < bytes <= kSmallMax.
[[nodiscard]] inline size_t size_class_of(size_t bytes) {
  return detail::kClassTable.by_quantum[(bytes + kBlockAlign - 1) / kBlockAlign];
}

[[nodiscard]] inline size_t size_class_bytes(size_t cls) { return detail::kClassTable.size[cls]; }

// offset / size_class_bytes(cls) without a division (allocation hot path);
// exact for offset < kSmallPageMax.
[[nodiscard]] inline size_t size_class_slot(size_t cls, size_t offset) {
  return static_cast<size_t>((offset * detail::kClassTable.reciprocal[cls]) >> 32);
}

static_assert(detail::kClassTable.size[0] == kMinBlock);
static_assert(kSmallPageMax * (uint64_t{1} << 32) / kMinBlock < (uint64_t{1} << 63), "slot math overflows");
static_assert(detail::kClassTable.size[kNumSizeClasses - 1] == kSmallMax);

}  // namespace zico
