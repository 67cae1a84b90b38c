// The ledger's rules one by one: grants, reclaims, charges, deadlocks, jobs, limits.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "ledger.h"
#include "ledger_test_support.h"

namespace zico::sharing {
namespace {

TEST(LedgerGrant, GrantsWhenItFits) {
  Books b(10);
  b.join(1);
  b.ask(1, 7, 4);
  const std::vector<LedgerAction> actions = b.ledger.pump(0);
  ASSERT_EQ(actions.size(), 1u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kGrant, 1, 7, 4)) << describe(actions);
  EXPECT_EQ(b.held(1), 4u);
  const Ledger::GpuView gpu = b.ledger.gpu(0);
  EXPECT_EQ(gpu.granted, 4u);
  EXPECT_EQ(gpu.grants, 4u);
  EXPECT_EQ(gpu.waiting, 0u);
  EXPECT_TRUE(b.ledger.pump(1).empty()) << "a grant is handed out once";
  EXPECT_EQ(b.ledger.check(), "");
}

TEST(LedgerGrant, FifoHeadBlocksSmallerLaterRequest) {
  Books b(10);
  b.join(1);
  b.join(2);
  b.join(3);
  b.hold(1, 1, 8);
  b.ask(2, 1, 5);  // head: does not fit in the 2 free chunks
  b.ask(3, 1, 1);  // would fit, but must not overtake the head
  std::vector<LedgerAction> actions = b.ledger.pump(0);
  EXPECT_EQ(count(actions, Kind::kGrant), 0u) << describe(actions);
  EXPECT_EQ(b.ledger.gpu(0).waiting, 6u);
  b.give(1, 4);  // job 1 now holds 4: 6 free
  actions = b.ledger.pump(1);
  ASSERT_EQ(actions.size(), 2u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kGrant, 2, 1, 5)) << "the head first: " << describe(actions);
  EXPECT_TRUE(same(actions[1], Kind::kGrant, 3, 1, 1)) << describe(actions);
  EXPECT_EQ(b.ledger.check(), "");
}

// The trade that made two climbing jobs hand all their memory back and forth:
// job 2 yielded and asks for everything again at the head; job 1, in the
// middle of its iteration, must be able to go on and finish it.
TEST(LedgerGrant, HeadHoldingNothingLetsAJobInMidIterationGoAhead) {
  LedgerOptions options;
  options.head_patience_ns = 1000;
  Books b(10, options);
  b.join(1);
  b.join(2);
  b.hold(1, 1, 6);
  b.ask(2, 1, 6, 0);  // holds nothing: only job 1's progress can make room
  b.ask(1, 2, 2, 0);  // job 1 holds 6 > its minimum: goes ahead
  std::vector<LedgerAction> actions = b.ledger.pump(10);
  ASSERT_GE(actions.size(), 1u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kGrant, 1, 2, 2)) << describe(actions);
  EXPECT_EQ(count(actions, Kind::kGrant), 1u) << describe(actions);
  // Job 1 is asked for idle chunks for the head; it has none.
  b.give(1, 0, true, 20);
  // Once the head has waited past the patience, it blocks the queue again:
  // job 1's next request waits, and the deadlock rule makes job 1 yield.
  b.ask(1, 3, 1, 2000);
  actions = b.ledger.pump(2000);
  ASSERT_EQ(count(actions, Kind::kGrant), 0u) << describe(actions);
  ASSERT_EQ(count(actions, Kind::kYield), 1u) << describe(actions);
  EXPECT_EQ(actions[0].job, 1u);
  EXPECT_EQ(b.ledger.check(), "");
}

TEST(LedgerGrant, WithinMinimumBypassesQueue) {
  Books b(10);
  b.join(1);
  b.join(2);
  b.join(3, /*min=*/3);
  b.hold(1, 1, 6);
  b.ask(2, 1, 6);  // head: 4 free, does not fit
  b.ask(3, 1, 2);  // within job 3's minimum: served ahead of the head
  std::vector<LedgerAction> actions = b.ledger.pump(0);
  ASSERT_EQ(count(actions, Kind::kGrant), 1u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kGrant, 3, 1, 2)) << describe(actions);
  b.ask(3, 2, 2);  // 2 + 2 > min 3: an ordinary request, waits behind the head
  actions = b.ledger.pump(1);
  EXPECT_EQ(count(actions, Kind::kGrant), 0u) << describe(actions);
  EXPECT_EQ(b.view(3).waiting, 2u);
  EXPECT_EQ(b.ledger.check(), "");
}

