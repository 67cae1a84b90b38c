// AllocationWaitScope: one clock for all the waits of one allocation call
// (registering, opening the GPU, asking for memory), started by its first
// wait; OutsideAllocationWait: a suspension inside the call has clocks of
// its own. The short sleeps only make the clock move on, so that a fresh
// clock can be told from the call's.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <thread>

#include "node_client.h"

namespace zico::sharing {
namespace {

using Clock = std::chrono::steady_clock;

void let_the_clock_move() { std::this_thread::sleep_for(std::chrono::milliseconds(2)); }

TEST(AllocationWaitScope, AllTheWaitsOfOneCallShareTheClockOfItsFirst) {
  Clock::time_point began;
  {
    const AllocationWaitScope call;
    const Clock::time_point before = Clock::now();
    let_the_clock_move();
    began = AllocationWaitScope::wait_began();  // the first wait starts the clock
    EXPECT_GT(began, before) << "the clock starts at the first wait, not with the scope";
    let_the_clock_move();
    EXPECT_EQ(AllocationWaitScope::wait_began(), began);
    {
      const AllocationWaitScope inner;  // an entry point inside another
      EXPECT_EQ(AllocationWaitScope::wait_began(), began);
    }
    EXPECT_EQ(AllocationWaitScope::deadline(2'000'000'000), began + std::chrono::seconds(2));
  }
  let_the_clock_move();
  const AllocationWaitScope next_call;
  EXPECT_GT(AllocationWaitScope::wait_began(), began) << "the next call has a clock of its own";
}

TEST(AllocationWaitScope, OutsideACallEachWaitHasItsOwnTimeout) {
  const Clock::time_point first = AllocationWaitScope::wait_began();
  let_the_clock_move();
  EXPECT_GT(AllocationWaitScope::wait_began(), first);
}

TEST(AllocationWaitScope, ASuspensionInsideACallWaitsOnClocksOfItsOwn) {
  const AllocationWaitScope call;
  const Clock::time_point began = AllocationWaitScope::wait_began();
  let_the_clock_move();
  {
    const OutsideAllocationWait suspended;
    const Clock::time_point resuming = AllocationWaitScope::wait_began();
    EXPECT_GT(resuming, began);
    let_the_clock_move();
    EXPECT_GT(AllocationWaitScope::wait_began(), resuming) << "each of the resumption's waits has its own timeout";
  }
  EXPECT_EQ(AllocationWaitScope::wait_began(), began) << "the call's clock is as it was";
}

TEST(AllocationWaitScope, ATimeoutBeyondTheClockNeverEnds) {
  const AllocationWaitScope call;
  EXPECT_EQ(AllocationWaitScope::deadline(UINT64_MAX), Clock::time_point::max());
}

}  // namespace
}  // namespace zico::sharing
