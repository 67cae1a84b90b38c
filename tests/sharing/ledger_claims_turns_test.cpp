// The ledger's claims (deadlock avoidance) and turns (parking between iterations).
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

// ---- Claims (deadlock avoidance) ---------------------------------------------

// Budget 10. Job 1 is in mid-iteration: holds 5, will peak at 8, settle at 2.
// Job 2 starts an iteration that peaks at 6 and settles at 0.
Books mid_iteration_pair(bool claims) {
  Books b(10);
  b.join(1);
  b.join(2);
  b.hold(1, 1, 5);
  if (claims) {
    EXPECT_TRUE(b.ledger.set_claim(1, 0, 8, 2));
    EXPECT_TRUE(b.ledger.set_claim(2, 0, 6, 0));
  }
  return b;
}

TEST(LedgerClaims, AGrantThatWouldStrandAJobInMidIterationWaits) {
  {
    // Without claims the ledger grants job 2's 3 chunks, and both are then
    // stuck short of their peaks: 3 free is less than either still needs.
    Books b = mid_iteration_pair(false);
    b.ask(2, 1, 3);
    const std::vector<LedgerAction> actions = b.ledger.pump(0);
    ASSERT_EQ(actions.size(), 1u) << describe(actions);
    EXPECT_TRUE(same(actions[0], Kind::kGrant, 2, 1, 3));
  }
  Books b = mid_iteration_pair(true);
  b.ask(2, 1, 3);
  EXPECT_EQ(count(b.ledger.pump(0), Kind::kGrant), 0u) << "after it neither job could finish";
  // Job 1's own request is safe (it can then finish) and does not queue
  // behind job 2's unsafe one.
  b.ask(1, 2, 3);
  std::vector<LedgerAction> actions = b.ledger.pump(0);
  ASSERT_EQ(count(actions, Kind::kGrant), 1u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kGrant, 1, 2, 3));
  // Job 1 ends its iteration and settles at 2: job 2 can have its 3 now.
  b.give(1, 6);
  EXPECT_TRUE(b.ledger.set_between_iterations(1, 0));
  actions = b.ledger.pump(0);
  ASSERT_EQ(actions.size(), 1u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kGrant, 2, 1, 3));
  EXPECT_EQ(b.ledger.check(), "");
}

TEST(LedgerClaims, AJobThatCanFinishGoesAheadOfABlockedHead) {
  for (const bool claim : {false, true}) {
    SCOPED_TRACE(claim ? "with a claim" : "without");
    Books b(10);
    b.join(1);
    b.join(2);
    b.hold(1, 1, 2);
    b.hold(2, 1, 3);
    b.ask(1, 2, 6);  // the head: 5 free, does not fit
    if (claim) {
      EXPECT_TRUE(b.ledger.set_claim(2, 0, 6, 1));
    }
    b.ask(2, 2, 2);  // fits; job 2 needs 3 more in all, which 5 free covers
    const std::vector<LedgerAction> actions = b.ledger.pump(0);
    if (!claim) {
      EXPECT_EQ(count(actions, Kind::kGrant), 0u) << "first come, first served: " << describe(actions);
      continue;
    }
    ASSERT_EQ(count(actions, Kind::kGrant), 1u) << describe(actions);
    EXPECT_TRUE(same(actions[0], Kind::kGrant, 2, 2, 2));
  }
}

TEST(LedgerClaims, AClaimOnlyForOpenedGpus) {
  Books b(10);
  b.join(1);
  EXPECT_FALSE(b.ledger.set_claim(7, 0, 5, 1));
  EXPECT_FALSE(b.ledger.set_claim(1, 3, 5, 1));
  EXPECT_FALSE(b.ledger.set_between_iterations(7, 0));
  EXPECT_TRUE(b.ledger.set_claim(1, 0, 5, 9));  // settle above peak: taken as the peak
  EXPECT_EQ(b.ledger.check(), "");
}

// The rules without parking (LedgerOptions::park_between off, as zico-umd
// runs them); with it, see LedgerTurns.
LedgerOptions without_parking() {
  LedgerOptions options;
  options.park_between = false;
  return options;
}