TEST(LedgerGrant, KeepsRoomForOthersMinimums) {
  Books b(10);
  b.join(1);
  b.join(2, /*min=*/4);  // idle, holds nothing, is owed 4
  b.join(3);
  b.hold(3, 1, 3);
  b.ask(1, 1, 4);  // 7 free covers 4, but 7 - 4 < job 2's unmet 4
  std::vector<LedgerAction> actions = b.ledger.pump(0);
  EXPECT_EQ(count(actions, Kind::kGrant), 0u) << describe(actions);
  // The shortfall is one chunk (4 + 4 - 7): only that much is asked back.
  ASSERT_EQ(count(actions, Kind::kReclaim), 1u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kReclaim, 3, 0, 1)) << describe(actions);
  b.give(3, 1, /*reclaim_reply=*/true);
  actions = b.ledger.pump(1);
  ASSERT_EQ(actions.size(), 1u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kGrant, 1, 1, 4));
  EXPECT_EQ(b.ledger.gpu(0).budget - b.ledger.gpu(0).granted, 4u) << "job 2's minimum is still free";
  EXPECT_EQ(b.ledger.check(), "");
}

TEST(LedgerGrant, DeniesImpossibleRequestAtOnceAnywhereInTheQueue) {
  Books b(10);
  b.join(1);
  b.join(2, /*min=*/3);
  b.join(3, /*min=*/0, /*max=*/4);
  b.hold(1, 1, 6);
  b.ask(2, 1, 5);  // head: fits later (5 <= 10 - 0), blocks for now
  b.ask(1, 2, 2);  // 6 + 2 > 10 - job 2's min 3: never
  b.ask(3, 1, 5);  // above job 3's max 4: never
  const std::vector<LedgerAction> actions = b.ledger.pump(0);
  ASSERT_EQ(count(actions, Kind::kDeny), 2u) << describe(actions);
  for (const LedgerAction& a : actions) {
    if (a.kind != Kind::kDeny) continue;
    EXPECT_EQ(a.errc, Errc::kOutOfMemory);
    EXPECT_FALSE(a.reason.empty());
    EXPECT_TRUE((a.job == 1 && a.request_id == 2) || (a.job == 3 && a.request_id == 1)) << describe(actions);
  }
  EXPECT_EQ(b.view(2).waiting, 5u) << "the possible head keeps waiting";
  EXPECT_NE(actions[0].reason.find("at most 7"), std::string::npos) << actions[0].reason;
  EXPECT_EQ(b.ledger.check(), "");
}

// Where the chunk's size is known (the daemon, the simulator), the reason a
// user reads speaks bytes.
TEST(LedgerGrant, ADenialsReasonSpeaksBytesWhereTheChunkIsKnown) {
  Ledger ledger;
  ledger.add_gpu(8, 2 << 20);
  std::string why;
  ASSERT_TRUE(ledger.add_job(1, 1000, 1));
  ASSERT_TRUE(ledger.open(1, 0, 0, &why).is_ok()) << why;
  ASSERT_TRUE(ledger.request(1, 0, 1, 9, 0, &why).is_ok()) << why;
  const std::vector<LedgerAction> actions = ledger.pump(0);
  ASSERT_EQ(actions.size(), 1u) << describe(actions);
  EXPECT_EQ(actions[0].kind, Kind::kDeny);
  EXPECT_NE(actions[0].reason.find("asks for 18 MiB while holding 0 B, but the job can hold at most 16 MiB"),
            std::string::npos)
      << actions[0].reason;
  EXPECT_EQ(actions[0].reason.find("chunks"), std::string::npos) << actions[0].reason;
}

// One chunk short of a 5 GiB ceiling reads "5.00 GiB" on its own: beside the
// ceiling it gets the decimals that tell the two apart.
TEST(LedgerGrant, ADenialTellsWhatTheJobHoldsApartFromWhatItMayHold) {
  Ledger ledger;
  ledger.add_gpu(2560, 2 << 20);
  std::string why;
  ASSERT_TRUE(ledger.add_job(1, 1000, 1));
  ASSERT_TRUE(ledger.open(1, 0, 2559, &why).is_ok()) << why;
  ASSERT_TRUE(ledger.request(1, 0, 1, 2, 0, &why).is_ok()) << why;
  const std::vector<LedgerAction> actions = ledger.pump(0);
  ASSERT_EQ(actions.size(), 1u) << describe(actions);
  EXPECT_EQ(actions[0].kind, Kind::kDeny);
  EXPECT_NE(actions[0].reason.find("asks for 4 MiB while holding 4.998 GiB, but the job can hold at most 5 GiB"),
            std::string::npos)
      << actions[0].reason;
}

