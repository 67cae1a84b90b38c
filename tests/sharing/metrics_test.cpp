// The Prometheus exposition (sharing/metrics.h): its structure, labels,
// escaping and histograms. That a real Prometheus reads it is
// tests/integration/prometheus_scrape_test.py's business.
#include "metrics.h"

#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <string>

namespace zico::sharing {
namespace {

EventCounts one_gpu_of_events() {
  EventCounts events;
  events.gpus.resize(1);
  return events;
}

proto::StatusReply one_gpu_one_job() {
  proto::StatusReply status;
  status.uptime_ns = 2'500'000'000;
  status.job_count = 1;
  proto::GpuStatus gpu;
  gpu.index = 0;
  for (size_t i = 0; i < gpu.uuid.size(); ++i) gpu.uuid[i] = static_cast<uint8_t>(0x10 + i);
  gpu.chunk_bytes = 2 << 20;
  gpu.budget_bytes = 64 << 20;
  gpu.granted_bytes = 8 << 20;
  gpu.grants = 5;
  gpu.reclaims = 1;
  gpu.deadlocks = 2;
  status.gpus.push_back(gpu);
  proto::JobStatus job;
  job.id = 7;
  job.pid = 4242;
  job.uid = 1000;
  job.gpu = 0;
  job.name = R"(say "hi" \ bye)";
  job.granted_bytes = 8 << 20;
  job.max_bytes = UINT64_MAX;
  job.wait_ns = 1'500'000'000;
  job.state = proto::JobRunState::kSuspended;
  status.jobs.push_back(job);
  return status;
}

// Sample lines by their name and labels, as written.
std::map<std::string, std::string> samples(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    out[line.substr(0, space)] = line.substr(space + 1);
  }
  return out;
}

constexpr const char* kGpu = R"(gpu="0",uuid="GPU-10111213-1415-1617-1819-1a1b1c1d1e1f")";

TEST(Metrics, UuidLabelIsNvidiaSmisForm) {
  proto::GpuUuid uuid{};
  for (size_t i = 0; i < uuid.size(); ++i) uuid[i] = static_cast<uint8_t>(0xa0 + i);
  EXPECT_EQ(uuid_label(uuid), "GPU-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf");
}

TEST(Metrics, EveryFamilyHasHelpAndTypeBeforeItsSamples) {
  const std::string text = render_metrics(one_gpu_one_job(), one_gpu_of_events());
  std::istringstream lines(text);
  std::string family;  // the last TYPE line's
  std::string type;
  std::map<std::string, int> helps;
  int families = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.starts_with("# HELP ")) {
      const std::string name = line.substr(7, line.find(' ', 7) - 7);
      EXPECT_EQ(++helps[name], 1) << "two HELP lines for " << name;
      continue;
    }
    if (line.starts_with("# TYPE ")) {
      std::istringstream words(line.substr(7));
      words >> family >> type;
      EXPECT_EQ(helps.count(family), 1u) << "no HELP before TYPE " << family;
      ++families;
      EXPECT_EQ(type == "counter", family.ends_with("_total")) << family << " is a " << type;
      continue;
    }
    const std::string name = line.substr(0, line.find_first_of("{ "));
    EXPECT_TRUE(name == family || (type == "histogram" && (name == family + "_bucket" || name == family + "_sum" ||
                                                           name == family + "_count")))
        << name << " follows TYPE " << family;
  }
  EXPECT_GE(families, 25);
}

TEST(Metrics, JobSeriesCarryGpuUuidJobAndOwnerWithTheNameEscaped) {
  const std::map<std::string, std::string> got =
      samples(render_metrics(one_gpu_one_job(), one_gpu_of_events()));
  const std::string job = std::string(kGpu) + R"(,job_id="7",job_name="say \"hi\" \\ bye",uid="1000",pid="4242")";
  EXPECT_EQ(got.at("zicoum_job_held_bytes{" + job + "}"), "8388608");
  EXPECT_EQ(got.at("zicoum_job_wait_seconds_total{" + job + "}"), "1.5");
  EXPECT_EQ(got.at("zicoum_job_suspended{" + job + "}"), "1");
  // No maximum of its own: no series, rather than a number a graph would show as a limit.
  EXPECT_EQ(got.count("zicoum_job_max_bytes{" + job + "}"), 0u);
  EXPECT_EQ(got.at(std::string("zicoum_gpu_budget_bytes{") + kGpu + "}"), "67108864");
  EXPECT_EQ(got.at(std::string("zicoum_gpu_lent_bytes_total{") + kGpu + "}"), std::to_string(5 * (2 << 20)));
  EXPECT_EQ(got.at(std::string("zicoum_gpu_deadlocks_total{") + kGpu + "}"), "2");
  EXPECT_EQ(got.at("zicoum_jobs"), "1");
  EXPECT_EQ(got.at("zicoum_daemon_uptime_seconds"), "2.5");
}

