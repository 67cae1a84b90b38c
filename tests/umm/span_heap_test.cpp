#include "span_heap.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace zico {
namespace {

constexpr uintptr_t kBase = 0x10000000;

TEST(SpanHeap, PlacesBestFitAndCoalesces) {
  SpanHeap heap(VaRange{kBase, 1000 * 512});
  const uintptr_t a = *heap.allocate(100 * 512, 512);
  const uintptr_t b = *heap.allocate(10 * 512, 512);
  const uintptr_t c = *heap.allocate(50 * 512, 512);
  EXPECT_EQ(a, kBase);
  EXPECT_EQ(b, a + 100 * 512);
  EXPECT_EQ(c, b + 10 * 512);
  heap.free(a, 100 * 512);  // a hole of 100 before b
  // Best fit: a 60-unit request takes the 100-unit hole, not the big tail.
  EXPECT_EQ(*heap.allocate(60 * 512, 512), kBase);
  heap.free(kBase, 60 * 512);
  heap.free(b, 10 * 512);
  heap.free(c, 50 * 512);
  EXPECT_EQ(heap.span_count(), 1u) << "all spans merge back into one";
  EXPECT_EQ(heap.free_bytes(), 1000u * 512);
}

TEST(SpanHeap, HonoursAlignment) {
  const size_t chunk = size_t{2} << 20;
  SpanHeap heap(VaRange{kBase, 8 * chunk});
  ASSERT_TRUE(heap.allocate(512, 512).has_value());
  const uintptr_t aligned = *heap.allocate(chunk, chunk);
  EXPECT_EQ(aligned % chunk, 0u);
  EXPECT_EQ(heap.free_bytes(), 8 * chunk - chunk - 512);
}

TEST(SpanHeap, ReportsExhaustion) {
  SpanHeap heap(VaRange{kBase, 4096});
  EXPECT_FALSE(heap.allocate(8192, 512).has_value());
  EXPECT_TRUE(heap.allocate(4096, 512).has_value());
  EXPECT_FALSE(heap.allocate(512, 512).has_value());
}

TEST(SpanHeap, RandomOperationsConserveBytes) {
  const size_t total = 1 << 24;
  SpanHeap heap(VaRange{kBase, total});
  std::mt19937_64 rng(7);
  std::vector<std::pair<uintptr_t, size_t>> live;
  size_t used = 0;
  for (int op = 0; op < 20000; ++op) {
    if (!live.empty() && rng() % 2 == 0) {
      const size_t i = rng() % live.size();
      heap.free(live[i].first, live[i].second);
      used -= live[i].second;
      live[i] = live.back();
      live.pop_back();
    } else {
      const size_t bytes = (1 + rng() % 64) * 512;
      if (auto p = heap.allocate(bytes, 512)) {
        for (const auto& [addr, size] : live) ASSERT_FALSE((VaRange{addr, size}.overlaps(VaRange{*p, bytes})));
        live.emplace_back(*p, bytes);
        used += bytes;
      }
    }
    ASSERT_EQ(heap.free_bytes() + used, total);
  }
}

}  // namespace
}  // namespace zico

namespace zico {
namespace {

TEST(SpanHeap, TakesAnExactRangeAndReportsNeighbouringRuns) {
  SpanHeap heap(VaRange{kBase, 100 * 512});
  heap.take_range(kBase + 10 * 512, 20 * 512);  // splits one span into two
  EXPECT_EQ(heap.span_count(), 2u);
  EXPECT_EQ(heap.free_bytes(), 80u * 512);
  EXPECT_EQ(heap.free_run_ending_at(kBase + 10 * 512), 10u * 512);
  EXPECT_EQ(heap.free_run_starting_at(kBase + 30 * 512), 70u * 512);
  EXPECT_EQ(heap.free_run_starting_at(kBase + 31 * 512), 0u) << "only a span that starts exactly there";
  EXPECT_EQ(heap.free_run_ending_at(kBase + 30 * 512), 0u);
  heap.free(kBase + 10 * 512, 20 * 512);
  EXPECT_EQ(heap.span_count(), 1u);
}

TEST(SpanHeap, ZeroByteOperationsChangeNothing) {
  SpanHeap heap(VaRange{kBase, 8 * 512});
  const uintptr_t a = *heap.allocate(4 * 512, 512);
  heap.free(a + 4 * 512, 0);
  heap.take_range(a + 4 * 512, 0);
  EXPECT_EQ(heap.span_count(), 1u);
  EXPECT_EQ(heap.free_bytes(), 4u * 512);
  heap.free(a, 4 * 512);
  EXPECT_EQ(heap.span_count(), 1u);
}

}  // namespace
}  // namespace zico

namespace zico {
namespace {

TEST(SpanHeap, PlacesAtEitherEndOfTheChosenSpan) {
  SpanHeap heap(VaRange{kBase, 100 * 512});
  const uintptr_t high = *heap.allocate(10 * 512, 512, SpanHeap::End::kHigh);
  EXPECT_EQ(high, kBase + 90 * 512);
  const uintptr_t low = *heap.allocate(10 * 512, 512, SpanHeap::End::kLow);
  EXPECT_EQ(low, kBase);
  const size_t chunk = 4096;
  const uintptr_t aligned = *heap.allocate(chunk, chunk, SpanHeap::End::kHigh);
  EXPECT_EQ(aligned % chunk, 0u);
  EXPECT_LE(aligned + chunk, kBase + 90 * 512);
}

}  // namespace
}  // namespace zico