TEST(LedgerGrant, BudgetShrinkOrNewLimitsDenyWaitingRequests) {
  Books b(10);
  b.join(1);
  b.join(2);
  b.hold(1, 1, 8);
  b.ask(2, 1, 6);
  EXPECT_EQ(count(b.ledger.pump(0), Kind::kDeny), 0u);
  std::string why;
  ASSERT_TRUE(b.ledger.set_budget(0, 5, &why).is_ok()) << why;
  std::vector<LedgerAction> actions = b.ledger.pump(1);
  ASSERT_EQ(count(actions, Kind::kDeny), 1u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kDeny, 2, 1, 6));

  b.ask(2, 2, 3);
  ASSERT_TRUE(b.ledger.set_job_limits(2, 0, 0, 2, &why).is_ok()) << why;
  actions = b.ledger.pump(2);
  ASSERT_GE(actions.size(), 1u);
  EXPECT_TRUE(same(actions[0], Kind::kDeny, 2, 2, 3)) << describe(actions);
  EXPECT_EQ(b.ledger.check(), "");
}

TEST(LedgerReclaim, AsksBiggestHoldersForTheShortfallAboveTheirMinimum) {
  Books b(20);
  b.join(1, /*min=*/3);
  b.join(2);
  b.join(3);
  b.join(4);
  b.hold(1, 1, 8);
  b.hold(2, 1, 6);
  b.hold(3, 1, 4);
  b.ask(4, 1, 10);  // 2 free: 8 short
  const std::vector<LedgerAction> actions = b.ledger.pump(0);
  ASSERT_EQ(actions.size(), 2u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kReclaim, 1, 0, 5)) << "biggest first, not below its min: " << describe(actions);
  EXPECT_TRUE(same(actions[1], Kind::kReclaim, 2, 0, 3)) << "only the rest of the shortfall: " << describe(actions);
  EXPECT_EQ(b.ledger.check(), "");
}

TEST(LedgerReclaim, SkipsWaitersAndJobsAtTheirMinimum) {
  Books b(12);
  b.join(1);
  b.join(2, /*min=*/3);
  b.join(3);
  b.join(4, /*min=*/5);
  b.hold(4, 1, 5);  // big, but all of it is guaranteed
  b.hold(2, 1, 4);
  b.hold(3, 1, 3);
  b.ask(1, 1, 2);  // head: nothing free, 2 short
  b.ask(3, 2, 1);  // job 3 waits: its chunks are not idle
  const std::vector<LedgerAction> actions = b.ledger.pump(0);
  ASSERT_EQ(actions.size(), 1u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kReclaim, 2, 0, 1)) << "job 2 down to its min, no further: " << describe(actions);
  EXPECT_EQ(b.ledger.check(), "");
}

TEST(LedgerReclaim, RespectsRetryIntervalAndOutstandingReclaim) {
  Books b(10);
  b.join(1);
  b.join(2);
  b.hold(1, 1, 10);
  b.ask(2, 1, 4);
  std::vector<LedgerAction> actions = b.ledger.pump(0);
  ASSERT_EQ(actions.size(), 1u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kReclaim, 1, 0, 4));
  EXPECT_TRUE(b.ledger.pump(10 * kMs).empty()) << "unanswered";
  EXPECT_TRUE(b.ledger.pump(3 * kRetry).empty()) << "still unanswered, however long";
  b.give(1, 1);  // a voluntary return is not the answer
  EXPECT_TRUE(b.ledger.pump(3 * kRetry + 1).empty());
  b.give(1, 0, /*reclaim_reply=*/true, 4 * kRetry);  // nothing idle
  EXPECT_TRUE(b.ledger.pump(4 * kRetry + kRetry / 2).empty()) << "the interval runs from the reply";
  actions = b.ledger.pump(5 * kRetry);
  ASSERT_EQ(actions.size(), 1u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kReclaim, 1, 0, 3)) << describe(actions);
  EXPECT_EQ(b.ledger.check(), "");
}

TEST(LedgerReclaim, OverBudgetAfterShrinkReclaimsAndGrantsNothing) {
  Books b(20);
  b.join(1, /*min=*/2);
  b.join(2);
  b.join(3);
  b.hold(1, 1, 12);
  b.hold(2, 1, 6);
  std::string why;
  ASSERT_TRUE(b.ledger.set_budget(0, 10, &why).is_ok()) << why;
  // Nobody waits, yet the 8 chunks above the budget are asked back.
  std::vector<LedgerAction> actions = b.ledger.pump(0);
  ASSERT_EQ(actions.size(), 1u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kReclaim, 1, 0, 8)) << describe(actions);
  b.give(1, 5, /*reclaim_reply=*/true, 1);  // granted 13
  b.ask(3, 1, 1, 2);
  actions = b.ledger.pump(3);
  EXPECT_EQ(count(actions, Kind::kGrant), 0u) << "above the budget nothing is granted: " << describe(actions);
  ASSERT_EQ(actions.size(), 1u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kReclaim, 2, 0, 4)) << "job 1 was asked recently: " << describe(actions);
  b.give(2, 4, /*reclaim_reply=*/true, 4);  // granted 9
  actions = b.ledger.pump(5);
  ASSERT_EQ(actions.size(), 1u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kGrant, 3, 1, 1));
  EXPECT_EQ(b.ledger.gpu(0).granted, 10u);
  EXPECT_EQ(b.ledger.check(), "");
}

