#include "ledger.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace zico::sharing {
namespace {

using Kind = LedgerAction::Kind;
constexpr uint64_t kMs = 1'000'000;
constexpr uint64_t kRetry = 100 * kMs;  // LedgerOptions' default reclaim_retry_ns

std::string describe(const std::vector<LedgerAction>& actions) {
  static const char* const kNames[] = {"grant", "deny", "reclaim", "yield", "park", "resume"};
  std::string text;
  for (const LedgerAction& a : actions) {
    text += std::string(kNames[static_cast<int>(a.kind)]) + "(job " + std::to_string(a.job) + " gpu " +
            std::to_string(a.gpu) + " req " + std::to_string(a.request_id) + " chunks " + std::to_string(a.chunks) +
            ") ";
  }
  return text.empty() ? "no actions" : text;
}

bool same(const LedgerAction& a, Kind kind, JobId job, uint64_t request_id, uint64_t chunks) {
  return a.kind == kind && a.job == job && a.request_id == request_id && a.chunks == chunks;
}

size_t count(const std::vector<LedgerAction>& actions, Kind kind) {
  size_t n = 0;
  for (const LedgerAction& a : actions) n += a.kind == kind ? 1 : 0;
  return n;
}

// A ledger with one GPU and helpers that fail the test on unexpected errors.
// Job ids double as their arrival order, so a higher id is younger.
struct Books {
  explicit Books(uint64_t budget, LedgerOptions options = {}) : ledger(options) { ledger.add_gpu(budget); }

  void join(JobId job, uint64_t min = 0, uint64_t max = UINT64_MAX, uint64_t held = 0) {
    std::string why;
    EXPECT_TRUE(ledger.add_job(job, 1000, job));
    EXPECT_TRUE(ledger.open(job, 0, held, &why).is_ok()) << why;
    EXPECT_TRUE(ledger.set_job_limits(job, 0, min, max, &why).is_ok()) << why;
  }
  void ask(JobId job, uint64_t id, uint64_t chunks, uint64_t now = 0) {
    std::string why;
    EXPECT_TRUE(ledger.request(job, 0, id, chunks, now, &why).is_ok()) << why;
  }
  void give(JobId job, uint64_t chunks, bool reclaim_reply = false, uint64_t now = 0) {
    std::string why;
    EXPECT_TRUE(ledger.returned(job, 0, chunks, reclaim_reply, now, &why).is_ok()) << why;
  }
  // Puts `chunks` in the job's hands through an ordinary grant.
  void hold(JobId job, uint64_t id, uint64_t chunks) {
    ask(job, id, chunks);
    const std::vector<LedgerAction> actions = ledger.pump(0);
    EXPECT_TRUE(actions.size() == 1 && same(actions[0], Kind::kGrant, job, id, chunks)) << describe(actions);
  }
  Ledger::JobView view(JobId job, uint64_t now = 0) const {
    Ledger::JobView v;
    EXPECT_TRUE(ledger.job(job, 0, now, &v));
    return v;
  }
  uint64_t held(JobId job) const { return view(job).held; }

  Ledger ledger;
};

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

// --- randomized: a daemon that carries out every action -------------------

constexpr uint32_t kGpus = 2;

struct SimJob {
  std::array<bool, kGpus> open{};
  std::array<uint64_t, kGpus> held{};
  std::array<uint64_t, kGpus> asked{};  // outstanding reclaim, 0 if none
  std::map<uint64_t, std::pair<uint32_t, uint64_t>> waiting;  // request id -> (GPU, chunks)
  uint64_t next_request = 1;
  std::array<bool, kGpus> parked{};
  bool frozen = false;
};

// What the random daemon's jobs do besides asking and giving back: with
// claims, they also claim, wait at their gates (and ask may_start), get
// frozen and thawed; parks (turns) then happen and are carried out.
enum class Iterations : uint8_t { kNone, kClaimsAndTurns };

class Daemon {
 public:
  Daemon(DeadlockPolicy policy, uint64_t seed, Iterations iterations = Iterations::kNone)
      : ledger_(options(policy)), policy_(policy), iterations_(iterations), rng_(seed) {
    for (uint32_t g = 0; g < kGpus; ++g) ledger_.add_gpu(pick(8, 32));
    for (int i = 0; i < 6; ++i) add_job();
  }

  void run(int operations) {
    for (int op = 0; op < operations; ++op) {
      now_ += pick(0, 30 * kMs);
      step();
      pump();
      verify();
      if (::testing::Test::HasFatalFailure() || ::testing::Test::HasNonfatalFailure()) {
        ADD_FAILURE() << "after operation " << op;
        return;
      }
      if (op % 2500 == 2499) {
        drain(op % 5000 == 2499);
        if (::testing::Test::HasFailure()) return;
      }
    }
  }

