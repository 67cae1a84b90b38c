// zico-umd: the node daemon. Parses the command line, opens the driver
// (ZICO_BACKEND, as the library does) and runs sharing::Daemon.
#include <grp.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config.h"
#include "driver_factory.h"
#include "daemon.h"
#include "log.h"
#include "sizes.h"

namespace {

constexpr const char* kUsage =
    "Usage: zico-umd [OPTION]...\n"
    "The zicoum node daemon: lends physical GPU memory to the jobs of this node\n"
    "under a memory budget per GPU.\n"
    "\n"
    "  --socket PATH          listen here (default $ZICO_SOCKET or /run/zicoum/zicoum.sock)\n"
    "  --group NAME           group of the socket file; members may connect (default: the daemon's)\n"
    "  --mode OCTAL           permissions of the socket file (default 0660)\n"
    "  --admin-group NAME     members may change budgets and act on others' jobs\n"
    "                         (root and the daemon's user always may)\n"
    "  --budget [GPU=]SIZE    node budget of every GPU, or of GPU number GPU; repeatable\n"
    "                         (default: the GPU's memory). SIZE like 40GiB, 512MiB\n"
    "  --gpus LIST            GPUs to manage, e.g. 0,1 (default: all)\n"
    "  --chunk-size SIZE      unit of lending, a power of two (default: the GPU's granularity, 2MiB)\n"
    "  --on-deadlock POLICY   yield (default, or $ZICO_ON_DEADLOCK) or fail\n"
    "  --schedule POLICY      zico (default): delay jobs' iteration starts so their memory\n"
    "                         peaks do not coincide (docs/scheduling.md); fcfs: serve\n"
    "                         chunk requests first come, first served, nothing else\n"
    "  --start-guard on|off   on: an iteration start the plan allows also waits (at most 1 s)\n"
    "                         while it could leave a job in mid-iteration unable to finish\n"
    "                         (its claim, docs/scheduling.md); off (default)\n"
    "  --turns on|off         on: jobs whose iterations cannot run side by side take turns,\n"
    "                         the one in the way suspended to host memory at its gate for a\n"
    "                         while (docs/scheduling.md); off (default)\n"
    "  --on-overuse ACTION    a job whose process holds more than it was lent (it kept memory\n"
    "                         it gave back; checked every second) is charged for it and: deny\n"
    "                         (default): gets no more memory until it lets go; kill: is killed\n"
    "                         (SIGKILL); warn: only logged\n"
    "  --metrics HOST:PORT    serve Prometheus metrics at http://HOST:PORT/metrics\n"
    "  --state-file PATH      what jobs hold, for a restarted daemon (default: the socket path + .state)\n"
    "  --help, --version\n"
    "\n"
    "The backend comes from ZICO_BACKEND (cuda or sim) and the ZICO_SIM_* variables,\n"
    "as for libzicoum; ZICO_LOG sets the log level (default info for the daemon).\n"
    "Exit status: 0 after SIGINT/SIGTERM, 2 for bad usage, 1 for other failures.\n";

int usage_error(const std::string& message) {
  std::fprintf(stderr, "zico-umd: %s\nTry 'zico-umd --help'.\n", message.c_str());
  return 2;
}

bool parse_gpu_list(std::string_view text, std::vector<int>* out) {
  while (!text.empty()) {
    const size_t comma = text.find(',');
    const std::string_view item = text.substr(0, comma);
    if (item.empty() || item.size() > 2 || item.find_first_not_of("0123456789") != std::string_view::npos) return false;
    out->push_back(std::atoi(std::string(item).c_str()));
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
    if (text.empty()) return false;
  }
  return !out->empty();
}

}  // namespace

