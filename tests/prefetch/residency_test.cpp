#include "residency.h"

#include <gtest/gtest.h>

namespace zico::prefetch {
namespace {

TEST(Residency, SlotsFollowTheStates) {
  Residency r(2 << 20, 8, 3 * (2 << 20) + 100);  // a partial page of budget is no slot
  EXPECT_EQ(r.budget_pages(), 3u);
  EXPECT_EQ(r.free_pages(), 3u);
  r.start_arrival(0);
  r.start_arrival(1);
  EXPECT_EQ(r.occupied_pages(), 2u);
  EXPECT_EQ(r.arriving_pages(), 2u);
  EXPECT_TRUE(r.present_or_coming(0));
  r.arrive(0, 10);
  r.arrive(1, 20);
  EXPECT_EQ(r.arriving_pages(), 0u);
  EXPECT_EQ(r.by_migration().begin()->second, 0u);  // least recently migrated first
  r.start_leaving(0);
  EXPECT_EQ(r.state(0), PageState::kLeaving);
  EXPECT_EQ(r.occupied_pages(), 2u);  // a leaving page keeps its slot until its copy is done
  EXPECT_FALSE(r.present_or_coming(0));
  r.queue(2);
  EXPECT_EQ(r.queued_pages(), 1u);
  EXPECT_TRUE(r.present_or_coming(2));
  r.leave(0);
  EXPECT_EQ(r.occupied_pages(), 1u);
  r.start_arrival(2);
  EXPECT_EQ(r.queued_pages(), 0u);
  r.arrive(2, 30);
  r.drop(1);
  EXPECT_EQ(r.state(1), PageState::kAbsent);
  EXPECT_EQ(r.occupied_pages(), 1u);
  EXPECT_EQ(r.by_migration().size(), 1u);
}

TEST(Residency, LiveBytesSayWhenAPageDies) {
  Residency r(4096, 2, 8192);
  r.add_live(0, 100);
  r.add_live(0, 200);
  EXPECT_TRUE(r.live(0));
  EXPECT_FALSE(r.remove_live(0, 100));
  EXPECT_TRUE(r.remove_live(0, 200));
  EXPECT_FALSE(r.live(0));
  EXPECT_STREQ(to_string(PageState::kQueued), "queued");
}

}  // namespace
}  // namespace zico::prefetch
