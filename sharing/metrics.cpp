#include "metrics.h"

#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

namespace zico::sharing {

void RateWindow::sample(uint64_t now_ns, const proto::StatusReply& status) {
  Sample s{now_ns, {}, {}};
  for (const proto::GpuStatus& gpu : status.gpus) {
    s.grants.push_back(gpu.grants);
    s.returns.push_back(gpu.reclaims);
  }
  samples_.push_back(std::move(s));
  while (samples_.size() > 2 && now_ns - samples_.front().at_ns > kWindowNs) samples_.pop_front();
}

double RateWindow::rate(uint32_t gpu, bool grants) const {
  if (samples_.size() < 2) return 0;
  const Sample& first = samples_.front();
  const Sample& last = samples_.back();
  const auto& a = grants ? first.grants : first.returns;
  const auto& b = grants ? last.grants : last.returns;
  if (gpu >= a.size() || gpu >= b.size() || last.at_ns <= first.at_ns) return 0;
  return static_cast<double>(b[gpu] - a[gpu]) / (static_cast<double>(last.at_ns - first.at_ns) / 1e9);
}

double RateWindow::grants_per_s(uint32_t gpu) const { return rate(gpu, true); }
double RateWindow::returns_per_s(uint32_t gpu) const { return rate(gpu, false); }

namespace {

void line(std::string* out, const char* name, const std::string& labels, double value) {
  char number[64];
  std::snprintf(number, sizeof number, "%.17g", value);
  *out += name;
  if (!labels.empty()) *out += "{" + labels + "}";
  *out += " ";
  *out += number;
  *out += "\n";
}

void header(std::string* out, const char* name, const char* type, const char* help) {
  *out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

// Label values are job names from the jobs themselves: escape them.
std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '\\' || c == '"') out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

std::string render_metrics(const proto::StatusReply& status, const RateWindow& rates) {
  std::string out;
  struct GpuMetric {
    const char* name;
    const char* type;
    const char* help;
    double (*value)(const proto::GpuStatus&, const RateWindow&);
  };
  static const GpuMetric kGpuMetrics[] = {
      {"zicoum_gpu_budget_bytes", "gauge", "Node budget of the GPU.",
       [](const proto::GpuStatus& g, const RateWindow&) { return static_cast<double>(g.budget_bytes); }},
      {"zicoum_gpu_granted_bytes", "gauge", "Memory lent to jobs.",
       [](const proto::GpuStatus& g, const RateWindow&) { return static_cast<double>(g.granted_bytes); }},
      {"zicoum_gpu_pool_bytes", "gauge", "Physical memory the daemon has created (lent or free).",
       [](const proto::GpuStatus& g, const RateWindow&) { return static_cast<double>(g.pool_bytes); }},
      {"zicoum_gpu_waiting_bytes", "gauge", "Memory requested by jobs and not granted yet.",
       [](const proto::GpuStatus& g, const RateWindow&) { return static_cast<double>(g.waiting_bytes); }},
      {"zicoum_gpu_granted_chunks_total", "counter", "Chunks granted since the daemon started.",
       [](const proto::GpuStatus& g, const RateWindow&) { return static_cast<double>(g.grants); }},
      {"zicoum_gpu_returned_chunks_total", "counter", "Chunks given back (returns and reclaims) since start.",
       [](const proto::GpuStatus& g, const RateWindow&) { return static_cast<double>(g.reclaims); }},
      {"zicoum_gpu_moved_bytes_total", "counter", "Bytes granted plus bytes given back since start.",
       [](const proto::GpuStatus& g, const RateWindow&) {
         return static_cast<double>((g.grants + g.reclaims) * g.chunk_bytes);
       }},
      {"zicoum_gpu_deadlocks_total", "counter", "Deadlocks broken since start.",
       [](const proto::GpuStatus& g, const RateWindow&) { return static_cast<double>(g.deadlocks); }},
      {"zicoum_gpu_grant_rate", "gauge", "Chunks granted per second over the last 10 s.",
       [](const proto::GpuStatus& g, const RateWindow& r) { return r.grants_per_s(g.index); }},
      {"zicoum_gpu_return_rate", "gauge", "Chunks given back per second over the last 10 s.",
       [](const proto::GpuStatus& g, const RateWindow& r) { return r.returns_per_s(g.index); }},
  };
  for (const GpuMetric& metric : kGpuMetrics) {
    header(&out, metric.name, metric.type, metric.help);
    for (const proto::GpuStatus& gpu : status.gpus) {
      line(&out, metric.name, "gpu=\"" + std::to_string(gpu.index) + "\"", metric.value(gpu, rates));
    }
  }
  struct JobMetric {
    const char* name;
    const char* type;
    const char* help;
    double (*value)(const proto::JobStatus&);
  };
  static const JobMetric kJobMetrics[] = {
      {"zicoum_job_granted_bytes", "gauge", "Memory the job holds.",
       [](const proto::JobStatus& j) { return static_cast<double>(j.granted_bytes); }},
      {"zicoum_job_budget_bytes", "gauge", "The job's maximum (0: no limit of its own).",
       [](const proto::JobStatus& j) { return j.max_bytes == UINT64_MAX ? 0.0 : static_cast<double>(j.max_bytes); }},
      {"zicoum_job_min_bytes", "gauge", "The job's guaranteed minimum.",
       [](const proto::JobStatus& j) { return static_cast<double>(j.min_bytes); }},
      {"zicoum_job_allocated_bytes", "gauge", "Live blocks of the job (its last report).",
       [](const proto::JobStatus& j) { return static_cast<double>(j.allocated_bytes); }},
      {"zicoum_job_persistent_bytes", "gauge", "Memory live through the job's last iteration.",
       [](const proto::JobStatus& j) { return static_cast<double>(j.persistent_bytes); }},
      {"zicoum_job_waiting_bytes", "gauge", "Memory the job waits for.",
       [](const proto::JobStatus& j) { return static_cast<double>(j.waiting_bytes); }},
      {"zicoum_job_wait_seconds_total", "counter", "Time the job spent waiting for memory.",
       [](const proto::JobStatus& j) { return static_cast<double>(j.wait_ns) / 1e9; }},
  };
  for (const JobMetric& metric : kJobMetrics) {
    header(&out, metric.name, metric.type, metric.help);
    for (const proto::JobStatus& job : status.jobs) {
      const std::string labels = "gpu=\"" + std::to_string(job.gpu) + "\",job=\"" + std::to_string(job.id) +
                                 "\",pid=\"" + std::to_string(job.pid) + "\",name=\"" + escape(job.name) + "\"";
      line(&out, metric.name, labels, metric.value(job));
    }
  }
  return out;
}

}  // namespace zico::sharing
