#include "correlation_table.h"

#include <gtest/gtest.h>

#include <vector>

namespace zico::prefetch {
namespace {

TEST(CorrelationTable, PredictsTheMostRecentSuccessor) {
  CorrelationTable t;
  uint64_t next = 0;
  EXPECT_FALSE(t.predict_next(1, &next));
  t.record_successor(1, 2);
  t.record_successor(1, 3);
  ASSERT_TRUE(t.predict_next(1, &next));
  EXPECT_EQ(next, 3u);
  t.record_successor(1, 2);  // seen again: most recent again
  ASSERT_TRUE(t.predict_next(1, &next));
  EXPECT_EQ(next, 2u);
  for (uint64_t id = 10; id < 20; ++id) t.record_successor(1, id);  // only kSuccessors are kept
  ASSERT_TRUE(t.predict_next(1, &next));
  EXPECT_EQ(next, 19u);
}

TEST(CorrelationTable, PageTablesMergeFaults) {
  CorrelationTable t;
  t.record_faults(7, std::vector<PageId>{1, 5});
  t.record_faults(7, std::vector<PageId>{2, 5, 9});
  const auto pages = t.pages(7);
  EXPECT_EQ(std::vector<PageId>(pages.begin(), pages.end()), (std::vector<PageId>{1, 2, 5, 9}));
  EXPECT_TRUE(t.pages(8).empty());
}

}  // namespace
}  // namespace zico::prefetch
