#include "period_detector.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
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
  (void)d.add(999);  // one stray launch is no change
  EXPECT_EQ(d.period(), 8u);
  uint64_t i = 0;
  for (; i < 12 && d.period() != 0; ++i) (void)d.add(500 + i % 12);
  EXPECT_EQ(d.period(), 0u) << "the old loop was still followed after a whole period of the new one";
  for (; i < 72; ++i) (void)d.add(500 + i % 12);
  EXPECT_EQ(d.period(), 12u);
}

// A 46-launch iteration with a stray launch (a metric or logging kernel)
// after every 2 to 6 launches, wherever that falls in the iteration: the
// ID `stray(n)` for the n-th. Returns, for each boundary found, the position
// in the iteration of the first regular launch from it on; *periods gets
// period() at each.
std::vector<uint64_t> boundaries_among_strays(uint64_t (*stray)(uint64_t), std::vector<uint32_t>* periods) {
  constexpr uint64_t kLength = 46;
  PeriodDetector d;
  std::mt19937 random(7);
  std::uniform_int_distribution<int> gap(2, 6);
  std::vector<uint64_t> positions;
  bool on_stray = false;  // a boundary fell on a stray: it is where the next regular launch is
  int until_stray = gap(random);
  uint64_t strays = 0;
  for (uint64_t i = 0; i < 30 * kLength; ++i) {
    if (d.add(i % kLength) || on_stray) {
      positions.push_back(i % kLength);
      periods->push_back(d.period());
    }
    on_stray = false;
    if (--until_stray == 0) {
      on_stray = d.add(stray(strays++));
      until_stray = gap(random);
    }
  }
  return positions;
}

TEST(PeriodDetector, FindsTheWholeIterationAmongStrayLaunches) {
  for (const auto stray : {+[](uint64_t) -> uint64_t { return 4242; },  // the same kernel on the same block
                           +[](uint64_t n) -> uint64_t { return 1'000'000 + n; }}) {  // a new block each time
    std::vector<uint32_t> periods;
    const std::vector<uint64_t> positions = boundaries_among_strays(stray, &periods);
    ASSERT_GE(positions.size(), 20u) << "the iteration was lost among the strays";
    // Once found, one boundary each iteration, at the same launch of it.
    for (size_t k = 1; k < positions.size(); ++k) {
      EXPECT_EQ(positions[k], positions[0]) << "boundary " << k;
      EXPECT_GE(periods[k], 46u) << "boundary " << k;        // all of the iteration
      EXPECT_LE(periods[k], 46u + 23u) << "boundary " << k;  // and its strays, no more
    }
  }
}

TEST(PeriodDetector, KeepsThePeriodWhenALaunchChangesItsId) {
  // A block placed a page away changes one launch's ID in an iteration
  // (exec_id.h): a different launch each iteration, never the same twice.
  constexpr uint64_t kLength = 30;
  PeriodDetector d;
  uint64_t found_at = 0;
  for (uint64_t i = 0; i < 20 * kLength; ++i) {
    const uint64_t iteration = i / kLength;
    const bool moved = iteration >= 3 && i % kLength == iteration % kLength;
    if (d.add(moved ? 5000 + iteration : i % kLength) && found_at == 0) found_at = i;
    if (found_at != 0) {
      ASSERT_EQ(d.period(), kLength) << "after launch " << i;
    }
  }
  EXPECT_NE(found_at, 0u);
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
