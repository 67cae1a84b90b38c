#include "peak_bound.h"

#include <gtest/gtest.h>

#include "paging_streams.h"

#include <algorithm>

namespace zico::prefetch {
namespace {

TEST(PeakBound, CountsWhatMustLeaveBeforeThePeakAndComeBackAfter) {
  // Iteration: make three 1 MiB activations (forward), then use them in
  // reverse (backward) and free them. With 2 MiB of room, of which the peak
  // op's new activation takes 1 MiB, 1 MiB must leave before the peak and
  // come back after it.
  constexpr uint64_t kMiB = 1 << 20;
  testing::StreamBuilder b(kMiB);
  for (int it = 0; it < 2; ++it) {
    b.mark();
    const uint32_t a0 = b.allocate_at(0, kMiB);
    b.op({a0}, 1000, 1);
    const uint32_t a1 = b.allocate_at(kMiB, kMiB);
    b.op({a0, a1}, 1000, 2);
    const uint32_t a2 = b.allocate_at(2 * kMiB, kMiB);
    b.op({a1, a2}, 1000, 3);  // the peak: 3 MiB live
    b.op({a2, a1}, 1000, 4);
    b.free(a2);
    b.op({a1, a0}, 1000, 5);
    b.free(a1);
    b.free(a0);
  }
  const AccessStream s = b.finish();
  const TransferModel model;
  const PeakBound bound = peak_bound(s, 2 * kMiB, model);
  // Before op 3 starts: a0 and a1 hold data and were made this iteration
  // (a2 has none yet, but op 3 needs it on the GPU): 2 MiB, 1 MiB fits
  // beside a2. After: a0, a1 are used again.
  EXPECT_EQ(bound.out_bytes, kMiB);
  EXPECT_EQ(bound.in_bytes, kMiB);
  EXPECT_GE(bound.before_ns, 2000u);  // at least the compute before the peak
  EXPECT_EQ(bound.before_ns, std::max<uint64_t>(2000, static_cast<uint64_t>(kMiB / model.d2h_bytes_per_s * 1e9)));
  EXPECT_EQ(peak_bound(s, 8 * kMiB, model).iteration_ns(), 5000u);  // everything fits: compute alone
}

TEST(PeakBound, CountsStateTheLastStepWroteLessWhatItsTailCouldHide) {
  // A 4 MiB optimizer state used only by the step at the end of each
  // iteration, and 2 MiB of activations holding data at the peak: with 3 MiB
  // of room, 1 MiB of it for the peak op's output, 4 MiB must leave before
  // it, and only the 1 us of compute after the step could hide the copies.
  constexpr uint64_t kMiB = 1 << 20;
  testing::StreamBuilder b(kMiB);
  const uint32_t state = b.allocate(4 * kMiB);
  for (int it = 0; it < 2; ++it) {
    b.mark();
    const uint32_t a = b.allocate_at(4 * kMiB, 2 * kMiB);
    b.op({a}, 1000, 1);
    const uint32_t c = b.allocate_at(6 * kMiB, kMiB);
    b.op({a, c}, 1000, 2);  // the peak: 7 MiB live, c not written yet
    b.free(c);
    b.free(a);
    b.op({state}, 1000, 3);  // the step
    b.op({}, 1000, 4);
  }
  const AccessStream s = b.finish();
  const TransferModel model;
  const PeakBound bound = peak_bound(s, 3 * kMiB, model);
  EXPECT_EQ(bound.out_bytes, 4 * kMiB);
  const auto copy = static_cast<uint64_t>(4 * kMiB / model.d2h_bytes_per_s * 1e9);
  EXPECT_EQ(bound.before_ns, copy - 1000);
}

}  // namespace
}  // namespace zico::prefetch