TEST(Metrics, EventCountersAndHistogramsAreCumulative) {
  EventCounts events;
  events.gpus.resize(1);
  events.gpus[0].grants = 3;
  events.gpus[0].denials = 1;
  events.gpus[0].timeouts = 4;
  events.gpus[0].reclaims = 6;
  events.gpus[0].parks = 2;
  events.suspends = 5;
  events.resumes = 4;
  events.gpus[0].grant_wait.observe(0);              // at once
  events.gpus[0].grant_wait.observe(2'000'000);      // 2 ms
  events.gpus[0].grant_wait.observe(90'000'000'000);  // beyond the last bound
  events.gate_delay.observe(1'000'000'000);          // exactly on a bound: counted in it (le)
  const std::map<std::string, std::string> got = samples(render_metrics(one_gpu_one_job(), events));
  const std::string gpu(kGpu);
  EXPECT_EQ(got.at("zicoum_gpu_grants_total{" + gpu + "}"), "3");
  EXPECT_EQ(got.at("zicoum_gpu_denials_total{" + gpu + "}"), "1");
  EXPECT_EQ(got.at("zicoum_gpu_request_timeouts_total{" + gpu + "}"), "4");
  EXPECT_EQ(got.at("zicoum_gpu_reclaims_total{" + gpu + "}"), "6");
  EXPECT_EQ(got.at("zicoum_gpu_parks_total{" + gpu + "}"), "2");
  EXPECT_EQ(got.at("zicoum_suspends_total"), "5");
  EXPECT_EQ(got.at("zicoum_resumes_total"), "4");
  const std::string wait = "zicoum_gpu_grant_wait_seconds";
  EXPECT_EQ(got.at(wait + "_bucket{" + gpu + ",le=\"0.0001\"}"), "1");
  EXPECT_EQ(got.at(wait + "_bucket{" + gpu + ",le=\"0.001\"}"), "1");
  EXPECT_EQ(got.at(wait + "_bucket{" + gpu + ",le=\"0.005\"}"), "2");
  EXPECT_EQ(got.at(wait + "_bucket{" + gpu + ",le=\"60\"}"), "2");
  EXPECT_EQ(got.at(wait + "_bucket{" + gpu + ",le=\"+Inf\"}"), "3");
  EXPECT_EQ(got.at(wait + "_count{" + gpu + "}"), "3");
  EXPECT_EQ(got.at(wait + "_sum{" + gpu + "}"), "90.002");
  EXPECT_EQ(got.at("zicoum_gate_delay_seconds_bucket{le=\"0.5\"}"), "0");
  EXPECT_EQ(got.at("zicoum_gate_delay_seconds_bucket{le=\"1\"}"), "1");
  EXPECT_EQ(got.at("zicoum_gate_delay_seconds_sum"), "1");
}

TEST(Metrics, AJobsMaximumIsShownWhenItHasOne) {
  proto::StatusReply status = one_gpu_one_job();
  status.jobs[0].max_bytes = 32 << 20;
  status.jobs[0].name = "plain";
  const std::map<std::string, std::string> got = samples(render_metrics(status, EventCounts{}));
  EXPECT_EQ(got.at(std::string("zicoum_job_max_bytes{") + kGpu +
                   R"(,job_id="7",job_name="plain",uid="1000",pid="4242"})"),
            "33554432");
  // No event counts for the GPU (an empty EventCounts): zeros, not a crash.
  EXPECT_EQ(got.at(std::string("zicoum_gpu_grants_total{") + kGpu + "}"), "0");
}

}  // namespace
}  // namespace zico::sharing
