#include "status_view.h"

#include <pwd.h>
#include <sys/types.h>

#include <cstdio>
#include <set>
#include <vector>

#include "sizes.h"

namespace zico::umctl {

const char* run_state_name(proto::JobRunState state) {
  switch (state) {
    case proto::JobRunState::kRunning: return "running";
    case proto::JobRunState::kSuspendRequested: return "suspend-requested";
    case proto::JobRunState::kSuspended: return "suspended";
    case proto::JobRunState::kFailed: return "failed";
  }
  return "unknown";
}

uint64_t transient_bytes(const proto::JobStatus& job) {
  return job.allocated_bytes > job.persistent_bytes ? job.allocated_bytes - job.persistent_bytes : 0;
}

std::string short_name(const std::string& name) {
  constexpr size_t kWidth = 24;
  return name.size() <= kWidth ? name : name.substr(0, kWidth - 3) + "...";
}

std::string user_name(uint32_t uid) {
  passwd entry{};
  passwd* found = nullptr;
  std::vector<char> buffer(16384);
  if (::getpwuid_r(static_cast<uid_t>(uid), &entry, buffer.data(), buffer.size(), &found) == 0 && found != nullptr) {
    return found->pw_name;
  }
  return std::to_string(uid);
}

std::string format_limit(uint64_t bytes) { return bytes == UINT64_MAX ? "unlimited" : format_size(bytes); }

std::string format_duration(double seconds) {
  char text[48];
  if (seconds < 60) {
    std::snprintf(text, sizeof text, "%.1fs", seconds < 0 ? 0.0 : seconds);
    return text;
  }
  const auto whole = static_cast<unsigned long long>(seconds);
  if (whole < 3600) {
    std::snprintf(text, sizeof text, "%llum %02llus", whole / 60, whole % 60);
  } else if (whole < 86400) {
    std::snprintf(text, sizeof text, "%lluh %02llum", whole / 3600, whole / 60 % 60);
  } else {
    std::snprintf(text, sizeof text, "%llud %02lluh", whole / 86400, whole / 3600 % 24);
  }
  return text;
}

std::string cut_note(const proto::StatusReply& status) {
  if (status.job_rows <= status.jobs.size()) return "";
  return "(listing " + std::to_string(status.jobs.size()) + " of " + std::to_string(status.job_rows) +
         " job rows: zico-umd sends at most " + std::to_string(status.jobs.size()) + ")\n";
}

void write_gpu_json(JsonWriter& json, const proto::GpuStatus& gpu) {
  json.begin_object();
  json.field("index", static_cast<uint64_t>(gpu.index));
  json.field("uuid", proto::to_hex(gpu.uuid));
  json.field("chunk_bytes", gpu.chunk_bytes);
  json.field("budget_bytes", gpu.budget_bytes);
  json.field("granted_bytes", gpu.granted_bytes);
  json.field("pool_bytes", gpu.pool_bytes);
  json.field("waiting_bytes", gpu.waiting_bytes);
  json.field("grants", gpu.grants);
  json.field("returns", gpu.reclaims);  // chunks given back, whatever the reason
  json.field("deadlocks", gpu.deadlocks);
  json.field("parks", gpu.parks);
  json.field("denials", gpu.denials);
  json.field("timeouts", gpu.timeouts);
  json.field("device_total_bytes", gpu.device_total_bytes);
  json.field("device_used_bytes", gpu.device_used_bytes);
  json.end_object();
}

void write_job_json(JsonWriter& json, const proto::JobStatus& job) {
  json.begin_object();
  json.field("id", job.id);
  json.field("pid", static_cast<uint64_t>(job.pid));
  json.field("uid", static_cast<uint64_t>(job.uid));
  json.field("name", job.name);
  json.field("gpu", static_cast<uint64_t>(job.gpu));
  json.field("granted_bytes", job.granted_bytes);
  json.field("min_bytes", job.min_bytes);
  json.field_or_null("max_bytes", job.max_bytes != UINT64_MAX, job.max_bytes);
  json.field("allocated_bytes", job.allocated_bytes);
  json.field("persistent_bytes", job.persistent_bytes);
  json.field("transient_bytes", transient_bytes(job));
  json.field("waiting_bytes", job.waiting_bytes);
  json.key("wait_s");
  json.value(static_cast<double>(job.wait_ns) / 1e9, 3);
  json.field("iterations", job.iterations);
  json.field("state", run_state_name(job.state));
  json.field("mode", job.pageable ? "um" : "vmm");
  json.end_object();
}

std::string status_json(const proto::StatusReply& status) {
  JsonWriter json;
  json.begin_object();
  json.field("daemon_pid", status.daemon_pid);
  json.key("uptime_s");
  json.value(static_cast<double>(status.uptime_ns) / 1e9, 3);
  json.key("gpus");
  json.begin_array();
  for (const proto::GpuStatus& gpu : status.gpus) write_gpu_json(json, gpu);
  json.end_array();
  json.field("job_count", status.job_count);
  write_job_rows_json(json, status);
  json.end_object();
  return json.text();
}

void write_job_rows_json(JsonWriter& json, const proto::StatusReply& status) {
  json.field("job_rows", status.job_rows);
  json.key("jobs");
  json.begin_array();
  for (const proto::JobStatus& job : status.jobs) write_job_json(json, job);
  json.end_array();
}

}  // namespace zico::umctl
