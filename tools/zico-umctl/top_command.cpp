// `zico-umctl top`: a live view of zico-umd, refreshed every interval: per
// GPU the budget and what is granted, per job its memory and a sparkline of
// what it held over the last minute. The history lives here, one sample per
// refresh: the daemon keeps none.
#include <poll.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "command_args.h"
#include "node_commands.h"
#include "node_connection.h"
#include "sizes.h"
#include "sparkline.h"
#include "status_view.h"
#include "text_table.h"

namespace zico::umctl {
namespace {

constexpr const char* kUsage =
    "Usage: zico-umctl top [--interval SECONDS] [--iterations N] [--json] [--socket PATH]\n"
    "A live view of zico-umd: per GPU the budget, what jobs hold and wait for; per job\n"
    "HELD (granted), PERSISTENT* and TRANSIENT* memory (*: as of the job's last usage report,\n"
    "every 0.5 s: a moment behind HELD, and they can add up to more), WAIT (total time spent waiting for memory), STATE,\n"
    "and a sparkline of HELD over the last minute, scaled to its peak there.\n"
    "Ctrl-C (or q then Enter) quits.\n"
    "\n"
    "  --interval SECONDS  time between refreshes, 0.1 to 3600 (default 1)\n"
    "  --iterations N      stop after N refreshes\n"
    "  --json              one line per refresh on stdout, each the object 'zico-umctl status\n"
    "                      --json' prints (JSON Lines), for a script or a log\n"
    "%s"
    "\n"
    "On a terminal each refresh redraws the screen; otherwise frames follow each other,\n"
    "separated by a blank line.\n"
    "Exit status: 0, 1 if zico-umd stopped answering, 2 for bad usage, 3 if no zico-umd runs.\n";

constexpr const char* kCommand = "top";
constexpr double kHistorySeconds = 60;
constexpr size_t kSparkColumns = 30;
constexpr size_t kBarWidth = 20;

struct Options {
  double interval = 1;
  std::optional<uint64_t> iterations;
  std::string socket;
  bool json = false;
};

// HELD of each (job, GPU), one sample per refresh, kHistorySeconds worth.
class History {
 public:
  explicit History(double interval)
      : capacity_(std::max<size_t>(1, static_cast<size_t>(std::ceil(kHistorySeconds / interval)))) {}

  // Adds this refresh's samples; jobs that left are forgotten.
  void add(const proto::StatusReply& status) {
    std::map<Key, std::deque<uint64_t>> next;
    for (const proto::JobStatus& job : status.jobs) {
      const Key key{job.id, job.gpu};
      std::deque<uint64_t>& samples = next[key];
      if (auto it = series_.find(key); it != series_.end()) samples = std::move(it->second);
      samples.push_back(job.granted_bytes);
      while (samples.size() > capacity_) samples.pop_front();
    }
    series_ = std::move(next);
  }

  [[nodiscard]] std::string sparkline_of(const proto::JobStatus& job) const {
    const auto it = series_.find(Key{job.id, job.gpu});
    if (it == series_.end()) return "";
    const std::vector<uint64_t> samples(it->second.begin(), it->second.end());
    return sparkline(samples, (capacity_ + kSparkColumns - 1) / kSparkColumns);
  }

