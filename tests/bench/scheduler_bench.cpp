// The node manager's decision costs with 8 jobs on one GPU (docs/benchmarks.md).
//
//  - ChunkRequest/fcfs: one chunk request through the Ledger as zico-umd
//    serves it without time shift: request, pump (the grant), and the return
//    later, with pump again. The baseline.
//  - ChunkRequest/zico: the same, plus what time shift adds per request in
//    the daemon (the holding update the gates get on every grant and return).
//  - ChunkRequest/zico_claims: the same, with every job's claim known, as
//    in steady state: the request carries the claim (set_claim) and the
//    grant runs the banker's check over all 8 jobs, half of them still
//    below what they will settle at.
//  - ChunkRequest/zico_claims_gates: the same with half the jobs waiting at
//    their gates (the simulator's turn rules weighed on every pump; none
//    parks: each waiting iteration fits beside the others' rest).
//  - IterationGate: one gate decision of the time-shift scheduler, for a job
//    whose 7 co-runners are at spread-out phases of their iterations. Paid
//    once per iteration per job, not per request.
//  - TrackerEvent: one allocation or free through a job's UsageTracker with
//    iteration marks (1000 blocks allocated, then freed, per iteration), its
//    outlook and step check included, with remaining_peak_bytes() read after
//    each as the client does. BlockMapEvent, its baseline: the same stream
//    into a hash map of live blocks, the least any per-block tracking costs.
//
// Time is virtual (a counter), so the figures are pure decision cost.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>

#include <unordered_map>

#include "iteration_gates.h"
#include "ledger.h"
#include "time_shift_scheduler.h"
#include "usage_tracker.h"
#include "../sharing/test_curves.h"

