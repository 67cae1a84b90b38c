#include "lifetime_plan.h"

#include <gtest/gtest.h>

#include "planned_target.h"
#include "replay.h"
#include "trace_reader.h"

namespace zico::replay {
namespace {

constexpr uint64_t kKiB = 1024;

trace::Trace parse(const std::string& body, int records) {
  const std::string text =
      "zicoum-trace 1\nmeta model t\nmeta command test\nmeta source meta\nmeta batch 1\nmeta iterations 3\n"
      "meta timing none\n" +
      body + "end " + std::to_string(records) + "\n";
  trace::Trace trace;
  std::string error;
  EXPECT_TRUE(trace::parse_trace(text, "t", &trace, &error).is_ok()) << error;
  return trace;
}

// One iteration: weight W persists; A (4 KiB) lives throughout, B (8 KiB)
// and C (8 KiB) one after the other. B and C can share an offset; A cannot.
std::string iteration(int n, int base_id, bool b_outlives_c = false) {
  const auto id = [&](int k) { return std::to_string(base_id + k); };
  const std::string t = std::to_string(n * 100);
  std::string s = "i " + std::to_string(n) + " " + t + "\n";
  s += "a " + id(1) + " 4096 " + t + " act -1\n";
  s += "a " + id(2) + " 8192 " + t + " temp -1\n";
  if (!b_outlives_c) s += "f " + id(2) + " " + t + "\n";
  s += "a " + id(3) + " 8192 " + t + " temp -1\n";
  s += "f " + id(3) + " " + t + "\n";
  if (b_outlives_c) s += "f " + id(2) + " " + t + "\n";
  s += "f " + id(1) + " " + t + "\n";
  return s;
}

TEST(LifetimePlan, SharesAddressesBetweenBlocksThatNeverCoexist) {
  const trace::Trace trace = parse("a 1 65536 0 param -1\n" + iteration(0, 10) + iteration(1, 20) + iteration(2, 30), 22);
  const LifetimePlan plan = plan_iteration(trace, 1);
  ASSERT_EQ(plan.slots.size(), 3u);
  EXPECT_TRUE(plan.slots[0].planned);
  EXPECT_EQ(plan.slots[1].offset, plan.slots[2].offset) << "B and C never coexist";
  EXPECT_NE(plan.slots[0].offset, plan.slots[1].offset);
  EXPECT_EQ(plan.lower_bound_bytes, 12 * kKiB);
  EXPECT_EQ(plan.arena_bytes, 12 * kKiB) << "the plan reaches the lower bound here";
}

TEST(LifetimePlan, PlansBlocksThatWrapIntoTheNextIterationButNotLongerLivedOnes) {
  // Iteration 0: T (temp) lives at its start; G (a gradient) is made late and
  // dropped early in iteration 1; S (optimizer state) is never freed.
  // G's wrapped lifetime covers the iteration's start, so it cannot share T's offset.
  const trace::Trace trace = parse(
      "i 0 0\na 10 4096 0 temp -1\nf 10 0\na 11 4096 0 grad -1\na 12 512 0 optim -1\n"
      "i 1 10\nf 11 10\na 13 4096 10 temp -1\nf 13 10\n",
      9);
  const LifetimePlan plan = plan_iteration(trace, 0);
  ASSERT_EQ(plan.slots.size(), 3u);
  EXPECT_TRUE(plan.slots[0].planned);
  EXPECT_TRUE(plan.slots[1].planned) << "freed in the next iteration: planned with a wrapped lifetime";
  EXPECT_FALSE(plan.slots[2].planned) << "never freed: left to the online allocator";
  EXPECT_NE(plan.slots[0].offset, plan.slots[1].offset);
  EXPECT_EQ(plan.lower_bound_bytes, 8 * kKiB);
  EXPECT_EQ(plan.arena_bytes, 8 * kKiB);
}

TEST(PlannedTarget, ServesRepeatedIterationsFromThePlan) {
  const trace::Trace trace = parse("a 1 65536 0 param -1\n" + iteration(0, 10) + iteration(1, 20) + iteration(2, 30), 22);
  std::unique_ptr<PlannedTarget> target;
  std::string why;
  ASSERT_TRUE(PlannedTarget::create(plan_iteration(trace, 1), &target, &why).is_ok()) << why;
  ReplayResult result;
  ASSERT_TRUE(replay(trace, *target, &result, &why).is_ok()) << why;
  EXPECT_EQ(target->planned_allocations(), 3u);
  EXPECT_EQ(target->fallbacks(), 0u);
}

TEST(PlannedTarget, FallsBackWhenTheLifetimesChange) {
  // In iteration 2, B outlives C: C's planned offset is B's, so C must not get it.
  const trace::Trace trace =
      parse("a 1 65536 0 param -1\n" + iteration(0, 10) + iteration(1, 20) + iteration(2, 30, true), 22);
  std::unique_ptr<PlannedTarget> target;
  std::string why;
  ASSERT_TRUE(PlannedTarget::create(plan_iteration(trace, 1), &target, &why).is_ok()) << why;
  for (uint32_t i = 0; i < 2; ++i) target->iteration_started(i);
  target->iteration_started(2);
  void* a = nullptr;
  void* b = nullptr;
  void* c = nullptr;
  ASSERT_TRUE(target->allocate(0, 4096, &a).is_ok());
  ASSERT_TRUE(target->allocate(0, 8192, &b).is_ok());
  ASSERT_TRUE(target->allocate(0, 8192, &c).is_ok());
  const auto overlaps = [](void* x, size_t xs, void* y, size_t ys) {
    const auto p = reinterpret_cast<uintptr_t>(x), q = reinterpret_cast<uintptr_t>(y);
    return p < q + ys && q < p + xs;
  };
  EXPECT_FALSE(overlaps(b, 8192, c, 8192)) << "C must not be placed over the still-live B";
  EXPECT_FALSE(overlaps(a, 4096, c, 8192));
  EXPECT_EQ(target->fallbacks(), 1u);
  target->free(0, c);
  target->free(0, b);
  target->free(0, a);
}

}  // namespace
}  // namespace zico::replay
