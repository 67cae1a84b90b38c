#include "learned_iteration.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "iteration_plan.h"

namespace zico::prefetch {
namespace {

LearnedIteration three_ops() {
  LearnedIteration it;
  it.add_op(11, 100, std::vector<PageId>{0, 1});
  it.add_op(12, 200, std::vector<PageId>{2});
  it.add_op(13, 300, std::vector<PageId>{0, 3});
  it.finish(5);
  return it;
}

TEST(LearnedIteration, NextUseRunsOnIntoTheNextIteration) {
  const LearnedIteration it = three_ops();
  EXPECT_EQ(it.next_use(0, 0), 2u);
  EXPECT_EQ(it.next_use(0, 2), 3u);  // position 0 of the next iteration
  EXPECT_EQ(it.next_use(2, 4), 7u);
  EXPECT_EQ(it.next_use(4, 0), kNoUse);  // never used
  EXPECT_EQ(it.time_between(0, 2), 300u);
  EXPECT_EQ(it.time_between(1, 4), 200u + 300 + 100);
}

TEST(LearnedIteration, MatchesComparesIdentityAndPages) {
  const LearnedIteration it = three_ops();
  EXPECT_TRUE(it.matches(1, 12, std::vector<PageId>{2}));
  EXPECT_FALSE(it.matches(1, 12, std::vector<PageId>{2, 3}));
  EXPECT_FALSE(it.matches(1, 99, std::vector<PageId>{2}));
  EXPECT_FALSE(it.matches(3, 11, std::vector<PageId>{0, 1}));
  LearnedIteration other = three_ops();
  EXPECT_TRUE(it.same_as(other));
  other.add_death(3);
  EXPECT_FALSE(it.same_as(other));
}

TEST(IterationPlan, IssuesEachFetchRightAfterItsVictimsLastUse) {
  // Four pages, three slots. In the steady loop pages 0, 1 and 3 are resident
  // when op 1 needs page 2; 0 and 1 are next used farthest ahead (op 0 of the
  // next iteration; the tie goes to the higher page), so page 1 leaves, which
  // it may do as soon as op 0, its last use, is done.
  LearnedIteration it;
  it.add_op(1, 10, std::vector<PageId>{0, 1});
  it.add_op(2, 10, std::vector<PageId>{2});
  it.add_op(3, 10, std::vector<PageId>{3});
  it.finish(4);
  IterationPlan plan;
  plan.build(it, 3, 4);
  bool found = false;
  for (const PlannedFetch& f : plan.fetches()) {
    if (f.page == 2) {
      EXPECT_EQ(f.need, 1u);
      EXPECT_EQ(f.victim, 1u);
      EXPECT_EQ(f.issue, 1);
      found = true;
    }
  }
  EXPECT_TRUE(found);
}

TEST(IterationPlan, AVictimIsNotUsedBetweenIssueAndNeed) {
  LearnedIteration it;
  const std::vector<std::vector<PageId>> ops = {{0, 1}, {2, 3}, {4}, {0, 5}, {2, 6}, {1, 4}, {3, 5, 6}};
  for (size_t i = 0; i < ops.size(); ++i) it.add_op(i, 10, ops[i]);
  it.finish(7);
  IterationPlan plan;
  plan.build(it, 4, 7);
  ASSERT_FALSE(plan.fetches().empty());
  const auto length = static_cast<int64_t>(ops.size());
  for (size_t i = 0; i < plan.fetches().size(); ++i) {
    const PlannedFetch& f = plan.fetches()[i];
    if (i > 0) {
      EXPECT_LE(plan.fetches()[i - 1].issue, f.issue);
    }
    EXPECT_LE(f.issue, int64_t{f.need});
    EXPECT_GT(f.issue, int64_t{f.need} - length);
    if (f.victim == kNoPage) continue;
    EXPECT_NE(f.victim, f.page);
    for (int64_t p = f.issue; p < int64_t{f.need}; ++p) {
      const auto& used = ops[static_cast<size_t>((p % length + length) % length)];
      EXPECT_EQ(std::count(used.begin(), used.end(), f.victim), 0) << "victim " << f.victim << " used at " << p;
    }
  }
}

}  // namespace
}  // namespace zico::prefetch
