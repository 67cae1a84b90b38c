// What a copy from the host tells of a pointer table (prefetch/pointer_table.h).
#include "pointer_table.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

namespace zico::prefetch {
namespace {

constexpr VaRange kArena{uintptr_t{0x7f0000000000}, uintptr_t{1} << 30};

std::vector<std::byte> words(const std::vector<uint64_t>& values, size_t offset = 0) {
  std::vector<std::byte> bytes(offset + values.size() * sizeof(uint64_t));
  std::memcpy(bytes.data() + offset, values.data(), values.size() * sizeof(uint64_t));
  return bytes;
}

TEST(PointerTable, AnArrayOfAddressesNamesEachOnce) {
  const uint64_t a = kArena.base + 0x1000, b = kArena.base + (uint64_t{3} << 20);
  std::vector<uintptr_t> out;
  arena_addresses(words({b, a, b, a}), kArena.base, kArena, &out);
  EXPECT_EQ(out, (std::vector<uintptr_t>{a, b}));
}

TEST(PointerTable, AStructOfAddressesAndSizesIsATableDataIsNot) {
  const uint64_t a = kArena.base + 0x2000;
  std::vector<uintptr_t> out;
  // A multi-tensor kernel's table: an address, then sizes and indices (one word in four an address).
  arena_addresses(words({a, 4096, 7, 0, a + 64, 4096, 7, 1}), kArena.base, kArena, &out);
  EXPECT_EQ(out.size(), 2u);
  // Data with one word that happens to fall in the arena among 64: no table.
  std::vector<uint64_t> data(64);
  std::mt19937_64 random(7);
  for (uint64_t& word : data) word = random() % 1000000;
  data[10] = a;
  arena_addresses(words(data), kArena.base, kArena, &out);
  EXPECT_TRUE(out.empty());
  // Nothing in the arena at all.
  arena_addresses(words({1, 2, kArena.end(), kArena.base - 8}), kArena.base, kArena, &out);
  EXPECT_TRUE(out.empty());
}

TEST(PointerTable, WordsAreReadWhereTheyLandAligned) {
  const uint64_t a = kArena.base + 0x3000;
  std::vector<uintptr_t> out;
  // Landing 4 bytes past an 8-byte boundary: the device's words start 4 bytes in.
  arena_addresses(words({a, a + 8}, 4), kArena.base + 4, kArena, &out);
  EXPECT_EQ(out, (std::vector<uintptr_t>{a, a + 8}));
  // Read as if aligned at the start instead, the same bytes hold no address.
  arena_addresses(words({a, a + 8}, 4), kArena.base, kArena, &out);
  EXPECT_TRUE(out.empty());
}

TEST(PointerTable, OnlyTheFirstBytesAreRead) {
  const uint64_t a = kArena.base + 0x4000;
  std::vector<uint64_t> values(kTableBytesRead / sizeof(uint64_t) + 16, 0);
  values.back() = a;  // beyond what is read
  std::vector<uintptr_t> out;
  arena_addresses(words(values), kArena.base, kArena, &out);
  EXPECT_TRUE(out.empty());
}

}  // namespace
}  // namespace zico::prefetch