 private:
  static LedgerOptions options(DeadlockPolicy policy) {
    LedgerOptions o;
    o.deadlock_policy = policy;
    o.reclaim_retry_ns = kRetry;
    return o;
  }

  uint64_t pick(uint64_t lo, uint64_t hi) { return std::uniform_int_distribution<uint64_t>(lo, hi)(rng_); }
  JobId any_job() {
    auto it = jobs_.begin();
    std::advance(it, static_cast<std::ptrdiff_t>(pick(0, jobs_.size() - 1)));
    return it->first;
  }
  uint32_t any_gpu() { return static_cast<uint32_t>(pick(0, kGpus - 1)); }

  Ledger::JobView view(JobId job, uint32_t gpu) {
    Ledger::JobView v;
    EXPECT_TRUE(ledger_.job(job, gpu, now_, &v));
    return v;
  }
  uint64_t sum_mins(uint32_t gpu) {
    uint64_t sum = 0;
    for (auto& [id, job] : jobs_) {
      if (job.open[gpu]) sum += view(id, gpu).min;
    }
    return sum;
  }

  void open(JobId id, uint32_t gpu, uint64_t held) {
    std::string why;
    ASSERT_TRUE(ledger_.open(id, gpu, held, &why).is_ok()) << why;
    jobs_[id].open[gpu] = true;
    jobs_[id].held[gpu] = held;
  }

  void add_job() {
    const JobId id = next_job_++;
    ASSERT_TRUE(ledger_.add_job(id, 1000, id));
    jobs_[id];
    for (uint32_t g = 0; g < kGpus; ++g) {
      if (pick(0, 1) == 0) continue;
      // Now and then a job "reconnects" holding chunks, even past the budget.
      open(id, g, pick(0, 9) == 0 ? pick(1, ledger_.gpu(g).budget / 2) : 0);
    }
  }

  void ask(JobId id, uint32_t gpu, uint64_t chunks) {
    SimJob& job = jobs_[id];
    if (!job.open[gpu]) open(id, gpu, 0);
    const uint64_t request_id = job.next_request++;
    std::string why;
    ASSERT_TRUE(ledger_.request(id, gpu, request_id, chunks, now_, &why).is_ok()) << why;
    job.waiting[request_id] = {gpu, chunks};
  }

  void give(JobId id, uint32_t gpu, uint64_t chunks, bool reclaim_reply) {
    SimJob& job = jobs_[id];
    std::string why;
    ASSERT_TRUE(ledger_.returned(id, gpu, chunks, reclaim_reply, now_, &why).is_ok()) << why;
    job.held[gpu] -= chunks;
    if (reclaim_reply) job.asked[gpu] = 0;
  }

  // A job's iteration: a claim, a wait at its gate (asking may_start), or
  // its connection lost and found (frozen).
  void iterate(JobId id, uint32_t gpu, uint64_t budget) {
    SimJob& job = jobs_[id];
    if (!job.open[gpu]) return;
    const uint64_t dice = pick(0, 9);
    if (dice < 4) {
      const uint64_t peak = pick(0, 4) == 0 ? 0 : pick(1, budget + 2);
      EXPECT_TRUE(ledger_.set_claim(id, gpu, peak, pick(0, peak)));
    } else if (dice < 8) {
      const uint64_t next_peak = pick(0, 1) == 0 ? 0 : pick(1, budget + 2);
      EXPECT_TRUE(ledger_.set_between_iterations(id, gpu, next_peak));
      const bool may = ledger_.may_start(id, gpu, next_peak, pick(0, next_peak), now_);
      EXPECT_TRUE(!may || !job.parked[gpu]) << "a parked job may not start";
    } else {
      job.frozen = !job.frozen;
      ledger_.set_frozen(id, job.frozen);
      if (job.frozen) job.parked.fill(false);  // a frozen job cannot be a victim
    }
  }