TEST(LedgerClaims, MayStartProtectsJobsInMidIteration) {
  Books b(10, without_parking());
  b.join(1);
  b.join(2);
  b.hold(1, 1, 2);
  b.hold(2, 1, 4);
  // Job 2 at its gate: nothing is in mid-iteration, so anything may start,
  // even what cannot be safe.
  EXPECT_TRUE(b.ledger.set_between_iterations(2, 0));
  EXPECT_TRUE(b.ledger.set_between_iterations(1, 0));
  EXPECT_TRUE(b.ledger.may_start(1, 0, 100, 2, 0));
  EXPECT_TRUE(b.ledger.may_start(1, 0, 0, 0, 0)) << "a job still learning, alone";
  // Job 2 in mid-iteration, needing 3 more (peak 7), settling at 1.
  EXPECT_TRUE(b.ledger.set_claim(2, 0, 7, 1));
  // Job 2 can finish in the 4 free; then 7 are free for job 1. Starting
  // leaves job 1's chunks to the ledger, which grants them while job 2 can
  // still finish; what must not start is an iteration that could not finish
  // even then.
  EXPECT_TRUE(b.ledger.may_start(1, 0, 9, 2, 0));
  EXPECT_FALSE(b.ledger.may_start(1, 0, 10, 2, 0));
  EXPECT_FALSE(b.ledger.may_start(1, 0, 0, 0, 0))
      << "a job without a claim does not start against one in mid-iteration";
  // Job 2 still learning (no claim) in mid-iteration: nothing starts against it.
  EXPECT_TRUE(b.ledger.set_claim(2, 0, 0, 0));
  EXPECT_FALSE(b.ledger.may_start(1, 0, 3, 2, 0));
  // Job 2 waits for chunks: in mid-iteration whatever its claim says.
  EXPECT_TRUE(b.ledger.set_claim(2, 0, 4, 1));
  EXPECT_TRUE(b.ledger.may_start(1, 0, 6, 2, 0)) << "at its peak, job 2 needs nothing more";
  b.ask(2, 2, 1);
  EXPECT_TRUE(b.ledger.set_claim(2, 0, 5, 1));
  EXPECT_TRUE(b.ledger.may_start(1, 0, 9, 2, 0));
  EXPECT_FALSE(b.ledger.may_start(1, 0, 10, 2, 0));
}

TEST(LedgerClaims, MayStartWhenTheJobInMidIterationWaitsForWhatTheGateJobHolds) {
  for (const bool claim : {true, false}) {
    SCOPED_TRACE(claim ? "job 1 with a claim" : "job 1 still learning");
    Books b(10, without_parking());
    b.join(1);
    b.join(2);
    b.hold(2, 1, 3);  // job 2 at its gate, resting at 3
    EXPECT_TRUE(b.ledger.set_between_iterations(2, 0));
    // Job 1, in mid-iteration, asks for 8: 7 are free, and only job 2 can
    // give the eighth. Holding job 2 at its gate would wait for job 1, which
    // waits for job 2.
    if (claim) {
      EXPECT_TRUE(b.ledger.set_claim(1, 0, 8, 1));
    }
    b.ask(1, 1, 8);
    EXPECT_EQ(count(b.ledger.pump(0), Kind::kGrant), 0u);
    EXPECT_TRUE(b.ledger.may_start(2, 0, 6, 3, 0)) << "waiting at the gate cannot help";
    EXPECT_TRUE(b.ledger.may_start(2, 0, 0, 0, 0));
  }
  // Job 1 waits for 5 with 3 free, but job 3 (at its peak) settles at 0
  // and frees 4: job 1 waits for job 3, not for job 2, so job 2's start is
  // judged by its claim as before.
  Books b(12, without_parking());
  b.join(1);
  b.join(2);
  b.join(3);
  b.hold(2, 1, 3);
  EXPECT_TRUE(b.ledger.set_between_iterations(2, 0));
  b.hold(3, 1, 4);
  EXPECT_TRUE(b.ledger.set_claim(3, 0, 4, 0));
  b.hold(1, 1, 2);
  EXPECT_TRUE(b.ledger.set_claim(1, 0, 7, 1));
  b.ask(1, 2, 5);
  EXPECT_EQ(count(b.ledger.pump(0), Kind::kGrant), 0u);
  EXPECT_TRUE(b.ledger.may_start(2, 0, 6, 3, 0));
  EXPECT_FALSE(b.ledger.may_start(2, 0, 12, 3, 0)) << "job 1 could not finish after it";
}

// --- turns: parking a job between iterations --------------------------------------

// Budget 10. Job 1 rests at 3 between iterations (its last claim: peak 5,
// settle 3); job 2 rests at 2 and its iteration peaks at 9: 9 + 3 > 10, so
// job 2 can run only while job 1 is out, and job 1 beside job 2's rest.
struct TwoThatCannotCoRun {
  static constexpr uint64_t kSwap = 20 * kMs;  // how long job 1 takes to give back
  Books b{10};
  TwoThatCannotCoRun() {
    b.join(1);
    b.join(2);
    b.hold(1, 1, 3);
    EXPECT_TRUE(b.ledger.set_claim(1, 0, 5, 3));
    EXPECT_TRUE(b.ledger.set_between_iterations(1, 0, 5));
    b.hold(2, 1, 2);
    EXPECT_TRUE(b.ledger.set_between_iterations(2, 0));
  }
  // Job 2 asks to start and is told to wait for job 1's rest; job 1 is
  // parked; it gives everything back kSwap later.
  void park_job_1(uint64_t now) {
    EXPECT_FALSE(b.ledger.may_start(2, 0, 9, 2, now)) << "job 2 cannot fit beside job 1's rest";
    EXPECT_TRUE(b.ledger.set_between_iterations(2, 0, 9));
    EXPECT_FALSE(b.ledger.may_start(1, 0, 5, 3, now)) << "job 1 is in job 2's way: it is parked, not started";
    const std::vector<LedgerAction> actions = b.ledger.pump(now);
    ASSERT_EQ(actions.size(), 1u) << describe(actions);
    EXPECT_TRUE(same(actions[0], Kind::kPark, 1, 0, 3)) << describe(actions);
    EXPECT_TRUE(b.ledger.pump(now + 1).empty()) << "one park, told once";
    EXPECT_FALSE(b.ledger.may_start(1, 0, 5, 3, now + 1)) << "a parked job waits for kResume";
    Ledger::JobView view;
    ASSERT_TRUE(b.ledger.job(1, 0, now + 1, &view));
    EXPECT_TRUE(view.parked);
    EXPECT_EQ(b.ledger.turn_wait_until_ns(0, now + 1), now + 1) << "job 2 waits for a park in progress";
    b.give(1, 3, false, now + kSwap);
    EXPECT_TRUE(b.ledger.may_start(2, 0, 9, 2, now + kSwap));
    EXPECT_EQ(b.ledger.check(), "");
  }
};