TEST(LedgerReclaim, ReconnectingJobAboveBudgetIsAskedForTheExcess) {
  Books b(10);
  b.join(1, 0, UINT64_MAX, /*held=*/4);
  b.join(2, 0, UINT64_MAX, /*held=*/9);
  EXPECT_EQ(b.ledger.gpu(0).granted, 13u);
  EXPECT_EQ(b.ledger.check(), "");
  const std::vector<LedgerAction> actions = b.ledger.pump(0);
  ASSERT_EQ(actions.size(), 1u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kReclaim, 2, 0, 3)) << describe(actions);
}

// Memory a job kept after giving it back is charged to it: it fills the
// budget like any holding, but it is not the job's to give, so a yield
// ends once the job gave back all it was lent.
TEST(LedgerCharge, ChargesFillTheBudgetButAYieldDoesNotWaitForThem) {
  Books b(10);
  b.join(1);
  b.join(2);
  b.hold(1, 1, 4);
  std::string why;
  ASSERT_TRUE(b.ledger.charge(1, 0, 2, &why).is_ok()) << why;
  EXPECT_EQ(b.ledger.gpu(0).granted, 6u);
  EXPECT_EQ(b.view(1).held, 4u);
  EXPECT_EQ(b.view(1).charged, 2u);
  EXPECT_EQ(b.ledger.check(), "");
  b.hold(2, 1, 3);
  b.ask(1, 2, 2, 100);  // 1 free: both wait, each for the other
  b.ask(2, 2, 2, 100);
  std::vector<LedgerAction> actions = b.ledger.pump(100);
  ASSERT_EQ(count(actions, Kind::kYield), 1u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kYield, 1, 2, 4)) << "asked for what it was lent: " << describe(actions);
  b.give(1, 4, false, 200);
  actions = b.ledger.pump(200);
  EXPECT_EQ(count(actions, Kind::kGrant), 1u) << "the yield ended with the charge still held: " << describe(actions);
  EXPECT_FALSE(b.ledger.uncharge(1, 0, 3, &why).is_ok()) << "uncharged more than charged";
  ASSERT_TRUE(b.ledger.uncharge(1, 0, 2, &why).is_ok()) << why;
  EXPECT_EQ(b.ledger.check(), "");
  b.ledger.remove_job(2);
  b.ledger.remove_job(1);
  EXPECT_EQ(b.ledger.gpu(0).granted, 0u);
}

TEST(LedgerDeadlock, YieldPicksBiggestHolderOneAtATime) {
  Books b(10);
  b.join(1);
  b.join(2);
  b.join(3);
  b.hold(1, 1, 4);
  b.hold(2, 1, 6);
  b.ask(1, 2, 3, 100);
  b.ask(2, 2, 2, 100);
  b.ask(3, 1, 1, 100);
  std::vector<LedgerAction> actions = b.ledger.pump(100);
  ASSERT_EQ(actions.size(), 1u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kYield, 2, 2, 6)) << "the biggest holder yields: " << describe(actions);
  EXPECT_EQ(b.view(2).waiting, 0u) << "its request left the queue";
  EXPECT_EQ(b.ledger.gpu(0).deadlocks, 1u);

  // Job 2 hands back part and asks again before it is done: still a deadlock
  // on paper, but no second victim until it has returned everything.
  b.give(2, 2, false, 200);
  b.ask(2, 3, 2, 200);
  for (uint64_t t = 300; t < 10 * kRetry; t += kRetry) {
    actions = b.ledger.pump(t);
    EXPECT_TRUE(actions.empty()) << describe(actions);
  }
  EXPECT_EQ(b.ledger.gpu(0).deadlocks, 1u);
  b.give(2, 4, false, 10 * kRetry);
  actions = b.ledger.pump(10 * kRetry);
  ASSERT_EQ(actions.size(), 3u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kGrant, 1, 2, 3)) << describe(actions);
  EXPECT_TRUE(same(actions[1], Kind::kGrant, 3, 1, 1)) << describe(actions);
  EXPECT_TRUE(same(actions[2], Kind::kGrant, 2, 3, 2)) << "the victim's new request comes last: " << describe(actions);
  EXPECT_EQ(b.ledger.check(), "");
}

