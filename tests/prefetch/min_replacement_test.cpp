#include "min_replacement.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <random>
#include <vector>

namespace zico::prefetch {
namespace {

uint64_t costly_misses(const MinReplacement& min, uint32_t items, uint32_t slots) {
  uint64_t count = 0;
  min.run(items, slots, [&](const MinReplacement::Miss& m) { count += m.first_touch ? 0 : 1; });
  return count;
}

// The optimum by exhaustive search: after each op the cache is any set that
// holds the op's items, fits the slots and came from the cache before plus
// the op's items; a miss on an item touched before costs one.
uint64_t brute_force(const std::vector<std::vector<uint32_t>>& ops, uint32_t items, uint32_t slots) {
  const uint32_t states = 1u << items;
  constexpr uint64_t kInf = UINT64_MAX / 2;
  std::vector<uint64_t> best(states, kInf);
  best[0] = 0;
  uint32_t touched = 0;
  for (const auto& op : ops) {
    uint32_t need = 0;
    for (const uint32_t i : op) need |= 1u << i;
    std::vector<uint64_t> next(states, kInf);
    for (uint32_t c = 0; c < states; ++c) {
      if (best[c] == kInf) continue;
      const uint64_t cost = best[c] + std::popcount(need & ~c & touched);
      const uint32_t pool = c | need;
      // Keep any subset of the pool that contains the op's items.
      for (uint32_t keep = pool;; keep = (keep - 1) & pool) {
        if ((keep & need) == need && std::popcount(keep) <= static_cast<int>(slots)) {
          next[keep] = std::min(next[keep], cost);
        }
        if (keep == 0) break;
      }
    }
    best = next;
    touched |= need;
  }
  return *std::min_element(best.begin(), best.end());
}

TEST(MinReplacement, EvictsTheItemUsedFarthestAhead) {
  MinReplacement min;
  const std::vector<std::vector<uint32_t>> ops = {{0}, {1}, {2}, {0}, {1}, {0}};
  for (const auto& op : ops) min.add_op(op);
  std::vector<MinReplacement::Miss> misses;
  min.run(3, 2, [&](const MinReplacement::Miss& m) { misses.push_back(m); });
  // Item 2 needs a slot: 0 is next used at op 3, 1 at op 4, so 1 goes.
  ASSERT_EQ(misses.size(), 4u);
  EXPECT_EQ(misses[2].item, 2u);
  EXPECT_EQ(misses[2].victim, 1u);
  EXPECT_EQ(misses[2].slot_free_after, 1u);
  EXPECT_EQ(misses[3].op, 4u);
  EXPECT_FALSE(misses[3].first_touch);
}

TEST(MinReplacement, NeverEvictsAnItemOfTheOpItServes) {
  MinReplacement min;
  min.add_op(std::vector<uint32_t>{0, 1});
  min.add_op(std::vector<uint32_t>{2, 0});  // 0 is used again by this op, and never after
  min.run(3, 2, [&](const MinReplacement::Miss& m) {
    if (m.item == 2) {
      EXPECT_EQ(m.victim, 1u);
    }
  });
}

TEST(MinReplacement, AReleasedItemFreesItsSlot) {
  MinReplacement min;
  min.add_op(std::vector<uint32_t>{0});
  min.add_op(std::vector<uint32_t>{1});
  min.add_release(0);
  min.add_op(std::vector<uint32_t>{2});
  min.run(3, 2, [&](const MinReplacement::Miss& m) { EXPECT_EQ(m.victim, MinReplacement::kNoItem); });
}

TEST(MinReplacement, MatchesTheExhaustiveOptimumOnRandomOps) {
  std::mt19937 rng(7);
  auto below = [&](uint32_t n) { return static_cast<uint32_t>(rng() % n); };
  for (int round = 0; round < 300; ++round) {
    const uint32_t items = 3 + below(5);  // up to 7 items: 128 cache states
    const uint32_t slots = 2 + below(items - 1);
    std::vector<std::vector<uint32_t>> ops;
    MinReplacement min;
    const uint32_t count = 4 + below(14);
    for (uint32_t k = 0; k < count; ++k) {
      std::vector<uint32_t> op;
      const uint32_t width = 1 + below(std::min(slots, 3u));
      while (op.size() < width) {
        const uint32_t i = below(items);
        if (std::find(op.begin(), op.end(), i) == op.end()) op.push_back(i);
      }
      ops.push_back(op);
      min.add_op(op);
    }
    ASSERT_EQ(costly_misses(min, items, slots), brute_force(ops, items, slots)) << "round " << round;
  }
}

}  // namespace
}  // namespace zico::prefetch
