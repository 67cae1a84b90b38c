#include "segment_bound.h"

#include <gtest/gtest.h>

#include <cmath>

#include "belady_bound.h"
#include "paging_streams.h"
#include "peak_bound.h"

namespace zico::prefetch {
namespace {

constexpr uint64_t kMiB = 1 << 20;

uint64_t copy_ns(uint64_t bytes, double per_s) {
  return static_cast<uint64_t>(std::floor(static_cast<double>(bytes) / per_s * 1e9));
}

// A 2 MiB weight and two 2 MiB moments (1 MiB pages); each iteration `lead_ns`
// of compute that uses nothing (none if 0), then `steps` 1 us ops on the
// weight and the moments in turn.
AccessStream alternating_moments(int iterations, uint64_t lead_ns, int steps) {
  testing::StreamBuilder b(kMiB);
  const uint32_t w = b.allocate(2 * kMiB);
  const uint32_t m1 = b.allocate(2 * kMiB);
  const uint32_t m2 = b.allocate(2 * kMiB);
  for (int it = 0; it < iterations; ++it) {
    b.mark();
    if (lead_ns != 0) b.op({}, lead_ns, 1);
    for (int k = 0; k < steps; ++k) b.op({w, k % 2 == 0 ? m1 : m2}, 1000, 2 + static_cast<uint64_t>(k));
  }
  return b.finish();
}

TEST(SegmentBound, IsTheComputeWhenEverythingFits) {
  testing::StreamBuilder b(kMiB);
  const uint32_t w = b.allocate(2 * kMiB);
  for (int it = 0; it < 2; ++it) {
    b.mark();
    const uint32_t a = b.allocate_at(2 * kMiB, kMiB);
    b.op({w, a}, 3000, 1);
    b.op({a}, 2000, 2);
    b.free(a);
  }
  const AccessStream s = b.finish();
  const SegmentBound bound = segment_bound(s, 8 * kMiB, TransferModel{});
  EXPECT_EQ(bound.iteration_ns, 5000u);
  EXPECT_EQ(bound.in_bytes, 0u);
  EXPECT_EQ(bound.out_bytes, 0u);
}

TEST(SegmentBound, ChargesEachSwitchOfAShortPhaseThatTheOtherBoundsSpreadOverTheIteration) {
  // An optimizer-like tail: four 1 us ops alternate between two 2 MiB
  // moments beside a 2 MiB weight, with 4 MiB of budget, after 100 us of
  // compute that uses nothing. Each switch must bring 2 MiB in (and take
  // 2 MiB out) within one 1 us op; the copies cannot hide in the 100 us.
  const AccessStream s = alternating_moments(3, 100000, 4);
  const TransferModel model;
  const SegmentBound bound = segment_bound(s, 4 * kMiB, model);
  const uint64_t swap = copy_ns(2 * kMiB, model.h2d_bytes_per_s);
  // The 100 us, then three segments of one switch each (the moment the
  // switch evicts leaves only once the op that used it has ended), then the
  // last op.
  EXPECT_EQ(bound.iteration_ns, 100000 + 3 * (1000 + swap) + 1000);
  EXPECT_EQ(bound.in_bytes, 6 * kMiB);
  EXPECT_EQ(bound.out_bytes, 6 * kMiB);
  // Belady's 8 MiB and the peak bound see the same bytes spread over the
  // whole iteration, where the 100 us would hide them.
  const auto fetched = belady_fetch_bytes(s, 4);
  EXPECT_LT(std::max(copy_ns(fetched.back(), model.h2d_bytes_per_s), uint64_t{104000}), bound.iteration_ns);
  EXPECT_LT(peak_bound(s, 4 * kMiB, model).iteration_ns(), bound.iteration_ns);
}

TEST(SegmentBound, NeitherFetchesFreshPagesNorWritesBackFreedOnes) {
  // A 3 MiB activation made, used twice and freed inside 3 MiB of budget
  // beside a 1 MiB weight: the weight must leave between the end of its op
  // and the activation's first, and come back after the activation's last
  // op starts and before the weight's next. The activation's pages start
  // empty (nothing to bring in) and die before the weight's op (nothing to
  // take out).
  testing::StreamBuilder b(kMiB);
  const uint32_t w = b.allocate(kMiB);
  for (int it = 0; it < 2; ++it) {
    b.mark();
    b.op({w}, 1000, 1);
    const uint32_t a = b.allocate_at(kMiB, 3 * kMiB);
    b.op({a}, 1000, 2);
    b.op({a}, 1000, 3);
    b.free(a);
    b.op({w}, 1000, 4);
  }
  const AccessStream s = b.finish();
  const TransferModel model;
  const SegmentBound bound = segment_bound(s, 3 * kMiB, model);
  const uint64_t out = copy_ns(kMiB, model.d2h_bytes_per_s), in = copy_ns(kMiB, model.h2d_bytes_per_s);
  EXPECT_EQ(bound.iteration_ns, (1000 + out) + 1000 + in + 1000);
  EXPECT_EQ(bound.in_bytes, kMiB);
  EXPECT_EQ(bound.out_bytes, kMiB);
}

TEST(SegmentBound, ShorterSegmentsOnlyLoosenIt) {
  const AccessStream s = alternating_moments(2, 0, 6);
  const TransferModel model;
  uint64_t previous = 0;
  for (const uint32_t reach : {1u, 2u, 3u, 8u}) {
    const uint64_t ns = segment_bound(s, 4 * kMiB, model, reach).iteration_ns;
    EXPECT_GE(ns, previous) << reach;
    EXPECT_GE(ns, 6000u) << reach;
    previous = ns;
  }
}

}  // namespace
}  // namespace zico::prefetch