  void step() {
    const uint64_t dice = pick(0, 99);
    const JobId id = any_job();
    SimJob& job = jobs_[id];
    const uint32_t gpu = any_gpu();
    const uint64_t budget = ledger_.gpu(gpu).budget;
    std::string why;
    if (iterations_ == Iterations::kClaimsAndTurns && pick(0, 3) == 0) {
      iterate(id, gpu, budget);
    } else if (dice < 30) {
      // Mostly modest asks; sometimes more than can ever be had.
      ask(id, gpu, pick(0, 9) == 0 ? pick(1, budget + 8) : pick(1, std::max<uint64_t>(1, budget / 3)));
    } else if (dice < 38) {
      if (job.waiting.empty()) {
        EXPECT_FALSE(ledger_.cancel(id, job.next_request + 5, now_));
        return;
      }
      auto it = job.waiting.begin();
      std::advance(it, static_cast<std::ptrdiff_t>(pick(0, job.waiting.size() - 1)));
      EXPECT_TRUE(ledger_.cancel(id, it->first, now_));
      job.waiting.erase(it);
    } else if (dice < 58) {
      if (job.open[gpu] && job.held[gpu] > 0) give(id, gpu, pick(1, job.held[gpu]), false);
    } else if (dice < 73) {
      if (job.asked[gpu] > 0) give(id, gpu, pick(0, job.held[gpu]), true);
    } else if (dice < 78) {
      if (jobs_.size() > 4) {
        ledger_.remove_job(id);
        jobs_.erase(id);
      }
    } else if (dice < 85) {
      if (jobs_.size() < 8) add_job();
    } else if (dice < 90) {
      const uint64_t mins = sum_mins(gpu);
      const uint64_t target = pick(mins > 2 ? mins - 2 : 0, 40);
      const Status status = ledger_.set_budget(gpu, target, &why);
      EXPECT_EQ(status.is_ok(), target >= mins) << why;
    } else if (dice < 95) {
      if (!job.open[gpu]) return;
      const uint64_t min = pick(0, budget / 3);
      const uint64_t max = pick(0, 3) == 0 ? UINT64_MAX : pick(min > 0 ? min - 1 : 0, budget);
      const uint64_t mins = sum_mins(gpu) - view(id, gpu).min + min;
      const Status status = ledger_.set_job_limits(id, gpu, min, max, &why);
      EXPECT_EQ(status.is_ok(), min <= max && mins <= budget) << why;
    } else {
      if (!job.open[gpu]) return;
      EXPECT_EQ(ledger_.returned(id, gpu, job.held[gpu] + 1, false, now_, &why).code(), Errc::kInvalidArgument);
    }
  }

