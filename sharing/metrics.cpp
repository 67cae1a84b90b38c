#include "metrics.h"

#include <cmath>
#include <cstdio>

namespace zico::sharing {
namespace {

// Integers (bytes, counts) whole, up to 2^53; other values in the shortest
// text that reads back as the same double, as Prometheus's own clients write.
std::string number(double value) {
  char text[64];
  if (value == std::floor(value) && std::fabs(value) < 9007199254740992.0) {
    std::snprintf(text, sizeof text, "%.0f", value);
    return text;
  }
  for (int digits = 6; digits <= 17; ++digits) {
    std::snprintf(text, sizeof text, "%.*g", digits, value);
    double back = 0;
    if (std::sscanf(text, "%lf", &back) == 1 && back == value) break;
  }
  return text;
}

void header(std::string* out, const char* name, const char* type, const char* help) {
  *out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void sample(std::string* out, const std::string& name, const std::string& labels, double value) {
  *out += name;
  if (!labels.empty()) *out += "{" + labels + "}";
  *out += " " + number(value) + "\n";
}

// Label values come from the jobs themselves (their names): the exposition
// format's three escapes, so that no name can end a label or a line.
std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

void histogram(std::string* out, const char* name, const std::string& labels, const LatencyHistogram& h) {
  const std::string base(name);
  const std::string comma = labels.empty() ? "" : labels + ",";
  for (size_t i = 0; i < LatencyHistogram::kBoundsSeconds.size(); ++i) {
    sample(out, base + "_bucket", comma + "le=\"" + number(LatencyHistogram::kBoundsSeconds[i]) + "\"",
           static_cast<double>(h.cumulative(i)));
  }
  sample(out, base + "_bucket", comma + "le=\"+Inf\"", static_cast<double>(h.count()));
  sample(out, base + "_sum", labels, h.sum_seconds());
  sample(out, base + "_count", labels, static_cast<double>(h.count()));
}

std::string gpu_labels(uint32_t index, const proto::GpuUuid& uuid) {
  return "gpu=\"" + std::to_string(index) + "\",uuid=\"" + uuid_label(uuid) + "\"";
}

double bytes(uint64_t value) { return static_cast<double>(value); }

}  // namespace

std::string uuid_label(const proto::GpuUuid& uuid) {
  const std::string hex = proto::to_hex(uuid);
  return "GPU-" + hex.substr(0, 8) + "-" + hex.substr(8, 4) + "-" + hex.substr(12, 4) + "-" + hex.substr(16, 4) + "-" +
         hex.substr(20);
}

std::string render_metrics(const proto::StatusReply& status, const EventCounts& events) {
  std::string out;
  // --- the daemon ---
  header(&out, "zicoum_daemon_uptime_seconds", "gauge", "Time since zico-umd started.");
  sample(&out, "zicoum_daemon_uptime_seconds", "", static_cast<double>(status.uptime_ns) / 1e9);
  header(&out, "zicoum_jobs", "gauge", "Jobs zico-umd serves (each on one or more GPUs).");
  sample(&out, "zicoum_jobs", "", static_cast<double>(status.job_count));
  header(&out, "zicoum_suspends_total", "counter",
         "Jobs that suspended to host memory or NVMe (zico-umctl suspend, or parked for another's turn).");
  sample(&out, "zicoum_suspends_total", "", static_cast<double>(events.suspends));
  header(&out, "zicoum_resumes_total", "counter", "Jobs that ran again after a suspension.");
  sample(&out, "zicoum_resumes_total", "", static_cast<double>(events.resumes));
  header(&out, "zicoum_gate_delay_seconds", "histogram",
         "Time a job waited at an iteration boundary for its go (the time-shift schedule's delay).");
  histogram(&out, "zicoum_gate_delay_seconds", "", events.gate_delay);

  // --- per GPU ---
  using GpuEvents = EventCounts::Gpu;
  struct GpuMetric {
    const char* name;
    const char* type;
    const char* help;
    double (*value)(const proto::GpuStatus&, const GpuEvents&);
  };
  static const GpuMetric kGpuMetrics[] = {
      {"zicoum_gpu_budget_bytes", "gauge", "Node budget of the GPU: the most zico-umd lends on it.",
       [](const proto::GpuStatus& g, const GpuEvents&) { return bytes(g.budget_bytes); }},
      {"zicoum_gpu_granted_bytes", "gauge", "Memory lent to jobs (all jobs' held bytes).",
       [](const proto::GpuStatus& g, const GpuEvents&) { return bytes(g.granted_bytes); }},
      {"zicoum_gpu_pool_bytes", "gauge", "Physical memory zico-umd has created, lent or free.",
       [](const proto::GpuStatus& g, const GpuEvents&) { return bytes(g.pool_bytes); }},
      {"zicoum_gpu_waiting_bytes", "gauge", "Memory requested by jobs and not granted yet.",
       [](const proto::GpuStatus& g, const GpuEvents&) { return bytes(g.waiting_bytes); }},
      {"zicoum_gpu_device_used_bytes", "gauge",
       "Memory in use on the device as it reports it (every process, contexts included; 0: unknown).",
       [](const proto::GpuStatus& g, const GpuEvents&) { return bytes(g.device_used_bytes); }},
      {"zicoum_gpu_chunk_bytes", "gauge", "Unit of lending: every grant and return is whole chunks.",
       [](const proto::GpuStatus& g, const GpuEvents&) { return bytes(g.chunk_bytes); }},
      {"zicoum_gpu_lent_bytes_total", "counter", "Memory granted to jobs.",
       [](const proto::GpuStatus& g, const GpuEvents&) { return bytes(g.grants * g.chunk_bytes); }},
      {"zicoum_gpu_returned_bytes_total", "counter", "Memory jobs gave back (returns and reclaims).",
       [](const proto::GpuStatus& g, const GpuEvents&) { return bytes(g.reclaims * g.chunk_bytes); }},
      {"zicoum_gpu_grants_total", "counter", "Requests granted.",
       [](const proto::GpuStatus&, const GpuEvents& e) { return static_cast<double>(e.grants); }},
      {"zicoum_gpu_denials_total", "counter",
       "Requests refused (beyond every limit, a deadlock's victim under --on-deadlock fail, overuse).",
       [](const proto::GpuStatus&, const GpuEvents& e) { return static_cast<double>(e.denials); }},
      {"zicoum_gpu_request_timeouts_total", "counter",
       "Requests a job withdrew after waiting its ZICO_WAIT_TIMEOUT: an allocation failed for want of memory.",
       [](const proto::GpuStatus&, const GpuEvents& e) { return static_cast<double>(e.timeouts); }},
      {"zicoum_gpu_reclaims_total", "counter", "Times a job was asked to give idle memory back.",
       [](const proto::GpuStatus&, const GpuEvents& e) { return static_cast<double>(e.reclaims); }},
      {"zicoum_gpu_deadlocks_total", "counter", "Deadlocks broken (a job yielded its memory, or was refused).",
       [](const proto::GpuStatus& g, const GpuEvents&) { return static_cast<double>(g.deadlocks); }},
      {"zicoum_gpu_parks_total", "counter", "Jobs parked in host memory to let another's iteration run (--turns).",
       [](const proto::GpuStatus&, const GpuEvents& e) { return static_cast<double>(e.parks); }},
  };
  static const GpuEvents kNoEvents{};
  const auto events_of = [&](const proto::GpuStatus& gpu) -> const GpuEvents& {
    return gpu.index < events.gpus.size() ? events.gpus[gpu.index] : kNoEvents;
  };
  for (const GpuMetric& metric : kGpuMetrics) {
    header(&out, metric.name, metric.type, metric.help);
    for (const proto::GpuStatus& gpu : status.gpus) {
      sample(&out, metric.name, gpu_labels(gpu.index, gpu.uuid), metric.value(gpu, events_of(gpu)));
    }
  }
  header(&out, "zicoum_gpu_grant_wait_seconds", "histogram", "Time a request waited for its grant.");
  for (const proto::GpuStatus& gpu : status.gpus) {
    histogram(&out, "zicoum_gpu_grant_wait_seconds", gpu_labels(gpu.index, gpu.uuid), events_of(gpu).grant_wait);
  }

  // --- per job and GPU ---
  struct JobMetric {
    const char* name;
    const char* type;
    const char* help;
    double (*value)(const proto::JobStatus&);
    bool (*present)(const proto::JobStatus&);
  };
  static const auto always = [](const proto::JobStatus&) { return true; };
  static const JobMetric kJobMetrics[] = {
      {"zicoum_job_held_bytes", "gauge", "Memory the job holds on the GPU.",
       [](const proto::JobStatus& j) { return bytes(j.granted_bytes); }, always},
      {"zicoum_job_max_bytes", "gauge", "The job's maximum on the GPU (no series: no maximum of its own).",
       [](const proto::JobStatus& j) { return bytes(j.max_bytes); },
       [](const proto::JobStatus& j) { return j.max_bytes != UINT64_MAX; }},
      {"zicoum_job_min_bytes", "gauge", "The job's guaranteed minimum on the GPU.",
       [](const proto::JobStatus& j) { return bytes(j.min_bytes); }, always},
      {"zicoum_job_allocated_bytes", "gauge", "The job's live allocations (its last report, at most 0.5 s old).",
       [](const proto::JobStatus& j) { return bytes(j.allocated_bytes); }, always},
      {"zicoum_job_persistent_bytes", "gauge", "Memory live through the job's last iteration.",
       [](const proto::JobStatus& j) { return bytes(j.persistent_bytes); }, always},
      {"zicoum_job_waiting_bytes", "gauge", "Memory the job waits for.",
       [](const proto::JobStatus& j) { return bytes(j.waiting_bytes); }, always},
      {"zicoum_job_wait_seconds_total", "counter", "Time the job's requests spent waiting for memory.",
       [](const proto::JobStatus& j) { return static_cast<double>(j.wait_ns) / 1e9; }, always},
      {"zicoum_job_iterations_total", "counter", "Iterations the job marked (or its allocator detected).",
       [](const proto::JobStatus& j) { return static_cast<double>(j.iterations); }, always},
      {"zicoum_job_suspended", "gauge", "1 while the job is suspended or about to be (parked included), else 0.",
       [](const proto::JobStatus& j) {
         return j.state == proto::JobRunState::kSuspended || j.state == proto::JobRunState::kSuspendRequested ? 1.0
                                                                                                              : 0.0;
       },
       always},
  };
  std::vector<std::string> job_labels;
  for (const proto::JobStatus& job : status.jobs) {
    proto::GpuUuid uuid{};
    for (const proto::GpuStatus& gpu : status.gpus) {
      if (gpu.index == job.gpu) uuid = gpu.uuid;
    }
    job_labels.push_back(gpu_labels(job.gpu, uuid) + ",job_id=\"" + std::to_string(job.id) + "\",job_name=\"" +
                         escape(job.name) + "\",uid=\"" + std::to_string(job.uid) + "\",pid=\"" +
                         std::to_string(job.pid) + "\"");
  }
  for (const JobMetric& metric : kJobMetrics) {
    header(&out, metric.name, metric.type, metric.help);
    for (size_t i = 0; i < status.jobs.size(); ++i) {
      if (metric.present(status.jobs[i])) sample(&out, metric.name, job_labels[i], metric.value(status.jobs[i]));
    }
  }
  return out;
}

}  // namespace zico::sharing
