#include "iteration_gates.h"
#include "test_curves.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "ledger.h"

namespace zico::sharing {
namespace {

constexpr uint64_t kMs = 1'000'000;
constexpr uint64_t kGiB = uint64_t{1} << 30;

using testing::triangle_curve;

SchedulerOptions no_headroom() {
  SchedulerOptions options;
  options.headroom = 0;
  return options;
}

// Two jobs with a learned pattern under a budget that holds one peak and
// the other's floor: job 1 goes at once, job 2 waits until job 1's peak has
// passed, then goes.
IterationGates two_jobs(bool time_shift) {
  IterationGates gates(time_shift, no_headroom());
  gates.add_gpu(14 * kGiB);
  for (JobId job : {1, 2}) {
    gates.open(job, 0);
    gates.set_curve(job, 0, triangle_curve(100 * kMs, 1 * kGiB, 10 * kGiB));
  }
  return gates;
}

TEST(IterationGates, HoldsTheSecondJobUntilTheFirstJobsPeakHasPassed) {
  IterationGates gates = two_jobs(true);
  gates.arrive(1, 7, 0);
  auto opened = gates.due(0);
  ASSERT_EQ(opened.size(), 1u);
  EXPECT_EQ(opened[0].job, 1u);
  EXPECT_EQ(opened[0].sequence, 7u);

  gates.arrive(2, 1, 1 * kMs);
  EXPECT_TRUE(gates.due(1 * kMs).empty());
  const uint64_t next = gates.next_due_ns();
  ASSERT_NE(next, UINT64_MAX);
  EXPECT_GT(next, 1 * kMs);
  EXPECT_LT(next, 100 * kMs);
  EXPECT_TRUE(gates.due(next - 1).empty());
  opened = gates.due(next);
  ASSERT_EQ(opened.size(), 1u);
  EXPECT_EQ(opened[0].job, 2u);
  EXPECT_EQ(gates.waiting(), 0u);
  EXPECT_EQ(gates.delayed_gates(), 1u);
  EXPECT_EQ(gates.delay_ns(), next - 1 * kMs);
}

TEST(IterationGates, FcfsOpensEveryGateAtOnce) {
  IterationGates gates = two_jobs(false);
  gates.arrive(1, 1, 0);
  gates.arrive(2, 1, 0);
  EXPECT_EQ(gates.due(0).size(), 2u);
  EXPECT_EQ(gates.next_due_ns(), UINT64_MAX);
  EXPECT_EQ(gates.delayed_gates(), 0u);
}

TEST(IterationGates, ABudgetIncreaseReleasesAWaitingGate) {
  IterationGates gates = two_jobs(true);
  gates.arrive(1, 1, 0);
  (void)gates.due(0);
  gates.arrive(2, 1, 0);
  ASSERT_TRUE(gates.due(0).empty());
  gates.set_budget(0, 24 * kGiB);
  const auto opened = gates.due(2 * kMs);
  ASSERT_EQ(opened.size(), 1u);
  EXPECT_EQ(opened[0].job, 2u);
}

TEST(IterationGates, ABudgetCutHoldsAGateThatWouldHaveOpened) {
  IterationGates gates = two_jobs(true);
  gates.set_budget(0, 24 * kGiB);
  gates.arrive(1, 1, 0);
  (void)gates.due(0);
  gates.arrive(2, 1, 0);
  // Planned for now under 24 GiB; the cut to 14 GiB comes before it opens.
  ASSERT_EQ(gates.next_due_ns(), 0u);
  gates.set_budget(0, 14 * kGiB);
  EXPECT_TRUE(gates.due(0).empty());
  EXPECT_GT(gates.next_due_ns(), 0u);
}

TEST(IterationGates, ALeavingJobReleasesTheOthersAndLeavesNoGateBehind) {
  IterationGates gates = two_jobs(true);
  gates.arrive(1, 1, 0);
  (void)gates.due(0);
  gates.arrive(2, 1, 0);
  ASSERT_TRUE(gates.due(0).empty());
  gates.remove_job(1);
  EXPECT_EQ(gates.due(1 * kMs).size(), 1u);
  gates.arrive(1, 2, 2 * kMs);  // unknown now: it waits for nothing
  EXPECT_EQ(gates.due(2 * kMs).size(), 1u);
  gates.remove_job(2);
  gates.remove_job(1);
  EXPECT_EQ(gates.waiting(), 0u);
}

TEST(IterationGates, AJobOnTwoGpusWaitsForTheLaterOfTheirDecisions) {
  // GPU 1 is the constraint, GPU 0 is not: the later decision must win.
  IterationGates gates(true, no_headroom());
  gates.add_gpu(100 * kGiB);
  gates.add_gpu(14 * kGiB);
  for (JobId job : {1, 2}) {
    gates.open(job, 0);
    gates.set_curve(job, 0, triangle_curve(100 * kMs, 1 * kGiB, 10 * kGiB));
    gates.open(job, 1);
    gates.set_curve(job, 1, triangle_curve(100 * kMs, 1 * kGiB, 10 * kGiB));
  }
  gates.arrive(1, 1, 0);
  (void)gates.due(0);
  // What GPU 1 alone would decide.
  TimeShiftScheduler alone(no_headroom());
  alone.set_budget(14 * kGiB);
  for (JobId job : {1, 2}) {
    alone.add_job(job);
    alone.set_curve(job, triangle_curve(100 * kMs, 1 * kGiB, 10 * kGiB));
  }
  alone.started(1, 0);
  const uint64_t expected = alone.plan_start(2, 0).start_ns;
  ASSERT_GT(expected, 0u);
  gates.arrive(2, 1, 0);
  EXPECT_TRUE(gates.due(0).empty());
  EXPECT_EQ(gates.next_due_ns(), expected);
}

// After a re-plan the oldest waiting job is placed first, not around a
// younger one's stale plan.
TEST(IterationGates, ReplansServeTheOldestWaiterFirst) {
  IterationGates gates(true, no_headroom());
  gates.add_gpu(16 * kGiB);
  for (JobId job : {1, 2, 3}) {
    gates.open(job, 0);
    gates.set_curve(job, 0, triangle_curve(100 * kMs, 1 * kGiB, 10 * kGiB));
  }
  gates.arrive(1, 1, 0);
  (void)gates.due(0);
  gates.arrive(2, 1, 10 * kMs);
  gates.arrive(3, 1, 20 * kMs);
  ASSERT_TRUE(gates.due(20 * kMs).empty());  // both wait for job 1's peak
  ASSERT_EQ(gates.waiting(), 2u);
  gates.set_budget(0, 15 * kGiB);
  uint64_t opened_at[4] = {};
  for (uint64_t t = 20 * kMs; gates.waiting() > 0 && t < 1000 * kMs; t += kMs / 4) {
    for (const auto& o : gates.due(t)) opened_at[o.job] = t;
  }
  ASSERT_NE(opened_at[2], 0u);
  ASSERT_NE(opened_at[3], 0u);
  EXPECT_LT(opened_at[2], opened_at[3]);
}

TEST(IterationGates, ANewMarkReplacesTheJobsWaitingOne) {
  IterationGates gates = two_jobs(true);
  gates.arrive(1, 1, 0);
  (void)gates.due(0);
  gates.arrive(2, 1, 0);
  gates.arrive(2, 2, 1 * kMs);
  EXPECT_EQ(gates.waiting(), 1u);
  const auto opened = gates.due(gates.next_due_ns());
  ASSERT_EQ(opened.size(), 1u);
  EXPECT_EQ(opened[0].sequence, 2u);
}

// --- the guard (Ledger::may_start in the daemon) ---------------------------------

constexpr uint64_t kMaxBlock = Ledger::kMaxGateBlockNs;

// Says what `allow` says, and records who was asked and who started.
class FakeGuard final : public GateGuard {
 public:
  bool may_start(JobId job) override {
    asked.push_back(job);
    return allow(job);
  }
  void starting(JobId job) override {
    started.push_back(job);
    on_start(job);
  }

