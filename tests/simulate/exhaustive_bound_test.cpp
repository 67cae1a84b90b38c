#include "exhaustive_bound.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "simulator.h"
#include "synthetic_trace.h"

namespace zico::simulate {
namespace {

using testing::kGiB;
using testing::kMs;

constexpr uint64_t kCycle = 1'024'000'000;  // divisible by the 1024-cell grid
constexpr uint64_t kHigh = 6 * kGiB;
constexpr uint64_t kLow = 1 * kGiB;

// High for the first `high_ns` of the period, low after.
PeriodicCurve pulse(uint64_t period, uint64_t high_ns) { return {period, {{0, kHigh}, {high_ns, kLow}}}; }

ExhaustiveBound bound_of(const std::vector<PeriodicCurve>& curves) {
  ExhaustiveBound bound;
  std::string error;
  EXPECT_TRUE(exhaustive_bound(curves, &bound, &error).is_ok()) << error;
  return bound;
}

TEST(ExhaustiveBound, TwoHalfPeriodPulsesGoHalfACycleApart) {
  const ExhaustiveBound b = bound_of({pulse(kCycle, kCycle / 2), pulse(kCycle, kCycle / 2)});
  EXPECT_EQ(b.cycle_ns, kCycle);
  EXPECT_EQ(b.peak_bytes, kHigh + kLow);
  ASSERT_EQ(b.offsets_ns.size(), 2u);
  EXPECT_EQ(b.offsets_ns[0], 0u);
  EXPECT_EQ(b.offsets_ns[1], kCycle / 2);
  EXPECT_EQ(b.aligned_peak_bytes, 2 * kHigh);
  EXPECT_EQ(b.sum_of_peaks_bytes, 2 * kHigh);
}

TEST(ExhaustiveBound, ThreeQuarterPulsesInterleave) {
  const ExhaustiveBound b =
      bound_of({pulse(kCycle, kCycle / 4), pulse(kCycle, kCycle / 4), pulse(kCycle, kCycle / 4)});
  EXPECT_EQ(b.peak_bytes, kHigh + 2 * kLow);
  ASSERT_EQ(b.offsets_ns.size(), 3u);
  // Pulses [o, o + C/4) must not overlap, cyclically.
  std::vector<uint64_t> starts = b.offsets_ns;
  std::sort(starts.begin(), starts.end());
  for (size_t i = 0; i < starts.size(); ++i) {
    const uint64_t next = i + 1 < starts.size() ? starts[i + 1] : starts[0] + kCycle;
    EXPECT_GE(next - starts[i], kCycle / 4) << "offset " << starts[i];
  }
  EXPECT_EQ(b.aligned_peak_bytes, 3 * kHigh);
}

TEST(ExhaustiveBound, AShorterJobIdlesAtItsEndLevel) {
  // Job 1's period is half the cycle; afterwards it holds its end level (2 GiB).
  const PeriodicCurve longer = pulse(kCycle, kCycle / 2);
  const PeriodicCurve shorter{kCycle / 2, {{0, kHigh}, {kCycle / 4, 2 * kGiB}}};
  const ExhaustiveBound b = bound_of({longer, shorter});
  EXPECT_EQ(b.cycle_ns, kCycle);
  EXPECT_EQ(b.peak_bytes, kHigh + 2 * kGiB) << "its pulse sits in the other's low half";
  EXPECT_GE(b.offsets_ns[1], kCycle / 2);
  EXPECT_LE(b.offsets_ns[1], kCycle * 3 / 4);
}

TEST(ExhaustiveBound, AnInstantSpikeCounts) {
  // 1 GiB flat but for a spike to 5 GiB that lasts no time at 100 ms.
  const PeriodicCurve spiky{kCycle, {{0, kLow}, {100 * kMs, 5 * kGiB}, {100 * kMs, kLow}}};
  const PeriodicCurve flat{kCycle, {{0, kLow}}};
  const ExhaustiveBound b = bound_of({spiky, flat});
  EXPECT_EQ(b.peak_bytes, 6 * kGiB) << "per-cell maxima never under-state";
}

TEST(ExhaustiveBound, OneJobIsItsOwnPeak) {
  const ExhaustiveBound b = bound_of({pulse(kCycle, kCycle / 3)});
  EXPECT_EQ(b.peak_bytes, kHigh);
  EXPECT_EQ(b.offsets_ns, std::vector<uint64_t>{0});
}

TEST(ExhaustiveBound, RejectsBadCurves) {
  ExhaustiveBound b;
  std::string error;
  EXPECT_FALSE(exhaustive_bound({}, &b, &error).is_ok());
  EXPECT_FALSE(exhaustive_bound(std::vector<PeriodicCurve>(4, pulse(kCycle, 1)), &b, &error).is_ok());
  EXPECT_FALSE(exhaustive_bound({PeriodicCurve{0, {{0, 1}}}}, &b, &error).is_ok());
  EXPECT_FALSE(exhaustive_bound({PeriodicCurve{kCycle, {{5, 1}}}}, &b, &error).is_ok());
  EXPECT_FALSE(exhaustive_bound({PeriodicCurve{kCycle, {{0, 1}, {10, 2}, {5, 3}}}}, &b, &error).is_ok());
}

TEST(ExhaustiveBound, SteadyCurveOfAJobModelIsItsNeedInChunks) {
  // 1 GiB of weights, +1 GiB at 0, 10, 20, 30, 40 ms, all freed at 45 ms.
  testing::SyntheticJob job = testing::climbing_job("a", 1 * kGiB, 1 * kGiB);
  job.free_at_ns = 45 * kMs;
  const PeriodicCurve c = steady_need_curve(testing::model_of(job), kDefaultChunkBytes);
  EXPECT_EQ(c.period_ns, 100 * kMs);
  ASSERT_FALSE(c.steps.empty());
  EXPECT_EQ(c.steps.front(), (std::pair<uint64_t, uint64_t>{0, 1 * kGiB})) << "the level it starts from";
  uint64_t most = 0;
  for (const auto& [t, bytes] : c.steps) most = std::max(most, bytes);
  EXPECT_EQ(most, 6 * kGiB);
  EXPECT_EQ(c.steps.back(), (std::pair<uint64_t, uint64_t>{45 * kMs, 1 * kGiB}));
  // Two of them: the bound puts the 45 ms climbs apart, the first offset
  // found being the least that does.
  const ExhaustiveBound b = bound_of({c, c});
  EXPECT_EQ(b.peak_bytes, 7 * kGiB);
  ASSERT_EQ(b.offsets_ns.size(), 2u);
  EXPECT_GE(b.offsets_ns[1], 45 * kMs);
  EXPECT_LE(b.offsets_ns[1], 55 * kMs);
  EXPECT_EQ(b.aligned_peak_bytes, 12 * kGiB);
}

TEST(ExhaustiveBound, CoincidentStepsInOneCellAreCountedTogether) {
  // High for 60 % of the period: the only offset that keeps the sum at 8 GiB
  // (half a period) lines one job's drop up with the other's rise, and the
  // cell holding both counts both maxima, so the grid reports 9 GiB.
  const PeriodicCurve c = steady_need_curve(testing::model_of(testing::climbing_job("a", 1 * kGiB, 1 * kGiB)),
                                            kDefaultChunkBytes);
  const ExhaustiveBound b = bound_of({c, c});
  EXPECT_GE(b.peak_bytes, 8 * kGiB) << "never below the true optimum";
  EXPECT_LE(b.peak_bytes, 9 * kGiB);
  EXPECT_EQ(b.sum_of_peaks_bytes, 12 * kGiB);
}

StretchedCycle stretched_of(const std::vector<PeriodicCurve>& curves, uint64_t budget) {
  StretchedCycle stretched;
  std::string error;
  EXPECT_TRUE(least_fitting_cycle(curves, budget, &stretched, &error).is_ok()) << error;
  return stretched;
}

TEST(LeastFittingCycle, PulsesLongerThanHalfAPeriodFitOnceTheCycleHoldsBoth) {
  // High for 60 % of the period: at the period itself the highs overlap
  // (12 GiB, the bound's peak); on a 7 GiB budget they fit once the cycle is
  // 1.2 periods and they sit half of it apart.
  const std::vector<PeriodicCurve> curves{pulse(kCycle, kCycle * 6 / 10), pulse(kCycle, kCycle * 6 / 10)};
  EXPECT_EQ(bound_of(curves).peak_bytes, 2 * kHigh);
  const StretchedCycle s = stretched_of(curves, kHigh + kLow);
  ASSERT_TRUE(s.found);
  EXPECT_EQ(s.cycle_ns, kCycle * 6 / 5) << "the first step of 0.5 % that fits";
  EXPECT_EQ(s.peak_bytes, kHigh + kLow);
  ASSERT_EQ(s.offsets_ns.size(), 2u);
  EXPECT_EQ(s.offsets_ns[1], s.cycle_ns / 2);
  EXPECT_EQ(s.shortfall_bytes, 0u);
}

TEST(LeastFittingCycle, ABudgetTheBoundMeetsFitsAtTheLongestPeriod) {
  const std::vector<PeriodicCurve> curves{pulse(kCycle, kCycle / 2), pulse(kCycle / 2, kCycle / 4)};
  const StretchedCycle s = stretched_of(curves, bound_of(curves).peak_bytes);
  ASSERT_TRUE(s.found);
  EXPECT_EQ(s.cycle_ns, kCycle);
}

TEST(LeastFittingCycle, APeakAndTheOthersLeastAboveTheBudgetFitAtNoCycle) {
  // Whenever one is at 6 GiB the other holds at least 1 GiB: 7 GiB at any
  // cycle, half a GiB more than the budget.
  const std::vector<PeriodicCurve> curves{pulse(kCycle, kCycle / 10), pulse(kCycle, kCycle / 10)};
  const StretchedCycle s = stretched_of(curves, kHigh + kLow / 2);
  EXPECT_FALSE(s.found);
  EXPECT_EQ(s.shortfall_bytes, kLow / 2);
  EXPECT_TRUE(stretched_of(curves, kHigh + kLow).found) << "at exactly the budget they fit";
}

TEST(LeastFittingCycle, ScansUpToTheSummedPeriods) {
  // High for all of the period but its last 1/1024: on a budget of one high
  // and one low, the two fit only one after the other, at nearly the summed
  // periods, the longest cycle looked at.
  const PeriodicCurve almost_flat{kCycle, {{0, kHigh}, {kCycle - kCycle / 1024, kLow}}};
  const StretchedCycle s = stretched_of({almost_flat, almost_flat}, kHigh + kLow);
  ASSERT_TRUE(s.found);
  EXPECT_LE(s.cycle_ns, 2 * kCycle);
  EXPECT_GE(s.cycle_ns, 2 * kCycle - 2 * kCycle / 100);
}

TEST(LeastFittingCycle, RejectsBadCurves) {
  StretchedCycle s;
  std::string error;
  EXPECT_FALSE(least_fitting_cycle({}, kHigh, &s, &error).is_ok());
  EXPECT_FALSE(least_fitting_cycle({PeriodicCurve{kCycle, {{5, 1}}}}, kHigh, &s, &error).is_ok());
  EXPECT_NE(error.find("curve 0"), std::string::npos) << error;
}

}  // namespace
}  // namespace zico::simulate
