// `zico-umctl status`: the daemon, its GPUs and the number of jobs; with
// --json, every GPU and every job (the shape is in kUsage).
#include <cstdio>
#include <string>

#include "command_args.h"
#include "node_commands.h"
#include "node_connection.h"
#include "sizes.h"
#include "status_view.h"
#include "text_table.h"

namespace zico::umctl {
namespace {

constexpr const char* kUsage =
    "Usage: zico-umctl status [--json] [--socket PATH]\n"
    "Show zico-umd: its pid and uptime, per GPU the budget, the memory granted to jobs, the\n"
    "pool of chunks it created, what jobs wait for, and since it started the chunks granted and\n"
    "returned, the yields (YIELDS: jobs all waiting on each other, one of which moved its\n"
    "memory to the host for a while so the others could go on; JSON \"deadlocks\"), the jobs\n"
    "parked in host memory to let another's iteration run (PARKS, zico-umd --turns on), the\n"
    "requests refused (DENIED) and those that waited past their ZICO_WAIT_TIMEOUT (TIMEOUTS);\n"
    "what the device itself reports in use (DEVICE USED: every process's memory and the CUDA\n"
    "contexts' own, zicoum's or not; above BUDGET with unified-memory jobs, whose evicted pages\n"
    "keep their device memory until another allocation needs it); and how many jobs it serves.\n"
    "\n"
    "  --json          on stdout: {\"daemon_pid\":N,\"uptime_s\":F,\"gpus\":[GPU...],\"job_count\":N,\n"
    "                  \"job_rows\":N,\"jobs\":[JOB...]} (job_rows > the JOBs listed: the daemon sends 128)\n"
    "                  GPU: {\"index\",\"uuid\",\"chunk_bytes\",\"budget_bytes\",\"granted_bytes\",\n"
    "                  \"pool_bytes\",\"waiting_bytes\",\"grants\",\"returns\",\"deadlocks\",\"parks\",\n"
    "                  \"denials\",\"timeouts\",\"device_total_bytes\",\"device_used_bytes\"}\n"
    "                  JOB: as in 'zico-umctl jobs --json'\n"
    "%s"
    "\n"
    "Exit status: 0, 1 if zico-umd failed to answer, 2 for bad usage, 3 if no zico-umd runs.\n";

// What the device reports in use, of its total; "?" when it cannot tell.
std::string device_used(const proto::GpuStatus& gpu) {
  if (gpu.device_total_bytes == 0) return "?";
  return format_size(gpu.device_used_bytes) + " of " + format_size(gpu.device_total_bytes);
}

void print_text(const proto::StatusReply& status) {
  const uint64_t jobs = status.job_count;
  std::printf("zico-umd pid %llu, up %s, %llu job%s\n", static_cast<unsigned long long>(status.daemon_pid),
              format_duration(static_cast<double>(status.uptime_ns) / 1e9).c_str(),
              static_cast<unsigned long long>(jobs), jobs == 1 ? "" : "s");
  using Align = TextTable::Align;
  TextTable table({{"GPU", Align::kRight},
                   {"BUDGET", Align::kRight},
                   {"GRANTED", Align::kRight},
                   {"POOL", Align::kRight},
                   {"WAITING", Align::kRight},
                   {"GRANTS", Align::kRight},
                   {"RETURNS", Align::kRight},
                   {"YIELDS", Align::kRight},
                   {"PARKS", Align::kRight},
                   {"DENIED", Align::kRight},
                   {"TIMEOUTS", Align::kRight},
                   {"DEVICE USED", Align::kRight}});
  for (const proto::GpuStatus& gpu : status.gpus) {
    table.add_row({std::to_string(gpu.index), format_size(gpu.budget_bytes), format_size(gpu.granted_bytes),
                   format_size(gpu.pool_bytes), format_size(gpu.waiting_bytes), std::to_string(gpu.grants),
                   std::to_string(gpu.reclaims), std::to_string(gpu.deadlocks), std::to_string(gpu.parks),
                   std::to_string(gpu.denials), std::to_string(gpu.timeouts), device_used(gpu)});
  }
  std::fputs(table.render().c_str(), stdout);
}

void print_json(const proto::StatusReply& status) { std::printf("%s\n", status_json(status).c_str()); }

}  // namespace

int run_status(int argc, char** argv) { return run_status_query("status", kUsage, argc, argv, print_text, print_json); }

}  // namespace zico::umctl
