#include "usage_tracker.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <vector>

#include "demand_curve.h"

namespace zico::sharing {
namespace {

// ---- DemandCurve ------------------------------------------------------------

DemandCurve flat(uint64_t period_ns, uint64_t level) {
  DemandCurve c;
  c.period_ns = period_ns;
  c.bins.fill(level);
  return c;
}

TEST(DemandCurve, BinOfSplitsThePeriodIntoEqualBins) {
  DemandCurve c = flat(1280, 0);
  EXPECT_EQ(c.bin_ns(), 10u);
  EXPECT_EQ(c.bin_of(0), 0u);
  EXPECT_EQ(c.bin_of(9), 0u);
  EXPECT_EQ(c.bin_of(10), 1u);
  EXPECT_EQ(c.bin_of(645), 64u);
  EXPECT_EQ(c.bin_of(1279), 127u);
  EXPECT_EQ(c.bin_of(1280), 127u);  // at or past the period: the last bin
  EXPECT_EQ(c.bin_of(UINT64_MAX), 127u);

  c.period_ns = 100;  // bins of 100/128 ns: exact arithmetic, no drift
  EXPECT_EQ(c.bin_of(1), 1u);
  EXPECT_EQ(c.bin_of(50), 64u);
  EXPECT_EQ(c.bin_of(99), 126u);
  EXPECT_EQ(c.bin_ns(), 1u);

  c.period_ns = UINT64_MAX;  // the product would overflow
  EXPECT_EQ(c.bin_of(UINT64_MAX / 2), 64u);

  EXPECT_EQ(DemandCurve{}.bin_of(123), 0u);
  EXPECT_FALSE(DemandCurve{}.known());
}

TEST(DemandCurve, PeakTroughAndMaxFrom) {
  DemandCurve c = flat(1280, 100);
  c.bins[3] = 50;
  c.bins[10] = 900;
  c.bins[100] = 400;
  EXPECT_EQ(c.peak(), 900u);
  EXPECT_EQ(c.trough(), 50u);
  EXPECT_EQ(c.max_from(0), 900u);
  EXPECT_EQ(c.max_from(109), 900u);  // bin 10
  EXPECT_EQ(c.max_from(110), 400u);  // bin 11 on
  EXPECT_EQ(c.max_from(1010), 100u);  // bin 101 on
  EXPECT_EQ(c.max_from(5000), 100u);  // past the period: the last bin
}

TEST(DemandCurve, MateriallyDifferent) {
  const DemandCurve unknown;
  DemandCurve base = flat(1000, 100);
  base.bins[7] = 1000;
  EXPECT_FALSE(materially_different(unknown, unknown, 0.05));
  EXPECT_TRUE(materially_different(unknown, base, 0.05));
  EXPECT_TRUE(materially_different(base, unknown, 0.05));
  EXPECT_FALSE(materially_different(base, base, 0.05));

  DemandCurve next = base;
  next.period_ns = 1050;  // exactly 5 %: not more than the tolerance
  EXPECT_FALSE(materially_different(base, next, 0.05));
  next.period_ns = 1051;
  EXPECT_TRUE(materially_different(base, next, 0.05));
  next.period_ns = 949;
  EXPECT_TRUE(materially_different(base, next, 0.05));

  next = base;
  next.bins[7] = 1049;  // 49 < 5 % of the larger peak (52.45)
  EXPECT_FALSE(materially_different(base, next, 0.05));
  next.bins[7] = 1060;  // 60 > 53
  EXPECT_TRUE(materially_different(base, next, 0.05));

  // A small bin is judged against the peak, not against itself.
  next = base;
  next.bins[90] = 150;  // +50 % of the bin, exactly 5 % of the peak
  EXPECT_FALSE(materially_different(base, next, 0.05));
  next.bins[90] = 151;
  EXPECT_TRUE(materially_different(base, next, 0.05));
  next.bins[90] = 49;
  EXPECT_TRUE(materially_different(base, next, 0.05));

  // The split and end bytes are not part of the test.
  next = base;
  next.persistent_bytes = 999;
  next.end_bytes = 5;
  EXPECT_FALSE(materially_different(base, next, 0.05));
}

// ---- UsageTracker with marks ------------------------------------------------

// One iteration of 1280 ns starting at `s` (bins of 10 ns). The weight W
// (id 1, 1000 B) lives throughout; G (id 4, 300 B) is a gradient made in
// each iteration and freed early in the next; A (id 2) an activation; S
// (id 3, 50 B) 10 ns of scratch.
void marked_iteration(UsageTracker& t, uint64_t s, uint64_t a_bytes, bool free_g) {
  t.on_iteration(s);
  if (free_g) t.on_free(4, s + 10);
  t.on_allocate(2, a_bytes, s + 100);
  t.on_allocate(3, 50, s + 200);
  t.on_allocate(4, 300, s + 205);
  t.on_free(3, s + 210);
  t.on_free(2, s + 600);
}

TEST(UsageTracker, MarksGiveExactCurve) {
  UsageTracker t;
  t.on_allocate(1, 1000, 0);
  marked_iteration(t, 0, 500, false);
  EXPECT_TRUE(t.explicit_marks());
  EXPECT_EQ(t.iterations(), 1u);
  EXPECT_FALSE(t.curve().known());  // none complete yet
  EXPECT_EQ(t.curve_version(), 0u);
  t.on_iteration(1280);
  EXPECT_EQ(t.iterations(), 2u);
  EXPECT_EQ(t.iteration_start_ns(), 1280u);
  EXPECT_EQ(t.curve_version(), 1u);

  const DemandCurve& c = t.curve();
  ASSERT_TRUE(c.known());
  EXPECT_EQ(c.period_ns, 1280u);
  std::array<uint64_t, kDemandBins> want{};
  for (size_t i = 0; i < kDemandBins; ++i) {
    if (i < 10) {
      want[i] = 1000;
    } else if (i < 20) {
      want[i] = 1500;  // A from 100 ns
    } else if (i < 22) {
      want[i] = 1850;  // S and G at 200 and 205; S's free at 210 carries 1850 into bin 21
    } else if (i <= 60) {
      want[i] = 1800;  // until A's free at 600, which carries 1800 into bin 60
    } else {
      want[i] = 1300;
    }
  }
  for (size_t i = 0; i < kDemandBins; ++i) EXPECT_EQ(c.bins[i], want[i]) << "bin " << i;
  EXPECT_EQ(c.peak(), 1850u);
  EXPECT_EQ(c.trough(), 1000u);
  EXPECT_EQ(c.max_from(215), 1850u);
  EXPECT_EQ(c.max_from(220), 1800u);
  EXPECT_EQ(c.max_from(610), 1300u);
  EXPECT_EQ(c.end_bytes, 1300u);
  // At the peak (205 ns): W was born before the iteration, G is still live
  // at its end; A lived 500 ns, S 10 ns < 1 % of 1280 ns.
  EXPECT_EQ(c.persistent_bytes, 1300u);
  EXPECT_EQ(c.transient_bytes, 500u);
  EXPECT_EQ(c.workspace_bytes, 50u);
}

TEST(UsageTracker, VersionMovesOnlyOnMaterialChange) {
  UsageTracker t;
  t.on_allocate(1, 1000, 0);
  marked_iteration(t, 0, 500, false);
  marked_iteration(t, 1280, 500, true);
  EXPECT_EQ(t.curve_version(), 1u);
  EXPECT_EQ(t.curve().bins[1], 1000u);

  // The second iteration starts with last iteration's G still live (bin 0
  // and 1 hold 1300, not 1000): 300 B > 5 % of the peak, a material change.
  marked_iteration(t, 2560, 500, true);
  EXPECT_EQ(t.curve_version(), 2u);
  EXPECT_EQ(t.curve().bins[1], 1300u);
  EXPECT_EQ(t.curve().persistent_bytes, 1300u);

  // Identical iteration: no change.
  marked_iteration(t, 3840, 500, true);
  EXPECT_EQ(t.curve_version(), 2u);

  // A grows by 20 B: curve() follows, the version does not.
  marked_iteration(t, 5120, 520, true);
  EXPECT_EQ(t.curve().peak(), 1850u);  // the iteration before, A = 500
  marked_iteration(t, 6400, 500, true);
  EXPECT_EQ(t.curve().peak(), 1870u);
  EXPECT_EQ(t.curve().transient_bytes, 520u);
  EXPECT_EQ(t.curve_version(), 2u);

  // Small steps that add up: compared with the curve of the last bump
  // (peak 1850), not the one before.
  marked_iteration(t, 7680, 560, true);  // ends the 500 iteration
  marked_iteration(t, 8960, 600, true);  // ends 560: +60 < 95.5
  EXPECT_EQ(t.curve().peak(), 1910u);
  EXPECT_EQ(t.curve_version(), 2u);
  marked_iteration(t, 10240, 600, true);  // ends 600: +100 > 97.5
  EXPECT_EQ(t.curve().peak(), 1950u);
  EXPECT_EQ(t.curve_version(), 3u);

  // A longer iteration: the period moves by 10 %.
  marked_iteration(t, 11520, 600, true);
  t.on_iteration(11520 + 1408);
  EXPECT_EQ(t.curve().period_ns, 1408u);
  EXPECT_EQ(t.curve_version(), 4u);
  EXPECT_EQ(t.iterations(), 11u);
}

TEST(UsageTracker, ZeroLengthIterationStaysKnown) {
  UsageTracker t;
  t.on_iteration(50);
  t.on_allocate(1, 10, 50);
  t.on_free(1, 50);
  t.on_iteration(50);
  EXPECT_EQ(t.curve().period_ns, 1u);
  EXPECT_EQ(t.curve().peak(), 10u);
  EXPECT_EQ(t.curve().end_bytes, 0u);
}

TEST(UsageTracker, UnknownFreesAreIgnoredAndCounted) {
  UsageTracker t;
  t.on_allocate(1, 100, 0);
  t.on_free(7, 1);
  t.on_free(1, 2);
  t.on_free(1, 3);  // already freed
  EXPECT_EQ(t.ignored_frees(), 2u);
  EXPECT_EQ(t.live_bytes(), 0u);
}

TEST(UsageTracker, ReallocatingALiveIdFreesItFirst) {
  UsageTracker t;
  t.on_iteration(0);
  t.on_allocate(1, 100, 0);
  t.on_allocate(1, 40, 10);
  EXPECT_EQ(t.live_bytes(), 40u);
  t.on_free(1, 20);
  EXPECT_EQ(t.live_bytes(), 0u);
  EXPECT_EQ(t.ignored_frees(), 0u);
  t.on_iteration(1280);
  EXPECT_EQ(t.curve().peak(), 100u);
  EXPECT_EQ(t.curve().bins[3], 0u);
}

// `pairs` allocations of 64 B, each freed at once: 2 * pairs tokens.
void churn(UsageTracker& t, uint64_t& id, uint64_t& now, size_t pairs) {
  for (size_t i = 0; i < pairs; ++i) {
    t.on_allocate(id, 64, now += 1);
    t.on_free(id++, now += 1);
  }
}

TEST(UsageTracker, MarkedIterationPastTheCapPublishesAnUnknownCurve) {
  UsageTrackerOptions o;
  o.max_iteration_tokens = 50;
  UsageTracker t(o);
  t.on_allocate(1, 1000, 0);
  marked_iteration(t, 0, 500, false);
  marked_iteration(t, 1280, 500, true);
  marked_iteration(t, 2560, 500, true);
  t.on_iteration(3840);
  ASSERT_EQ(t.curve_version(), 2u);  // as in VersionMovesOnlyOnMaterialChange
  const DemandCurve steady = t.curve();

  // Exactly the cap (50 tokens) is still measured.
  uint64_t id = 100;
  uint64_t now = 3840;
  churn(t, id, now, 25);
  t.on_iteration(now += 10);
  EXPECT_TRUE(t.curve().known());
  EXPECT_EQ(t.curve().period_ns, 60u);
  EXPECT_EQ(t.curve_version(), 3u);

  // One token more: the curve goes unknown when the iteration ends, and
  // that moves the version.
  churn(t, id, now, 25);
  const uint64_t extra = id++;
  t.on_allocate(extra, 64, now += 1);
  EXPECT_TRUE(t.curve().known());  // not before the mark
  const uint64_t seen = t.iterations();
  t.on_iteration(now += 10);
  EXPECT_FALSE(t.curve().known());
  EXPECT_EQ(t.curve_version(), 4u);
  EXPECT_EQ(t.iterations(), seen + 1);
  EXPECT_EQ(t.iteration_start_ns(), now);

  // Another one too long (ended by the next mark): still unknown, no new
  // version.
  t.on_free(extra, now += 1);
  churn(t, id, now, 1000);
  marked_iteration(t, 1280 * 100, 500, true);
  EXPECT_FALSE(t.curve().known());
  EXPECT_EQ(t.curve_version(), 4u);

  // An iteration that fits is measured again, exactly.
  t.on_iteration(1280 * 101);
  EXPECT_TRUE(t.curve().known());
  EXPECT_EQ(t.curve_version(), 5u);
  EXPECT_FALSE(materially_different(steady, t.curve(), 0.0));
  EXPECT_EQ(t.curve().peak(), 1850u);
  EXPECT_EQ(t.curve().persistent_bytes, 1300u);
}

TEST(UsageTracker, IterationCapDefaultsToTwiceTheLongestPeriod) {
  UsageTrackerOptions o;
  o.max_period_tokens = 16;
  UsageTracker t(o);
  uint64_t id = 1;
  uint64_t now = 0;
  t.on_iteration(now);
  churn(t, id, now, 16);  // 32 tokens
  t.on_iteration(now += 1);
  EXPECT_TRUE(t.curve().known());
  churn(t, id, now, 17);  // 34
  t.on_iteration(now += 1);
  EXPECT_FALSE(t.curve().known());
}

TEST(UsageTracker, MemoryStaysBoundedWhenMarksStop) {
  // One mark, then marks never come again: the tracker keeps at most
  // max_iteration_tokens (here the default, 2 * 32768) tokens, not all of
  // them.
  UsageTracker t;
  uint64_t id = 1;
  uint64_t now = 0;
  t.on_iteration(now);
  churn(t, id, now, 50'000);
  const size_t held = t.buffered_tokens();
  EXPECT_GE(held, 2u * 32768);
  EXPECT_LE(held, 2u * 32768 + 2 * 4096);
  churn(t, id, now, 500'000);  // a million tokens more
  EXPECT_EQ(t.buffered_tokens(), held);
  EXPECT_EQ(t.iterations(), 1u);
  EXPECT_FALSE(t.curve().known());

  // Detection keeps its window and no more.
  UsageTrackerOptions o;
  o.max_period_tokens = 1024;
  UsageTracker d(o);
  uint64_t size = 1;
  for (int i = 0; i < 300'000; ++i) {
    size = size * 6364136223846793005u + 1442695040888963407u;  // never repeats
    d.on_allocate(id, (size >> 40) + 1, now += 1);
    d.on_free(id++, now += 1);
  }
  EXPECT_EQ(d.detected_period_tokens(), 0u);
  EXPECT_LE(d.buffered_tokens(), 2u * 1024 + 2 * 4096);
}

// ---- UsageTracker without marks ---------------------------------------------

constexpr uint64_t kWeight = 10'000;
constexpr uint64_t kOptimizer = 4'000;
constexpr uint64_t kInput = 64;
constexpr uint64_t kScratch = 7;
constexpr uint64_t kPeriodNs = 1000;
constexpr uint64_t kTokenNs = 10;

// A synthetic training job: weights, then iterations of input, `layers`
// activations (100 B * layer), a scratch block, frees in reverse. The first
// iteration also creates optimizer state, so it differs from the rest.
struct Job {
  explicit Job(UsageTracker& tracker) : t(tracker) {}

  UsageTracker& t;
  uint64_t next_id = 1;
  uint64_t start = 0;  // of the current iteration
  uint64_t token = 0;  // tokens into the current iteration
  std::vector<uint64_t> anchor_times;  // when each "input freed" token came

  uint64_t now() { return start + kTokenNs * token++; }
  uint64_t alloc(uint64_t bytes) {
    const uint64_t id = next_id++;
    t.on_allocate(id, bytes, now());
    return id;
  }
  void free(uint64_t id) { t.on_free(id, now()); }

  void iteration(size_t layers, uint64_t odd_layer = 0, uint64_t odd_bytes = 0, bool first = false) {
    token = 0;
    const uint64_t input = alloc(kInput);
    std::vector<uint64_t> acts;
    for (size_t l = 1; l <= layers; ++l) acts.push_back(alloc(l == odd_layer ? odd_bytes : 100 * l));
    const uint64_t scratch = alloc(kScratch);
    free(scratch);
    if (first) alloc(kOptimizer);
    for (size_t l = acts.size(); l-- > 0;) free(acts[l]);
    anchor_times.push_back(start + kTokenNs * token);
    free(input);
    start += kPeriodNs;
  }
  static size_t tokens(size_t layers) { return 2 * layers + 4; }
};

UsageTrackerOptions options() {
  UsageTrackerOptions o;
  // 25 ns: the scratch (10 ns) is workspace, the last activation (30 ns) is not.
  o.workspace_fraction = 0.025;
  return o;
}

TEST(UsageTracker, DetectsPeriodAfterDifferingFirstIteration) {
  UsageTracker t(options());
  Job job(t);
  job.alloc(kWeight);
  job.iteration(10, 0, 0, true);
  const size_t p = Job::tokens(10);  // 24
  size_t fed = 1 + p + 1;
  while (fed + p < 1024) {
    job.iteration(10);
    fed += p;
    EXPECT_EQ(t.detected_period_tokens(), 0u);
    EXPECT_EQ(t.iterations(), 0u);
  }
  // The check at token 1024 falls in this iteration.
  job.iteration(10);
  EXPECT_EQ(t.detected_period_tokens(), p);
  EXPECT_FALSE(t.explicit_marks());
  // The anchor is the trough: right after the input is freed. The check ran
  // before this iteration's anchor: the iteration before was measured in
  // hindsight (two starts), then this iteration's anchor came (a third).
  EXPECT_EQ(t.iterations(), 3u);
  EXPECT_EQ(t.iteration_start_ns(), job.anchor_times.back());
  EXPECT_EQ(t.curve_version(), 1u);

  const DemandCurve& c = t.curve();
  EXPECT_EQ(c.period_ns, kPeriodNs);
  const uint64_t floor = kWeight + kOptimizer;
  EXPECT_EQ(c.bins[0], floor);
  EXPECT_EQ(c.trough(), floor);
  EXPECT_EQ(c.end_bytes, floor);
  EXPECT_EQ(c.peak(), floor + kInput + 5500 + kScratch);
  EXPECT_EQ(c.persistent_bytes, floor);
  EXPECT_EQ(c.transient_bytes, kInput + 5500);
  EXPECT_EQ(c.workspace_bytes, kScratch);

  // One start per further iteration.
  for (int i = 0; i < 5; ++i) job.iteration(10);
  EXPECT_EQ(t.iterations(), 8u);
  EXPECT_EQ(t.iteration_start_ns(), job.anchor_times.back());
  EXPECT_EQ(t.curve_version(), 1u);
  EXPECT_EQ(t.detected_period_tokens(), p);
}

TEST(UsageTracker, InnerLoopsAreNotTakenForTheIteration) {
  // Eight identical layers of 4 tokens inside a 42-token iteration.
  UsageTracker t(options());
  uint64_t id = 1;
  uint64_t now = 0;
  auto iteration = [&] {
    std::vector<uint64_t> head;
    for (uint64_t k = 1; k <= 5; ++k) {
      head.push_back(id);
      t.on_allocate(id++, 1000 * k, now += 10);
    }
    for (int layer = 0; layer < 8; ++layer) {
      t.on_allocate(id, 32, now += 10);
      t.on_allocate(id + 1, 48, now += 10);
      t.on_free(id, now += 10);
      t.on_free(id + 1, now += 10);
      id += 2;
    }
    for (uint64_t h : head) t.on_free(h, now += 10);
  };
  for (int i = 0; i < 60; ++i) iteration();
  EXPECT_EQ(t.detected_period_tokens(), 42u);
  EXPECT_EQ(t.curve().period_ns, 420u);
  EXPECT_EQ(t.curve().peak(), 15'000u + 80u);
}

TEST(UsageTracker, RepeatingGrowthIsNotAnIteration) {
  // Building a model of identical layers repeats exactly, but only takes
  // memory; so does a forward pass that frees a temporary per layer.
  UsageTracker t;
  uint64_t id = 1;
  uint64_t now = 0;
  for (int layer = 0; layer < 300; ++layer) {
    for (uint64_t k = 1; k <= 8; ++k) t.on_allocate(id++, 1000 * k, now += 10);
  }
  EXPECT_EQ(t.detected_period_tokens(), 0u);
  for (int layer = 0; layer < 300; ++layer) {  // 8 tokens, keeps 600 B a layer
    t.on_allocate(id, 500, now += 10);
    t.on_allocate(id + 1, 800, now += 10);
    t.on_allocate(id + 2, 300, now += 10);
    t.on_allocate(id + 3, 200, now += 10);
    t.on_free(id + 1, now += 10);
    t.on_free(id + 2, now += 10);
    t.on_allocate(id + 4, 100, now += 10);
    t.on_free(id + 3, now += 10);
    id += 5;
  }
  EXPECT_EQ(t.detected_period_tokens(), 0u);
  EXPECT_EQ(t.iterations(), 0u);
  EXPECT_FALSE(t.curve().known());
}

TEST(UsageTracker, PatternsShorterThanTheMinimumAreIgnored) {
  UsageTracker t;
  for (uint64_t i = 0; i < 4000; ++i) {
    t.on_allocate(i, 64, 2 * i);
    t.on_free(i, 2 * i + 1);
  }
  EXPECT_EQ(t.detected_period_tokens(), 0u);
  EXPECT_FALSE(t.curve().known());
  EXPECT_EQ(t.iterations(), 0u);
}

TEST(UsageTracker, DropsABrokenPatternAndFindsTheNewOne) {
  UsageTracker t(options());
  Job job(t);
  job.alloc(kWeight);
  job.iteration(10, 0, 0, true);
  for (int i = 0; i < 60; ++i) job.iteration(10);
  ASSERT_EQ(t.detected_period_tokens(), 24u);
  const uint64_t seen = t.iterations();
  const uint64_t start = t.iteration_start_ns();
  const uint64_t version = t.curve_version();
  const DemandCurve before = t.curve();

  // Layer 5 changes size: the first differing token drops the pattern.
  job.iteration(12, 5, 777);
  EXPECT_EQ(t.detected_period_tokens(), 0u);
  for (int i = 0; i < 20; ++i) job.iteration(12, 5, 777);  // 560 tokens: before the next check
  EXPECT_EQ(t.detected_period_tokens(), 0u);
  EXPECT_EQ(t.iterations(), seen);
  EXPECT_EQ(t.iteration_start_ns(), start);
  EXPECT_EQ(t.curve_version(), version);
  EXPECT_EQ(t.curve().peak(), before.peak());

  for (int i = 0; i < 40; ++i) job.iteration(12, 5, 777);
  EXPECT_EQ(t.detected_period_tokens(), Job::tokens(12));
  EXPECT_GT(t.iterations(), seen);
  EXPECT_EQ(t.iteration_start_ns(), job.anchor_times.back());
  EXPECT_EQ(t.curve_version(), version + 1);
  EXPECT_EQ(t.curve().peak(), kWeight + kOptimizer + kInput + (7800 - 500 + 777) + kScratch);
}

TEST(UsageTracker, UnknownFreeDoesNotBreakAPattern) {
  UsageTracker t(options());
  Job job(t);
  job.alloc(kWeight);
  for (int i = 0; i < 60; ++i) job.iteration(10);
  ASSERT_EQ(t.detected_period_tokens(), 24u);
  t.on_free(999'999, job.start);
  job.iteration(10);
  EXPECT_EQ(t.detected_period_tokens(), 24u);
  EXPECT_EQ(t.ignored_frees(), 1u);
}

TEST(UsageTracker, ExplicitMarkSwitchesDetectionOff) {
  UsageTracker t(options());
  Job job(t);
  job.alloc(kWeight);
  for (int i = 0; i < 60; ++i) job.iteration(10);
  ASSERT_EQ(t.detected_period_tokens(), 24u);
  const uint64_t seen = t.iterations();

  t.on_iteration(job.start);
  EXPECT_TRUE(t.explicit_marks());
  EXPECT_EQ(t.detected_period_tokens(), 0u);
  EXPECT_EQ(t.iterations(), seen + 1);
  EXPECT_EQ(t.iteration_start_ns(), job.start);
  job.iteration(10);
  for (int i = 0; i < 100; ++i) job.iteration(10);  // detection would have found it again
  EXPECT_EQ(t.detected_period_tokens(), 0u);
  EXPECT_EQ(t.iterations(), seen + 1);  // no marks since
  t.on_iteration(job.start);
  EXPECT_EQ(t.iterations(), seen + 2);
  EXPECT_EQ(t.curve().period_ns, 101 * kPeriodNs);
}

TEST(UsageTracker, DetectedBoundariesAreSeenInFrees) {
  // Each iteration takes four blocks and gives them back: the trough, where
  // iterations start, is right after the last free. A caller that gates at
  // allocations sees the new iteration at its next allocation.
  UsageTracker t(options());
  uint64_t id = 1;
  uint64_t now = 0;
  size_t on_allocations = 0;
  size_t on_frees = 0;
  size_t detections = 0;
  uint64_t anchor_ns = 0;
  auto watch = [&](bool is_free, auto&& call) {
    const uint64_t before = t.iterations();
    call();
    const uint64_t moved = t.iterations() - before;
    if (moved == 0) return;
    if (moved == 2) {
      ++detections;  // on whichever token the detection pass finished
      return;
    }
    EXPECT_EQ(moved, 1u);
    if (is_free) {
      ++on_frees;
      EXPECT_EQ(t.iteration_start_ns(), now);  // this very free
    } else {
      ++on_allocations;
    }
  };
  for (int i = 0; i < 400; ++i) {
    for (uint64_t k = 1; k <= 4; ++k) watch(false, [&] { t.on_allocate(id + k, 100 * k, now += 10); });
    for (uint64_t k = 4; k >= 1; --k) {
      watch(true, [&] {
        t.on_free(id + k, now += 10);
        if (k == 1) anchor_ns = now;
      });
    }
    id += 4;
  }
  EXPECT_EQ(t.detected_period_tokens(), 8u);
  EXPECT_EQ(detections, 1u);
  EXPECT_EQ(on_allocations, 0u);
  EXPECT_GT(on_frees, 250u);
  EXPECT_EQ(t.iterations(), 2 + on_frees);
  EXPECT_EQ(t.iteration_start_ns(), anchor_ns);
  EXPECT_EQ(t.curve().end_bytes, 0u);
}

TEST(UsageTracker, LongPeriodIsFoundByAPassSpreadOverCalls) {
  // 6000-token iterations: a window of 12000+ tokens, more than one call's
  // share of a pass. It is still found, and measured.
  UsageTracker t(options());
  uint64_t id = 1;
  uint64_t now = 0;
  t.on_allocate(id++, kWeight, now);
  for (int i = 0; i < 8; ++i) {
    const uint64_t first = id;
    for (uint64_t k = 0; k < 3000; ++k) t.on_allocate(id++, 16 + k % 1000, now += 10);
    for (uint64_t k = id; k-- > first;) t.on_free(k, now += 10);
  }
  EXPECT_EQ(t.detected_period_tokens(), 6000u);
  EXPECT_EQ(t.curve().period_ns, 60'000u);
  EXPECT_EQ(t.curve().end_bytes, kWeight);
  EXPECT_GE(t.iterations(), 3u);
}


// ---- Outlook (remaining_peak_bytes) -------------------------------------------

// One marked iteration of a job holding `persistent`: three activations of
// 100, 200 and 300 bytes allocated (the forward pass), then freed in reverse
// (the backward pass), with `extra` bytes allocated before the first and
// kept (a first iteration creating optimizer state), and a 1 ns step per
// event. Returns after the last free, before the next mark.
void outlook_body(UsageTracker& t, uint64_t& now, uint64_t& id, uint64_t extra = 0) {
  if (extra > 0) t.on_allocate(1'000'000 + id++, extra, ++now);
  const uint64_t first = id;
  for (const uint64_t bytes : {100u, 200u, 300u}) t.on_allocate(id++, bytes, ++now);
  for (uint64_t b = id; b-- > first;) t.on_free(b, ++now);
}

// The same, after the iteration's mark.
void outlook_iteration(UsageTracker& t, uint64_t& now, uint64_t& id, uint64_t extra = 0) {
  t.on_iteration(now);
  outlook_body(t, now, id, extra);
}

// 1000 bytes persistent, two alike iterations behind, the third just begun:
// the outlook is trusted from here on.
void start_third_alike_iteration(UsageTracker& t, uint64_t& now, uint64_t& id) {
  t.on_allocate(id++, 1000, ++now);
  outlook_iteration(t, now, id);
  outlook_iteration(t, now, id);
  t.on_iteration(++now);
}

TEST(UsageTrackerOutlook, TheFirstIterationIsNoReference) {
  UsageTracker t;
  uint64_t now = 0;
  uint64_t id = 1;
  t.on_allocate(id++, 1000, ++now);  // persistent
  EXPECT_EQ(t.remaining_peak_bytes(), 0u);
  outlook_iteration(t, now, id, 50);  // the first iteration does more: 7 tokens
  EXPECT_EQ(t.remaining_peak_bytes(), 0u);
  t.on_iteration(++now);
  EXPECT_EQ(t.next_iteration_peak_bytes(), 0u) << "the first iteration is never trusted";
  outlook_body(t, now, id);  // the second: 6 tokens
  EXPECT_EQ(t.remaining_peak_bytes(), 0u) << "its outlook would be the first's";
  t.on_iteration(++now);
  // The second is trusted on its own, unlike as it is to the first. The
  // first iteration's 50 stayed: the peak is 1050 + 600.
  EXPECT_EQ(t.next_iteration_peak_bytes(), 1650u);
  EXPECT_EQ(t.remaining_peak_bytes(), 1650u);
}

TEST(UsageTrackerOutlook, AnIterationThatDoesSomethingElseLosesItsOutlook) {
  UsageTracker t;
  uint64_t now = 0;
  uint64_t id = 1;
  start_third_alike_iteration(t, now, id);
  EXPECT_EQ(t.remaining_peak_bytes(), 1600u);
  // 250 where the last iteration allocated 100: positions no longer say what
  // comes next, even when the tokens after match again.
  const uint64_t first = id;
  t.on_allocate(id++, 250, ++now);
  EXPECT_EQ(t.remaining_peak_bytes(), 0u);
  t.on_allocate(id++, 200, ++now);
  t.on_allocate(id++, 300, ++now);
  EXPECT_EQ(t.remaining_peak_bytes(), 0u);
  for (uint64_t b = id; b-- > first;) t.on_free(b, ++now);
  t.on_iteration(++now);
  // Nor is it trusted for the next one: it did not do what the one before did.
  EXPECT_EQ(t.next_iteration_peak_bytes(), 0u);
  outlook_body(t, now, id);  // the usual iteration again, unlike the last
  t.on_iteration(++now);
  EXPECT_EQ(t.next_iteration_peak_bytes(), 0u);
  outlook_body(t, now, id);  // and once more: two alike
  t.on_iteration(++now);
  EXPECT_EQ(t.next_iteration_peak_bytes(), 1600u);
  EXPECT_EQ(t.remaining_peak_bytes(), 1600u);
}

TEST(UsageTrackerOutlook, ALongerIterationIsNotTrustedForTheNext) {
  UsageTracker t;
  uint64_t now = 0;
  uint64_t id = 1;
  start_third_alike_iteration(t, now, id);
  // The second's six tokens exactly, then one more: aligned all the way,
  // past the last iteration's end its end level.
  outlook_body(t, now, id);
  t.on_allocate(id++, 7, ++now);
  EXPECT_EQ(t.remaining_peak_bytes(), 1007u);
  t.on_iteration(++now);
  EXPECT_EQ(t.next_iteration_peak_bytes(), 0u) << "7 tokens against 6";
}

// The size of allocation k of a long iteration (long_iteration).
uint64_t long_iteration_bytes(uint64_t k) { return 16 + k % 100; }

// An iteration of 9000 tokens, so the outlook keeps 4096 steps of 3 tokens:
// 4500 allocations of long_iteration_bytes(k), then all freed. Returns the
// bytes live at its peak.
uint64_t long_iteration(UsageTracker& t, uint64_t& now, uint64_t& id) {
  t.on_iteration(++now);
  const uint64_t first = id;
  uint64_t peak = 0;
  for (uint64_t k = 0; k < 4500; ++k) {
    t.on_allocate(id++, long_iteration_bytes(k), ++now);
    peak += long_iteration_bytes(k);
  }
  for (uint64_t b = id; b-- > first;) t.on_free(b, ++now);
  return peak;
}

TEST(UsageTrackerOutlook, AlignmentIsCheckedStepByStepInLongIterations) {
  // A step is compared once its third token is in.
  UsageTracker t;
  uint64_t now = 0;
  uint64_t id = 1;
  for (int i = 0; i < 3; ++i) long_iteration(t, now, id);
  t.on_iteration(++now);
  for (uint64_t k = 0; k < 5; ++k) t.on_allocate(id++, k == 4 ? 21 : 16 + k, ++now);
  EXPECT_GT(t.remaining_peak_bytes(), 0u) << "the step of tokens 3-5 is not complete";
  t.on_allocate(id++, 16 + 5, ++now);
  EXPECT_EQ(t.remaining_peak_bytes(), 0u);
}

TEST(UsageTrackerOutlook, AllocationsInsideALongStepDoNotRaiseIt) {
  // 9000 tokens an iteration, so 3 to an outlook step: an iteration that
  // repeats the last exactly is expected at the last one's peak throughout,
  // however far into a step it is. (Compared with the live bytes now rather
  // than at the step's start, each allocation inside a step raised the
  // expectation by its size: nasnetalarge claimed 166 chunks above its peak
  // and, next to a small job under a budget just above that peak, no grant
  // was ever safe.)
  UsageTracker t;
  uint64_t now = 0;
  uint64_t id = 1;
  uint64_t peak = 0;
  for (int i = 0; i < 3; ++i) peak = long_iteration(t, now, id);
  t.on_iteration(++now);
  EXPECT_EQ(t.remaining_peak_bytes(), peak);
  for (uint64_t k = 0; k < 8; ++k) {
    t.on_allocate(id++, long_iteration_bytes(k), ++now);
    EXPECT_EQ(t.remaining_peak_bytes(), peak) << "after " << k + 1 << " allocations";
  }
}

TEST(UsageTrackerOutlook, FollowsThePositionInTheIteration) {
  UsageTracker t;
  uint64_t now = 0;
  uint64_t id = 1;
  start_third_alike_iteration(t, now, id);
  // Time plays no part: the same positions long after give the same answer.
  now += 1'000'000;
  EXPECT_EQ(t.remaining_peak_bytes(), 1600u);
  const uint64_t first = id;
  t.on_allocate(id++, 100, ++now);
  EXPECT_EQ(t.remaining_peak_bytes(), 1600u);
  t.on_allocate(id++, 200, ++now);
  t.on_allocate(id++, 300, ++now);
  EXPECT_EQ(t.remaining_peak_bytes(), 1600u);  // at the peak
  t.on_free(first + 2, ++now);
  EXPECT_EQ(t.remaining_peak_bytes(), 1300u) << "past the peak only what is live remains";
  t.on_free(first + 1, ++now);
  t.on_free(first, ++now);
  EXPECT_EQ(t.remaining_peak_bytes(), 1000u);
  // Past the last iteration's length: its end level (or what is live).
  t.on_allocate(id++, 7, ++now);
  EXPECT_EQ(t.remaining_peak_bytes(), 1007u);
}

TEST(UsageTrackerOutlook, RunningAboveTheLastIterationRaisesTheRest) {
  UsageTracker t;
  uint64_t now = 0;
  uint64_t id = 1;
  t.on_allocate(id++, 1000, ++now);
  // Each iteration keeps 150 bytes it allocates first (state that grows):
  // the same tokens each time, each iteration 150 higher than the last.
  for (int i = 0; i < 3; ++i) outlook_iteration(t, now, id, 150);
  EXPECT_EQ(t.live_bytes(), 1450u);
  t.on_iteration(++now);
  // The third climbed from 1300 to 1300 + 150 + 600; this one starts 150
  // higher.
  EXPECT_EQ(t.next_iteration_peak_bytes(), 2050u + 150u);
  t.on_allocate(1'000'000 + id++, 150, ++now);
  EXPECT_EQ(t.remaining_peak_bytes(), 2050u + 150u);
}

TEST(UsageTrackerOutlook, ABrokenPatternForgetsIt) {
  UsageTracker t;
  uint64_t now = 0;
  uint64_t id = 1;
  t.on_allocate(id++, 1000, ++now);
  // Enough detected iterations (no marks) for a pattern and an outlook.
  for (int i = 0; i < 3000; ++i) {
    const uint64_t first = id;
    for (const uint64_t bytes : {100u, 200u, 300u, 400u}) t.on_allocate(id++, bytes, ++now);
    for (uint64_t b = id; b-- > first;) t.on_free(b, ++now);
  }
  ASSERT_GT(t.detected_period_tokens(), 0u);
  EXPECT_GE(t.remaining_peak_bytes(), 1000u);
  EXPECT_LE(t.remaining_peak_bytes(), 2000u);
  t.on_allocate(id++, 12345, ++now);  // breaks the pattern
  EXPECT_EQ(t.detected_period_tokens(), 0u);
  EXPECT_EQ(t.remaining_peak_bytes(), 0u);
}

}  // namespace
}  // namespace zico::sharing