// Chunks a job gave back that the daemon has not yet looked at stay charged
// to it, but they are on their way back: no deadlock is broken for them.
TEST(LedgerDeadlock, ReturnsAwaitingTheirLookAreNoJam) {
  Books b(10);
  b.join(1);
  b.hold(1, 1, 4);
  std::string why;
  ASSERT_TRUE(b.ledger.charge(1, 0, 6, &why).is_ok()) << why;  // gave 6 back, not yet looked at
  ASSERT_TRUE(b.ledger.set_returning(1, 0, 6));
  b.ask(1, 2, 1, 100);  // nothing free: everything is its own
  std::vector<LedgerAction> actions = b.ledger.pump(100);
  EXPECT_EQ(count(actions, Kind::kYield), 0u) << "a lone job yielded for its own returns: " << describe(actions);
  EXPECT_EQ(b.ledger.gpu(0).deadlocks, 0u);
  // Looked at: the chunks go to the pool, and the request is served.
  ASSERT_TRUE(b.ledger.set_returning(1, 0, 0));
  ASSERT_TRUE(b.ledger.uncharge(1, 0, 6, &why).is_ok()) << why;
  actions = b.ledger.pump(200);
  EXPECT_EQ(count(actions, Kind::kGrant), 1u) << describe(actions);
  EXPECT_EQ(b.ledger.check(), "");
  // Without the mark, the same state is a jam: the lone job yields.
  Books c(10);
  c.join(1);
  c.hold(1, 1, 4);
  ASSERT_TRUE(c.ledger.charge(1, 0, 6, &why).is_ok()) << why;
  c.ask(1, 2, 1, 100);
  actions = c.ledger.pump(100);
  EXPECT_EQ(count(actions, Kind::kYield), 1u) << describe(actions);
}

TEST(LedgerDeadlock, IdleJobAtItsMinimumDoesNotHideIt) {
  Books b(12);
  b.join(1);
  b.join(2);
  b.join(3, /*min=*/2);
  b.hold(3, 1, 2);  // never waits, cannot be reclaimed
  b.hold(1, 1, 5);
  b.hold(2, 1, 5);
  b.ask(1, 2, 2);
  b.ask(2, 2, 1);
  const std::vector<LedgerAction> actions = b.ledger.pump(0);
  ASSERT_EQ(actions.size(), 1u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kYield, 2, 2, 5)) << "equal holders: the youngest yields: " << describe(actions);
}

// Without turns, a job that is not waiting hides a jam only while it might
// give something back. Once, asked within the last retry interval, it gave
// nothing and keeps all it holds past its iteration's end (its claim says so;
// without one, it gave nothing twice running), the waiters' jam is broken. A
// job whose claim says it settles lower is waited for; with turns, any job is
// (it is parked at its next gate).
enum class Holder { kClaimsItsRest, kNoClaim, kSettlesLower, kAtGatesWithTurns, kNoGatesWithTurns };

// Jobs 1 and 2 wait mid-iteration holding 5 and 4 of 12; job 3 holds 2 and
// does not wait. Returns the ledger after job 3 was asked and gave nothing
// (or, resting at its gate with turns, was parked).
Books jam_beside_a_holder(Holder holder) {
  LedgerOptions options;
  options.park_between = holder == Holder::kAtGatesWithTurns || holder == Holder::kNoGatesWithTurns;
  Books b(12, options);
  b.join(1);
  b.join(2);
  b.join(3);
  b.hold(3, 1, 2);
  bool set = true;
  if (holder == Holder::kAtGatesWithTurns) set = b.ledger.set_between_iterations(3, 0, 2);
  if (holder == Holder::kClaimsItsRest || holder == Holder::kNoGatesWithTurns) set = b.ledger.set_claim(3, 0, 2, 2);
  if (holder == Holder::kSettlesLower) set = b.ledger.set_claim(3, 0, 2, 1);
  EXPECT_TRUE(set);
  b.hold(1, 1, 5);
  b.hold(2, 1, 4);
  b.ask(1, 2, 2);
  b.ask(2, 2, 2);
  const std::vector<LedgerAction> actions = b.ledger.pump(0);
  EXPECT_EQ(actions.size(), 1u) << describe(actions);
  if (holder == Holder::kAtGatesWithTurns) {  // resting at its gate, it is parked for them at once
    EXPECT_TRUE(!actions.empty() && same(actions[0], Kind::kPark, 3, 0, 2)) << describe(actions);
    return b;
  }
  EXPECT_TRUE(!actions.empty() && actions[0].kind == Kind::kReclaim && actions[0].job == 3)
      << "it may have idle chunks: " << describe(actions);
  b.give(3, 0, /*reclaim_reply=*/true, 10);
  return b;
}