  // One pump, every action checked against the rules and carried out.
  void pump() {
    for (int round = 0; round < 8; ++round) {
      std::array<uint64_t, kGpus> granted{};
      std::array<Ledger::GpuView, kGpus> before{};
      for (uint32_t g = 0; g < kGpus; ++g) {
        before[g] = ledger_.gpu(g);
        granted[g] = before[g].granted;
      }
      const std::vector<LedgerAction> actions = ledger_.pump(now_);
      std::vector<LedgerAction> yields;
      std::vector<LedgerAction> parks;
      for (const LedgerAction& a : actions) {
        ASSERT_TRUE(jobs_.count(a.job) == 1) << describe(actions);
        SimJob& job = jobs_[a.job];
        const uint64_t budget = before[a.gpu].budget;
        if (a.kind == Kind::kPark) {
          EXPECT_FALSE(job.frozen) << "parked a frozen job: " << describe(actions);
          EXPECT_FALSE(job.parked[a.gpu]) << "parked twice: " << describe(actions);
          EXPECT_EQ(job.asked[a.gpu], 0u) << "parked a job with a reclaim outstanding: " << describe(actions);
          EXPECT_EQ(a.chunks, job.held[a.gpu]) << describe(actions);
          for (const auto& [rid, w] : job.waiting) {
            EXPECT_NE(w.first, a.gpu) << "parked a waiting job: " << describe(actions);
          }
          job.parked[a.gpu] = true;
          parks.push_back(a);
          continue;
        }
        if (a.kind == Kind::kResume) {
          EXPECT_TRUE(job.parked[a.gpu]) << "resumed a job not parked: " << describe(actions);
          job.parked[a.gpu] = false;
          resumes_ += 1;
          continue;
        }
        if (a.kind == Kind::kReclaim) {
          EXPECT_EQ(job.asked[a.gpu], 0u) << "asked twice: " << describe(actions);
          EXPECT_FALSE(job.frozen) << "asked a frozen job: " << describe(actions);
          EXPECT_FALSE(job.parked[a.gpu] && job.held[a.gpu] > 0) << "asked a park's victim: " << describe(actions);
          const Ledger::JobView v = view(a.job, a.gpu);
          EXPECT_GE(a.chunks, 1u);
          EXPECT_LE(a.chunks + v.min, job.held[a.gpu]) << "asked below its minimum: " << describe(actions);
          for (const auto& [rid, w] : job.waiting) {
            EXPECT_NE(w.first, a.gpu) << "asked a waiting job: " << describe(actions);
          }
          job.asked[a.gpu] = a.chunks;
          continue;
        }
        auto it = job.waiting.find(a.request_id);
        ASSERT_TRUE(it != job.waiting.end() && it->second.first == a.gpu) << describe(actions);
        const uint64_t chunks = it->second.second;
        job.waiting.erase(it);
        if (a.kind == Kind::kGrant) {
          EXPECT_EQ(a.chunks, chunks);
          EXPECT_LE(granted[a.gpu] + chunks, budget) << "a grant broke the budget: " << describe(actions);
          uint64_t unmet = 0;  // the others' minimums must stay reachable
          for (auto& [other_id, other] : jobs_) {
            if (other_id == a.job || !other.open[a.gpu]) continue;
            const uint64_t min = view(other_id, a.gpu).min;
            unmet += min > other.held[a.gpu] ? min - other.held[a.gpu] : 0;
          }
          EXPECT_LE(granted[a.gpu] + chunks + unmet, budget) << "no room left for minimums: " << describe(actions);
          EXPECT_LE(job.held[a.gpu] + chunks, view(a.job, a.gpu).max) << describe(actions);
          granted[a.gpu] += chunks;
          job.held[a.gpu] += chunks;
        } else if (a.kind == Kind::kDeny) {
          EXPECT_EQ(a.errc, Errc::kOutOfMemory);
          const bool deadlock = a.reason.find("deadlock") != std::string::npos;
          EXPECT_TRUE(!deadlock || policy_ == DeadlockPolicy::kFail) << a.reason;
          if (!deadlock) {
            // Denied only if it could never be served (held as it was then).
            const Ledger::JobView v = view(a.job, a.gpu);
            const uint64_t others = sum_mins(a.gpu) - v.min;
            const uint64_t ceiling = std::min(v.max, budget > others ? budget - others : 0);
            EXPECT_GT(job.held[a.gpu] + chunks, ceiling) << "a possible request was denied: " << a.reason;
          }
          denials_ += 1;
        } else {
          EXPECT_EQ(policy_, DeadlockPolicy::kYield);
          EXPECT_EQ(a.chunks, job.held[a.gpu]) << describe(actions);
          yields.push_back(a);
          yield_sizes_[{a.job, a.request_id}] = chunks;
        }
      }
      for (uint32_t g = 0; g < kGpus; ++g) {
        const uint64_t after = ledger_.gpu(g).granted;
        // A pump never pushes granted above the budget (it may already be there).
        if (after > before[g].budget) {
          EXPECT_LE(after, before[g].granted) << "GPU " << g;
        }
        grants_ += ledger_.gpu(g).grants - before[g].grants;
      }
      // A parked job gives back everything (it suspends between iterations).
      for (const LedgerAction& p : parks) {
        if (jobs_[p.job].held[p.gpu] > 0) give(p.job, p.gpu, jobs_[p.job].held[p.gpu], false);
        parks_ += 1;
      }
      if (yields.empty() && parks.empty()) return;
      // The victim gives back everything, then asks again at the back.
      for (const LedgerAction& y : yields) {
        if (jobs_[y.job].held[y.gpu] > 0) give(y.job, y.gpu, jobs_[y.job].held[y.gpu], false);
        ask(y.job, y.gpu, yield_sizes_[{y.job, y.request_id}]);
        yields_ += 1;
      }
    }
  }

  void verify() {
    ASSERT_EQ(ledger_.check(), "");
    ASSERT_EQ(ledger_.jobs().size(), jobs_.size());
    std::array<uint64_t, kGpus> waiting{};
    for (auto& [id, job] : jobs_) {
      std::array<uint64_t, kGpus> chunks{};
      for (const auto& [rid, w] : job.waiting) chunks[w.first] += w.second;
      for (uint32_t g = 0; g < kGpus; ++g) {
        Ledger::JobView v;
        ASSERT_EQ(ledger_.job(id, g, now_, &v), job.open[g]);
        if (!job.open[g]) continue;
        ASSERT_EQ(v.held, job.held[g]) << "job " << id << " GPU " << g;
        ASSERT_EQ(v.waiting, chunks[g]) << "job " << id << " GPU " << g;
        waiting[g] += chunks[g];
      }
    }
    for (uint32_t g = 0; g < kGpus; ++g) ASSERT_EQ(ledger_.gpu(g).waiting, waiting[g]);
  }

