// `zico-umctl jobs`: one line per (job, GPU) the daemon serves.
#include <cstdio>
#include <string>

#include "command_args.h"
#include "json_writer.h"
#include "node_commands.h"
#include "node_connection.h"
#include "sizes.h"
#include "status_view.h"
#include "text_table.h"

namespace zico::umctl {
namespace {

constexpr const char* kUsage =
    "Usage: zico-umctl jobs [--json] [--socket PATH]\n"
    "List the jobs zico-umd serves, one line per job and GPU:\n"
    "  HELD        memory granted to the job, now\n"
    "  PERSISTENT* live across its last iteration (weights, optimizer state)\n"
    "  TRANSIENT*  live but not across the last iteration (allocated - persistent)\n"
    "              (*: both as of the job's last usage report, sent every 0.5 s: mid-iteration\n"
    "              they can be a moment behind HELD, and add up to more; the table says so)\n"
    "  WAITING     asked for and not yet granted; WAIT: total time it spent waiting\n"
    "  STATE       running, suspend-requested or suspended\n"
    "  MODE        vmm, or um: a Unified Memory job, lent room for its pages (they may exceed HELD)\n"
    "  MIN, MAX    its limits on the GPU (zico-umctl budget set --job)\n"
    "\n"
    "  --json          on stdout: {\"job_rows\":N,\"jobs\":[{\"id\",\"pid\",\"uid\",\"name\",\"gpu\",\"granted_bytes\",\n"
    "                  \"min_bytes\",\"max_bytes\" (null: unlimited),\"allocated_bytes\",\"persistent_bytes\",\n"
    "                  \"transient_bytes\",\"waiting_bytes\",\"wait_s\",\"iterations\",\"state\",\"mode\"}...]}\n"
    "%s"
    "\n"
    "Exit status: 0, 1 if zico-umd failed to answer, 2 for bad usage, 3 if no zico-umd runs.\n";

void print_text(const proto::StatusReply& status) {
  if (status.jobs.empty()) {
    std::printf("no jobs\n");
    return;
  }
  using Align = TextTable::Align;
  TextTable table({{"ID", Align::kRight},
                   {"PID", Align::kRight},
                   {"USER", Align::kLeft},
                   {"NAME", Align::kLeft},
                   {"GPU", Align::kRight},
                   {"HELD", Align::kRight},
                   {kPersistentHeader, Align::kRight},
                   {kTransientHeader, Align::kRight},
                   {"WAITING", Align::kRight},
                   {"WAIT", Align::kRight},
                   {"STATE", Align::kLeft},
                   {"MODE", Align::kLeft},
                   {"MIN", Align::kRight},
                   {"MAX", Align::kRight}});
  for (const proto::JobStatus& job : status.jobs) {
    table.add_row({std::to_string(job.id), std::to_string(job.pid), user_name(job.uid), short_name(job.name),
                   std::to_string(job.gpu), format_size(job.granted_bytes), format_size(job.persistent_bytes),
                   format_size(transient_bytes(job)), format_size(job.waiting_bytes),
                   format_duration(static_cast<double>(job.wait_ns) / 1e9), run_state_name(job.state),
                   job.pageable ? "um" : "vmm", format_size(job.min_bytes), format_limit(job.max_bytes)});
  }
  std::fputs(table.render().c_str(), stdout);
  std::fputs(kReportedNote, stdout);
  std::fputs(cut_note(status).c_str(), stdout);
}

void print_json(const proto::StatusReply& status) {
  JsonWriter json;
  json.begin_object();
  write_job_rows_json(json, status);
  json.end_object();
  std::printf("%s\n", json.text().c_str());
}

}  // namespace

int run_jobs(int argc, char** argv) { return run_status_query("jobs", kUsage, argc, argv, print_text, print_json); }

}  // namespace zico::umctl
