#include "job_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <unordered_map>

#include "trace_reader.h"

namespace zico::simulate {
namespace {

constexpr double kGiB = double(uint64_t{1} << 30);

trace::Trace parse(const std::string& body, int records) {
  const std::string text =
      "zicoum-trace 1\nmeta model synthetic\nmeta command test\nmeta source meta\nmeta batch 1\n"
      "meta iterations 3\nmeta timing none\n" +
      body + "end " + std::to_string(records) + "\n";
  trace::Trace trace;
  std::string error;
  EXPECT_TRUE(trace::parse_trace(text, "t", &trace, &error).is_ok()) << error;
  return trace;
}

struct StreamCheck {
  bool valid = true;
  std::string problem;
  uint64_t peak = 0;
  std::vector<uint64_t> boundary_live;  // after the prologue, then after each iteration
};

// Replays the prologue and `iterations` iterations, checking every free
// names a live block of the same size and that ids are never reused.
StreamCheck check_stream(const JobModel& model, uint32_t iterations) {
  StreamCheck check;
  std::unordered_map<uint64_t, uint64_t> live_blocks;
  std::unordered_map<uint64_t, bool> seen;
  uint64_t live = 0;
  const auto run = [&](const std::vector<ReplayEvent>& events, uint64_t period) {
    uint64_t previous_offset = 0;
    for (const ReplayEvent& e : events) {
      if (e.offset_ns < previous_offset || (period != 0 && e.offset_ns > period)) {
        check.valid = false;
        check.problem = "offset " + std::to_string(e.offset_ns) + " out of order or past the period";
      }
      previous_offset = e.offset_ns;
      if (e.kind == ReplayEvent::Kind::kAllocate) {
        if (seen.count(e.block) != 0) {
          check.valid = false;
          check.problem = "block " + std::to_string(e.block) + " allocated twice";
        }
        seen[e.block] = true;
        live_blocks[e.block] = e.bytes;
        live += e.bytes;
        check.peak = std::max(check.peak, live);
      } else {
        const auto it = live_blocks.find(e.block);
        if (it == live_blocks.end() || it->second != e.bytes) {
          check.valid = false;
          check.problem = "free of block " + std::to_string(e.block) + " that is not live with that size";
          continue;
        }
        live -= e.bytes;
        live_blocks.erase(it);
      }
    }
  };
  std::vector<ReplayEvent> events;
  append_prologue_events(model, &events);
  run(events, 0);
  check.boundary_live.push_back(live);
  for (uint32_t n = 0; n < iterations; ++n) {
    events.clear();
    append_iteration_events(model, n, &events);
    run(events, n == 0 ? model.first_period_ns : model.steady_period_ns);
    check.boundary_live.push_back(live);
  }
  return check;
}

// The trace's own peak of live bytes over its steady iterations (1 and on).
uint64_t trace_steady_peak(const trace::Trace& trace) {
  uint64_t live = 0;
  uint64_t peak = 0;
  for (size_t e = 0; e < trace.events.size(); ++e) {
    const trace::Event& event = trace.events[e];
    if (event.kind == trace::Event::Kind::kAllocate) {
      live += trace.blocks[event.index].bytes;
      if (e > trace.iteration_starts[1]) peak = std::max(peak, live);
    } else if (event.kind == trace::Event::Kind::kFree) {
      live -= trace.blocks[event.index].bytes;
    }
  }
  return peak;
}

// docs/traces.md, "steady iteration peak".
const std::map<std::string, double> kDocumentedPeakGiB = {
    {"bert_base", 8.79}, {"gpt2", 14.07},     {"gpt2_medium", 17.00}, {"mobilenet_v2", 9.43},
    {"nasnetalarge", 16.37}, {"resnet110", 1.02}, {"resnet50", 5.46},  {"vit_b_16", 8.56},
};

TEST(JobModel, CommittedTracesReplayForManyIterations) {
  const std::filesystem::path dir = std::filesystem::path(ZICO_SOURCE_DIR) / "tools" / "traces";
  int traces = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string file = entry.path().filename().string();
    if (file.size() < 10 || file.substr(file.size() - 10) != ".ztrace.gz") continue;
    SCOPED_TRACE(file);
    ++traces;
    trace::Trace trace;
    std::string error;
    ASSERT_TRUE(trace::read_trace_file(entry.path().string(), &trace, &error).is_ok()) << error;
    ASSERT_EQ(trace.iteration_starts.size(), 5u);
    JobModel model;
    ASSERT_TRUE(build_job_model(trace, &model, &error).is_ok()) << error;
    EXPECT_EQ(model.name, trace.meta.at("model"));
    EXPECT_GT(model.steady_period_ns, 0u);
    EXPECT_GT(model.first_period_ns, 0u);
    EXPECT_GT(model.utilization, 0.0);
    EXPECT_LE(model.utilization, 1.0);

    const StreamCheck check = check_stream(model, 10);
    EXPECT_TRUE(check.valid) << check.problem;
    for (size_t n = 1; n < check.boundary_live.size(); ++n) {
      EXPECT_EQ(check.boundary_live[n], model.persistent_bytes) << "after iteration " << n - 1;
    }
    EXPECT_EQ(check.peak, model.peak_bytes);
    EXPECT_EQ(model.peak_bytes, trace_steady_peak(trace));
    const auto documented = kDocumentedPeakGiB.find(model.name);
    ASSERT_NE(documented, kDocumentedPeakGiB.end()) << "no documented peak for " << model.name;
    EXPECT_NEAR(static_cast<double>(model.peak_bytes) / kGiB, documented->second, 0.005);
  }
  EXPECT_EQ(traces, static_cast<int>(kDocumentedPeakGiB.size()));
}

// W persists; each iteration makes G (kept into the next iteration, like a
// gradient), A and T. Iteration 0 also makes optimizer state S.
std::string iteration(int n, int base, int g_bytes = 4096, bool free_previous_g = true) {
  const auto id = [&](int k) { return std::to_string(base + k); };
  const std::string t0 = std::to_string(n * 100);
  const std::string t1 = std::to_string(n * 100 + 50);
  std::string s = "i " + std::to_string(n) + " " + t0 + "\n";
  if (n == 0) s += "a 2 512 " + t0 + " optim -1\n";
  if (n > 0 && free_previous_g) s += "f " + std::to_string(base - 10 + 1) + " " + t0 + "\n";
  s += "a " + id(1) + " " + std::to_string(g_bytes) + " " + t0 + " grad -1\n";
  s += "a " + id(2) + " 8192 " + t0 + " act -1\n";
  s += "a " + id(3) + " 1024 " + t1 + " temp -1\n";
  s += "f " + id(3) + " " + t1 + "\n";
  s += "f " + id(2) + " " + t1 + "\n";
  return s;
}

TEST(JobModel, SyntheticTraceRepeats) {
  // 1 + (6 + 1) + 7 * 2 records: prologue W, iteration 0 (with S), 1, 2.
  const trace::Trace trace = parse("a 1 65536 0 param -1\n" + iteration(0, 10) + iteration(1, 20) + iteration(2, 30), 22);
  JobModel model;
  std::string error;
  ASSERT_TRUE(build_job_model(trace, &model, &error).is_ok()) << error;
  EXPECT_EQ(model.name, "synthetic");
  EXPECT_EQ(model.first_period_ns, 100u);
  EXPECT_EQ(model.steady_period_ns, 50u);
  EXPECT_EQ(model.persistent_bytes, 65536u + 512 + 4096);
  EXPECT_EQ(model.peak_bytes, 65536u + 512 + 4096 + 8192 + 1024);
  EXPECT_EQ(model.utilization, 1.0) << "no ops: unknown, taken as busy";
  const StreamCheck check = check_stream(model, 6);
  EXPECT_TRUE(check.valid) << check.problem;
}

TEST(JobModel, TwoIterationsAreEnough) {
  const trace::Trace trace = parse("a 1 65536 0 param -1\n" + iteration(0, 10) + iteration(1, 20), 15);
  JobModel model;
  std::string error;
  ASSERT_TRUE(build_job_model(trace, &model, &error).is_ok()) << error;
  const StreamCheck check = check_stream(model, 6);
  EXPECT_TRUE(check.valid) << check.problem;
}

TEST(JobModel, RefusesANonRepeatingTrace) {
  JobModel model;
  std::string error;
  // The gradient grows in the last iteration: iteration 2 frees an 8 KiB G
  // from iteration 1 but allocates its own G with another size.
  const trace::Trace grows =
      parse("a 1 65536 0 param -1\n" + iteration(0, 10) + iteration(1, 20) + iteration(2, 30, 8192), 22);
  EXPECT_EQ(build_job_model(grows, &model, &error).code(), Errc::kInvalidArgument);
  EXPECT_NE(error.find("steady iteration does not repeat"), std::string::npos) << error;

  // The last iteration keeps its G without freeing the previous one: it leaks.
  error.clear();
  const trace::Trace leaks =
      parse("a 1 65536 0 param -1\n" + iteration(0, 10) + iteration(1, 20) + iteration(2, 30, 4096, false), 21);
  EXPECT_EQ(build_job_model(leaks, &model, &error).code(), Errc::kInvalidArgument);
  EXPECT_NE(error.find("steady iteration does not repeat"), std::string::npos) << error;

  error.clear();
  const trace::Trace one = parse("a 1 65536 0 param -1\n" + iteration(0, 10), 8);
  EXPECT_EQ(build_job_model(one, &model, &error).code(), Errc::kInvalidArgument);
  EXPECT_NE(error.find("at least 2"), std::string::npos) << error;
}

}  // namespace
}  // namespace zico::simulate