TEST(LedgerTurns, AJobInTheWayOfAnothersIterationIsParkedAtItsGateForFiftyTimesItsSwap) {
  TwoThatCannotCoRun t;
  t.park_job_1(0);
  // Parked for fifty times the 20 ms it took to give back.
  const uint64_t resume = t.kSwap + 50 * t.kSwap;
  EXPECT_EQ(t.b.ledger.next_due_ns(t.kSwap), resume);
  EXPECT_TRUE(t.b.ledger.set_claim(2, 0, 9, 2));  // job 2 runs
  EXPECT_TRUE(t.b.ledger.pump(resume - 1).empty());
  const std::vector<LedgerAction> actions = t.b.ledger.pump(resume);
  ASSERT_EQ(actions.size(), 1u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kResume, 1, 0, 0)) << describe(actions);
  EXPECT_EQ(t.b.ledger.gpu(0).parks, 1u);
  EXPECT_EQ(t.b.ledger.gpu(0).deadlocks, 0u) << "a park is no deadlock";
}

TEST(LedgerTurns, AResumedJobHasItsTurnThenIsParkedAgain) {
  TwoThatCannotCoRun t;
  t.park_job_1(0);
  const uint64_t resume = 51 * t.kSwap;
  ASSERT_EQ(count(t.b.ledger.pump(resume), Kind::kResume), 1u);
  // Job 1 asks for its rest back while job 2 rests at its gate: it fits.
  t.b.ask(1, 2, 3, resume);
  EXPECT_EQ(count(t.b.ledger.pump(resume), Kind::kGrant), 1u);
  EXPECT_TRUE(t.b.ledger.set_between_iterations(1, 0, 5));
  // Its turn: its swap back, and as long again as it was parked.
  const uint64_t turn_end = resume + 2 * t.kSwap + 50 * t.kSwap;
  EXPECT_EQ(t.b.ledger.turn_wait_until_ns(0, resume), turn_end);
  for (const uint64_t now : {resume + t.kSwap, turn_end - 1}) {
    EXPECT_TRUE(t.b.ledger.may_start(1, 0, 5, 3, now)) << "in its turn, though job 2 waits for its rest";
    EXPECT_TRUE(t.b.ledger.pump(now).empty()) << "not parked in its turn";
    EXPECT_FALSE(t.b.ledger.may_start(2, 0, 9, 2, now));
  }
  EXPECT_FALSE(t.b.ledger.may_start(1, 0, 5, 3, turn_end)) << "its turn is over";
  const std::vector<LedgerAction> actions = t.b.ledger.pump(turn_end);
  ASSERT_EQ(actions.size(), 1u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kPark, 1, 0, 3)) << describe(actions);
  EXPECT_EQ(t.b.ledger.check(), "");
}

TEST(LedgerTurns, JobsThatFitBesideEachOthersRestAreNeverParked) {
  Books b(10);
  b.join(1);
  b.join(2);
  b.hold(1, 1, 3);
  EXPECT_TRUE(b.ledger.set_between_iterations(1, 0, 5));
  b.hold(2, 1, 2);
  EXPECT_TRUE(b.ledger.set_between_iterations(2, 0, 7));  // 7 + 3 <= 10
  EXPECT_TRUE(b.ledger.may_start(2, 0, 7, 2, 0));
  EXPECT_TRUE(b.ledger.may_start(1, 0, 5, 3, 0));
  EXPECT_TRUE(b.ledger.pump(0).empty());
}

