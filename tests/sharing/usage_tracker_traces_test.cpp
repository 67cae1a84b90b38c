// UsageTracker on the committed traces of real training jobs: without marks
// it must find the iteration the marks give, and with marks measure it
// exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "trace_reader.h"
#include "usage_tracker.h"

namespace zico::sharing {
namespace {

using trace::Event;

std::vector<std::string> trace_files() {
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(ZICO_SOURCE_DIR) + "/tools/traces")) {
    const std::string name = entry.path().string();
    if (name.ends_with(".ztrace.gz")) files.push_back(name);
  }
  std::sort(files.begin(), files.end());
  return files;
}

// What the marks say about the last complete iteration, computed straight
// from the trace.
struct Expected {
  size_t tokens = 0;  // allocations and frees in one steady iteration
  uint64_t duration_ns = 0;
  uint64_t steady_peak = 0;  // the most live bytes from iteration 1 on
  uint64_t steady_trough = UINT64_MAX;  // the fewest, after a token
  uint64_t peak = 0;         // of the last complete iteration
  uint64_t persistent = 0;   // at that peak, by Block::persistent()
  uint64_t transient = 0;    // the rest, workspace included
  uint64_t end = 0;          // live at its end
};

Expected expected(const trace::Trace& t) {
  Expected e;
  const size_t n = t.iteration_starts.size();
  const size_t first = t.iteration_starts[n - 2];
  const size_t last = t.iteration_starts[n - 1];
  e.duration_ns = t.events[last].time - t.events[first].time;
  uint64_t live = 0;
  uint64_t persistent = 0;
  for (size_t i = 0; i < t.events.size(); ++i) {
    const Event& ev = t.events[i];
    if (ev.kind != Event::Kind::kAllocate && ev.kind != Event::Kind::kFree) continue;
    const trace::Block& b = t.blocks[ev.index];
    const bool alloc = ev.kind == Event::Kind::kAllocate;
    live = alloc ? live + b.bytes : live - b.bytes;
    if (b.persistent()) persistent = alloc ? persistent + b.bytes : persistent - b.bytes;
    if (i > t.iteration_starts[1]) {
      e.steady_peak = std::max(e.steady_peak, live);
      e.steady_trough = std::min(e.steady_trough, live);
    }
    if (i > first && i < last) {
      ++e.tokens;
      if (live > e.peak) {
        e.peak = live;
        e.persistent = persistent;
        e.transient = live - persistent;
      }
    }
    if (i < last) e.end = live;
  }
  return e;
}

// Returns each change of detected_period_tokens(), 0 for a pattern dropped.
std::vector<size_t> feed(const trace::Trace& t, UsageTracker& tracker, bool marks) {
  std::vector<size_t> periods;
  size_t last = 0;
  for (const Event& ev : t.events) {
    switch (ev.kind) {
      case Event::Kind::kAllocate:
        tracker.on_allocate(ev.index, t.blocks[ev.index].bytes, ev.time);
        break;
      case Event::Kind::kFree:
        tracker.on_free(ev.index, ev.time);
        break;
      case Event::Kind::kIteration:
        if (marks) tracker.on_iteration(ev.time);
        break;
      case Event::Kind::kOp:
        break;
    }
    if (tracker.detected_period_tokens() != last) {
      last = tracker.detected_period_tokens();
      periods.push_back(last);
    }
  }
  return periods;
}

TEST(TraceFiles, AllCommittedTracesAreFound) { EXPECT_EQ(trace_files().size(), 8u); }

class Traces : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string error;
    ASSERT_TRUE(trace::read_trace_file(GetParam(), &trace_, &error).is_ok()) << error;
    ASSERT_GE(trace_.iteration_starts.size(), 4u) << "needs a first iteration and three steady ones";
    want_ = expected(trace_);
  }
  trace::Trace trace_;
  Expected want_;
};

TEST_P(Traces, DetectionFindsTheSteadyIteration) {
  UsageTracker tracker;
  const std::vector<size_t> periods = feed(trace_, tracker, false);
  // Found once and kept: never a wrong period on the way (the layers of
  // model building, of a forward pass), never dropped.
  EXPECT_EQ(periods, std::vector<size_t>{want_.tokens});
  EXPECT_FALSE(tracker.explicit_marks());
  EXPECT_EQ(tracker.ignored_frees(), 0u);
  // Exactly one steady iteration's worth of tokens.
  EXPECT_EQ(tracker.detected_period_tokens(), want_.tokens);
  const DemandCurve& c = tracker.curve();
  ASSERT_TRUE(c.known());
  EXPECT_NEAR(static_cast<double>(c.period_ns), static_cast<double>(want_.duration_ns),
              0.01 * static_cast<double>(want_.duration_ns));
  EXPECT_NEAR(static_cast<double>(c.peak()), static_cast<double>(want_.steady_peak),
              0.01 * static_cast<double>(want_.steady_peak));
  // Phase 0 is the trough: the iteration starts, and so ends, at the fewest
  // live bytes of a steady iteration.
  EXPECT_EQ(c.end_bytes, want_.steady_trough);
  EXPECT_GE(tracker.iterations(), 3u);
  EXPECT_LE(tracker.iterations(), trace_.iteration_starts.size());
  EXPECT_EQ(c.persistent_bytes + c.transient_bytes + c.workspace_bytes, c.peak());
}

TEST_P(Traces, MarksMeasureTheLastIterationExactly) {
  UsageTracker tracker;
  EXPECT_TRUE(feed(trace_, tracker, true).empty());
  EXPECT_TRUE(tracker.explicit_marks());
  EXPECT_EQ(tracker.detected_period_tokens(), 0u);
  EXPECT_EQ(tracker.iterations(), trace_.iteration_starts.size());
  const DemandCurve& c = tracker.curve();
  EXPECT_EQ(c.period_ns, want_.duration_ns);
  EXPECT_EQ(c.peak(), want_.peak);
  EXPECT_EQ(c.persistent_bytes, want_.persistent);
  EXPECT_EQ(c.transient_bytes + c.workspace_bytes, want_.transient);
  EXPECT_EQ(c.end_bytes, want_.end);
  // Steady iterations repeat exactly.
  EXPECT_EQ(c.peak(), want_.steady_peak);
}

INSTANTIATE_TEST_SUITE_P(Committed, Traces, ::testing::ValuesIn(trace_files()),
                         [](const ::testing::TestParamInfo<std::string>& param) {
                           std::string name = std::filesystem::path(param.param).filename().string();
                           return name.substr(0, name.find('.'));
                         });

}  // namespace
}  // namespace zico::sharing