TEST(LedgerDeadlock, AnIdleHolderThatGaveNothingDoesNotHideIt) {
  {
    Books b = jam_beside_a_holder(Holder::kClaimsItsRest);
    const std::vector<LedgerAction> actions = b.ledger.pump(10);
    ASSERT_EQ(count(actions, Kind::kYield), 1u) << describe(actions);
    EXPECT_TRUE(same(actions[0], Kind::kYield, 1, 2, 5)) << "the biggest waiter yields: " << describe(actions);
    EXPECT_EQ(b.ledger.gpu(0).deadlocks, 1u);
    EXPECT_EQ(b.ledger.check(), "");
  }
}

TEST(LedgerDeadlock, AHolderThatMayStillGiveIsWaitedFor) {
  for (const Holder holder : {Holder::kSettlesLower, Holder::kAtGatesWithTurns, Holder::kNoGatesWithTurns}) {
    Books b = jam_beside_a_holder(holder);
    EXPECT_EQ(count(b.ledger.pump(10), Kind::kYield), 0u);
  }
  // Its reply is stale after a retry interval: it is asked again first.
  Books stale = jam_beside_a_holder(Holder::kClaimsItsRest);
  std::vector<LedgerAction> actions = stale.ledger.pump(10 + kRetry);
  EXPECT_EQ(count(actions, Kind::kYield), 0u) << describe(actions);
  EXPECT_EQ(count(actions, Kind::kReclaim), 1u) << describe(actions);
  // Without a claim, once is not enough: a job in its first iteration frees
  // its memory at the end. Twice running, it is.
  Books unclaimed = jam_beside_a_holder(Holder::kNoClaim);
  EXPECT_EQ(count(unclaimed.ledger.pump(10), Kind::kYield), 0u);
  actions = unclaimed.ledger.pump(10 + kRetry);
  ASSERT_EQ(count(actions, Kind::kReclaim), 1u) << describe(actions);
  unclaimed.give(3, 0, /*reclaim_reply=*/true, 20 + kRetry);
  EXPECT_EQ(count(unclaimed.ledger.pump(20 + kRetry), Kind::kYield), 1u);
}

TEST(LedgerDeadlock, VictimHoldsMoreThanItsMinimum) {
  Books b(12);
  b.join(1, /*min=*/7);
  b.join(2);
  b.join(3);
  b.hold(1, 1, 7);
  b.hold(2, 1, 3);
  b.hold(3, 1, 2);
  b.ask(1, 2, 1);
  b.ask(2, 2, 1);
  b.ask(3, 2, 1);
  // Job 1 holds the most, but yielding its minimum would only hand it straight
  // back through the bypass; job 2 holds the most above its minimum.
  const std::vector<LedgerAction> actions = b.ledger.pump(0);
  ASSERT_EQ(actions.size(), 1u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kYield, 2, 2, 3)) << describe(actions);
}

TEST(LedgerDeadlock, FailDeniesYoungest) {
  LedgerOptions options;
  options.deadlock_policy = DeadlockPolicy::kFail;
  Books b(10, options);
  b.join(1);
  b.join(2);
  b.hold(2, 1, 4);
  b.hold(1, 1, 6);
  b.ask(1, 2, 2);
  b.ask(2, 2, 3);
  const std::vector<LedgerAction> actions = b.ledger.pump(0);
  ASSERT_EQ(actions.size(), 2u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kDeny, 2, 2, 3)) << "the youngest is refused: " << describe(actions);
  EXPECT_EQ(actions[0].errc, Errc::kOutOfMemory);
  EXPECT_NE(actions[0].reason.find("deadlock"), std::string::npos) << actions[0].reason;
  // No longer waiting, job 2 is an ordinary holder and is asked for the head's shortfall.
  EXPECT_TRUE(same(actions[1], Kind::kReclaim, 2, 0, 2)) << describe(actions);
  EXPECT_EQ(b.ledger.gpu(0).deadlocks, 1u);
  EXPECT_EQ(b.ledger.check(), "");
}

TEST(LedgerDeadlock, FrozenHolderIsNeitherAskedNorHidesTheJam) {
  Books b(10);
  b.join(1);
  b.join(2);
  b.join(3);
  b.hold(3, 1, 2);
  b.ledger.set_frozen(3, true);  // its connection is gone; it gives back only when it exits
  b.hold(1, 2, 4);
  b.hold(2, 3, 4);
  b.ask(1, 4, 2);
  b.ask(2, 5, 2);
  const std::vector<LedgerAction> actions = b.ledger.pump(0);
  EXPECT_EQ(count(actions, Kind::kReclaim), 0u) << "the frozen job cannot answer: " << describe(actions);
  ASSERT_EQ(count(actions, Kind::kYield), 1u) << "jobs 1 and 2 hold each other up: " << describe(actions);
  EXPECT_EQ(b.ledger.gpu(0).deadlocks, 1u);
  EXPECT_EQ(b.ledger.check(), "");
}