  // Liveness: jobs stop asking and answer reclaims in full, keeping what
  // they are granted; then every waiting request ends, and (checked in pump)
  // only impossible ones, or kFail victims, end denied. Every other time the
  // jobs first give back everything; otherwise waiters start out holding
  // chunks, which is where deadlocks come from.
  void drain(bool give_back_first) {
    // Jobs answer again and say nothing of their iterations: claims can be
    // wrong and a frozen job gives back only when it goes, so neither is
    // promised to end every wait.
    for (auto& [id, job] : jobs_) {
      if (job.frozen) ledger_.set_frozen(id, false);
      job.frozen = false;
      for (uint32_t g = 0; g < kGpus; ++g) {
        if (job.open[g]) {
          EXPECT_TRUE(ledger_.set_claim(id, g, 0, 0));
        }
      }
    }
    for (auto& [id, job] : jobs_) {
      for (uint32_t g = 0; g < kGpus; ++g) {
        if (job.open[g] && give_back_first) give(id, g, job.held[g], job.asked[g] > 0);
      }
    }
    for (int i = 0; i < 1000; ++i) {
      now_ += kRetry;
      pump();
      verify();
      if (::testing::Test::HasFailure()) return;
      for (auto& [id, job] : jobs_) {
        for (uint32_t g = 0; g < kGpus; ++g) {
          if (job.asked[g] > 0) give(id, g, std::min(job.asked[g], job.held[g]), true);
        }
      }
      if (ledger_.gpu(0).waiting == 0 && ledger_.gpu(1).waiting == 0) {
        drains_ += 1;
        return;
      }
    }
    ADD_FAILURE() << "requests still wait: GPU 0 " << ledger_.gpu(0).waiting << ", GPU 1 " << ledger_.gpu(1).waiting;
  }

 public:
  uint64_t grants_ = 0;
  uint64_t denials_ = 0;
  uint64_t yields_ = 0;
  uint64_t parks_ = 0;
  uint64_t resumes_ = 0;
  uint64_t drains_ = 0;

 private:
  Ledger ledger_;
  DeadlockPolicy policy_;
  Iterations iterations_;
  std::mt19937_64 rng_;
  std::map<JobId, SimJob> jobs_;
  std::map<std::pair<JobId, uint64_t>, uint64_t> yield_sizes_;
  JobId next_job_ = 1;
  uint64_t now_ = 0;
};

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

TEST(LedgerTurns, AJobWhoseRestAWaitingRequestNeedsIsParkedNotStarted) {
  // Job 1, in mid-iteration, waits for 8 with 7 free: only job 2, resting
  // at its gate, can give the eighth (without parking it would start, and the
  // two would deadlock; LedgerClaims above).
  Books b(10);
  b.join(1);
  b.join(2);
  b.hold(2, 1, 3);
  EXPECT_TRUE(b.ledger.set_between_iterations(2, 0));
  EXPECT_TRUE(b.ledger.set_claim(1, 0, 8, 1));
  b.ask(1, 1, 8);
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

TEST(LedgerProperty, RandomDaemonWithYieldKeepsBooksAndLiveness) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Daemon daemon(DeadlockPolicy::kYield, seed);
    daemon.run(20'000);
    EXPECT_GT(daemon.grants_, 0u);
    EXPECT_GT(daemon.denials_, 0u);
    EXPECT_GT(daemon.yields_, 0u) << "the run should reach deadlocks";
    EXPECT_EQ(daemon.drains_, 8u);
  }
}

// The same daemon whose jobs also claim, wait at their gates and get frozen:
// the banker's check, turns and frozen jobs join the rules under test.
TEST(LedgerProperty, RandomDaemonWithClaimsTurnsAndFrozenJobsKeepsBooksAndLiveness) {
  for (uint64_t seed : {6u, 7u, 8u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Daemon daemon(DeadlockPolicy::kYield, seed, Iterations::kClaimsAndTurns);
    daemon.run(20'000);
    EXPECT_GT(daemon.grants_, 0u);
    EXPECT_GT(daemon.yields_, 0u);
    EXPECT_GT(daemon.parks_, 0u) << "the run should reach turns";
    EXPECT_GT(daemon.resumes_, 0u);
    EXPECT_EQ(daemon.drains_, 8u);
  }
}

TEST(LedgerProperty, RandomDaemonWithFailKeepsBooksAndLiveness) {
  for (uint64_t seed : {4u, 5u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Daemon daemon(DeadlockPolicy::kFail, seed);
    daemon.run(20'000);
    EXPECT_GT(daemon.grants_, 0u);
    EXPECT_EQ(daemon.yields_, 0u);
    EXPECT_EQ(daemon.drains_, 8u);
  }
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

}  // namespace
}  // namespace zico::sharing