// Budget 10. Job 1, in mid-iteration, waits for 8 with 7 free: only job 2,
// resting at its gate with 3 (a UM job if `pageable`), can give the eighth.
Books one_waits_for_the_others_rest(bool pageable) {
  Books b(10);
  b.join(1);
  b.join(2);
  b.hold(2, 1, 3);
  EXPECT_TRUE(b.ledger.set_between_iterations(2, 0));
  if (pageable) {
    EXPECT_TRUE(b.ledger.set_pageable(2, 0, 2));
  }
  EXPECT_TRUE(b.ledger.set_claim(1, 0, 8, 1));
  b.ask(1, 1, 8);
  return b;
}

TEST(LedgerTurns, AJobWhoseRestAWaitingRequestNeedsIsParkedNotStarted) {
  // Without parking job 2 would start, and the two would deadlock
  // (LedgerClaims above).
  Books b = one_waits_for_the_others_rest(false);
  EXPECT_FALSE(b.ledger.may_start(2, 0, 6, 3, 0));
  std::vector<LedgerAction> actions = b.ledger.pump(0);
  ASSERT_EQ(actions.size(), 1u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kPark, 2, 0, 3)) << describe(actions);
  b.give(2, 3, false, 5 * kMs);
  actions = b.ledger.pump(5 * kMs);
  ASSERT_EQ(actions.size(), 1u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kGrant, 1, 1, 8)) << describe(actions);
}

TEST(LedgerTurns, AParkedJobResumesAtOnceWhenNoOtherJobHoldsMemory) {
  TwoThatCannotCoRun t;
  t.park_job_1(0);
  t.b.ledger.remove_job(2);
  const std::vector<LedgerAction> actions = t.b.ledger.pump(t.kSwap + 1);
  ASSERT_EQ(actions.size(), 1u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kResume, 1, 0, 0)) << "nothing to wait for: " << describe(actions);
}

TEST(LedgerTurns, AParkedJobThatCanNoLongerAnswerHoldsNothingUp) {
  TwoThatCannotCoRun t;
  EXPECT_FALSE(t.b.ledger.may_start(2, 0, 9, 2, 0));
  EXPECT_TRUE(t.b.ledger.set_between_iterations(2, 0, 9));
  ASSERT_EQ(count(t.b.ledger.pump(0), Kind::kPark), 1u);
  EXPECT_EQ(t.b.ledger.turn_wait_until_ns(0, 1), 1u);
  t.b.ledger.set_frozen(1, true);  // its connection is gone before it gave back
  EXPECT_EQ(t.b.ledger.turn_wait_until_ns(0, 2), 0u) << "nothing is on its way back";
  t.b.ledger.set_frozen(1, false);
  EXPECT_EQ(t.b.ledger.next_due_ns(2), UINT64_MAX) << "back, it is not parked: no kResume to wait for";
  EXPECT_EQ(t.b.ledger.check(), "");
}

TEST(LedgerTurns, ALongSwapMakesALongTurnUpToTheLimit) {
  LedgerOptions options;
  options.max_turn_ns = 300 * kMs;
  Books b(10, options);
  b.join(1);
  b.join(2);
  b.hold(1, 1, 3);
  EXPECT_TRUE(b.ledger.set_between_iterations(1, 0, 5));
  b.hold(2, 1, 2);
  EXPECT_TRUE(b.ledger.set_between_iterations(2, 0, 9));
  ASSERT_EQ(count(b.ledger.pump(0), Kind::kPark), 1u);
  b.give(1, 3, false, 50 * kMs);  // fifty times would be 2.5 s
  EXPECT_EQ(b.ledger.next_due_ns(50 * kMs), 350 * kMs);
}

TEST(LedgerTurns, TurnsAllowStartWeighsTheTurnsAloneNotTheClaims) {
  TwoThatCannotCoRun t;
  // Job 2 starves beside job 1's rest; job 1 is in its way.
  EXPECT_FALSE(t.b.ledger.turns_allow_start(2, 0, 9, 0));
  EXPECT_TRUE(t.b.ledger.set_between_iterations(2, 0, 9));
  EXPECT_FALSE(t.b.ledger.turns_allow_start(1, 0, 5, 0)) << "in the way of a starved job, outside its turn";
  EXPECT_TRUE(t.b.ledger.turns_allow_start(2, 0, 0, 0)) << "an unknown peak starves nobody";
  // A claim that may_start() refuses does not matter to the turns: job 1
  // in mid-iteration without a claim holds back every start under
  // may_start(), none under the turns.
  Books b(10);
  b.join(1);
  b.join(2);
  b.hold(1, 1, 2);
  b.hold(2, 1, 2);
  EXPECT_TRUE(b.ledger.set_between_iterations(2, 0));
  EXPECT_FALSE(b.ledger.may_start(2, 0, 4, 2, 0));
  EXPECT_TRUE(b.ledger.turns_allow_start(2, 0, 4, 0));
  // Without turns it always says yes.
  Books off(10, without_parking());
  off.join(1);
  EXPECT_TRUE(off.ledger.turns_allow_start(1, 0, 100, 0));
  EXPECT_TRUE(off.ledger.turns_allow_start(7, 0, 1, 0)) << "unknown job";
}

