// UnseenUses: a page a kernel faulted in unnamed is learnt for the kernel's
// place in the iteration and its execution ID, and offered there again.
#include <gtest/gtest.h>

#include <vector>

#include "unseen_uses.h"

namespace zico::prefetch::testing {
namespace {

std::vector<PageId> learnt(UnseenUses& uses, uint32_t index, uint64_t exec_id) {
  std::vector<PageId> pages;
  uses.learnt_for(index, exec_id, &pages);
  return pages;
}

TEST(UnseenUses, APageTheOpDidNotNameIsLearntForItsPlace) {
  UnseenUses uses;
  const std::vector<PageId> named = {3, 4};
  uses.announce(10, 0, 0xA, named);
  uses.announce(11, 1, 0xB, named);
  EXPECT_FALSE(uses.on_fault(10, 4)) << "a named page was learnt";
  EXPECT_TRUE(uses.on_fault(11, 9));
  EXPECT_TRUE(uses.on_fault(11, 7));
  EXPECT_TRUE(uses.on_fault(11, 9)) << "a second report of the same page is still unnamed";
  EXPECT_EQ(uses.learnt_pages(), 2u);
  EXPECT_EQ(learnt(uses, 1, 0xB), (std::vector<PageId>{7, 9}));
  EXPECT_TRUE(learnt(uses, 0, 0xA).empty());
  EXPECT_TRUE(learnt(uses, 1, 0xC).empty()) << "another kernel at the place got its pages";
  EXPECT_EQ(learnt(uses, 1, 0xB).size(), 2u) << "a mismatch at the place forgot what it learnt";
}

TEST(UnseenUses, ReportsOlderThanTheReadBeforeTheLastAreNotLearnt) {
  UnseenUses uses;
  uses.announce(1, 0, 0xA, {});
  uses.reports_read();
  uses.announce(2, 0, 0xA, {});
  EXPECT_TRUE(uses.on_fault(1, 5)) << "a report one read late was lost";
  uses.reports_read();
  uses.reports_read();
  EXPECT_FALSE(uses.on_fault(2, 6)) << "an op two reads old was still known";
  EXPECT_FALSE(uses.on_fault(99, 6)) << "an unknown stamp was learnt";
}

TEST(UnseenUses, APlaceLearntAnewForAnotherKernelReplacesWhatItHad) {
  UnseenUses uses;
  uses.announce(1, 0, 0xA, {});
  EXPECT_TRUE(uses.on_fault(1, 5));
  uses.announce(2, 0, 0xB, {});
  EXPECT_TRUE(uses.on_fault(2, 6));
  EXPECT_EQ(uses.learnt_pages(), 1u);
  EXPECT_TRUE(learnt(uses, 0, 0xA).empty());
  EXPECT_EQ(learnt(uses, 0, 0xB), (std::vector<PageId>{6}));
}

TEST(UnseenUses, PlacesPastTheBoundAreNotLearnt) {
  UnseenUses uses;
  uses.announce(1, UnseenUses::kMaxPlaces, 0xA, {});
  EXPECT_FALSE(uses.on_fault(1, 5));
  EXPECT_EQ(uses.learnt_pages(), 0u);
}

}  // namespace
}  // namespace zico::prefetch::testing
