// Small training-job traces written in code, for the simulator's tests: a
// persistent weight allocated before iteration 0, then per iteration blocks
// allocated at given offsets and all freed at one offset, an op spanning a
// `busy` fraction of the period (the model's utilization) and a 1 ns op that
// ends the period (the last iteration's length comes from its last op).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "job_model.h"
#include "trace_reader.h"

namespace zico::simulate::testing {

inline constexpr uint64_t kMiB = uint64_t{1} << 20;
inline constexpr uint64_t kGiB = uint64_t{1} << 30;
inline constexpr uint64_t kMs = 1'000'000;

struct SyntheticJob {
  std::string name = "job";
  uint64_t weights = 1 * kGiB;
  uint64_t period_ns = 100 * kMs;
  std::vector<std::pair<uint64_t, uint64_t>> allocations;  // (offset ns, bytes) in each iteration
  uint64_t free_at_ns = 60 * kMs;                           // every allocation is freed here
  double busy = 1.0;                                        // the op's share of the period
  uint32_t iterations = 3;
};

// A job that climbs by `step` bytes five times, 10 ms apart, and frees it
// all at 60 ms of a 100 ms iteration: peak weights + 5 * step.
inline SyntheticJob climbing_job(std::string name, uint64_t weights, uint64_t step) {
  SyntheticJob job;
  job.name = std::move(name);
  job.weights = weights;
  for (uint64_t k = 0; k < 5; ++k) job.allocations.emplace_back(k * 10 * kMs, step);
  return job;
}

inline std::string trace_text(const SyntheticJob& job) {
  std::string body;
  uint64_t records = 0;
  const auto add = [&](const std::string& line) {
    body += line + "\n";
    ++records;
  };
  add("a 0 " + std::to_string(job.weights) + " 0 param -1");
  uint64_t next_id = 1;
  uint64_t next_op = 0;
  for (uint32_t i = 0; i < job.iterations; ++i) {
    const uint64_t start = i * job.period_ns;
    add("i " + std::to_string(i) + " " + std::to_string(start));
    const auto op_ns = static_cast<uint64_t>(static_cast<double>(job.period_ns) * job.busy);
    std::vector<std::pair<uint64_t, std::string>> timed;  // offset, record (stable in order)
    const auto op = [&](uint64_t offset, uint64_t duration) {
      timed.emplace_back(offset, "o " + std::to_string(next_op++) + " " + std::to_string(start + offset) + " " +
                                     std::to_string(duration) + " step - -");
    };
    op(0, op_ns);
    std::vector<uint64_t> ids;
    for (const auto& [offset, bytes] : job.allocations) {
      ids.push_back(next_id++);
      timed.emplace_back(offset, "a " + std::to_string(ids.back()) + " " + std::to_string(bytes) + " " +
                                     std::to_string(start + offset) + " act -1");
    }
    for (const uint64_t id : ids) {
      timed.emplace_back(job.free_at_ns, "f " + std::to_string(id) + " " + std::to_string(start + job.free_at_ns));
    }
    op(job.period_ns - 1, 1);
    std::stable_sort(timed.begin(), timed.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (const auto& [offset, record] : timed) add(record);
  }
  return "zicoum-trace 1\nmeta model " + job.name +
         "\nmeta command test\nmeta source meta\nmeta batch 1\nmeta iterations " + std::to_string(job.iterations) +
         "\nmeta timing test\n" + body + "end " + std::to_string(records) + "\n";
}

inline JobModel model_of(const SyntheticJob& job) {
  trace::Trace trace;
  std::string error;
  JobModel model;
  EXPECT_TRUE(trace::parse_trace(trace_text(job), job.name + ".ztrace", &trace, &error).is_ok()) << error;
  EXPECT_TRUE(build_job_model(trace, &model, &error).is_ok()) << error;
  return model;
}

}  // namespace zico::simulate::testing