TEST(LedgerTurns, AParkedJobThatNeverGivesBackHoldsTheGatesOnlyASecond) {
  TwoThatCannotCoRun t;
  EXPECT_TRUE(t.b.ledger.set_between_iterations(2, 0, 9));
  ASSERT_EQ(count(t.b.ledger.pump(0), Kind::kPark), 1u);
  EXPECT_EQ(t.b.ledger.turn_wait_until_ns(0, 500 * kMs), 500 * kMs) << "still giving back";
  const uint64_t later = 3 * Ledger::kMaxGateBlockNs;
  EXPECT_EQ(t.b.ledger.turn_wait_until_ns(0, later), Ledger::kMaxGateBlockNs)
      << "a job that does not give back (a client that cannot suspend) must not hold the gates for ever";
}

TEST(LedgerClaims, TheSafetyCheckFindsTheOrderInWhichEveryJobFinishes) {
  // Budget 10, nothing held. Job 1 will climb to 6 and keep 3; job 2 asks for
  // 1 of the 9 it climbs to, and keeps 1. Granted, job 2 can finish first (8
  // more, free 9) and job 1 after it (6 of the 9 free again). The least
  // needy first would send job 1 first, which keeps 3 of what job 2 needs:
  // the grant looked unsafe, and with nothing held nobody would ever be served.
  Books b(10);
  b.join(1);
  b.join(2);
  EXPECT_TRUE(b.ledger.set_claim(1, 0, 6, 3));
  EXPECT_TRUE(b.ledger.set_claim(2, 0, 9, 1));
  b.ask(2, 1, 1);
  std::vector<LedgerAction> actions = b.ledger.pump(0);
  ASSERT_EQ(actions.size(), 1u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kGrant, 2, 1, 1));
  // A grant that no order can finish still waits: job 1 asking for 2 would
  // leave 7 free, and job 2 needs 8.
  b.ask(1, 2, 2);
  EXPECT_EQ(count(b.ledger.pump(0), Kind::kGrant), 0u);
  EXPECT_EQ(b.ledger.check(), "");
}

TEST(LedgerClaims, OfTwoJobsStillClimbingTheOneThatGivesMoreBackGoesFirst) {
  // Budget 9, nothing held, both early in an iteration (each will keep more
  // than it holds). Job 1 climbs to 5 and keeps 4; job 2 climbs to 8 and
  // keeps 3, giving 5 back. With job 1's 1 granted, job 2 first (8 of the 8
  // free) then job 1 (4 of the 5 left) finishes both; job 1 first keeps 4 of
  // the 8 and leaves job 2 short. Were that the only order tried, neither
  // grant would look safe, and with nothing held nobody would ever be served.
  Books b(9);
  b.join(1);
  b.join(2);
  EXPECT_TRUE(b.ledger.set_claim(1, 0, 5, 4));
  EXPECT_TRUE(b.ledger.set_claim(2, 0, 8, 3));
  b.ask(1, 1, 1);
  b.ask(2, 1, 1);
  const std::vector<LedgerAction> actions = b.ledger.pump(0);
  ASSERT_EQ(actions.size(), 2u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kGrant, 1, 1, 1)) << describe(actions);
  EXPECT_TRUE(same(actions[1], Kind::kGrant, 2, 1, 1)) << describe(actions);
  EXPECT_EQ(b.ledger.check(), "");
}

TEST(LedgerClaims, AClaimAboveWhatTheJobCanEverHoldCountsAsThatMuch) {
  // A job whose iteration needs more than the budget (it pages beyond it):
  // counted at its claim it could never finish, and no grant, not even its
  // own, would ever be safe.
  Books b(10);
  b.join(1);
  EXPECT_TRUE(b.ledger.set_claim(1, 0, 20, 0));
  b.hold(1, 1, 3);
  // A job without a claim waits: job 1 may still need all of the budget...
  b.join(2);
  b.ask(2, 2, 1);
  EXPECT_EQ(count(b.ledger.pump(0), Kind::kGrant), 0u);
  // ... which it gets, up to the whole of it.
  b.ask(1, 3, 7);
  std::vector<LedgerAction> actions = b.ledger.pump(0);
  ASSERT_GE(actions.size(), 1u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kGrant, 1, 3, 7)) << describe(actions);
  EXPECT_EQ(count(actions, Kind::kGrant), 1u) << "job 2 waits (job 1 is asked for idle chunks)";
  // Its iteration over, it settles and job 2 goes on.
  b.give(1, 10);
  EXPECT_TRUE(b.ledger.set_between_iterations(1, 0));
  actions = b.ledger.pump(0);
  ASSERT_EQ(actions.size(), 1u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kGrant, 2, 2, 1));
  // Its maximum caps it the same way: with at most 4, job 1's claim of 20
  // leaves room for job 2.
  std::string why;
  ASSERT_TRUE(b.ledger.set_job_limits(1, 0, 0, 4, &why).is_ok()) << why;
  EXPECT_TRUE(b.ledger.set_claim(1, 0, 20, 0));
  b.hold(1, 4, 4);
  b.ask(2, 5, 5);
  actions = b.ledger.pump(0);
  ASSERT_EQ(actions.size(), 1u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kGrant, 2, 5, 5));
  EXPECT_EQ(b.ledger.check(), "");
}