int main(int argc, char** argv) {
  using namespace zico;
  sharing::DaemonOptions options;
  const char* env_socket = std::getenv("ZICO_SOCKET");
  options.socket_path = env_socket != nullptr && *env_socket != '\0' ? env_socket : kDefaultSocketPath;
  std::string deadlock = std::getenv("ZICO_ON_DEADLOCK") != nullptr ? std::getenv("ZICO_ON_DEADLOCK") : "yield";
  uint64_t all_budget = 0;
  std::vector<std::pair<int, uint64_t>> gpu_budgets;
  std::vector<int> gpu_list;
  std::string socket_group;
  std::string admin_group;

  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    const auto value = [&](const char*) -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (arg == "--version") {
      std::printf("zico-umd (zicoum) %s\n", ZICO_VERSION);
      return 0;
    }
    static constexpr std::string_view kWithValue[] = {"--socket", "--group",      "--admin-group", "--mode",   "--budget",
                                                      "--gpus",   "--chunk-size", "--on-deadlock", "--metrics",
                                                      "--state-file", "--schedule", "--start-guard", "--turns",
                                                      "--on-overuse"};
    if (std::find(std::begin(kWithValue), std::end(kWithValue), arg) == std::end(kWithValue)) {
      return usage_error("unknown option '" + std::string(arg) + "'");
    }
    const char* v = value(argv[i]);
    if (v == nullptr) return usage_error(std::string(arg) + " needs a value");
    if (arg == "--socket") {
      if (*v == '\0') return usage_error("--socket needs a path");
      options.socket_path = v;
    } else if (arg == "--group") {
      socket_group = v;
    } else if (arg == "--admin-group") {
      admin_group = v;
    } else if (arg == "--mode") {
      char* end = nullptr;
      const unsigned long mode = std::strtoul(v, &end, 8);
      if (*v == '\0' || *end != '\0' || mode > 0777) return usage_error(std::string("--mode '") + v + "' is not valid; expected octal permissions like 0660");
      options.socket_mode = static_cast<mode_t>(mode);
    } else if (arg == "--budget") {
      const std::string text = v;
      const size_t eq = text.find('=');
      const std::optional<uint64_t> size = parse_size(eq == std::string::npos ? text : text.substr(eq + 1));
      if (!size || *size == 0) {
        return usage_error(size_above_zero_error("--budget", text) + " (or GPU=SIZE for one GPU, e.g. 0=40GiB)");
      }
      if (eq == std::string::npos) {
        all_budget = *size;
      } else {
        std::vector<int> one;
        if (!parse_gpu_list(std::string_view(text).substr(0, eq), &one) || one.size() != 1) {
          return usage_error("--budget '" + text + "': '" + text.substr(0, eq) + "' is not a GPU number");
        }
        gpu_budgets.emplace_back(one[0], *size);
      }
    } else if (arg == "--gpus") {
      if (!parse_gpu_list(v, &gpu_list)) return usage_error(std::string("--gpus '") + v + "' is not valid; expected numbers like 0,1");
    } else if (arg == "--chunk-size") {
      const std::optional<uint64_t> size = parse_size(v);
      if (!size || *size == 0 || (*size & (*size - 1)) != 0) {
        return usage_error(std::string("--chunk-size '") + v + "' is not valid; expected a power-of-two size like 2MiB");
      }
      options.chunk_bytes = *size;
    } else if (arg == "--on-deadlock") {
      deadlock = v;
    } else if (arg == "--metrics") {
      options.metrics_address = v;
    } else if (arg == "--state-file") {
      options.state_path = v;
    } else if (arg == "--schedule") {
      const std::string_view policy = v;
      if (policy != "zico" && policy != "fcfs") {
        return usage_error(std::string("--schedule '") + v + "' is not valid; expected zico or fcfs");
      }
      options.time_shift = policy == "zico";
    } else if (arg == "--start-guard") {
      const std::string_view guard = v;
      if (guard != "on" && guard != "off") {
        return usage_error(std::string("--start-guard '") + v + "' is not valid; expected on or off");
      }
      options.start_guard = guard == "on";
    } else if (arg == "--on-overuse") {
      const std::string_view action = v;
      if (action == "warn") {
        options.overuse = sharing::OveruseAction::kWarn;
      } else if (action == "deny") {
        options.overuse = sharing::OveruseAction::kDeny;
      } else if (action == "kill") {
        options.overuse = sharing::OveruseAction::kKill;
      } else {
        return usage_error(std::string("--on-overuse '") + v + "' is not valid; expected deny, kill or warn");
      }
    } else if (arg == "--turns") {
      const std::string_view turns = v;
      if (turns != "on" && turns != "off") {
        return usage_error(std::string("--turns '") + v + "' is not valid; expected on or off");
      }
      options.turns = turns == "on";
    }
  }
  if (options.state_path.empty()) options.state_path = options.socket_path + ".state";
  if (options.turns && !options.time_shift) {
    return usage_error("--turns on needs --schedule zico (turns are taken at iteration gates)");
  }
  if (deadlock == "yield") {
    options.deadlock_policy = sharing::DeadlockPolicy::kYield;
  } else if (deadlock == "fail") {
    options.deadlock_policy = sharing::DeadlockPolicy::kFail;
  } else {
    return usage_error("deadlock policy '" + deadlock + "' is not valid; expected yield or fail");
  }
  for (auto [name, gid] : {std::pair{&socket_group, &options.socket_group}, std::pair{&admin_group, &options.admin_group}}) {
    if (name->empty()) continue;
    const group* g = ::getgrnam(name->c_str());
    if (g == nullptr) return usage_error("no group named '" + *name + "'");
    *gid = g->gr_gid;
  }

  // The library's variables choose and shape the backend.
  Config config;
  std::string error;
  if (!load_config_from_environment(&config, &error).is_ok()) {
    std::fprintf(stderr, "zico-umd: %s\n", error.c_str());
    return 2;
  }
  set_log_level(std::getenv("ZICO_LOG") != nullptr ? config.log_level : LogLevel::kInfo);
  // SIGINT and SIGTERM are read from a signalfd (Daemon::run). Blocked before
  // the driver starts its threads, which inherit the mask: a thread of
  // CUDA's with them unblocked would take the signal's default action and
  // kill the daemon instead of stopping it.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  (void)::pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::unique_ptr<Driver> driver;
  if (!open_driver(config, &driver, &error).is_ok()) {
    std::fprintf(stderr, "zico-umd: %s\n", error.c_str());
    return 1;
  }
  options.zero_new_chunks = config.backend != Backend::kSim;  // fresh memfds read as zeros
  int count = 0;
  (void)driver->device_count(&count);
  if (gpu_list.empty()) {
    for (int g = 0; g < count; ++g) gpu_list.push_back(g);
  }
  for (int g : gpu_list) {
    if (g >= count) return usage_error("no GPU " + std::to_string(g) + " (this node has " + std::to_string(count) + ")");
    sharing::DaemonGpuConfig gpu{DeviceId{g}, all_budget};
    for (auto [index, bytes] : gpu_budgets) {
      if (index == g) gpu.budget_bytes = bytes;
    }
    options.gpus.push_back(gpu);
  }
  for (auto [index, bytes] : gpu_budgets) {
    if (std::find(gpu_list.begin(), gpu_list.end(), index) == gpu_list.end()) {
      return usage_error("--budget names GPU " + std::to_string(index) + ", which is not managed");
    }
  }
  // One descriptor per pooled chunk on SimDriver, and one per connection.
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    (void)::setrlimit(RLIMIT_NOFILE, &files);
  }

  std::unique_ptr<sharing::Daemon> daemon;
  if (!sharing::Daemon::create(*driver, options, &daemon, &error).is_ok()) {
    // The default socket's folder is made by the systemd unit (RuntimeDirectory).
    const std::filesystem::path folder = std::filesystem::path(options.socket_path).parent_path();
    std::error_code ignored;
    if (error.starts_with("cannot bind") && !folder.empty() && !std::filesystem::exists(folder, ignored)) {
      error += "; create " + folder.string() + " (mkdir -m 0755 -p " + folder.string() +
               ") or pass --socket PATH in a folder that exists";
    }
    std::fprintf(stderr, "zico-umd: %s\n", error.c_str());
    return 1;
  }
  for (const sharing::DaemonGpuConfig& gpu : options.gpus) {
    ZICO_LOG(kInfo, "GPU %d: budget %s", gpu.device.value,
             gpu.budget_bytes != 0 ? format_size(gpu.budget_bytes).c_str() : "all of its memory");
  }
  if (daemon->metrics_port() != 0) ZICO_LOG(kInfo, "metrics on port %u", daemon->metrics_port());
  const Status status = daemon->run(true);
  if (!status.is_ok()) {
    std::fprintf(stderr, "zico-umd: %s\n", status.message().c_str());
    return 1;
  }
  return 0;
}