TEST(LedgerJobs, RemoveJobFreesAndUnblocks) {
  Books b(10);
  b.join(1);
  b.join(2);
  b.hold(1, 1, 8);
  b.ask(2, 1, 5);
  b.ask(1, 2, 1);
  EXPECT_EQ(b.ledger.gpu(0).waiting, 6u);
  b.ledger.remove_job(1);
  EXPECT_FALSE(b.ledger.has_job(1));
  EXPECT_EQ(b.ledger.gpu(0).granted, 0u);
  EXPECT_EQ(b.ledger.gpu(0).returns, 8u);
  EXPECT_EQ(b.ledger.gpu(0).waiting, 5u) << "job 1's own request vanished";
  const std::vector<LedgerAction> actions = b.ledger.pump(1);
  ASSERT_EQ(actions.size(), 1u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kGrant, 2, 1, 5));
  EXPECT_EQ(b.ledger.jobs(), std::vector<JobId>{2});
  EXPECT_EQ(b.ledger.check(), "");
}

TEST(LedgerJobs, RemovingTheYieldVictimEndsTheYield) {
  Books b(10);
  b.join(1);
  b.join(2);
  b.hold(1, 1, 4);
  b.hold(2, 1, 6);
  b.ask(1, 2, 3);
  b.ask(2, 2, 2);
  ASSERT_EQ(count(b.ledger.pump(0), Kind::kYield), 1u);
  b.ledger.remove_job(2);
  const std::vector<LedgerAction> actions = b.ledger.pump(1);
  ASSERT_EQ(actions.size(), 1u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kGrant, 1, 2, 3));
  EXPECT_EQ(b.ledger.check(), "");
}

TEST(LedgerJobs, CancelWithdrawsWaitingRequest) {
  Books b(10);
  b.join(1);
  b.join(2);
  b.join(3);
  b.hold(1, 1, 8);
  b.ask(2, 1, 5);
  b.ask(3, 1, 1);
  EXPECT_EQ(count(b.ledger.pump(0), Kind::kGrant), 0u);
  EXPECT_TRUE(b.ledger.cancel(2, 1, 1));
  EXPECT_FALSE(b.ledger.cancel(2, 1, 1)) << "already withdrawn";
  EXPECT_FALSE(b.ledger.cancel(1, 1, 1)) << "granted long ago";
  EXPECT_FALSE(b.ledger.cancel(3, 99, 1)) << "never asked";
  EXPECT_EQ(b.view(2).waiting, 0u);
  const std::vector<LedgerAction> actions = b.ledger.pump(2);
  ASSERT_EQ(count(actions, Kind::kGrant), 1u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kGrant, 3, 1, 1)) << "no longer blocked: " << describe(actions);
  EXPECT_EQ(b.ledger.check(), "");
}

TEST(LedgerJobs, RequestAndOpenValidation) {
  Books b(10);
  b.join(1);
  std::string why;
  EXPECT_FALSE(b.ledger.add_job(1, 0, 9)) << "exists";
  EXPECT_EQ(b.ledger.open(1, 0, 0, &why).code(), Errc::kInvalidArgument) << "already open";
  EXPECT_EQ(b.ledger.open(7, 0, 0, &why).code(), Errc::kInvalidArgument) << "unknown job";
  EXPECT_EQ(b.ledger.open(1, 5, 0, &why).code(), Errc::kInvalidArgument) << "unknown GPU";
  EXPECT_EQ(b.ledger.request(7, 0, 1, 1, 0, &why).code(), Errc::kInvalidArgument) << "unknown job";
  EXPECT_EQ(b.ledger.request(1, 0, 0, 1, 0, &why).code(), Errc::kInvalidArgument) << "id 0";
  EXPECT_EQ(b.ledger.request(1, 0, 1, 0, 0, &why).code(), Errc::kInvalidArgument) << "0 chunks";
  const uint32_t second = b.ledger.add_gpu(10);
  EXPECT_EQ(b.ledger.gpu_count(), 2u);
  EXPECT_EQ(b.ledger.request(1, second, 1, 1, 0, &why).code(), Errc::kInvalidArgument) << "not opened";
  ASSERT_TRUE(b.ledger.open(1, second, 0, &why).is_ok()) << why;
  b.ask(1, 1, 20);  // 20 > budget: waits until the next pump denies it
  EXPECT_EQ(b.ledger.request(1, second, 1, 1, 0, &why).code(), Errc::kInvalidArgument)
      << "ids are per job across GPUs while waiting";
  EXPECT_NE(why.find("already waiting"), std::string::npos) << why;
  EXPECT_EQ(b.ledger.check(), "");
}