namespace zico::sharing {
namespace {

constexpr int kJobs = 8;
constexpr uint64_t kChunk = uint64_t{2} << 20;
constexpr uint64_t kBudgetChunks = 20'000;  // 40 GiB of 2 MiB chunks
constexpr uint64_t kMs = 1'000'000;

using testing::triangle_curve;

void chunk_requests(benchmark::State& state, bool time_shift, bool claims, bool half_at_gates = false) {
  Ledger ledger;
  IterationGates gates(time_shift, SchedulerOptions{});
  (void)ledger.add_gpu(kBudgetChunks);
  gates.add_gpu(kBudgetChunks * kChunk);
  std::string why;
  for (JobId job = 1; job <= kJobs; ++job) {
    (void)ledger.add_job(job, 1000, job);
    (void)ledger.open(job, 0, 0, &why);
    gates.open(job, 0);
    gates.set_curve(job, 0, triangle_curve((20 + job * 5) * kMs, 1ull << 30, 4ull << 30));
    // Each job holds some memory, as in a running node.
    (void)ledger.request(job, 0, 1, 1000, 0, &why);
  }
  (void)ledger.pump(0);
  // The other half waits at its gates for an iteration that fits beside the
  // rest (nothing is parked), so every pump weighs the turn rules in full.
  const JobId requesters = half_at_gates ? kJobs / 2 : kJobs;
  for (JobId job = requesters + 1; job <= kJobs; ++job) (void)ledger.set_between_iterations(job, 0, 1500);
  uint64_t now = 1;
  uint64_t request_id = 2;
  uint64_t held[kJobs + 1] = {};
  for (JobId job = 1; job <= kJobs; ++job) held[job] = 1000;
  JobId job = 1;
  for (auto _ : state) {
    // Ask for one chunk, get it, give it back: one request's whole life.
    if (claims) (void)ledger.set_claim(job, 0, 1500, job % 2 == 0 ? 1200 : 800);
    (void)ledger.request(job, 0, request_id++, 1, now, &why);
    auto actions = ledger.pump(now);
    benchmark::DoNotOptimize(actions);
    if (actions.empty() || actions[0].kind != LedgerAction::Kind::kGrant) {
      state.SkipWithError("the request was not granted: the benchmark would measure a refusal");
      break;
    }
    if (time_shift) gates.set_held(job, 0, (held[job] + 1) * kChunk);
    (void)ledger.returned(job, 0, 1, false, now, &why);
    actions = ledger.pump(now);
    benchmark::DoNotOptimize(actions);
    if (time_shift) gates.set_held(job, 0, held[job] * kChunk);
    job = job % requesters + 1;
    now += 1000;
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_ChunkRequest_fcfs(benchmark::State& state) { chunk_requests(state, false, false); }
void BM_ChunkRequest_zico(benchmark::State& state) { chunk_requests(state, true, false); }
void BM_ChunkRequest_zico_claims(benchmark::State& state) { chunk_requests(state, true, true); }
void BM_ChunkRequest_zico_claims_gates(benchmark::State& state) { chunk_requests(state, true, true, true); }
BENCHMARK(BM_ChunkRequest_fcfs);
BENCHMARK(BM_ChunkRequest_zico);
BENCHMARK(BM_ChunkRequest_zico_claims);
BENCHMARK(BM_ChunkRequest_zico_claims_gates);

void BM_IterationGate(benchmark::State& state) {
  TimeShiftScheduler scheduler;
  scheduler.set_budget(40ull << 30);
  for (JobId job = 1; job <= kJobs; ++job) {
    scheduler.add_job(job);
    scheduler.set_curve(job, triangle_curve((20 + job * 5) * kMs, 1ull << 30, 8ull << 30));
  }
  // The co-runners are spread over their iterations.
  for (JobId job = 2; job <= kJobs; ++job) scheduler.started(job, job * 3 * kMs);
  const uint64_t now = 30 * kMs;
  for (auto _ : state) {
    const StartDecision decision = scheduler.plan_start(1, now);
    benchmark::DoNotOptimize(decision);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_IterationGate);

constexpr uint64_t kBlocksPerIteration = 1000;

// Runs `event(block, bytes, allocate)` over iterations of kBlocksPerIteration
// blocks allocated then freed, and `mark()` between iterations, one event per
// benchmark iteration.
template <typename Event, typename Mark>
void block_stream(benchmark::State& state, Event event, Mark mark) {
  uint64_t i = 0;
  for (auto _ : state) {
    const uint64_t phase = i % (2 * kBlocksPerIteration);
    if (phase == 0) mark();
    const bool allocate = phase < kBlocksPerIteration;
    const uint64_t block = allocate ? phase : 2 * kBlocksPerIteration - 1 - phase;
    event(block + 1, (block % 64 + 1) << 16, allocate);
    ++i;
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_TrackerEvent(benchmark::State& state) {
  UsageTracker tracker;
  uint64_t now = 0;
  uint64_t known = 0;  // events after which a claim could be made
  block_stream(
      state,
      [&](uint64_t block, uint64_t bytes, bool allocate) {
        if (allocate) {
          tracker.on_allocate(block, bytes, ++now);
        } else {
          tracker.on_free(block, ++now);
        }
        known += tracker.remaining_peak_bytes() != 0 ? 1 : 0;
      },
      [&] { tracker.on_iteration(++now); });
  if (known == 0 && static_cast<uint64_t>(state.iterations()) > 8 * kBlocksPerIteration) {
    state.SkipWithError("never an outlook: the step check did not run");
  }
}
BENCHMARK(BM_TrackerEvent);

void BM_BlockMapEvent(benchmark::State& state) {
  std::unordered_map<uint64_t, uint64_t> live;
  live.reserve(kBlocksPerIteration);
  block_stream(
      state,
      [&](uint64_t block, uint64_t bytes, bool allocate) {
        if (allocate) {
          live.emplace(block, bytes);
        } else {
          live.erase(block);
        }
        benchmark::DoNotOptimize(live.size());
      },
      [] {});
}
BENCHMARK(BM_BlockMapEvent);

}  // namespace
}  // namespace zico::sharing

BENCHMARK_MAIN();
