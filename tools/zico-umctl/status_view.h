// How zico-umctl shows the daemon's status (proto::StatusReply): the words,
// derived numbers and JSON objects that status, jobs, budget and top share,
// so that one job looks the same in every command.
#pragma once

#include <cstdint>
#include <string>

#include "json_writer.h"
#include "protocol.h"

namespace zico::umctl {

// "running", "suspend-requested", "suspended".
[[nodiscard]] const char* run_state_name(proto::JobRunState state);

// Memory live now but not across the last iteration: allocated - persistent,
// 0 when the report lags behind.
[[nodiscard]] uint64_t transient_bytes(const proto::JobStatus& job);

// The columns that come from the job's usage reports, not from the daemon's
// own count: marked with '*' in jobs and top, and this note under the table.
inline constexpr const char* kPersistentHeader = "PERSISTENT*";
inline constexpr const char* kTransientHeader = "TRANSIENT*";
inline constexpr const char* kReportedNote =
    "* as of the job's last usage report (every 0.5 s), HELD as of now: they can add up to more\n"
    "  than HELD mid-iteration, and for a um job by what it has on the host\n";

// A job's name cut to 24 characters ("..." at the end when cut), so that a
// long command line does not push the other columns of a table out of line.
[[nodiscard]] std::string short_name(const std::string& name);

// The user's login name, or the number when it has none.
[[nodiscard]] std::string user_name(uint32_t uid);

// A job's maximum: "unlimited" for UINT64_MAX, else format_size.
[[nodiscard]] std::string format_limit(uint64_t bytes);

// "0.4s", "59.9s", "5m 07s", "3h 02m", "2d 04h".
[[nodiscard]] std::string format_duration(double seconds);

// "" or, when the daemon listed only some of its (job, GPU) rows (it sends
// at most 128), a line that says how many.
[[nodiscard]] std::string cut_note(const proto::StatusReply& status);

// {"index":0,"uuid":"..","chunk_bytes":N,"budget_bytes":N,"granted_bytes":N,"pool_bytes":N,
//  "waiting_bytes":N,"grants":N,"returns":N,"deadlocks":N}
void write_gpu_json(JsonWriter& json, const proto::GpuStatus& gpu);

// {"id":N,"pid":N,"uid":N,"name":"..","gpu":N,"granted_bytes":N,"min_bytes":N,"max_bytes":N|null,
//  "allocated_bytes":N,"persistent_bytes":N,"transient_bytes":N,"waiting_bytes":N,"wait_s":F,
//  "iterations":N,"state":".."}; max_bytes is null when unlimited.
void write_job_json(JsonWriter& json, const proto::JobStatus& job);

// "job_rows":N,"jobs":[JOB...] (fields of the object being written): the
// rows 'zico-umctl jobs --json' and status --json list.
void write_job_rows_json(JsonWriter& json, const proto::StatusReply& status);

// The whole reply, as 'zico-umctl status --json' prints it (one line):
// {"daemon_pid":N,"uptime_s":F,"gpus":[GPU...],"job_count":N,"job_rows":N,"jobs":[JOB...]}
[[nodiscard]] std::string status_json(const proto::StatusReply& status);

}  // namespace zico::umctl
