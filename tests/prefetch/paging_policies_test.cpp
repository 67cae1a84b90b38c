// The paging policies run in the simulator: the invariants every policy must
// keep on any stream and budget, and what each is for.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>

#include "belady_bound.h"
#include "peak_bound.h"
#include "segment_bound.h"
#include "paging_simulator.h"
#include "paging_streams.h"

namespace zico::prefetch {
namespace {

using page::PagingOptions;
using page::PagingResult;
using testing::random_training_stream;
using testing::StreamBuilder;

uint64_t total_h2d(const PagingResult& r) {
  return std::accumulate(r.iterations.begin(), r.iterations.end(), uint64_t{0},
                         [](uint64_t sum, const page::IterationStats& s) { return sum + s.h2d_bytes; });
}

// Runs `policy` and checks, at every event, that the budget holds and that a
// running op finds all its pages resident; and that the policy never asked
// for what the executor must refuse (evicting a page in use or not there),
// which the executor's refusal would otherwise hide.
PagingResult run_checked(const AccessStream& stream, const std::string& policy, uint64_t budget) {
  PagingOptions options;
  options.budget_bytes = budget;
  const uint32_t slots = static_cast<uint32_t>(budget / stream.page_bytes);
  uint64_t violations = 0;
  options.check = [&](const Residency& r, std::span<const PageId> running) {
    if (r.occupied_pages() > slots) ++violations;
    for (const PageId page : running) {
      if (r.state(page) != PageState::kResident) ++violations;
    }
  };
  PagingResult result;
  std::string error;
  EXPECT_TRUE(page::run_paging(stream, policy, options, &result, &error)) << error;
  EXPECT_EQ(violations, 0u) << policy;
  EXPECT_EQ(result.live_discards, 0u) << policy;
  EXPECT_EQ(result.refused_evictions, 0u) << policy;
  EXPECT_LE(result.peak_resident_bytes, budget);
  return result;
}

TEST(PagingPolicies, KeepTheBudgetAndTheRunningOpsPagesOnRandomStreams) {
  for (uint32_t seed = 1; seed <= 200; ++seed) {
    const uint64_t page = seed % 2 == 0 ? uint64_t{2} << 20 : uint64_t{64} << 10;
    const AccessStream stream = random_training_stream(seed, 4, page);
    ASSERT_EQ(stream_error(stream), "") << seed;
    const StreamFacts facts = stream_facts(stream);
    // From the largest op's working set up to everything.
    const uint32_t lo = facts.max_op_pages;
    const uint32_t hi = std::max(lo, stream.page_count);
    for (const uint32_t slots : {lo, (lo + hi) / 2, hi}) {
      const uint64_t budget = uint64_t{slots} * page;
      const auto bound = belady_fetch_bytes(stream, slots);
      const PeakBound peak = peak_bound(stream, budget, TransferModel{});
      const SegmentBound segments = segment_bound(stream, budget, TransferModel{});
      const uint64_t least = std::accumulate(bound.begin(), bound.end(), uint64_t{0});
      for (const std::string_view policy : kPolicyNames) {
        SCOPED_TRACE("seed " + std::to_string(seed) + ", " + std::to_string(slots) + " slots, " + std::string(policy));
        const PagingResult r = run_checked(stream, std::string(policy), budget);
        EXPECT_GE(total_h2d(r), least);  // nobody moves less than Belady
        for (const auto& it : r.iterations) EXPECT_GE(it.elapsed_ns(), it.compute_ns);
        EXPECT_GE(r.iterations.back().elapsed_ns(), peak.iteration_ns());  // nobody beats the peak bound
        EXPECT_GE(r.iterations.back().elapsed_ns(), segments.iteration_ns);  // nor the segment bound
      }
    }
  }
}

TEST(PagingPolicies, KeepTheInvariantsWhenNothingMarksTheIterations) {
  // zico then finds the period itself (period_detector.h); the budget and
  // the running op's pages must hold all the same.
  for (uint32_t seed = 1; seed <= 60; ++seed) {
    AccessStream stream = random_training_stream(seed, 12, seed % 2 == 0 ? uint64_t{2} << 20 : uint64_t{64} << 10);
    std::erase_if(stream.events, [](const StreamEvent& e) { return e.kind == StreamEvent::Kind::kIteration; });
    stream.iterations = 0;
    const StreamFacts facts = stream_facts(stream);
    for (const uint32_t slots : {facts.max_op_pages, (facts.max_op_pages + stream.page_count) / 2}) {
      SCOPED_TRACE("seed " + std::to_string(seed) + ", " + std::to_string(slots) + " slots");
      (void)run_checked(stream, "zico", uint64_t{slots} * stream.page_bytes);
    }
  }
}

TEST(PagingPolicies, ZicoRunsASteadyIterationWithoutFaultsAndMovesLessThanUm) {
  for (uint32_t seed = 1; seed <= 10; ++seed) {
    const AccessStream stream = random_training_stream(seed, 5, uint64_t{2} << 20);
    const StreamFacts facts = stream_facts(stream);
    const uint64_t budget = std::max<uint64_t>(facts.peak_live_bytes / 2, uint64_t{facts.max_op_pages} << 21);
    const PagingResult zico = run_checked(stream, "zico", budget);
    const PagingResult um = run_checked(stream, "um", budget);
    EXPECT_EQ(zico.iterations.back().faults, 0u) << seed;
    EXPECT_LE(total_h2d(zico), total_h2d(um)) << seed;
    EXPECT_LE(zico.iterations.back().elapsed_ns(), um.iterations.back().elapsed_ns()) << seed;
  }
}

// Host time per driver call (the calibration's call, range and block costs)
// delays the moves, which start only once their pager thread has issued
// them; the fault path's per-block stall slows a faulting policy.
TEST(PagingPolicies, TheDriversHostTimeDelaysTheMoves) {
  for (uint32_t seed = 1; seed <= 5; ++seed) {
    const AccessStream stream = random_training_stream(seed, 4, uint64_t{2} << 20);
    const StreamFacts facts = stream_facts(stream);
    const uint64_t tight = std::max<uint64_t>(facts.peak_live_bytes / 2, uint64_t{facts.max_op_pages} << 21);
    const auto elapsed = [&](const std::string& policy, uint64_t budget, const TransferModel& model) {
      PagingOptions options;
      options.budget_bytes = budget;
      options.model = model;
      PagingResult result;
      std::string error;
      EXPECT_TRUE(page::run_paging(stream, policy, options, &result, &error)) << error;
      return result.iterations.back().elapsed_ns();
    };
    TransferModel costly;
    costly.call_ns = 200'000;
    costly.range_ns = 50'000;
    costly.block_ns = 20'000;
    costly.to_host_sync = true;
    costly.cpu_map_block_ns = 30'000;
    EXPECT_GT(elapsed("zico", tight, costly), elapsed("zico", tight, TransferModel{})) << seed;
    TransferModel faults_cost;
    faults_cost.fault_block_ns = 100'000;
    EXPECT_GT(elapsed("um", tight, faults_cost), elapsed("um", tight, TransferModel{})) << seed;
  }
}

TEST(PagingPolicies, UmWritesDeadDataBackAndTheOthersDoNot) {
  // One page of weights, two pages for activations that die every iteration;
  // a budget of two pages forces evictions.
  StreamBuilder b(4096);
  const uint32_t w = b.allocate(4096);
  for (int it = 0; it < 4; ++it) {
    b.mark();
    const uint32_t a = b.allocate_at(4096, 4096);
    b.op({w, a}, 1000, 1);
    const uint32_t c = b.allocate_at(8192, 4096);
    b.op({a, c}, 1000, 2);
    b.free(a);
    b.op({w, c}, 1000, 3);
    b.free(c);
  }
  const AccessStream stream = b.finish();
  const PagingResult um = run_checked(stream, "um", 2 * 4096);
  for (const char* policy : {"deepum", "autoswap", "zico"}) {
    const PagingResult r = run_checked(stream, policy, 2 * 4096);
    EXPECT_LT(r.iterations.back().d2h_bytes, um.iterations.back().d2h_bytes) << policy;
  }
}

TEST(PagingPolicies, ZicoLearnsIterationsThatAlternate) {
  // An allocator whose placements settle into a 2-cycle: even iterations put
  // the activations on pages 1-2, odd ones on pages 3-4. Predicting each
  // iteration from the last one would fail every time; the planner learns
  // the two as one period and runs without faults.
  StreamBuilder b(4096);
  const uint32_t w = b.allocate(4096);
  for (int it = 0; it < 12; ++it) {
    b.mark();
    const uint64_t base = it % 2 == 0 ? 4096 : 3 * 4096;
    const uint32_t a = b.allocate_at(base, 4096);
    b.op({w, a}, 100000, 1);
    const uint32_t c = b.allocate_at(base + 4096, 4096);
    b.op({a, c}, 100000, 2);
    b.free(a);
    b.op({w, c}, 100000, 3);
    b.free(c);
    b.op({w}, 100000, 4);
  }
  const AccessStream stream = b.finish();
  const PagingResult r = run_checked(stream, "zico", 2 * 4096);
  EXPECT_EQ(r.iterations.back().faults, 0u);
  EXPECT_EQ(r.iterations[r.iterations.size() - 2].faults, 0u);
}

// Sixteen one-page weights, and the ops of one pass over them in `order`:
// op i uses the i-th and the next (exec ids 1 to 16).
std::vector<uint32_t> sixteen_weights(StreamBuilder& b) {
  std::vector<uint32_t> weights;
  for (int i = 0; i < 16; ++i) weights.push_back(b.allocate(4096));
  return weights;
}
void pass_over(StreamBuilder& b, const std::vector<uint32_t>& order) {
  for (uint64_t i = 0; i < 16; ++i) b.op({order[i], order[(i + 1) % 16]}, 100000, 1 + i);
}

// Sixteen one-page weights, each op using two, under a budget of six pages;
// before them `drifting` one-page activations, each used by one op, land on
// different pages every iteration, in no period of one or two (an
// allocator's placements can drift so).
AccessStream drifting_stream(uint64_t drifting) {
  StreamBuilder b(4096);
  const std::vector<uint32_t> weights = sixteen_weights(b);
  constexpr uint64_t kPlaces[] = {16, 19, 17, 22, 18, 21, 20, 23};
  for (int it = 0; it < 12; ++it) {
    b.mark();
    for (uint64_t k = 0; k < drifting; ++k) {
      const uint32_t a = b.allocate_at((kPlaces[(it + k) % 8] + 8 * k) * 4096, 4096);
      b.op({a}, 100000, 100 + k);
      b.free(a);
    }
    pass_over(b, weights);
  }
  return b.finish();
}

TEST(PagingPolicies, ZicoFollowsAPlanWhosePlacementsDriftALittle) {
  // One activation: 2 of the prediction's 33 page references differ (the
  // page it uses, the page it was predicted to use). The planner follows
  // its plan and fetches that page when its op needs it, where switching to
  // demand paging at the first difference faulted on every later op.
  const AccessStream stream = drifting_stream(1);
  const PagingResult zico = run_checked(stream, "zico", 6 * 4096);
  const PagingResult um = run_checked(stream, "um", 6 * 4096);
  for (size_t i = zico.iterations.size() - 3; i < zico.iterations.size(); ++i) {
    EXPECT_LE(zico.iterations[i].faults, 1u) << "iteration " << i;
    EXPECT_LT(zico.iterations[i].elapsed_ns(), um.iterations[i].elapsed_ns()) << "iteration " << i;
  }
}

TEST(PagingPolicies, ZicoKeepsAnAlternationWhosePlacementsDriftALittle) {
  // Weights and two activations on pages that alternate between two places
  // (learned as one period of two iterations), and one more activation that
  // drifts over eight places in no such period. The drift is followed
  // through and the period kept: no iteration runs on demand paging.
  StreamBuilder b(4096);
  const std::vector<uint32_t> weights = sixteen_weights(b);
  constexpr uint64_t kPlaces[] = {24, 27, 25, 30, 26, 29, 28, 31};
  for (int it = 0; it < 16; ++it) {
    b.mark();
    const uint32_t d = b.allocate_at(kPlaces[it % 8] * 4096, 4096);
    b.op({d}, 100000, 100);
    b.free(d);
    const uint64_t base = it % 2 == 0 ? 16 : 20;
    const uint32_t a = b.allocate_at(base * 4096, 4096);
    b.op({weights[0], a}, 100000, 101);
    const uint32_t c = b.allocate_at((base + 1) * 4096, 4096);
    b.op({a, c}, 100000, 102);
    b.free(a);
    b.op({weights[1], c}, 100000, 103);
    b.free(c);
    pass_over(b, weights);
  }
  const AccessStream stream = b.finish();
  const PagingResult zico = run_checked(stream, "zico", 6 * 4096);
  for (size_t i = zico.iterations.size() - 4; i < zico.iterations.size(); ++i) {
    EXPECT_LE(zico.iterations[i].faults, 1u) << "iteration " << i;
  }
}

TEST(PagingPolicies, ZicoLeavesAPlanThatNoLongerFits) {
  // The same launches, but each iteration's ops use the weights in another
  // order: the prediction's pages are wrong everywhere. Followed on, its
  // planned fetches bring the wrong pages (1.16x the bytes demand paging
  // moves); the planner leaves it at its first op and moves about what
  // demand paging does (its cold path evicts ahead, a little more).
  StreamBuilder b(4096);
  const std::vector<uint32_t> weights = sixteen_weights(b);
  std::mt19937 random(7);
  std::vector<uint32_t> order(weights);
  for (int it = 0; it < 12; ++it) {
    b.mark();
    std::shuffle(order.begin(), order.end(), random);
    pass_over(b, order);
  }
  const AccessStream stream = b.finish();
  const PagingResult zico = run_checked(stream, "zico", 6 * 4096);
  const PagingResult um = run_checked(stream, "um", 6 * 4096);
  EXPECT_LE(total_h2d(zico), total_h2d(um) * 21 / 20);
}

TEST(PagingPolicies, TheSimulatorRefusesWhatCannotRun) {
  const AccessStream stream = random_training_stream(3, 2, 4096);
  PagingOptions options;
  options.budget_bytes = uint64_t{stream_facts(stream).max_op_pages - 1} * 4096;
  PagingResult result;
  std::string error;
  EXPECT_FALSE(page::run_paging(stream, "zico", options, &result, &error));
  EXPECT_NE(error.find("largest op"), std::string::npos) << error;
  options.budget_bytes = uint64_t{1} << 40;
  EXPECT_FALSE(page::run_paging(stream, "lru", options, &result, &error));
  EXPECT_NE(error.find("unknown policy 'lru'"), std::string::npos) << error;
  AccessStream broken = stream;
  broken.events.push_back({StreamEvent::Kind::kFree, 0});
  broken.events.push_back({StreamEvent::Kind::kFree, 0});
  EXPECT_FALSE(page::run_paging(broken, "um", options, &result, &error));
  EXPECT_NE(error.find("freed while not live"), std::string::npos) << error;
}

}  // namespace
}  // namespace zico::prefetch