// ---- Unified Memory jobs (set_pageable) -----------------------------------

TEST(LedgerClaims, AUmJobIsCountedAtWhatItHoldsOrItsFloorNotItsPeak) {
  // Job 1 holds 5 of the 8 it climbs to; job 2's 3 would leave 2 free, short
  // of what either still needs (LedgerClaims above). A UM job 1 that can run
  // holding 5, paging the rest, finishes with what it holds: the grant is safe.
  Books b = mid_iteration_pair(true);
  EXPECT_TRUE(b.ledger.set_pageable(1, 0, 5));
  b.ask(2, 1, 3);
  std::vector<LedgerAction> actions = b.ledger.pump(0);
  ASSERT_EQ(actions.size(), 1u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kGrant, 2, 1, 3));
  // A floor above what it holds counts: job 2's 4 would leave 1 free,
  // enough for neither once job 1 needs 2 more to reach a floor of 7.
  for (const uint64_t floor : {uint64_t{5}, uint64_t{7}}) {
    Books other = mid_iteration_pair(true);
    EXPECT_TRUE(other.ledger.set_pageable(1, 0, floor));
    other.ask(2, 1, 4);
    EXPECT_EQ(count(other.ledger.pump(0), Kind::kGrant), floor == 5 ? 1u : 0u) << "floor " << floor;
  }
  // Ordinary again.
  EXPECT_TRUE(b.ledger.set_pageable(1, 0, 0));
  EXPECT_FALSE(b.ledger.set_pageable(3, 0, 1)) << "job 3 never opened the GPU";
  EXPECT_EQ(b.ledger.check(), "");
}

TEST(LedgerTurns, AUmJobIsNeitherParkedNorHeldAtItsGate) {
  // As in AJobWhoseRestAWaitingRequestNeedsIsParkedNotStarted, but job 2
  // pages: it starts (giving back what job 1 needs as it pages) and is not
  // swapped out whole.
  Books b = one_waits_for_the_others_rest(true);
  EXPECT_TRUE(b.ledger.may_start(2, 0, 6, 3, 0));
  EXPECT_EQ(count(b.ledger.pump(0), Kind::kPark), 0u);
  // Nor does a UM job wait at its gate for a turn: job 2 cannot start
  // beside job 1's rest, and a UM job 1 starts rather than being parked.
  TwoThatCannotCoRun t;
  EXPECT_TRUE(t.b.ledger.set_pageable(1, 0, 2));
  EXPECT_FALSE(t.b.ledger.may_start(2, 0, 9, 2, 0));
  EXPECT_TRUE(t.b.ledger.set_between_iterations(2, 0, 9));
  EXPECT_TRUE(t.b.ledger.turns_allow_start(1, 0, 5, 0));
  EXPECT_TRUE(t.b.ledger.may_start(1, 0, 5, 3, 0));
  EXPECT_EQ(count(t.b.ledger.pump(0), Kind::kPark), 0u);
}

// Jobs 1 and 2 on a GPU of 10 chunks holding held1 and held2; a floor of 0
// leaves a job ordinary, any other makes it a UM job (set_pageable).
Books um_pair(uint64_t floor1, uint64_t held1, uint64_t floor2, uint64_t held2, LedgerOptions options = {}) {
  Books b(10, options);
  b.join(1);
  b.join(2);
  EXPECT_TRUE(floor1 == 0 || b.ledger.set_pageable(1, 0, floor1));
  EXPECT_TRUE(floor2 == 0 || b.ledger.set_pageable(2, 0, floor2));
  b.hold(1, 1, held1);
  b.hold(2, 1, held2);
  return b;
}

TEST(LedgerUm, AUmJobsRequestBlocksNobodyAndReclaimReachesItWhileItWaits) {
  // Budget 10: UM job 1 (floor 2) holds 6 and wishes for 3 more; job 2
  // holds 2. Job 2's 2 fit behind job 1's wish, which does not: granted.
  Books b = um_pair(2, 6, 0, 2);
  b.ask(1, 2, 3);
  b.ask(2, 2, 2);
  std::vector<LedgerAction> actions = b.ledger.pump(0);
  ASSERT_GE(actions.size(), 1u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kGrant, 2, 2, 2)) << describe(actions);
  // The wish may take what an ordinary job holds idle, never the UM job's own pages.
  for (const LedgerAction& a : actions) {
    EXPECT_FALSE(a.kind == Kind::kReclaim && a.job == 1) << "a UM job was asked to page out for its own wish";
  }
  b.give(2, 0, count(actions, Kind::kReclaim) == 1);  // job 2 has nothing idle
  // Job 2 needs 3 more with nothing free: job 1, waiting but running on,
  // is asked to page out 3 (it keeps its floor), and nobody yields.
  b.ask(2, 3, 3);
  actions = b.ledger.pump(0);
  ASSERT_EQ(count(actions, Kind::kReclaim), 1u) << describe(actions);
  EXPECT_TRUE(same(actions.back(), Kind::kReclaim, 1, 0, 3)) << describe(actions);
  EXPECT_EQ(count(actions, Kind::kYield), 0u) << describe(actions);
  b.give(1, 3, true);
  actions = b.ledger.pump(0);
  EXPECT_EQ(count(actions, Kind::kGrant), 1u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kGrant, 2, 3, 3)) << describe(actions);
  EXPECT_EQ(b.ledger.check(), "");
}