TEST(LedgerJobs, ReturnedValidatesAndCounts) {
  Books b(10);
  b.join(1);
  b.hold(1, 1, 3);
  std::string why;
  EXPECT_EQ(b.ledger.returned(1, 0, 4, false, 0, &why).code(), Errc::kInvalidArgument);
  EXPECT_NE(why.find("returns 4"), std::string::npos) << why;
  EXPECT_NE(why.find("holds 3"), std::string::npos) << why;
  EXPECT_EQ(b.held(1), 3u) << "a refused return changes nothing";
  b.ledger.add_gpu(10);
  EXPECT_EQ(b.ledger.returned(1, 1, 0, false, 0, &why).code(), Errc::kInvalidArgument) << "GPU not opened";
  b.give(1, 2);
  EXPECT_EQ(b.ledger.gpu(0).returns, 2u);
  EXPECT_EQ(b.ledger.gpu(0).granted, 1u);
  EXPECT_EQ(b.ledger.check(), "");
}

TEST(LedgerLimits, SetBudgetBelowSumOfMinimumsRefused) {
  Books b(10);
  b.join(1, /*min=*/3);
  b.join(2, /*min=*/4);
  std::string why;
  EXPECT_EQ(b.ledger.set_budget(0, 6, &why).code(), Errc::kInvalidArgument);
  EXPECT_NE(why.find("7"), std::string::npos) << why;
  EXPECT_EQ(b.ledger.gpu(0).budget, 10u);
  EXPECT_TRUE(b.ledger.set_budget(0, 7, &why).is_ok()) << why;
  EXPECT_EQ(b.ledger.gpu(0).budget, 7u);
  EXPECT_EQ(b.ledger.set_budget(3, 7, &why).code(), Errc::kInvalidArgument) << "unknown GPU";
}

TEST(LedgerLimits, SetJobLimitsValidation) {
  Books b(10);
  b.join(1, /*min=*/6);
  b.join(2);
  std::string why;
  EXPECT_EQ(b.ledger.set_job_limits(2, 0, 5, 4, &why).code(), Errc::kInvalidArgument) << "min > max";
  EXPECT_EQ(b.ledger.set_job_limits(2, 0, 5, 9, &why).code(), Errc::kInvalidArgument) << "6 + 5 > 10";
  EXPECT_NE(why.find("11"), std::string::npos) << why;
  EXPECT_EQ(b.ledger.set_job_limits(9, 0, 0, 1, &why).code(), Errc::kInvalidArgument) << "unknown job";
  EXPECT_TRUE(b.ledger.add_job(3, 0, 3));
  EXPECT_EQ(b.ledger.set_job_limits(3, 0, 0, 1, &why).code(), Errc::kInvalidArgument) << "GPU not opened";
  EXPECT_TRUE(b.ledger.set_job_limits(1, 0, 2, 8, &why).is_ok()) << why << " (its own old min is replaced)";
  EXPECT_TRUE(b.ledger.set_job_limits(2, 0, 8, 8, &why).is_ok()) << why;
  const Ledger::JobView v = b.view(2);
  EXPECT_EQ(v.min, 8u);
  EXPECT_EQ(v.max, 8u);
  EXPECT_EQ(b.view(1).min, 2u);
  EXPECT_EQ(b.ledger.check(), "");
}

TEST(LedgerAccounting, WaitTimeCountsFinishedAndCurrentWaits) {
  Books b(10);
  b.join(1);
  b.join(2);
  b.hold(1, 1, 10);
  b.ask(2, 1, 4, 100);
  (void)b.ledger.pump(100);
  b.give(1, 4, true, 300);
  ASSERT_EQ(count(b.ledger.pump(350), Kind::kGrant), 1u);  // waited 250
  b.ask(2, 2, 9, 400);
  EXPECT_TRUE(b.ledger.cancel(2, 2, 450));  // waited 50
  b.ask(2, 3, 20, 500);
  ASSERT_EQ(count(b.ledger.pump(510), Kind::kDeny), 1u);  // waited 10
  b.ask(2, 4, 5, 600);
  (void)b.ledger.pump(600);
  EXPECT_EQ(b.view(2, 900).wait_ns, 250u + 50u + 10u + 300u) << "the current wait is included";
  EXPECT_EQ(b.view(2, 1000).wait_ns, 250u + 50u + 10u + 400u);
  EXPECT_EQ(b.view(1, 1000).wait_ns, 0u);
}

}  // namespace
}  // namespace zico::sharing
