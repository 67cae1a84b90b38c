#include "simulator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "sim_managed.h"
#include "step_recorder.h"
#include "synthetic_trace.h"
#include "transfer_model.h"

namespace zico::simulate {
namespace {

using testing::climbing_job;
using testing::kGiB;
using testing::kMs;
using testing::model_of;

// zico-umctl simulate, zico-umctl page (the paging model) and the library
// (ZICO_HOST_BANDWIDTH, the simulated device) assume one host link.
TEST(Simulator, DefaultsToTheHostLinkOfThePagingModelAndTheLibrary) {
  EXPECT_EQ(SimulationOptions{}.host_bytes_per_second, prefetch::TransferModel{}.h2d_bytes_per_s);
  EXPECT_EQ(SimulationOptions{}.host_bytes_per_second, SimManagedCosts{}.h2d_bytes_per_s);
}

// The ledger's policies (unlimited, fcfs, zico) launch every job at once
// here, so the tests see the ledger's and the time-shift scheduler's own
// decisions (the launch plan search has tests of its own); static runs its
// best plan, which its tests are about.
SimulationResult run(const std::vector<JobModel>& jobs, Policy policy, std::vector<BudgetStep> budget,
                     uint32_t iterations = 10, std::optional<double> utilization = std::nullopt) {
  SimulationOptions options;
  options.policy = policy;
  options.launch_together = policy != Policy::kStatic;
  options.budget = std::move(budget);
  options.iterations = iterations;
  options.utilization = utilization;
  SimulationResult result;
  std::string error;
  EXPECT_TRUE(simulate(jobs, options, &result, &error).is_ok()) << error;
  return result;
}

std::vector<BudgetStep> budget(uint64_t bytes) { return {{0, bytes}}; }

// Two jobs with 1 GiB of weights climbing by 1 GiB five times: peak 6 GiB,
// trough 1 GiB. Both peaks (12) exceed 8 GiB; one peak and one trough fit.
std::vector<JobModel> two_climbers() {
  return {model_of(climbing_job("a", 1 * kGiB, 1 * kGiB)), model_of(climbing_job("b", 1 * kGiB, 1 * kGiB))};
}

// The most the jobs held together at any change after `from` ns.
uint64_t peak_sum_after(const SimulationResult& r, uint64_t from) {
  std::map<uint64_t, std::vector<std::pair<size_t, uint64_t>>> changes;
  for (size_t j = 0; j < r.jobs.size(); ++j) {
    for (const auto& [t, bytes] : r.jobs[j].held) changes[t].emplace_back(j, bytes);
  }
  std::vector<uint64_t> held(r.jobs.size(), 0);
  uint64_t most = 0;
  for (const auto& [t, list] : changes) {
    for (const auto& [j, bytes] : list) held[j] = bytes;
    uint64_t sum = 0;
    for (const uint64_t b : held) sum += b;
    if (t >= from) most = std::max(most, sum);
  }
  return most;
}

TEST(Simulator, ModelsTheSyntheticJob) {
  const JobModel m = model_of(climbing_job("a", 1 * kGiB, 1 * kGiB));
  EXPECT_EQ(m.steady_period_ns, 100 * kMs);
  EXPECT_EQ(m.peak_bytes, 6 * kGiB);
  EXPECT_NEAR(m.utilization, 1.0, 1e-6);
}

TEST(Simulator, UnlimitedComputeSharingHalvesTwoFullyBusyJobs) {
  const SimulationResult r = run(two_climbers(), Policy::kUnlimited, {}, 10);
  ASSERT_EQ(r.jobs.size(), 2u);
  for (const JobResult& j : r.jobs) {
    EXPECT_EQ(j.iterations, 10u);
    EXPECT_FALSE(j.failed);
    EXPECT_NEAR(j.mean_iter_s, 2 * j.solo_iter_s, 1e-6) << j.name;
    EXPECT_EQ(j.delay_s, 0);
  }
  EXPECT_NEAR(r.makespan_s, 2.0, 1e-6);
  EXPECT_NEAR(r.aggregate_iters_per_s, 10.0, 1e-6);
  EXPECT_EQ(r.peak_bytes, 12 * kGiB);
  EXPECT_TRUE(r.budget.empty());
  EXPECT_FALSE(r.budget_exceeded);
}

TEST(Simulator, HalfBusyJobsDoNotSlowEachOther) {
  const SimulationResult r = run(two_climbers(), Policy::kUnlimited, {}, 10, 0.5);
  for (const JobResult& j : r.jobs) EXPECT_NEAR(j.mean_iter_s, j.solo_iter_s, 1e-6) << j.name;
  EXPECT_NEAR(r.makespan_s, 1.0, 1e-6);
}

TEST(Simulator, ThreeJobsAtHalfShareAtOneAndAHalf) {
  std::vector<JobModel> jobs = two_climbers();
  jobs.push_back(model_of(climbing_job("c", 1 * kGiB, 1 * kGiB)));
  const SimulationResult r = run(jobs, Policy::kUnlimited, {}, 10, 0.5);
  for (const JobResult& j : r.jobs) EXPECT_NEAR(j.mean_iter_s, 1.5 * j.solo_iter_s, 1e-6) << j.name;
}

TEST(Simulator, SequentialRunsOneAfterTheOther) {
  const SimulationResult r = run(two_climbers(), Policy::kSequential, budget(8 * kGiB), 10);
  EXPECT_NEAR(r.jobs[0].mean_iter_s, r.jobs[0].solo_iter_s, 1e-6);
  EXPECT_NEAR(r.jobs[1].start_s, 1.0, 1e-6);
  EXPECT_NEAR(r.jobs[1].queue_s, 1.0, 1e-6);
  EXPECT_NEAR(r.jobs[1].delay_s, 1.0, 1e-6);
  EXPECT_NEAR(r.jobs[1].mean_iter_s, 2 * r.jobs[1].solo_iter_s, 1e-6);
  EXPECT_NEAR(r.makespan_s, 2.0, 1e-6);
  EXPECT_EQ(r.peak_bytes, 6 * kGiB);
  EXPECT_FALSE(r.budget_exceeded);
}

// `plan`: none searches for the best one.
SimulationResult run_plan(const std::vector<JobModel>& jobs, std::optional<LaunchPlan> plan, uint64_t budget_bytes,
                          uint32_t iterations, std::optional<double> utilization, Policy policy = Policy::kStatic) {
  SimulationOptions options;
  options.policy = policy;
  options.budget = budget(budget_bytes);
  options.iterations = iterations;
  options.utilization = utilization;
  options.launch_plan = std::move(plan);
  SimulationResult result;
  std::string error;
  EXPECT_TRUE(simulate(jobs, options, &result, &error).is_ok()) << error;
  return result;
}

TEST(Simulator, StaticBackfillsAJobThatFitsWhileAnEarlierOneWaits) {
  std::vector<JobModel> jobs = two_climbers();
  jobs.push_back(model_of(climbing_job("small", 512 * testing::kMiB, 128 * testing::kMiB)));  // peak 1.125 GiB
  // In the given order: a (6) fits 8 GiB; b (6) does not beside it and
  // waits; small fits beside a and goes ahead of b; b starts when a ends.
  const SimulationResult r = run_plan(jobs, LaunchPlan{{0, 1, 2}, 0}, 8 * kGiB, 10, 0.5);
  EXPECT_NEAR(r.jobs[0].start_s, 0, 1e-9);
  EXPECT_NEAR(r.jobs[2].start_s, 0, 1e-9) << "small waited behind b";
  EXPECT_NEAR(r.jobs[1].start_s, 1.0, 1e-6);
  EXPECT_NEAR(r.jobs[1].queue_s, 1.0, 1e-6);
  EXPECT_EQ(r.jobs[0].peak_bytes, 6 * kGiB) << "the reservation, held throughout";
  EXPECT_LE(r.peak_bytes, 8 * kGiB);
  EXPECT_FALSE(r.budget_exceeded);
  for (const JobResult& j : r.jobs) EXPECT_EQ(j.iterations, 10u);
  // A cap of one job at a time: each waits for the one before.
  const SimulationResult one = run_plan(jobs, LaunchPlan{{2, 0, 1}, 1}, 8 * kGiB, 10, 0.5);
  EXPECT_NEAR(one.jobs[2].start_s, 0, 1e-9);
  EXPECT_GT(one.jobs[0].start_s, 0);
  EXPECT_GT(one.jobs[1].start_s, one.jobs[0].start_s);
}

// Static partitioning is the best of its plans: never below any one of them,
// sequential (a cap of one in the given order) included, on mixes of jobs
// that fit together in different ways, at busy fractions where co-running
// pays and where it does not.
TEST(Simulator, StaticRunsTheBestPlan) {
  const std::vector<JobModel> jobs = {model_of(climbing_job("a", 1 * kGiB, 1 * kGiB)),          // peak 6 GiB
                                      model_of(climbing_job("b", 2 * kGiB, 512 * testing::kMiB)),  // 4.5 GiB
                                      model_of(climbing_job("c", 512 * testing::kMiB, 256 * testing::kMiB)),
                                      model_of(climbing_job("d", 1 * kGiB, 256 * testing::kMiB))};
  for (const double utilization : {0.25, 0.5, 1.0}) {
    for (const uint64_t budget_bytes : {7 * kGiB, 9 * kGiB, 12 * kGiB}) {
      SCOPED_TRACE("utilization " + std::to_string(utilization) + ", budget " + std::to_string(budget_bytes >> 30));
      const SimulationResult best = run(jobs, Policy::kStatic, budget(budget_bytes), 5, utilization);
      EXPECT_EQ(best.launch_plan.order.size(), jobs.size());
      const SimulationResult sequential = run(jobs, Policy::kSequential, budget(budget_bytes), 5, utilization);
      EXPECT_GE(best.aggregate_iters_per_s, sequential.aggregate_iters_per_s * (1 - 1e-9));
      for (const LaunchPlan& plan : {LaunchPlan{{0, 1, 2, 3}, 0}, LaunchPlan{{3, 2, 1, 0}, 2},
                                     LaunchPlan{{1, 3, 0, 2}, 3}, LaunchPlan{{2, 0, 3, 1}, 1}}) {
        const SimulationResult other = run_plan(jobs, plan, budget_bytes, 5, utilization);
        EXPECT_GE(best.aggregate_iters_per_s, other.aggregate_iters_per_s * (1 - 1e-9));
      }
      // The plan it reports is the one that ran.
      const SimulationResult again = run_plan(jobs, best.launch_plan, budget_bytes, 5, utilization);
      EXPECT_DOUBLE_EQ(again.aggregate_iters_per_s, best.aggregate_iters_per_s);
    }
  }
}

// A mix where the order and the cap matter: a careful plan beats admitting
// the jobs in the given order (with backfill) by more than a tenth.
TEST(Simulator, StaticSearchBeatsTheGivenOrder) {
  const auto job = [](const char* name, uint64_t weights, uint64_t step, uint64_t period_ms, double busy) {
    testing::SyntheticJob j = climbing_job(name, weights, step);
    j.period_ns = period_ms * kMs;
    j.busy = busy;
    return model_of(j);
  };
  const std::vector<JobModel> jobs = {job("a", 1 * kGiB, 512 * testing::kMiB, 200, 1.0),
                                      job("b", 3 * kGiB, 256 * testing::kMiB, 100, 0.5),
                                      job("c", 3 * kGiB, 512 * testing::kMiB, 400, 0.5),
                                      job("d", 4 * kGiB, 1 * kGiB, 300, 0.5)};
  const SimulationResult best = run(jobs, Policy::kStatic, budget(11 * kGiB), 5, 0.5);
  const SimulationResult given = run_plan(jobs, LaunchPlan{{0, 1, 2, 3}, 0}, 11 * kGiB, 5, 0.5);
  EXPECT_GE(best.aggregate_iters_per_s, 1.1 * given.aggregate_iters_per_s);
  EXPECT_NE(best.launch_plan.max_running, 0u) << "a cap is part of the best plan here";
}

TEST(Simulator, LaunchPlanMustNameEveryJobOnce) {
  for (const Policy policy : {Policy::kStatic, Policy::kZico}) {
    SimulationOptions options;
    options.policy = policy;
    options.budget = budget(8 * kGiB);
    SimulationResult result;
    std::string error;
    for (const LaunchPlan& bad : {LaunchPlan{{0}, 0}, LaunchPlan{{0, 0}, 0}, LaunchPlan{{0, 2}, 0}}) {
      options.launch_plan = bad;
      EXPECT_EQ(simulate(two_climbers(), options, &result, &error).code(), Errc::kInvalidArgument);
      EXPECT_NE(error.find("every job once"), std::string::npos) << error;
    }
  }
}

// A long job and two short ones at u = 0.5, with memory for all three: all
// together, the three slow each other down until the short ones end and the
// long one finishes late; holding the third back until the second ends keeps
// the long one at full speed. zico's launch plan search finds that, like
// static's.
std::vector<JobModel> one_long_two_short() {
  testing::SyntheticJob long_job = climbing_job("long", 1 * kGiB, 512 * testing::kMiB);
  long_job.period_ns = 400 * kMs;
  return {model_of(long_job), model_of(climbing_job("short", 1 * kGiB, 512 * testing::kMiB)),
          model_of(climbing_job("short2", 1 * kGiB, 512 * testing::kMiB))};
}

TEST(Simulator, ZicoHoldsAThirdJobBackWhenThatKeepsTheLongestAtFullSpeed) {
  const std::vector<JobModel> jobs = one_long_two_short();
  const uint64_t ample = 12 * kGiB;  // three peaks of 3.5 GiB
  const SimulationResult together = run(jobs, Policy::kZico, budget(ample), 10, 0.5);
  EXPECT_EQ(together.launch_plan.max_running, 0u);
  const SimulationResult best = run_plan(jobs, std::nullopt, ample, 10, 0.5, Policy::kZico);
  ASSERT_EQ(best.failed_jobs, 0u);
  EXPECT_EQ(best.launch_plan.max_running, 2u);
  EXPECT_EQ(best.launch_plan.order.front(), 0u) << "the long job starts first";
  EXPECT_GE(best.aggregate_iters_per_s, 1.1 * together.aggregate_iters_per_s);
  // Less its waits at the gate (learning), it ran at full speed; together it
  // did not.
  const SimulationResult alone = run({jobs[0]}, Policy::kUnlimited, {}, 10, 0.5);
  const auto running_s = [](const JobResult& j) { return j.end_s - j.start_s - j.delay_s; };
  EXPECT_NEAR(running_s(best.jobs[0]), running_s(alone.jobs[0]), 1e-3 * alone.jobs[0].end_s);
  EXPECT_GT(running_s(together.jobs[0]), 1.05 * running_s(alone.jobs[0]));
  // The held-back job started when another ended, and held nothing before.
  const JobResult& held_back = best.jobs[best.launch_plan.order.back()];
  EXPECT_GT(held_back.start_s, 0.5);
  EXPECT_NEAR(held_back.queue_s, held_back.start_s, 1e-6);
  for (const auto& [at_ns, bytes] : held_back.held) {
    if (static_cast<double>(at_ns) / 1e9 < held_back.start_s - 1e-9) {
      EXPECT_EQ(bytes, 0u) << at_ns;
    }
  }
  // The plan it reports is the one that ran, and it is no worse than the
  // others (one at a time among them).
  const SimulationResult again = run_plan(jobs, best.launch_plan, ample, 10, 0.5, Policy::kZico);
  EXPECT_DOUBLE_EQ(again.aggregate_iters_per_s, best.aggregate_iters_per_s);
  for (const LaunchPlan& plan : {LaunchPlan{{1, 2, 0}, 2}, LaunchPlan{{0, 1, 2}, 1}, LaunchPlan{{2, 0, 1}, 1}}) {
    const SimulationResult other = run_plan(jobs, plan, ample, 10, 0.5, Policy::kZico);
    EXPECT_GE(best.aggregate_iters_per_s, other.aggregate_iters_per_s * (1 - 1e-9));
  }
}

// Where launching together is best (u = 1: a cap only idles the GPU's
// share) the search keeps it, so its figures are the scheduler's own.
TEST(Simulator, ZicoKeepsEveryJobTogetherWhenNoPlanDoesBetter) {
  const std::vector<JobModel> jobs = two_climbers();
  const SimulationResult together = run(jobs, Policy::kZico, budget(12 * kGiB), 10, 1.0);
  const SimulationResult best = run_plan(jobs, std::nullopt, 12 * kGiB, 10, 1.0, Policy::kZico);
  EXPECT_EQ(best.launch_plan.max_running, 0u);
  EXPECT_DOUBLE_EQ(best.aggregate_iters_per_s, together.aggregate_iters_per_s);
}

TEST(Simulator, StaticFailsAJobWhosePeakExceedsTheBudget) {
  std::vector<JobModel> jobs = {model_of(climbing_job("big", 1 * kGiB, 2 * kGiB)),  // peak 11 GiB
                                model_of(climbing_job("a", 1 * kGiB, 1 * kGiB))};
  const SimulationResult r = run(jobs, Policy::kStatic, budget(8 * kGiB), 5);
  EXPECT_TRUE(r.jobs[0].failed);
  EXPECT_NE(r.jobs[0].failure.find("peak 11 GiB exceeds budget 8 GiB"), std::string::npos) << r.jobs[0].failure;
  EXPECT_EQ(r.jobs[0].iterations, 0u);
  EXPECT_FALSE(r.jobs[1].failed);
  EXPECT_NEAR(r.jobs[1].start_s, 0, 1e-9) << "the failed job does not hold the queue";
  EXPECT_EQ(r.failed_jobs, 1u);
}

TEST(Simulator, FcfsKeepsTheBudgetAndYieldsWhenBothClimbAtOnce) {
  const SimulationResult r = run(two_climbers(), Policy::kFcfs, budget(8 * kGiB), 10);
  EXPECT_FALSE(r.budget_exceeded);
  EXPECT_LE(r.peak_bytes, 8 * kGiB);
  EXPECT_EQ(r.over_budget_s, 0);
  EXPECT_GT(r.yields, 0u);
  EXPECT_GT(r.deadlocks, 0u);
  for (const JobResult& j : r.jobs) {
    EXPECT_EQ(j.iterations, 10u);
    EXPECT_FALSE(j.failed) << j.failure;
    EXPECT_GT(j.delay_s, 0);
  }
  EXPECT_GT(r.jobs[0].swap_s + r.jobs[1].swap_s, 0);
}

// Two climbers with periods of 100 and 130 ms: their phases drift.
std::vector<JobModel> drifting_pair() {
  testing::SyntheticJob slow = climbing_job("b", 1 * kGiB, 1 * kGiB);
  slow.period_ns = 130 * kMs;
  return {model_of(climbing_job("a", 1 * kGiB, 1 * kGiB)), model_of(slow)};
}

TEST(Simulator, ZicoShiftsThePeaksApartAndBeatsFcfs) {
  // Periods of 100 and 130 ms: the phases drift, so under fcfs the climbs
  // keep meeting and deadlocking; zico's gates keep them apart.
  const std::vector<JobModel> jobs = drifting_pair();
  for (const double u : {1.0, 0.5}) {
    const SimulationResult fcfs = run(jobs, Policy::kFcfs, budget(8 * kGiB), 20, u);
    const SimulationResult zico = run(jobs, Policy::kZico, budget(8 * kGiB), 20, u);
    EXPECT_FALSE(fcfs.budget_exceeded) << "u " << u;
    EXPECT_FALSE(zico.budget_exceeded) << "u " << u;
    EXPECT_LE(zico.peak_bytes, 8 * kGiB) << "u " << u;
    EXPECT_LT(zico.yields, fcfs.yields) << "u " << u;
    EXPECT_GT(zico.aggregate_iters_per_s, fcfs.aggregate_iters_per_s) << "u " << u;
    uint64_t gate_delays = 0;
    for (const JobResult& j : zico.jobs) {
      EXPECT_EQ(j.iterations, 20u);
      EXPECT_FALSE(j.failed) << j.failure;
      gate_delays += j.gate_delays;
    }
    EXPECT_GT(gate_delays, 0u) << "u " << u;
    // Whichever job asks second waits; with the phases drifting that need
    // not be both.
    EXPECT_GT(zico.jobs[0].gate_s + zico.jobs[1].gate_s, 0) << "u " << u;
  }
}

TEST(Simulator, ZicoNeverDeadlocksOnceTheJobsAreKnown) {
  // The drifting pair above over 100 iterations: the ledger's claims (each
  // job's outlook) keep a job from taking what another in mid-iteration
  // needs, and jobs still learning run alone, so nothing ever yields.
  const std::vector<JobModel> jobs = drifting_pair();
  for (const double u : {1.0, 0.5}) {
    const SimulationResult fcfs = run(jobs, Policy::kFcfs, budget(8 * kGiB), 100, u);
    const SimulationResult zico = run(jobs, Policy::kZico, budget(8 * kGiB), 100, u);
    const SimulationResult unlimited = run(jobs, Policy::kUnlimited, {}, 100, u);
    EXPECT_GT(fcfs.yields, 0u) << "u " << u << ": the case must deadlock without claims";
    EXPECT_EQ(zico.yields, 0u) << "u " << u;
    EXPECT_FALSE(zico.budget_exceeded) << "u " << u;
    EXPECT_GE(zico.aggregate_iters_per_s, 0.9 * unlimited.aggregate_iters_per_s) << "u " << u;
  }
}

TEST(Simulator, BelowOnePeakPlusTheOthersRestZicoRunsTheJobsInTurn) {
  // 6.5 GiB holds one climber's 6 GiB peak but not that and the other's
  // 1 GiB rest: no time shift fits, each iteration needs the other job's
  // memory. A job waiting at its gate for the other to finish would wait for
  // its own memory; it is parked (Ledger turns) and the two take turns.
  // Before either, each of its iterations waited out the gate's full second
  // and the run crawled.
  const std::vector<JobModel> jobs = two_climbers();
  const SimulationResult sequential = run(jobs, Policy::kSequential, budget(13 * kGiB / 2), 40, 0.5);
  const SimulationResult fcfs = run(jobs, Policy::kFcfs, budget(13 * kGiB / 2), 40, 0.5);
  const SimulationResult zico = run(jobs, Policy::kZico, budget(13 * kGiB / 2), 40, 0.5);
  for (const JobResult& j : zico.jobs) {
    EXPECT_EQ(j.iterations, 40u) << j.name;
    EXPECT_FALSE(j.failed) << j.failure;
  }
  EXPECT_FALSE(zico.budget_exceeded);
  EXPECT_GE(zico.aggregate_iters_per_s, 0.9 * sequential.aggregate_iters_per_s);
  EXPECT_GE(zico.aggregate_iters_per_s, fcfs.aggregate_iters_per_s);
}

JobModel committed(const std::string& name) {
  const std::string path = std::string(ZICO_SOURCE_DIR) + "/tools/traces/" + name + ".ztrace.gz";
  trace::Trace trace;
  JobModel model;
  std::string error;
  EXPECT_TRUE(trace::read_trace_file(path, &trace, &error).is_ok()) << error;
  EXPECT_TRUE(build_job_model(trace, &model, &error).is_ok()) << error;
  return model;
}

TEST(Simulator, ABigJobThatNeedsTheOthersRestTakesTurnsWithItNotEveryIteration) {
  // gpt2_medium peaks at 17.00 GiB, bert_base rests at 1.63 GiB: under
  // 17.78 GiB every gpt2_medium iteration needs bert_base out, while
  // bert_base's 8.79 GiB fit beside gpt2_medium's rest. Without turns they
  // met in mid-iteration once per gpt2_medium iteration and one yielded all
  // it held there: 129 yields, 0.16 x sequential. Parked at its gate for fifty
  // swaps' worth, bert_base costs a few swaps of its rest.
  const std::vector<JobModel> jobs = {committed("bert_base"), committed("gpt2_medium")};
  const std::vector<BudgetStep> b = budget(19'091'129'630);  // 17.78 GiB
  const SimulationResult sequential = run(jobs, Policy::kSequential, b, 100, 0.5);
  const SimulationResult zico = run(jobs, Policy::kZico, b, 100, 0.5);
  for (const JobResult& j : zico.jobs) {
    EXPECT_EQ(j.iterations, 100u) << j.name;
    EXPECT_FALSE(j.failed) << j.failure;
  }
  EXPECT_FALSE(zico.budget_exceeded);
  EXPECT_GE(zico.aggregate_iters_per_s, 0.95 * sequential.aggregate_iters_per_s);
  EXPECT_LE(zico.yields, 5u) << "parks included";
}

TEST(Simulator, TrackersLearnTheRunningTimeNotTheStalls) {
  // Under a budget that fits one peak and one trough, the jobs stall inside
  // their iterations (ledger waits, yields and swaps) while the trackers
  // learn. At u 0.5 two jobs do not slow each other, so the progress clock
  // runs at the solo rate: every learned period is the solo period.
  const std::vector<JobModel> jobs = two_climbers();
  const SimulationResult r = run(jobs, Policy::kZico, budget(7 * kGiB), 20, 0.5);
  double stalled_in_iterations = 0;
  for (const JobResult& j : r.jobs) {
    EXPECT_EQ(j.iterations, 20u) << j.name;
    EXPECT_GT(j.longest_learned_iter_s, 0) << j.name;
    EXPECT_NEAR(j.longest_learned_iter_s, j.solo_iter_s, 1e-6) << j.name;
    stalled_in_iterations += j.wait_s + j.swap_s;
  }
  EXPECT_GT(stalled_in_iterations, 0) << "the case must stall inside iterations to test anything";
  const SimulationResult fcfs = run(jobs, Policy::kFcfs, budget(7 * kGiB), 20, 0.5);
  for (const JobResult& j : fcfs.jobs) EXPECT_EQ(j.longest_learned_iter_s, 0) << "no tracker under fcfs";
}

TEST(Simulator, HeldFollowsABudgetShrinkAndTheLagIsReported) {
  for (const Policy policy : {Policy::kFcfs, Policy::kZico}) {
    // 16 GiB, then 7 GiB at 255 ms: both jobs (u 0.5, in step) hold 6 GiB
    // then and free 5 of it at 260 ms.
    const std::vector<BudgetStep> schedule = {{0, 16 * kGiB}, {255 * kMs, 7 * kGiB}};
    const SimulationResult r = run(two_climbers(), policy, schedule, 10, 0.5);
    EXPECT_FALSE(r.budget_exceeded) << to_string(policy);
    EXPECT_GT(r.longest_over_budget_s, 0) << to_string(policy);
    EXPECT_GE(r.over_budget_s, r.longest_over_budget_s);
    EXPECT_NEAR(r.longest_over_budget_s, 0.005, 1e-6) << to_string(policy) << ": held comes down at the frees";
    const auto settled = static_cast<uint64_t>((0.255 + r.longest_over_budget_s) * 1e9) + 1;
    EXPECT_LE(peak_sum_after(r, settled), 7 * kGiB) << to_string(policy);
    for (const JobResult& j : r.jobs) EXPECT_EQ(j.iterations, 10u) << to_string(policy);
    ASSERT_EQ(r.budget.size(), 2u);
  }
}

TEST(Simulator, AJobWhoseNeedExceedsTheBudgetFailsWithTheReason) {
  for (const Policy policy : {Policy::kFcfs, Policy::kZico}) {
    const std::vector<JobModel> jobs = {model_of(climbing_job("a", 1 * kGiB, 1 * kGiB))};
    const SimulationResult r = run(jobs, policy, budget(4 * kGiB), 5);
    ASSERT_EQ(r.jobs.size(), 1u);
    EXPECT_TRUE(r.jobs[0].failed);
    EXPECT_NE(r.jobs[0].failure.find("needs 5 GiB"), std::string::npos) << r.jobs[0].failure;
    EXPECT_NE(r.jobs[0].failure.find("iteration 0"), std::string::npos) << r.jobs[0].failure;
    EXPECT_NE(r.jobs[0].failure.find("budget 4 GiB"), std::string::npos) << r.jobs[0].failure;
    EXPECT_EQ(r.jobs[0].iterations, 0u);
    EXPECT_EQ(r.failed_jobs, 1u);
    EXPECT_NEAR(r.jobs[0].end_s, 0.03, 1e-6) << "fails at its fourth step, 5 GiB";
  }
}

TEST(Simulator, StaticAndSequentialApplyAShrinkToAdmissionOnly) {
  // a is admitted under 16 GiB; b comes after a shrink to 7 GiB: sequential
  // lets it run alone, and a keeps running through the shrink.
  const std::vector<BudgetStep> schedule = {{0, 16 * kGiB}, {500 * kMs, 7 * kGiB}};
  const SimulationResult r = run(two_climbers(), Policy::kSequential, schedule, 10);
  EXPECT_FALSE(r.budget_exceeded);
  for (const JobResult& j : r.jobs) EXPECT_EQ(j.iterations, 10u);
}

TEST(Simulator, RejectsBadOptions) {
  const std::vector<JobModel> jobs = two_climbers();
  SimulationResult r;
  std::string error;
  SimulationOptions o;
  o.policy = Policy::kFcfs;
  EXPECT_FALSE(simulate(jobs, o, &r, &error).is_ok());
  EXPECT_NE(error.find("needs a budget"), std::string::npos) << error;
  o.budget = {{5, 8 * kGiB}};
  EXPECT_FALSE(simulate(jobs, o, &r, &error).is_ok());
  o.budget = {{0, 8 * kGiB}, {0, 4 * kGiB}};
  EXPECT_FALSE(simulate(jobs, o, &r, &error).is_ok());
  o.budget = {{0, 1024}};
  EXPECT_FALSE(simulate(jobs, o, &r, &error).is_ok());
  o.budget = {{0, 8 * kGiB}};
  o.utilization = 0.0;
  EXPECT_FALSE(simulate(jobs, o, &r, &error).is_ok());
  o.utilization = 1.5;
  EXPECT_FALSE(simulate(jobs, o, &r, &error).is_ok());
  o.utilization.reset();
  o.iterations = 0;
  EXPECT_FALSE(simulate(jobs, o, &r, &error).is_ok());
  EXPECT_FALSE(simulate({}, SimulationOptions{}, &r, &error).is_ok());
}

TEST(Simulator, PolicyNamesRoundTrip) {
  for (const Policy p : {Policy::kUnlimited, Policy::kFcfs, Policy::kZico, Policy::kStatic, Policy::kSequential}) {
    EXPECT_EQ(parse_policy(to_string(p)), p);
  }
  EXPECT_FALSE(parse_policy("all"));
  EXPECT_FALSE(parse_policy("Zico"));
}

TEST(Simulator, LongRunsKeepTheTimelineBounded) {
  SimulationOptions options;
  options.policy = Policy::kUnlimited;
  options.iterations = 2000;
  options.max_timeline_points = 256;
  SimulationResult r;
  std::string error;
  ASSERT_TRUE(simulate(two_climbers(), options, &r, &error).is_ok()) << error;
  for (const JobResult& j : r.jobs) {
    EXPECT_LE(j.held.size(), 256u + 2);
    uint64_t most = 0;
    for (const auto& [t, bytes] : j.held) most = std::max(most, bytes);
    EXPECT_EQ(most, 6 * kGiB) << "reduction keeps the peak";
    EXPECT_EQ(j.held.back().second, 0u) << "ends with nothing held";
  }
}

// The sum of `steps` at every time any of them changes, changes at one time
// applied together; with the states seen (one value per series).
std::vector<std::pair<uint64_t, std::vector<uint64_t>>> stacked(const std::vector<StackRecorder::Steps>& steps) {
  std::map<uint64_t, std::vector<std::pair<size_t, uint64_t>>> changes;
  for (size_t s = 0; s < steps.size(); ++s) {
    for (const auto& [t, v] : steps[s]) changes[t].emplace_back(s, v);
  }
  std::vector<std::pair<uint64_t, std::vector<uint64_t>>> out;
  std::vector<uint64_t> state(steps.size(), 0);
  for (const auto& [t, list] : changes) {
    for (const auto& [s, v] : list) state[s] = v;
    out.emplace_back(t, state);
  }
  return out;
}

TEST(StackRecorder, ExactWhenShortWithChangesAtOneTimeAsOne) {
  StackRecorder r(2, 100);
  r.record(0, 0, 5);
  r.record(0, 1, 1);
  r.record(10, 1, 4);  // b frees 3 ...
  r.record(10, 0, 8);  // ... and a takes them at the same time
  r.record(20, 0, 5);
  r.record(20, 0, 5);  // no change
  r.record(30, 0, 0);
  r.record(30, 1, 0);
  const std::vector<StackRecorder::Steps> steps = r.finish();
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0], (StackRecorder::Steps{{0, 5}, {10, 8}, {20, 5}, {30, 0}}));
  EXPECT_EQ(steps[1], (StackRecorder::Steps{{0, 1}, {10, 4}, {30, 0}}));
  for (const auto& [t, state] : stacked(steps)) EXPECT_LE(state[0] + state[1], 12u) << "at " << t;
}

TEST(StackRecorder, ReductionShowsOnlyRealStatesAndKeepsThePeakOfTheSum) {
  // Three series hand 6 units around at irregular times: the real sum is
  // always 10, except one moment at 11 in the middle. Reduced one by one,
  // each series' bucket maximum (6 + 2 + 2 ...) would stack far above 10.
  constexpr size_t kSeries = 3;
  StackRecorder r(kSeries, 64);
  std::vector<uint64_t> state = {8, 1, 1};
  std::vector<std::vector<uint64_t>> real = {state};
  for (size_t s = 0; s < kSeries; ++s) r.record(0, s, state[s]);
  uint64_t t = 0;
  for (uint64_t k = 1; k <= 100000; ++k) {
    t += 1 + (k * 7919) % 97;
    const size_t from = k % kSeries;
    const size_t to = (k + 1) % kSeries;
    const uint64_t moved = state[from] - 1;
    state[from] -= moved;
    state[to] += moved;
    if (k == 50001) state[to] += 1;
    if (k == 50002) state[from] -= 1;
    r.record(t, from, state[from]);
    r.record(t, to, state[to]);
    real.push_back(state);
  }
  EXPECT_LE(r.moments(), 64u);
  const std::vector<StackRecorder::Steps> steps = r.finish();
  std::sort(real.begin(), real.end());
  uint64_t most = 0;
  for (const auto& [time, seen] : stacked(steps)) {
    uint64_t sum = 0;
    for (const uint64_t v : seen) sum += v;
    most = std::max(most, sum);
    EXPECT_TRUE(std::binary_search(real.begin(), real.end(), seen)) << "a state never held, at " << time;
  }
  EXPECT_EQ(most, 11u);
  EXPECT_EQ(stacked(steps).back().second, state) << "ends on the final state";
}

TEST(Simulator, ReducedTimelinesNeverStackAboveWhatWasHeld) {
  // Long enough for the timelines to be reduced many times over: their sum
  // must stay within the budget the run kept, and show its peak.
  for (const Policy policy : {Policy::kFcfs, Policy::kZico}) {
    SimulationOptions options;
    options.policy = policy;
    options.budget = budget(8 * kGiB);
    options.iterations = 200;
    options.utilization = 0.5;
    options.max_timeline_points = 64;
    SimulationResult r;
    std::string error;
    ASSERT_TRUE(simulate(two_climbers(), options, &r, &error).is_ok()) << error;
    ASSERT_FALSE(r.budget_exceeded) << to_string(policy);
    EXPECT_EQ(peak_sum_after(r, 0), r.peak_bytes) << to_string(policy);
    EXPECT_LE(peak_sum_after(r, 0), 8 * kGiB) << to_string(policy);
    size_t points = 0;
    for (const JobResult& j : r.jobs) points = std::max(points, j.held.size());
    EXPECT_LE(points, 64u) << to_string(policy);
    EXPECT_GT(points, 8u) << to_string(policy);
  }
}

// ---- Unified Memory jobs -----------------------------------------------------

// A climber (peak 6 GiB) that can run holding 2 GiB, 3x slower; at 5 GiB it
// runs 1.2x slower.
sharing::PagingCost climber_paging() {
  sharing::PagingCost cost;
  cost.floor_bytes = 2 * kGiB;
  cost.points = {{2 * kGiB, 3.0}, {5 * kGiB, 1.2}, {6 * kGiB, 1.0}};
  return cost;
}

SimulationResult run_um(const std::vector<JobModel>& jobs, std::vector<BudgetStep> steps, uint32_t iterations = 10,
                        double host_bytes_per_second = kPcieGen4BytesPerSecond) {
  SimulationOptions options;
  options.host_bytes_per_second = host_bytes_per_second;
  options.policy = Policy::kZico;
  options.launch_together = true;  // the scheduler's own decisions, as in run()
  options.budget = std::move(steps);
  options.iterations = iterations;
  options.paging.assign(jobs.size(), climber_paging());
  SimulationResult result;
  std::string error;
  EXPECT_TRUE(simulate(jobs, options, &result, &error).is_ok()) << error;
  return result;
}

TEST(SimulatorUm, AJobPagesUnderABudgetBelowItsPeakWhereAnOrdinaryOneFails) {
  const std::vector<JobModel> one = {model_of(climbing_job("a", 1 * kGiB, 1 * kGiB))};
  const SimulationResult vmm = run(one, Policy::kZico, budget(5 * kGiB));
  ASSERT_EQ(vmm.failed_jobs, 1u);
  EXPECT_FALSE(vmm.jobs[0].um);

  const SimulationResult um = run_um(one, budget(5 * kGiB));
  ASSERT_EQ(um.failed_jobs, 0u) << um.jobs[0].failure;
  const JobResult& j = um.jobs[0];
  EXPECT_TRUE(j.um);
  EXPECT_EQ(j.iterations, 10u);
  EXPECT_EQ(j.capped_iterations, 10u);
  EXPECT_LE(j.peak_bytes, 5 * kGiB);
  EXPECT_FALSE(um.budget_exceeded);
  // Slower by its paging, but by no more than a whole iteration at 1.2x.
  EXPECT_GT(j.paging_s, 0);
  EXPECT_GT(j.mean_iter_s, j.solo_iter_s);
  EXPECT_LE(j.mean_iter_s, 1.2 * j.solo_iter_s + 1e-9);
  EXPECT_NEAR(j.mean_iter_s * j.iterations, j.solo_iter_s * j.iterations + j.paging_s, 1e-6);
}

// A UM job launched late by its plan gets its paging cost and gate paging
// when it starts, and pages under the budget as one launched at once does.
TEST(SimulatorUm, AJobLaunchedLatePagesAsOneLaunchedAtOnce) {
  const std::vector<JobModel> two = two_climbers();
  SimulationOptions options;
  options.policy = Policy::kZico;
  options.budget = budget(5 * kGiB);
  options.iterations = 10;
  options.paging.assign(two.size(), climber_paging());
  options.launch_plan = LaunchPlan{{1, 0}, 1};
  SimulationResult one_at_a_time;
  std::string error;
  ASSERT_TRUE(simulate(two, options, &one_at_a_time, &error).is_ok()) << error;
  ASSERT_EQ(one_at_a_time.failed_jobs, 0u) << one_at_a_time.jobs[0].failure << one_at_a_time.jobs[1].failure;
  EXPECT_FALSE(one_at_a_time.budget_exceeded);
  const JobResult& late = one_at_a_time.jobs[0];
  EXPECT_NEAR(late.start_s, one_at_a_time.jobs[1].end_s, 1e-6) << "launched when the first ended";
  EXPECT_TRUE(late.um);
  EXPECT_EQ(late.capped_iterations, 10u);
  EXPECT_GT(late.paging_s, 0);
  const SimulationResult alone = run_um({two[0]}, budget(5 * kGiB));
  EXPECT_NEAR(late.paging_s, alone.jobs[0].paging_s, 1e-6);
  EXPECT_NEAR(late.end_s - late.start_s, alone.jobs[0].end_s, 1e-6);
}

TEST(SimulatorUm, ABudgetCutBelowAJobsNeedPagesItInsteadOfStoppingIt) {
  const std::vector<JobModel> one = {model_of(climbing_job("a", 1 * kGiB, 1 * kGiB))};
  const std::vector<BudgetStep> cut = {{0, 8 * kGiB}, {350 * kMs, 5 * kGiB}};
  const SimulationResult vmm = run(one, Policy::kZico, cut);
  EXPECT_EQ(vmm.failed_jobs, 1u);
  const SimulationResult um = run_um(one, cut);
  ASSERT_EQ(um.failed_jobs, 0u) << um.jobs[0].failure;
  EXPECT_EQ(um.jobs[0].iterations, 10u);
  EXPECT_FALSE(um.budget_exceeded);
  // At the cut the job holds 6 GiB and would keep it until its frees at 60
  // ms; asked back, it pages the excess out at once, and stays under.
  EXPECT_LT(um.longest_over_budget_s, 0.001);
  EXPECT_LE(peak_sum_after(um, 350 * kMs + 1), 5 * kGiB);
}

TEST(SimulatorUm, TwoJobsAboveTheBudgetBothPageAndComplete) {
  // Two climbers (6 GiB peaks) under 5.1-5.9 GiB: each pages to the budget.
  // On a link too slow to page at their gates, where they hold each other up
  // one yields, and back in it asks for no more than the budget holds (its
  // 6 GiB the ledger would deny); on PCIe Gen4 the one at its gate pages out
  // instead and neither yields.
  const std::vector<JobModel> two = two_climbers();
  for (const double link : {1e8, kPcieGen4BytesPerSecond}) {
    uint64_t yields = 0;
    uint64_t gate_page_outs = 0;
    for (uint64_t tenths = 1; tenths <= 9; ++tenths) {
      const uint64_t bytes = 5 * kGiB + kGiB * tenths / 10;
      const SimulationResult um = run_um(two, budget(bytes), 10, link);
      EXPECT_EQ(um.failed_jobs, 0u) << bytes << ": " << um.jobs[0].failure << um.jobs[1].failure;
      EXPECT_FALSE(um.budget_exceeded) << bytes;
      yields += um.yields;
      for (const JobResult& j : um.jobs) gate_page_outs += j.gate_page_outs;
    }
    EXPECT_EQ(yields > 0, link < kPcieGen4BytesPerSecond) << link << ": " << yields << " yields";
    EXPECT_EQ(gate_page_outs > 0, link == kPcieGen4BytesPerSecond) << link << ": " << gate_page_outs;
  }
}

TEST(SimulatorUm, ABudgetBelowTheLargestOpFailsTheJobSayingSo) {
  const std::vector<JobModel> one = {model_of(climbing_job("a", 1 * kGiB, 1 * kGiB))};
  const SimulationResult um = run_um(one, budget(kGiB + kGiB / 2));
  ASSERT_EQ(um.failed_jobs, 1u);
  EXPECT_NE(um.jobs[0].failure.find("more than the budget"), std::string::npos) << um.jobs[0].failure;
}

TEST(SimulatorUm, RefusesPagingCostsThatDoNotFitTheJobs) {
  SimulationOptions options;
  options.budget = budget(5 * kGiB);
  sharing::PagingCost rising = climber_paging();
  rising.points[2].stretch = 2.0;
  options.paging = {rising};
  SimulationResult result;
  std::string error;
  const std::vector<JobModel> one = {model_of(climbing_job("a", 1 * kGiB, 1 * kGiB))};
  EXPECT_FALSE(simulate(one, options, &result, &error).is_ok());
  EXPECT_NE(error.find("job 0 (a): paging cost point 2"), std::string::npos) << error;
  options.paging = {climber_paging(), climber_paging()};
  EXPECT_FALSE(simulate(one, options, &result, &error).is_ok());
  EXPECT_NE(error.find("2 paging costs for 1 jobs"), std::string::npos) << error;
}

TEST(SimulatorUm, OtherPoliciesRunUmJobsAsOrdinaryOnes) {
  SimulationOptions options;
  options.policy = Policy::kSequential;
  options.budget = budget(5 * kGiB);
  options.iterations = 3;
  options.paging = {climber_paging()};
  SimulationResult result;
  std::string error;
  ASSERT_TRUE(simulate({model_of(climbing_job("a", 1 * kGiB, 1 * kGiB))}, options, &result, &error).is_ok()) << error;
  EXPECT_EQ(result.failed_jobs, 1u);
  EXPECT_FALSE(result.jobs[0].um);
}

}  // namespace
}  // namespace zico::simulate