TEST(LedgerUm, AUmJobsWishTakesFromAnotherUmJobOnlyAboveAnEqualShare) {
  Books b = um_pair(2, 6, 3, 4);
  // Job 2 wishes for 3 more: job 1 pages out only what it holds above half the budget.
  b.ask(2, 2, 3);
  std::vector<LedgerAction> actions = b.ledger.pump(0);
  ASSERT_EQ(actions.size(), 1u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kReclaim, 1, 0, 1)) << describe(actions);
  // The chunk it gives serves part of the wish; then both hold their share and nobody is asked.
  b.give(1, 1, true);
  actions = b.ledger.pump(0);
  ASSERT_EQ(actions.size(), 1u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kGrant, 2, 2, 1)) << describe(actions);
  b.ask(2, 3, 2);
  EXPECT_TRUE(b.ledger.pump(1'000'000'000).empty());
  // A budget cut to 5: each is asked down to its floor at most, 3 + 2.
  std::string why;
  ASSERT_TRUE(b.ledger.set_budget(0, 5, &why).is_ok()) << why;
  actions = b.ledger.pump(2'000'000'000);
  uint64_t asked = 0;
  for (const LedgerAction& a : actions) {
    if (a.kind != Kind::kReclaim) continue;
    EXPECT_LE(a.chunks, a.job == 1 ? 3u : 2u) << describe(actions);
    asked += a.chunks;
  }
  EXPECT_EQ(asked, 5u) << describe(actions);
  b.give(1, 3, true);
  b.give(2, 2, true);
  // The floors (2 + 3) fit a budget of 5. At 4 the budget wins: one is
  // asked below its floor for the last chunk.
  ASSERT_TRUE(b.ledger.set_budget(0, 4, &why).is_ok()) << why;
  actions = b.ledger.pump(3'000'000'000);
  ASSERT_EQ(count(actions, Kind::kReclaim), 1u) << describe(actions);
  EXPECT_EQ(actions.back().chunks, 1u) << describe(actions);
  EXPECT_EQ(b.ledger.check(), "");
}

TEST(LedgerUm, AnOrdinaryJobIsNeverStarvedByUmFloors) {
  // UM job 1 holds its floor of 8 of 10; ordinary job 2 holds 2 and needs 2
  // more. Job 1 is asked below its floor (it pages its kernels); job 2 is
  // neither refused nor made to yield.
  for (const DeadlockPolicy policy : {DeadlockPolicy::kYield, DeadlockPolicy::kFail}) {
    LedgerOptions options;
    options.deadlock_policy = policy;
    Books b = um_pair(8, 8, 0, 2, options);
    b.ask(2, 2, 2);
    uint64_t asked = 0;
    for (uint64_t now = 0; now < 1'000'000'000 && asked < 2; now += 200'000'000) {
      const std::vector<LedgerAction> actions = b.ledger.pump(now);
      EXPECT_EQ(count(actions, Kind::kYield) + count(actions, Kind::kDeny), 0u) << describe(actions);
      for (const LedgerAction& a : actions) {
        if (a.kind != Kind::kReclaim) continue;
        EXPECT_EQ(a.job, 1u) << describe(actions);
        asked += a.chunks;
        b.give(a.job, a.chunks, true, now);
      }
    }
    EXPECT_EQ(asked, 2u);
    const std::vector<LedgerAction> actions = b.ledger.pump(1'000'000'000);
    ASSERT_EQ(actions.size(), 1u) << describe(actions);
    EXPECT_TRUE(same(actions[0], Kind::kGrant, 2, 2, 2)) << describe(actions);
    EXPECT_EQ(b.ledger.check(), "");
  }
}

TEST(LedgerUm, AUmWishKeepsNoOrdinaryJobAtItsGate) {
  // With turns, a request another job's rest is needed for keeps that job
  // at its gate (LedgerTurns); a UM job's wish does not: it runs on.
  LedgerOptions options;
  options.park_between = true;
  Books b = um_pair(0, 6, 1, 3, options);
  EXPECT_TRUE(b.ledger.set_between_iterations(1, 0));
  b.ask(2, 2, 4);
  EXPECT_EQ(count(b.ledger.pump(0), Kind::kPark), 0u);
  EXPECT_TRUE(b.ledger.may_start(1, 0, 6, 2, 0)) << "a UM wish held an ordinary job at its gate";
  EXPECT_EQ(count(b.ledger.pump(0), Kind::kPark), 0u);
}

TEST(LedgerUm, AJobThatPagesAtItsGateIsAskedAheadOfTheClaimsThatNeedItNotParked) {
  // Job 1 rests at its gate holding 3 of 10; job 2 would start an iteration
  // that climbs to 9 (TwoThatCannotCoRun: job 1 is parked, all 3 swapped).
  // A UM job 1 that pages up to 2 at its gate keeps 1 there, room enough.
  TwoThatCannotCoRun t;
  Books& b = t.b;
  EXPECT_TRUE(b.ledger.set_gate_paging(1, 0, 2));
  EXPECT_TRUE(b.ledger.may_start(2, 0, 9, 2, 0));
  EXPECT_TRUE(b.ledger.set_claim(2, 0, 9, 2));
  // Job 2's claim needs 7 more with 5 free: job 1 is asked for 2 now, before
  // job 2 climbs, and is not parked.
  std::vector<LedgerAction> actions = b.ledger.pump(0);
  ASSERT_EQ(actions.size(), 1u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kReclaim, 1, 0, 2)) << describe(actions);
  b.give(1, 2, true, 5 * kMs);
  b.ask(2, 2, 7, 5 * kMs);
  actions = b.ledger.pump(5 * kMs);
  ASSERT_EQ(actions.size(), 1u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kGrant, 2, 2, 7)) << describe(actions);
  // It pages no more than 2 at one gate: a claim grown by 1 asks it nothing.
  EXPECT_TRUE(b.ledger.set_claim(2, 0, 10, 2));
  EXPECT_TRUE(b.ledger.pump(6 * kMs).empty());
  // Once it has started again, it pages at its next gate afresh.
  b.give(2, 7, false, 7 * kMs);
  EXPECT_TRUE(b.ledger.set_between_iterations(2, 0));
  EXPECT_TRUE(b.ledger.set_claim(1, 0, 5, 3));
  EXPECT_TRUE(b.ledger.set_between_iterations(1, 0, 5));
  EXPECT_TRUE(b.ledger.set_claim(2, 0, 10, 2));
  actions = b.ledger.pump(8 * kMs);
  ASSERT_EQ(actions.size(), 1u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kReclaim, 1, 0, 1)) << describe(actions);
  EXPECT_EQ(b.ledger.gpu(0).parks, 0u);
  EXPECT_EQ(b.ledger.check(), "");
}

TEST(LedgerUm, AJobThatPagesAtItsGateServesAWaitingRequestAtOnceThenIsParked) {
  // Job 2 holds 7 of 10 without a claim (still learning) and asks one chunk
  // at a time; job 1 rests at its gate holding 3 and pages up to 2 there.
  Books b(10);
  b.join(1);
  b.join(2);
  b.hold(1, 1, 3);
  EXPECT_TRUE(b.ledger.set_between_iterations(1, 0));
  EXPECT_TRUE(b.ledger.set_gate_paging(1, 0, 2));
  b.hold(2, 1, 7);
  for (uint64_t ask = 2; ask <= 3; ++ask) {
    // Each request is served from job 1's page-out at once, not a reclaim
    // retry (100 ms) later.
    const uint64_t now = ask * kMs;
    b.ask(2, ask, 1, now);
    std::vector<LedgerAction> actions = b.ledger.pump(now);
    ASSERT_EQ(actions.size(), 1u) << describe(actions);
    EXPECT_TRUE(same(actions[0], Kind::kReclaim, 1, 0, 1)) << describe(actions);
    b.give(1, 1, true, now);
    actions = b.ledger.pump(now);
    ASSERT_EQ(actions.size(), 1u) << describe(actions);
    EXPECT_TRUE(same(actions[0], Kind::kGrant, 2, ask, 1)) << describe(actions);
  }
  // Its 2 paged out, the next request needs its last chunk: it is parked.
  b.ask(2, 4, 1, 4 * kMs);
  const std::vector<LedgerAction> actions = b.ledger.pump(4 * kMs);
  ASSERT_EQ(actions.size(), 1u) << describe(actions);
  EXPECT_TRUE(same(actions[0], Kind::kPark, 1, 0, 1)) << describe(actions);
  EXPECT_EQ(b.ledger.check(), "");
}

TEST(LedgerUm, AJobThatPagesTooLittleAtItsGateIsParkedAsBefore) {
  // Paging 1 at its gate would leave 2 there, in the way of job 2's 9.
  TwoThatCannotCoRun t;
  EXPECT_TRUE(t.b.ledger.set_gate_paging(1, 0, 1));
  t.park_job_1(0);
  EXPECT_FALSE(t.b.ledger.set_gate_paging(3, 0, 1)) << "job 3 never opened the GPU";
}

}  // namespace
}  // namespace zico::sharing
