// `zico-umctl suspend | resume JOB`: asks zico-umd to tell a job to evict its
// memory and give every chunk back (or to take it back and continue), then
// watches the job's state in the daemon's status until it got there.
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>

#include "command_args.h"
#include "node_commands.h"
#include "node_connection.h"
#include "status_view.h"

namespace zico::umctl {
namespace {

constexpr const char* kSuspendUsage =
    "Usage: zico-umctl suspend JOB [--to host|nvme] [--wait SECONDS] [--socket PATH]\n"
    "Suspend job JOB (zico-umctl jobs lists them): at its next allocator call or iteration\n"
    "mark it waits for its GPU work, saves its memory to pinned host memory (host, the\n"
    "default) or to its swap file under ZICO_SWAP_DIR (nvme), and gives every chunk back to\n"
    "zico-umd, which lends them to other jobs. zico-umctl resume JOB continues it.\n"
    "\n"
    "  --to host|nvme  where the job's memory goes (default host)\n"
    "  --wait SECONDS  wait until the job is suspended, checking every 100 ms (default 10;\n"
    "                  0 returns once the job has been told)\n"
    "%s"
    "\n"
    "Exit status: 0, 1 if zico-umd refused or the job did not suspend in time, 2 for bad\n"
    "usage, 3 if no zico-umd runs.\n";

constexpr const char* kResumeUsage =
    "Usage: zico-umctl resume JOB [--wait SECONDS] [--socket PATH]\n"
    "Resume job JOB after zico-umctl suspend: it takes its memory back, at the same\n"
    "addresses and with the same contents, and continues.\n"
    "\n"
    "  --wait SECONDS  wait until the job runs again, checking every 100 ms (default 10;\n"
    "                  0 returns once the job has been told)\n"
    "%s"
    "\n"
    "Exit status: 0, 1 if zico-umd refused or the job did not resume in time, 2 for bad\n"
    "usage, 3 if no zico-umd runs.\n";

constexpr double kDefaultWaitSeconds = 10;
constexpr auto kPollInterval = std::chrono::milliseconds(100);

struct Options {
  uint64_t job = 0;
  proto::StoreKind to = proto::StoreKind::kHost;
  double wait_seconds = kDefaultWaitSeconds;
  std::string socket;
};

// Polls the status until every entry of the job is in `target`.
int wait_for(NodeConnection& daemon, const char* command, uint64_t job, proto::JobRunState target, double seconds) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                    std::chrono::duration<double>(seconds));
  for (;;) {
    proto::StatusReply reply;
    if (const int status = daemon.ask(proto::StatusQuery{}, &reply); status != kExitOk) return status;
    bool found = false;
    bool there = true;
    proto::JobRunState state = target;
    for (const proto::JobStatus& entry : reply.jobs) {
      if (entry.id != job) continue;
      found = true;
      if (entry.state != target) {
        there = false;
        state = entry.state;
      }
    }
    if (!found) {
      std::fprintf(stderr, "zico-umctl %s: job %llu is gone (its process exited or disconnected)\n", command,
                   static_cast<unsigned long long>(job));
      return kExitFailed;
    }
    if (state == proto::JobRunState::kFailed) {
      std::fprintf(stderr, "zico-umctl %s: job %llu %s; its log says why\n", command,
                   static_cast<unsigned long long>(job),
                   target == proto::JobRunState::kSuspended
                       ? "could not save its memory and runs on with all of it"
                       : "could not restore its memory and runs on without it (its allocations fail)");
      return kExitFailed;
    }
    if (there) {
      const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("job %llu is %s (after %.1f s)\n", static_cast<unsigned long long>(job), run_state_name(target), took);
      return kExitOk;
    }
    if (std::chrono::steady_clock::now() + kPollInterval > deadline) {
      std::fprintf(stderr, "zico-umctl %s: job %llu is still %s after %g s%s\n", command,
                   static_cast<unsigned long long>(job), run_state_name(state), seconds,
                   target == proto::JobRunState::kSuspended
                       ? " (it suspends at its next allocator call or iteration mark; a job that is idle"
                         " or inside a long kernel has not got there yet)"
                       : "");
      return kExitFailed;
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

int run(const char* command, proto::JobAction action, const Options& options) {
  NodeConnection daemon(command);
  if (const int status = daemon.connect(socket_path(options.socket)); status != kExitOk) return status;
  proto::Result result;
  if (const int status = daemon.ask(proto::JobControl{action, options.job, options.to}, &result); status != kExitOk) {
    return status;
  }
  if (result.errc != 0) {
    std::fprintf(stderr, "zico-umctl %s: %s\n", command, result.message.c_str());
    return kExitFailed;
  }
  std::printf("%s\n", result.message.c_str());
  if (options.wait_seconds <= 0) return kExitOk;
  std::fflush(stdout);
  const proto::JobRunState target =
      action == proto::JobAction::kSuspend ? proto::JobRunState::kSuspended : proto::JobRunState::kRunning;
  return wait_for(daemon, command, options.job, target, options.wait_seconds);
}

int parse_and_run(const char* command, proto::JobAction action, int argc, char** argv) {
  const bool suspend = action == proto::JobAction::kSuspend;
  Options options;
  std::string to;
  std::string wait;
  std::optional<std::string> job;
  ArgReader args(argc, argv);
  while (args.next()) {
    if (args.flag("--help") || args.flag("-h")) {
      std::printf(suspend ? kSuspendUsage : kResumeUsage, kSocketOptionHelp);
      return kExitOk;
    }
    if ((suspend && args.option("--to", &to)) || args.option("--wait", &wait) ||
        args.option("--socket", &options.socket)) {
      continue;
    } else if (args.unknown_option()) {
      return usage_error(command, "unknown option '" + std::string(args.current()) + "'");
    } else if (job) {
      return usage_error(command, "one JOB only ('" + *job + "', then '" + std::string(args.current()) + "')");
    } else {
      job = std::string(args.current());
    }
  }
  if (!args.error().empty()) return usage_error(command, args.error());
  if (!job) return usage_error(command, "which job? Give its id (zico-umctl jobs lists them)");
  const std::optional<uint64_t> id = parse_decimal(*job);
  if (!id || *id == 0) return usage_error(command, "JOB '" + *job + "' is not a job id (1, 2, ...; zico-umctl jobs lists them)");
  options.job = *id;
  if (!to.empty()) {
    if (to == "host") {
      options.to = proto::StoreKind::kHost;
    } else if (to == "nvme") {
      options.to = proto::StoreKind::kNvme;
    } else {
      return usage_error(command, "--to '" + to + "' is not host or nvme");
    }
  }
  if (!wait.empty()) {
    const std::optional<double> seconds = parse_seconds(wait);
    if (!seconds || *seconds > 86400) {
      return usage_error(command, "--wait '" + wait + "' is not valid; expected seconds from 0 to 86400, e.g. 10 or 0.5");
    }
    options.wait_seconds = *seconds;
  }
  return run(command, action, options);
}

}  // namespace

int run_suspend(int argc, char** argv) { return parse_and_run("suspend", proto::JobAction::kSuspend, argc, argv); }

int run_resume(int argc, char** argv) { return parse_and_run("resume", proto::JobAction::kResume, argc, argv); }

}  // namespace zico::umctl
