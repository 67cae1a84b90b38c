#include "paging_cost.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace zico::sharing {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;

PagingCost three_points() {
  PagingCost cost;
  cost.floor_bytes = 4 * kGiB;
  cost.points = {{4 * kGiB, 3.0}, {8 * kGiB, 1.5}, {10 * kGiB, 1.0}};
  return cost;
}

TEST(PagingCost, InterpolatesBetweenPointsAndHoldsTheEnds) {
  const PagingCost cost = three_points();
  EXPECT_DOUBLE_EQ(cost.stretch_at(4 * kGiB), 3.0);
  EXPECT_DOUBLE_EQ(cost.stretch_at(6 * kGiB), 2.25);
  EXPECT_DOUBLE_EQ(cost.stretch_at(9 * kGiB), 1.25);
  EXPECT_DOUBLE_EQ(cost.stretch_at(12 * kGiB), 1.0);
  EXPECT_DOUBLE_EQ(cost.stretch_at(2 * kGiB), 3.0);  // below the floor: the floor's
  EXPECT_DOUBLE_EQ(PagingCost{}.stretch_at(kGiB), 1.0);
}

TEST(PagingCost, LeastCapWithinAStretchInvertsTheInterpolation) {
  const PagingCost cost = three_points();
  EXPECT_EQ(cost.least_cap_within(1.25), 9 * kGiB);
  EXPECT_EQ(cost.least_cap_within(2.25), 6 * kGiB);
  EXPECT_EQ(cost.least_cap_within(5.0), 4 * kGiB);
  EXPECT_EQ(cost.least_cap_within(1.0), 10 * kGiB);
  // Whatever the answer, the stretch there is within the one asked.
  for (const double stretch : {1.05, 1.1, 1.4, 1.9, 2.7}) {
    EXPECT_LE(cost.stretch_at(cost.least_cap_within(stretch)), stretch + 1e-9) << stretch;
  }
}

TEST(PagingCost, InvalidNamesThePointAndWhy) {
  EXPECT_EQ(three_points().invalid(), "");
  PagingCost below = three_points();
  below.points[0].cap_bytes = kGiB;
  EXPECT_NE(below.invalid().find("point 0: cap"), std::string::npos) << below.invalid();
  PagingCost faster = three_points();
  faster.points[1].stretch = 0.5;
  EXPECT_NE(faster.invalid().find("point 1: stretch"), std::string::npos) << faster.invalid();
  PagingCost rising = three_points();
  rising.points[2].stretch = 2.0;
  EXPECT_NE(rising.invalid().find("rises"), std::string::npos) << rising.invalid();
  PagingCost unordered = three_points();
  unordered.points[2].cap_bytes = 7 * kGiB;
  EXPECT_NE(unordered.invalid().find("caps must increase"), std::string::npos) << unordered.invalid();
}

TEST(GatePaging, IsWhatTheLinkMovesInOnePeriod) {
  EXPECT_EQ(gate_paging_bytes(25e9, 30'000'000), 750'000'000u);  // 25 GB/s for 30 ms
  EXPECT_EQ(gate_paging_bytes(0, 30'000'000), 0u) << "unknown link";
  EXPECT_EQ(gate_paging_bytes(25e9, 0), 0u) << "unknown period";
  EXPECT_EQ(gate_paging_bytes(-1, 30'000'000), 0u);
  EXPECT_EQ(gate_paging_bytes(1e300, 30'000'000), UINT64_MAX) << "saturates";
}

}  // namespace
}  // namespace zico::sharing