 private:
  using Key = std::pair<uint64_t, uint32_t>;
  size_t capacity_;
  std::map<Key, std::deque<uint64_t>> series_;
};

std::string bar(uint64_t part, uint64_t whole) {
  const double ratio = whole == 0 ? 0 : static_cast<double>(part) / static_cast<double>(whole);
  const auto filled = static_cast<size_t>(std::lround(std::min(1.0, ratio) * static_cast<double>(kBarWidth)));
  std::string text = "[";
  for (size_t i = 0; i < kBarWidth; ++i) text += i < filled ? "█" : "░";
  char percent[16];
  std::snprintf(percent, sizeof percent, "] %3.0f%%", ratio * 100);
  return text + percent;
}

std::string clock_text() {
  const time_t now = ::time(nullptr);
  tm local{};
  char text[16] = "";
  if (::localtime_r(&now, &local) != nullptr) std::strftime(text, sizeof text, "%H:%M:%S", &local);
  return text;
}

std::string frame(const proto::StatusReply& status, const History& history, const Options& options, bool tty) {
  const uint64_t jobs = status.job_count;
  char line[256];
  std::snprintf(line, sizeof line, "zico-umd pid %llu, up %s, %llu job%s  %s", static_cast<unsigned long long>(status.daemon_pid),
                format_duration(static_cast<double>(status.uptime_ns) / 1e9).c_str(),
                static_cast<unsigned long long>(jobs), jobs == 1 ? "" : "s", clock_text().c_str());
  std::string out = line;
  if (tty) {
    std::snprintf(line, sizeof line, "  (every %gs; Ctrl-C or q+Enter quits)", options.interval);
    out += line;
  }
  out += '\n';
  using Align = TextTable::Align;
  for (const proto::GpuStatus& gpu : status.gpus) {
    out += "\nGPU " + std::to_string(gpu.index) + "  budget " + format_size(gpu.budget_bytes) + "  granted " +
           format_size(gpu.granted_bytes) + "  waiting " + format_size(gpu.waiting_bytes) + "  " +
           bar(gpu.granted_bytes, gpu.budget_bytes) + '\n';
    TextTable table({{"ID", Align::kRight},
                     {"NAME", Align::kLeft},
                     {"HELD", Align::kRight},
                     {kPersistentHeader, Align::kRight},
                     {kTransientHeader, Align::kRight},
                     {"WAIT", Align::kRight},
                     {"STATE", Align::kLeft},
                     {"HELD, LAST 60 S", Align::kLeft}});
    size_t rows = 0;
    for (const proto::JobStatus& job : status.jobs) {
      if (job.gpu != gpu.index) continue;
      table.add_row({std::to_string(job.id), short_name(job.name), format_size(job.granted_bytes),
                     format_size(job.persistent_bytes), format_size(transient_bytes(job)),
                     format_duration(static_cast<double>(job.wait_ns) / 1e9), run_state_name(job.state),
                     history.sparkline_of(job)});
      ++rows;
    }
    out += rows == 0 ? "  no jobs\n" : table.render("  ");
  }
  if (!status.jobs.empty()) out += kReportedNote;
  return out;
}

// Waits `seconds`; true when the user asked to quit (q, or end of input, on a terminal).
bool wait_or_quit(double seconds, bool watch_stdin) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd input{STDIN_FILENO, POLLIN, 0};
    const int ready = ::poll(&input, watch_stdin ? 1 : 0, static_cast<int>(left.count()));
    if (ready < 0 && errno != EINTR) return false;
    if (ready <= 0) continue;
    char text[256];
    const ssize_t n = ::read(STDIN_FILENO, text, sizeof text);
    if (n <= 0) return true;  // Ctrl-D
    if (std::find_if(text, text + n, [](char c) { return c == 'q' || c == 'Q'; }) != text + n) return true;
  }
}

int run(const Options& options) {
  NodeConnection daemon(kCommand);
  if (const int status = daemon.connect(socket_path(options.socket)); status != kExitOk) return status;
  const bool tty = ::isatty(STDOUT_FILENO) == 1;
  const bool watch_stdin = tty && ::isatty(STDIN_FILENO) == 1;
  History history(options.interval);
  for (uint64_t n = 0; !options.iterations || n < *options.iterations; ++n) {
    proto::StatusReply reply;
    if (const int status = daemon.ask(proto::StatusQuery{}, &reply); status != kExitOk) return status;
    history.add(reply);
    const std::string text = options.json ? status_json(reply) + '\n' : frame(reply, history, options, tty);
    if (options.json) {
      // JSON Lines: no clearing, no blank line between refreshes.
    } else if (tty) {
      std::fputs("\x1b[H\x1b[2J", stdout);  // cursor home, clear the screen
    } else if (n > 0) {
      std::fputc('\n', stdout);
    }
    std::fputs(text.c_str(), stdout);
    std::fflush(stdout);
    if (options.iterations && n + 1 == *options.iterations) break;
    if (wait_or_quit(options.interval, watch_stdin)) break;
  }
  return kExitOk;
}

}  // namespace

int run_top(int argc, char** argv) {
  Options options;
  std::string interval;
  std::string iterations;
  ArgReader args(argc, argv);
  while (args.next()) {
    if (args.flag("--help") || args.flag("-h")) {
      std::printf(kUsage, kSocketOptionHelp);
      return kExitOk;
    }
    if (args.flag("--json")) {
      options.json = true;
    } else if (args.option("--interval", &interval) || args.option("--iterations", &iterations) ||
        args.option("--socket", &options.socket)) {
      continue;
    } else if (args.unknown_option()) {
      return usage_error(kCommand, "unknown option '" + std::string(args.current()) + "'");
    } else {
      return usage_error(kCommand, "unexpected argument '" + std::string(args.current()) + "'");
    }
  }
  if (!args.error().empty()) return usage_error(kCommand, args.error());
  if (!interval.empty()) {
    const std::optional<double> seconds = parse_seconds(interval);
    if (!seconds || *seconds < 0.1 || *seconds > 3600) {
      return usage_error(kCommand, "--interval '" + interval + "' is not valid; expected seconds from 0.1 to 3600, e.g. 1 or 0.5");
    }
    options.interval = *seconds;
  }
  if (!iterations.empty()) {
    options.iterations = parse_decimal(iterations);
    if (!options.iterations || *options.iterations == 0) {
      return usage_error(kCommand, "--iterations '" + iterations + "' is not valid; expected a count of refreshes, 1 or more");
    }
  }
  return run(options);
}

}  // namespace zico::umctl