  uint64_t turn_wait_until_ns(JobId job, uint64_t now_ns) override { return turn_until(job, now_ns); }

  std::function<bool(JobId)> allow = [](JobId) { return true; };
  std::function<uint64_t(JobId, uint64_t)> turn_until = [](JobId, uint64_t) -> uint64_t { return 0; };
  std::function<void(JobId)> on_start = [](JobId) {};
  std::vector<JobId> asked;
  std::vector<JobId> started;
};

// Jobs still learning: their gates' time comes at once.
IterationGates learning_jobs(std::initializer_list<JobId> jobs) {
  IterationGates gates(true, no_headroom());
  gates.add_gpu(14 * kGiB);
  for (JobId job : jobs) gates.open(job, 0);
  return gates;
}

TEST(IterationGates, ARefusedGateWaitsUntilTheGuardAgrees) {
  IterationGates gates = learning_jobs({1});
  FakeGuard guard;
  guard.allow = [](JobId) { return false; };
  gates.arrive(1, 5, 0);
  EXPECT_TRUE(gates.due(0, &guard).empty());
  EXPECT_TRUE(gates.any_blocked());
  EXPECT_EQ(gates.next_due_ns(), kMaxBlock) << "a blocked gate wakes when its wait runs out";
  EXPECT_TRUE(gates.due(10 * kMs, &guard).empty());
  EXPECT_EQ(guard.asked, (std::vector<JobId>{1, 1})) << "asked again at every call";
  EXPECT_TRUE(guard.started.empty());
  guard.allow = [](JobId) { return true; };
  const auto opened = gates.due(20 * kMs, &guard);
  ASSERT_EQ(opened.size(), 1u);
  EXPECT_EQ(opened[0].job, 1u);
  EXPECT_EQ(opened[0].sequence, 5u);
  EXPECT_EQ(guard.started, (std::vector<JobId>{1}));
  EXPECT_FALSE(gates.any_blocked());
  EXPECT_EQ(gates.next_due_ns(), UINT64_MAX);
  EXPECT_EQ(gates.blocked_gates(), 1u);
  EXPECT_EQ(gates.blocked_ns(), 20 * kMs);
  EXPECT_EQ(gates.delayed_gates(), 1u);
}

TEST(IterationGates, ABlockedGateOpensAfterTheBoundRegardless) {
  IterationGates gates = learning_jobs({1});
  FakeGuard guard;
  guard.allow = [](JobId) { return false; };
  gates.arrive(1, 1, 3 * kMs);
  EXPECT_TRUE(gates.due(5 * kMs, &guard).empty());  // blocked from 5 ms on
  EXPECT_TRUE(gates.due(5 * kMs + kMaxBlock - 1, &guard).empty());
  ASSERT_EQ(gates.next_due_ns(), 5 * kMs + kMaxBlock);
  const auto opened = gates.due(gates.next_due_ns(), &guard);
  ASSERT_EQ(opened.size(), 1u);
  EXPECT_EQ(guard.started, (std::vector<JobId>{1})) << "a forced start is still a start";
  EXPECT_EQ(gates.blocked_ns(), kMaxBlock);
  EXPECT_EQ(gates.waiting(), 0u);
}

TEST(IterationGates, ABlockedGateWaitsOutATurnBeforeItsBoundCounts) {
  IterationGates gates = learning_jobs({1});
  FakeGuard guard;
  guard.allow = [](JobId) { return false; };
  const uint64_t turn_end = 3 * kMaxBlock;
  guard.turn_until = [&](JobId, uint64_t) { return turn_end; };
  gates.arrive(1, 1, 0);
  EXPECT_TRUE(gates.due(0, &guard).empty());
  EXPECT_EQ(gates.next_due_ns(), turn_end + kMaxBlock) << "the bound counts from the turn's end";
  EXPECT_TRUE(gates.due(2 * kMaxBlock, &guard).empty()) << "two seconds refused, but in a turn";
  // The turn ends early (the other job left): the bound counts from the
  // first refusal again.
  guard.turn_until = [](JobId, uint64_t) -> uint64_t { return 0; };
  const auto opened = gates.due(2 * kMaxBlock + 1, &guard);
  ASSERT_EQ(opened.size(), 1u);
  EXPECT_EQ(gates.waiting(), 0u);
}

// A start the guard holds back is not planned: the others are placed as if
// the blocked job stayed at its end level, not around a peak it does not take.
TEST(IterationGates, ABlockedGateIsNotPlannedAround) {
  IterationGates gates = two_jobs(true);
  FakeGuard guard;
  guard.allow = [](JobId job) { return job != 1; };
  gates.arrive(1, 1, 0);
  ASSERT_TRUE(gates.due(0, &guard).empty());
  // Had job 1 started at 0, job 2 would wait for its peak to pass
  // (HoldsTheSecondJobUntilTheFirstJobsPeakHasPassed).
  gates.arrive(2, 1, 1 * kMs);
  const auto opened = gates.due(1 * kMs, &guard);
  ASSERT_EQ(opened.size(), 1u);
  EXPECT_EQ(opened[0].job, 2u);
}

TEST(IterationGates, BlockedGatesAreAskedOldestFirst) {
  IterationGates gates = learning_jobs({1, 2, 3});
  FakeGuard guard;
  guard.allow = [](JobId) { return false; };
  gates.arrive(3, 1, 0);
  gates.arrive(1, 1, 1 * kMs);
  gates.arrive(2, 1, 2 * kMs);
  ASSERT_TRUE(gates.due(2 * kMs, &guard).empty());
  EXPECT_EQ(guard.asked, (std::vector<JobId>{3, 1, 2}));
  guard.asked.clear();
  guard.allow = [](JobId) { return true; };
  const auto opened = gates.due(3 * kMs, &guard);
  ASSERT_EQ(opened.size(), 3u);
  EXPECT_EQ(opened[0].job, 3u);
  EXPECT_EQ(opened[1].job, 1u);
  EXPECT_EQ(opened[2].job, 2u);
  EXPECT_EQ(guard.asked, (std::vector<JobId>{3, 1, 2}));
  EXPECT_EQ(guard.started, (std::vector<JobId>{3, 1, 2}));
}

// What a start changes (its claim) is in force before the next gate is
// asked: a guard that admits one start at a time lets one through per call.
TEST(IterationGates, EachStartTakesEffectBeforeTheNextGateIsAsked) {
  IterationGates gates = learning_jobs({1, 2, 3});
  bool running = false;  // one job in mid-iteration at most
  FakeGuard guard;
  guard.allow = [&](JobId) { return !running; };
  guard.on_start = [&](JobId) { running = true; };
  for (JobId job : {1, 2, 3}) gates.arrive(job, 1, 0);
  for (JobId expected : {1, 2, 3}) {
    const auto opened = gates.due(expected * kMs, &guard);
    ASSERT_EQ(opened.size(), 1u);
    EXPECT_EQ(opened[0].job, expected);
    running = false;  // its iteration ended
  }
  EXPECT_EQ(guard.started, (std::vector<JobId>{1, 2, 3}));
}

TEST(IterationGates, FcfsAsksNoGuard) {
  IterationGates gates = two_jobs(false);
  FakeGuard guard;
  guard.allow = [](JobId) { return false; };
  gates.arrive(1, 1, 0);
  gates.arrive(2, 1, 0);
  EXPECT_EQ(gates.due(0, &guard).size(), 2u);
  EXPECT_TRUE(guard.asked.empty());
  EXPECT_TRUE(guard.started.empty());
  EXPECT_EQ(gates.blocked_gates(), 0u);
}

// A blocked gate's time has come: a re-plan that would now delay it leaves
// it as it is, and its bound runs from its first refusal.
TEST(IterationGates, AReplanDoesNotMoveABlockedGate) {
  IterationGates gates = two_jobs(true);
  gates.set_budget(0, 24 * kGiB);  // room for both peaks
  FakeGuard guard;
  guard.allow = [](JobId job) { return job != 2; };
  gates.arrive(1, 1, 0);
  ASSERT_EQ(gates.due(0, &guard).size(), 1u);
  gates.arrive(2, 1, 1 * kMs);
  ASSERT_TRUE(gates.due(1 * kMs, &guard).empty());
  ASSERT_TRUE(gates.any_blocked());
  // Under 14 GiB job 2 would have to wait for job 1's peak to pass.
  gates.set_budget(0, 14 * kGiB);
  EXPECT_TRUE(gates.due(2 * kMs, &guard).empty());
  EXPECT_EQ(gates.next_due_ns(), 1 * kMs + kMaxBlock);
  guard.allow = [](JobId) { return true; };
  const auto opened = gates.due(3 * kMs, &guard);
  ASSERT_EQ(opened.size(), 1u);
  EXPECT_EQ(opened[0].job, 2u);
  EXPECT_EQ(gates.blocked_ns(), 2 * kMs);
}

}  // namespace
}  // namespace zico::sharing
