#include "period_detector.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "paging_simulator.h"
#include "paging_streams.h"

namespace zico::prefetch {
namespace {

TEST(PeriodDetector, FindsTheLoopAfterTwoRepeatsAndMarksEveryPeriod) {
  PeriodDetector d(4);
  std::vector<uint64_t> starts;
  // A prologue that does not repeat, then a 10-launch loop.
  for (uint64_t i = 0; i < 7; ++i) EXPECT_FALSE(d.add(1000 + i));
  for (uint64_t i = 0; i < 60; ++i) {
    if (d.add(i % 10)) starts.push_back(i);
  }
  EXPECT_EQ(d.period(), 10u);
  ASSERT_GE(starts.size(), 3u);
  EXPECT_LE(starts.front(), 20u);  // found once two periods match
  for (size_t k = 1; k < starts.size(); ++k) EXPECT_EQ(starts[k] - starts[k - 1], 10u);
}

TEST(PeriodDetector, AKernelRepeatedWithinTheIterationIsNotTheIteration) {
  // 200 launches an iteration, every tenth of them the same kernel: its
  // distance of 10 is a candidate, which the other launches between its
  // repeats must keep from ever covering a whole period.
  constexpr uint64_t kLength = 200;
  constexpr uint64_t kRepeated = 7777;
  PeriodDetector d;
  std::vector<uint64_t> starts;
  for (uint64_t i = 0; i < 10 * kLength; ++i) {
    const uint64_t at = i % kLength;
    if (d.add(at % 10 == 0 ? kRepeated : at)) starts.push_back(i);
    ASSERT_NE(d.period(), 10u) << "after launch " << i;
  }
  EXPECT_EQ(d.period(), kLength);
  ASSERT_GE(starts.size(), 8u);
  for (size_t k = 1; k < starts.size(); ++k) EXPECT_EQ(starts[k] - starts[k - 1], kLength);
}

TEST(PeriodDetector, DropsThePeriodWhenTheLoopChanges) {
  PeriodDetector d(4);
  for (uint64_t i = 0; i < 40; ++i) (void)d.add(i % 8);
  EXPECT_EQ(d.period(), 8u);
  (void)d.add(999);
  EXPECT_EQ(d.period(), 0u);
  for (uint64_t i = 0; i < 60; ++i) (void)d.add(500 + i % 12);
  EXPECT_EQ(d.period(), 12u);
}

TEST(PeriodDetector, IgnoresRepeatsShorterThanTheShortestPeriod) {
  PeriodDetector d(8);
  for (uint64_t i = 0; i < 100; ++i) EXPECT_FALSE(d.add(i % 3));  // a loop inside an iteration
  EXPECT_EQ(d.period(), 0u);
}

TEST(ZicoWithoutMarks, FindsTheIterationItselfAndStopsFaulting) {
  // A training stream of 32 iterations of 12 launches with its marks taken
  // out: zico must find the loop and, from then on, fetch ahead instead of
  // faulting.
  AccessStream stream = testing::random_training_stream(4, 32, uint64_t{2} << 20);
  std::erase_if(stream.events, [](const StreamEvent& e) { return e.kind == StreamEvent::Kind::kIteration; });
  stream.iterations = 0;
  const StreamFacts facts = stream_facts(stream);
  page::PagingOptions options;
  options.budget_bytes = std::max<uint64_t>(facts.peak_live_bytes / 2, uint64_t{facts.max_op_pages} << 21);
  page::PagingResult zico, um;
  std::string error;
  ASSERT_TRUE(page::run_paging(stream, "zico", options, &zico, &error)) << error;
  ASSERT_TRUE(page::run_paging(stream, "um", options, &um, &error)) << error;
  EXPECT_LT(zico.iterations.back().faults * 4, um.iterations.back().faults);
  EXPECT_LT(zico.iterations.back().elapsed_ns(), um.iterations.back().elapsed_ns());
}

}  // namespace
}  // namespace zico::prefetch
