// zico-demo: several training jobs share one GPU under a node budget below
// the sum of their peaks, first with zicoum (zico-umd's time-shift schedule),
// then as users share a GPU today (static partitioning: each job reserves its
// peak and waits until that fits). Works on a machine with no GPU (SimDriver,
// the default) and, with --backend cuda, on a real one.
//
// Each job is a real process (trace_job, beside this program) that replays a
// memory trace of a real model (tools/traces) through libzicoum in scaled
// real time, borrowing every byte from a real zico-umd. Scaling keeps the run
// short: memory × --memory-scale (the daemon's budget too, and its chunk,
// down to the sim backend's smallest granularity), time × --time-scale.
// Every phase gets a fresh daemon; a sampler records what each job holds
// every 10 ms, which gives the peaks, the budget check and the timelines.
//
// Exit: 0 when both phases ran and every job verified its memory; 1 when a
// job or the daemon failed (its log is shown); 2 for bad usage; 128+N on
// signal N (children are killed and the temporary directory removed).
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "demo_node.h"
#include "demo_report.h"
#include "job_model.h"
#include "simulator.h"
#include "sizes.h"
#include "trace_reader.h"

namespace {

using namespace zico::demo;
using namespace std::chrono_literals;

// zico-umd's arguments per phase, besides the socket, budget and chunk.
// The zico phase runs the time-shift schedule; static partitioning needs
// none (each job is capped at its reservation, and the reservations fit).
const std::vector<std::string> kZicoDaemonArgs = {"--schedule", "zico"};
const std::vector<std::string> kStaticDaemonArgs = {"--schedule", "fcfs"};

const char* const kDefaultTraces[] = {"bert_base", "gpt2", "vit_b_16"};
constexpr uint64_t kDefaultBudget = uint64_t{20} << 30;
constexpr uint32_t kDefaultIterations = 12;
constexpr double kDefaultTimeScale = 10;
constexpr const char* kDefaultMemoryScale = "1/256";
// zico-umd's chunk on a GPU; scaled with memory on the sim backend, down to this.
constexpr uint64_t kGpuChunk = uint64_t{2} << 20;
constexpr uint64_t kMinSimChunk = uint64_t{8} << 10;
constexpr size_t kMaxJobs = 8;

constexpr const char* kUsage =
    "Usage: zico-demo [OPTION]...\n"
    "Runs training jobs that replay real memory traces on one GPU under a node budget\n"
    "below the sum of their peaks: with zicoum's time-shift sharing, then with static\n"
    "partitioning (each job reserves its peak). Prints throughput and peak memory of both,\n"
    "side by side, and writes a timeline SVG of each.\n"
    "\n"
    "  --traces LIST        comma-separated trace files, or names in tools/traces\n"
    "                       (default bert_base,gpt2,vit_b_16)\n"
    "  --budget SIZE        node budget in model bytes, before scaling (default 20GiB)\n"
    "  --iterations N       iterations per job (default 12)\n"
    "  --time-scale X       wall seconds per model second (default 10)\n"
    "  --memory-scale F     bytes per model byte, e.g. 1/256 or 0.0039 (default 1/256)\n"
    "  --out DIR            where zico-demo-zico.svg and zico-demo-static.svg go (default .);\n"
    "                       DIR is created if its parent folder exists\n"
    "  --backend sim|cuda   the simulated GPU (default) or the real one\n"
    "  --turns              zico-umd --turns on in the zico phase: jobs that cannot run\n"
    "                       side by side take turns (a budget below the jobs' best overlap)\n"
    "  --json               print the results as JSON\n"
    "  --help\n";

std::atomic<int> g_signal{0};

void on_signal(int signal) { g_signal = signal; }

int usage_error(const std::string& message) {
  std::fprintf(stderr, "zico-demo: %s\nTry 'zico-demo --help'.\n", message.c_str());
  return 2;
}

bool parse_fraction(const std::string& text, double* out) {
  const size_t slash = text.find('/');
  const auto number = [](const std::string& s, double* value) {
    char* end = nullptr;
    *value = std::strtod(s.c_str(), &end);
    return !s.empty() && *end == '\0' && std::isfinite(*value);
  };
  double value = 0;
  if (slash == std::string::npos) {
    if (!number(text, &value)) return false;
  } else {
    double n = 0;
    double d = 0;
    if (!number(text.substr(0, slash), &n) || !number(text.substr(slash + 1), &d) || !(d > 0)) return false;
    value = n / d;
  }
  *out = value;
  return true;
}

struct Options {
  std::vector<std::string> traces;
  uint64_t budget = kDefaultBudget;
  uint32_t iterations = kDefaultIterations;
  double time_scale = kDefaultTimeScale;
  std::string time_scale_text = "10";
  double memory_scale = 1.0 / 256;
  std::string memory_scale_text = kDefaultMemoryScale;
  std::string out_dir = ".";
  std::string backend = "sim";
  bool turns = false;
  bool json = false;
};

std::string program_dir() {
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  return error ? std::string(".") : self.parent_path().string();
}

// A name without a slash or suffix is looked up among the committed traces.
std::string resolve_trace(const std::string& item) {
  if (item.find('/') != std::string::npos || item.ends_with(".gz")) return item;
  return std::string(ZICO_DEMO_TRACE_DIR) + "/" + item + ".ztrace.gz";
}

// Returns 0 to go on, else the exit status (2: usage error, -1: --help).
int parse_options(int argc, char** argv, Options* options) {
  for (const char* name : kDefaultTraces) options->traces.push_back(resolve_trace(name));
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return -1;
    }
    if (arg == "--json") {
      options->json = true;
      continue;
    }
    if (arg == "--turns") {
      options->turns = true;
      continue;
    }
    static constexpr std::string_view kWithValue[] = {"--traces", "--budget", "--iterations", "--time-scale",
                                                      "--memory-scale", "--out", "--backend"};
    if (std::find(std::begin(kWithValue), std::end(kWithValue), arg) == std::end(kWithValue)) {
      return usage_error("unknown option '" + std::string(arg) + "'");
    }
    if (i + 1 >= argc) return usage_error(std::string(arg) + " needs a value");
    const std::string value = argv[++i];
    if (arg == "--traces") {
      options->traces.clear();
      std::stringstream list(value);
      for (std::string item; std::getline(list, item, ',');) {
        if (item.empty()) return usage_error("--traces '" + value + "' has an empty item; expected names or paths separated by commas");
        options->traces.push_back(resolve_trace(item));
      }
      if (options->traces.empty() || options->traces.size() > kMaxJobs || value.back() == ',') {
        return usage_error("--traces '" + value + "' is not valid; expected 1 to " + std::to_string(kMaxJobs) +
                           " trace names (as in tools/traces) or paths, separated by commas");
      }
    } else if (arg == "--budget") {
      const std::optional<uint64_t> size = zico::parse_size(value);
      if (!size || *size == 0) return usage_error(zico::size_above_zero_error("--budget", value));
      options->budget = *size;
    } else if (arg == "--iterations") {
      char* end = nullptr;
      const long n = std::strtol(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || n < 1 || n > 100000) {
        return usage_error("--iterations '" + value + "' is not valid; expected an integer from 1 to 100000");
      }
      options->iterations = static_cast<uint32_t>(n);
    } else if (arg == "--time-scale") {
      if (!parse_fraction(value, &options->time_scale) || !(options->time_scale > 0) || options->time_scale > 1e6) {
        return usage_error("--time-scale '" + value + "' is not valid; expected a number > 0 such as 10 or 0.5");
      }
      options->time_scale_text = value;
    } else if (arg == "--memory-scale") {
      if (!parse_fraction(value, &options->memory_scale) || !(options->memory_scale > 0) || options->memory_scale > 1) {
        return usage_error("--memory-scale '" + value + "' is not valid; expected a fraction in (0, 1] such as 1/256 or 0.25");
      }
      options->memory_scale_text = value;
    } else if (arg == "--out") {
      if (value.empty()) return usage_error("--out needs a directory");
      options->out_dir = value;
    } else if (arg == "--backend") {
      if (value != "sim" && value != "cuda") return usage_error("--backend '" + value + "' is not valid; expected sim or cuda");
      options->backend = value;
    }
  }
  return 0;
}

// The child processes' common environment.
std::vector<std::string> node_environment(const DemoSetup& setup, const std::string& dir) {
  std::vector<std::string> env = {"ZICO_BACKEND=" + setup.backend, "ZICO_WAIT_TIMEOUT=120s",
                                  "ZICO_SWAP_DIR=" + dir + "/swap"};
  if (setup.backend == "sim") env.push_back("ZICO_SIM_GRANULARITY=" + std::to_string(setup.chunk_bytes));
  return env;
}

std::vector<std::string> job_args(const std::string& trace_job, const DemoSetup& setup, const DemoJob& job,
                                  uint32_t iterations, double time_scale) {
  char time[32];
  char memory[32];
  std::snprintf(time, sizeof time, "%.17g", time_scale);
  std::snprintf(memory, sizeof memory, "%.17g", setup.memory_scale);
  return {trace_job, "--trace", job.trace_path, "--iterations", std::to_string(iterations), "--time-scale", time,
          "--memory-scale", memory, "--name", job.name};
}

std::map<std::string, std::string> read_result(const std::string& path) {
  std::map<std::string, std::string> fields;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (!line.starts_with("result ")) continue;
    std::stringstream words(line.substr(7));
    for (std::string word; words >> word;) {
      const size_t eq = word.find('=');
      if (eq != std::string::npos) fields[word.substr(0, eq)] = word.substr(eq + 1);
    }
  }
  return fields;
}

bool interrupted() { return g_signal.load() != 0; }

std::string job_failure(const ChildProcess& job) {
  return "job " + job.name + " " + job.how_it_ended() + ":\n" + file_tail(job.err_path, 15);
}

// Each job's peak under zicoum's allocator, alone (no daemon, no waiting):
// what a user reserves for it. Runs them all at once, without delays.
bool measure_reservations(const std::string& trace_job, const std::string& dir, DemoSetup* setup, std::string* why) {
  std::vector<std::string> env = node_environment(*setup, dir);
  env.push_back("ZICO_SOCKET=off");
  if (setup->chunk_bytes != 0) env.push_back("ZICO_CHUNK_SIZE=" + std::to_string(setup->chunk_bytes));
  DemoNode node(dir, env);
  for (const DemoJob& job : setup->jobs) {
    if (!node.start_job(job.name, job_args(trace_job, *setup, job, 2, 0), {"ZICO_SOCKET=off"}, why)) return false;
  }
  for (const auto deadline = Clock::now() + 60s; !node.all_jobs_exited(); std::this_thread::sleep_for(2ms)) {
    if (interrupted()) return false;
    if (Clock::now() > deadline) {
      *why = "measuring the jobs' peaks took over 60 s";
      return false;
    }
    (void)node.reap_jobs();
  }
  const uint64_t unit = setup->chunk_bytes != 0 ? setup->chunk_bytes : kGpuChunk;
  for (size_t i = 0; i < setup->jobs.size(); ++i) {
    const ChildProcess& child = node.jobs()[i];
    if (!child.succeeded()) {
      *why = "measuring its peak: " + job_failure(child);
      return false;
    }
    const auto result = read_result(child.out_path);
    const auto mapped = result.find("peak_mapped_bytes");
    if (mapped == result.end()) {
      *why = "job " + child.name + " printed no result line";
      return false;
    }
    DemoJob& job = setup->jobs[i];
    const uint64_t model_peak =
        static_cast<uint64_t>(std::ceil(static_cast<double>(job.model.peak_bytes) * setup->memory_scale));
    const uint64_t peak = std::max<uint64_t>(model_peak, std::strtoull(mapped->second.c_str(), nullptr, 10));
    job.reservation_bytes = (peak + unit - 1) / unit * unit;
  }
  return true;
}

// Static partitioning as a careful operator would run it: the best plan the
// simulator finds for these jobs (admission order, jobs at once). The demo's
// jobs share no compute (the simulated backend's kernels are waits), so the
// plan is made without compute sharing.
zico::simulate::LaunchPlan best_static_plan(const DemoSetup& setup) {
  std::vector<zico::simulate::JobModel> models;
  for (const DemoJob& job : setup.jobs) models.push_back(job.model);
  zico::simulate::SimulationOptions options;
  options.policy = zico::simulate::Policy::kStatic;
  options.budget = {{0, setup.budget_bytes}};
  options.iterations = setup.iterations;
  options.utilization = 1e-6;
  zico::simulate::SimulationResult result;
  std::string ignored;
  if (zico::simulate::simulate(models, options, &result, &ignored).is_ok()) return result.launch_plan;
  zico::simulate::LaunchPlan given;  // what cannot be planned runs in the order given
  for (uint32_t i = 0; i < setup.jobs.size(); ++i) given.order.push_back(i);
  return given;
}

// The simulator's figures for the two phases as the demo runs them: zico
// with every job launched at once, static with `plan`; no compute shared.
zico::demo::Prediction predict(const DemoSetup& setup, const zico::simulate::LaunchPlan& plan) {
  std::vector<zico::simulate::JobModel> models;
  for (const DemoJob& job : setup.jobs) models.push_back(job.model);
  zico::simulate::SimulationOptions options;
  options.budget = {{0, setup.budget_bytes}};
  options.iterations = setup.iterations;
  options.utilization = 1e-6;
  zico::demo::Prediction predicted;
  zico::simulate::SimulationResult zico_run, static_run;
  std::string ignored;
  options.policy = zico::simulate::Policy::kZico;
  options.launch_together = true;
  if (!zico::simulate::simulate(models, options, &zico_run, &ignored).is_ok()) return predicted;
  options.policy = zico::simulate::Policy::kStatic;
  options.launch_together = false;
  options.launch_plan = plan;
  if (!zico::simulate::simulate(models, options, &static_run, &ignored).is_ok()) return predicted;
  predicted.known = true;
  predicted.zico_iters_per_s = zico_run.aggregate_iters_per_s;
  predicted.static_iters_per_s = static_run.aggregate_iters_per_s;
  predicted.zico_deadlocks = zico_run.deadlocks;
  return predicted;
}

// "a, then b, then c; at most 2 at once"
std::string plan_text(const DemoSetup& setup, const zico::simulate::LaunchPlan& plan) {
  std::string text;
  for (size_t k = 0; k < plan.order.size(); ++k) text += (k == 0 ? "" : ", then ") + setup.jobs[plan.order[k]].name;
  if (plan.max_running != 0) text += "; at most " + std::to_string(plan.max_running) + " at once";
  return text;
}

// One phase: a fresh zico-umd, the jobs (all at once under time shift; under
// static partitioning in the plan's order, each when its reservation fits and
// the plan's cap allows, later ones that fit going ahead of one that does
// not), sampling until they all exit.
bool run_phase(const std::string& tools, const DemoSetup& setup, const std::string& dir, bool time_shift, bool turns,
               const zico::simulate::LaunchPlan& plan, PhaseRun* phase, std::vector<uint32_t>* pids, std::string* why) {
  std::filesystem::create_directories(dir + "/swap");
  DemoNode node(dir, node_environment(setup, dir));
  std::vector<std::string> daemon_args = time_shift ? kZicoDaemonArgs : kStaticDaemonArgs;
  if (time_shift && turns) daemon_args.insert(daemon_args.end(), {"--turns", "on"});
  daemon_args.insert(daemon_args.end(), {"--budget", std::to_string(setup.node_budget_bytes)});
  if (setup.chunk_bytes != 0) daemon_args.insert(daemon_args.end(), {"--chunk-size", std::to_string(setup.chunk_bytes)});
  if (!node.start_daemon(tools + "/zico-umd", daemon_args, why)) return false;

  // Long enough for every job to run alone, one after the other, several times over.
  double ideal_s = 0;
  for (const DemoJob& job : setup.jobs) {
    ideal_s += static_cast<double>(job.model.first_period_ns + (setup.iterations - 1) * job.model.steady_period_ns) *
               setup.time_scale / 1e9;
  }
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(4 * ideal_s + 60));
  node.start_sampling();
  std::vector<size_t> job_of_child;  // children are numbered as they start
  std::vector<bool> started(setup.jobs.size(), false);
  uint64_t reserved = 0;
  size_t running = 0;
  while (true) {
    if (interrupted()) return false;
    for (const uint32_t i : plan.order) {
      if (started[i]) continue;
      const DemoJob& job = setup.jobs[i];
      if (!time_shift && plan.max_running != 0 && running >= plan.max_running) break;
      if (!time_shift && reserved + job.reservation_bytes > setup.node_budget_bytes) continue;  // backfill
      std::vector<std::string> env;
      if (!time_shift) env.push_back("ZICO_BUDGET=" + std::to_string(job.reservation_bytes));
      if (!node.start_job(job.name, job_args(tools + "/trace_job", setup, job, setup.iterations, setup.time_scale), env,
                          why)) {
        return false;
      }
      started[i] = true;
      job_of_child.push_back(i);
      ++running;
      reserved += time_shift ? 0 : job.reservation_bytes;
      phase->peak_reserved_bytes = std::max(phase->peak_reserved_bytes, reserved);
    }
    for (const size_t child : node.reap_jobs()) {
      if (!node.jobs()[child].succeeded()) {
        *why = job_failure(node.jobs()[child]);
        return false;
      }
      --running;
      reserved -= time_shift ? 0 : setup.jobs[job_of_child[child]].reservation_bytes;
    }
    if (job_of_child.size() == setup.jobs.size() && node.all_jobs_exited()) break;
    if (Clock::now() > deadline) {
      *why = "the " + phase->name + " phase did not finish within " +
             std::to_string(static_cast<int>(4 * ideal_s + 60)) + " s";
      return false;
    }
    std::this_thread::sleep_for(2ms);
  }
  node.stop_sampling();
  if (!node.stop_daemon(why)) return false;

  const auto since_epoch = [&](Clock::time_point t) { return std::chrono::duration<double>(t - node.epoch()).count(); };
  // Reported in the jobs' order, whatever order they started in.
  for (size_t i = 0; i < setup.jobs.size(); ++i) {
    const size_t child_index =
        static_cast<size_t>(std::find(job_of_child.begin(), job_of_child.end(), i) - job_of_child.begin());
    const ChildProcess& child = node.jobs()[child_index];
    JobRun run;
    run.result = read_result(child.out_path);
    if (run.result.empty()) {
      *why = "job " + child.name + " printed no result line";
      return false;
    }
    run.start_s = since_epoch(child.started);
    run.end_s = since_epoch(child.ended);
    phase->makespan_s = std::max(phase->makespan_s, run.end_s);
    phase->jobs.push_back(std::move(run));
    pids->push_back(static_cast<uint32_t>(child.pid));
  }
  phase->samples = node.samples();
  if (phase->samples.empty()) {
    *why = "no status sample from zico-umd: " + node.sampler_error();
    return false;
  }
  summarize_samples(*pids, phase);
  return true;
}

// The temporary directory, removed however the demo ends.
class TempDir {
 public:
  bool create(std::string* why) {
    char path[] = "/tmp/zico-demo-XXXXXX";
    if (::mkdtemp(path) == nullptr) {
      *why = std::string("mkdtemp: ") + std::strerror(errno);
      return false;
    }
    path_ = path;
    return true;
  }
  ~TempDir() {
    std::error_code ignored;
    if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
  }
  [[nodiscard]] const std::string& path() const { return path_; }

 private:
  std::string path_;
};

int fail(const std::string& why) {
  if (interrupted()) {
    std::fprintf(stderr, "zico-demo: interrupted; children stopped, temporary files removed\n");
    return 128 + g_signal.load();
  }
  std::fprintf(stderr, "zico-demo: %s\n", why.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const Clock::time_point begin = Clock::now();
  Options options;
  if (const int status = parse_options(argc, argv, &options); status != 0) return status < 0 ? 0 : status;

  const std::string tools = program_dir();
  for (const char* tool : {"zico-umd", "trace_job"}) {
    if (::access((tools + "/" + tool).c_str(), X_OK) != 0) {
      std::fprintf(stderr, "zico-demo: %s/%s is missing; build it (cmake --build build)\n", tools.c_str(), tool);
      return 1;
    }
  }
  // Only the last folder is created: a typo higher up fails here, not silently elsewhere.
  if (::mkdir(options.out_dir.c_str(), 0777) != 0 && errno != EEXIST) {
    const int error = errno;
    return usage_error("--out '" + options.out_dir + "': cannot create it: " + std::strerror(error) +
                       (error == ENOENT ? " (its parent folder does not exist)" : ""));
  }
  if (std::error_code ignored; !std::filesystem::is_directory(options.out_dir, ignored)) {
    return usage_error("--out '" + options.out_dir + "' exists and is not a directory");
  }

  DemoSetup setup;
  setup.iterations = options.iterations;
  setup.time_scale = options.time_scale;
  setup.memory_scale = options.memory_scale;
  setup.memory_scale_text = options.memory_scale_text;
  setup.backend = options.backend;
  setup.budget_bytes = options.budget;
  if (options.backend == "sim") {
    // The GPU's chunk, scaled like the memory, to a power of two the sim backend accepts.
    const double scaled = static_cast<double>(kGpuChunk) * options.memory_scale;
    uint64_t chunk = kMinSimChunk;
    while (static_cast<double>(chunk * 2) <= scaled && chunk < kGpuChunk) chunk *= 2;
    setup.chunk_bytes = chunk;
  }
  const uint64_t unit = setup.chunk_bytes != 0 ? setup.chunk_bytes : kGpuChunk;
  setup.node_budget_bytes =
      static_cast<uint64_t>(static_cast<double>(options.budget) * options.memory_scale) / unit * unit;
  if (setup.node_budget_bytes == 0) {
    return usage_error("--budget " + zico::format_size(options.budget) + " at --memory-scale " +
                       options.memory_scale_text + " is less than one chunk (" + zico::format_size(unit) +
                       "); raise either");
  }
  for (const std::string& path : options.traces) {
    DemoJob job;
    job.trace_path = path;
    zico::trace::Trace trace;
    std::string error;
    if (!zico::trace::read_trace_file(path, &trace, &error).is_ok() ||
        !zico::simulate::build_job_model(trace, &job.model, &error).is_ok()) {
      return usage_error("--traces: " + error);
    }
    job.name = job.model.name;
    int same = 0;
    for (const DemoJob& other : setup.jobs) same += other.model.name == job.model.name ? 1 : 0;
    if (same > 0) job.name += "-" + std::to_string(same + 1);
    setup.jobs.push_back(std::move(job));
  }

  struct sigaction action {};
  action.sa_handler = on_signal;
  ::sigemptyset(&action.sa_mask);
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);
  ::sigaction(SIGHUP, &action, nullptr);

  TempDir temp;
  std::string why;
  if (!temp.create(&why)) return fail(why);
  const auto say = [&](const std::string& text) {
    if (!options.json) std::fprintf(stderr, "zico-demo: %s\n", text.c_str());
  };
  say("measuring each job's peak alone (what static partitioning reserves)");
  if (!measure_reservations(tools + "/trace_job", temp.path(), &setup, &why)) return fail(why);
  for (const DemoJob& job : setup.jobs) {
    if (job.reservation_bytes > setup.node_budget_bytes) {
      return usage_error("job " + job.name + " needs " + zico::format_size(job.reservation_bytes) +
                         " at its peak (scaled), more than the scaled budget " +
                         zico::format_size(setup.node_budget_bytes) + "; raise --budget");
    }
  }

  PhaseRun zico_phase;
  zico_phase.name = "zico";
  zico_phase.description = options.turns ? "all jobs at once, zico-umd shifting their iterations, with turns"
                                         : "all jobs at once, zico-umd shifting their iterations";
  PhaseRun static_phase;
  static_phase.name = "static";
  const zico::simulate::LaunchPlan plan = best_static_plan(setup);
  static_phase.description = "each job reserves its peak; the best plan: " + plan_text(setup, plan);
  std::vector<uint32_t> zico_pids;
  std::vector<uint32_t> static_pids;
  say("phase zico: " + std::to_string(setup.jobs.size()) + " jobs at once");
  if (!run_phase(tools, setup, temp.path() + "/zico", true, options.turns, plan, &zico_phase, &zico_pids, &why)) {
    return fail(why);
  }
  say("phase static: " + plan_text(setup, plan) + ", each when its reservation fits");
  if (!run_phase(tools, setup, temp.path() + "/static", false, false, plan, &static_phase, &static_pids, &why)) {
    return fail(why);
  }

  zico_phase.svg_path = (std::filesystem::path(options.out_dir) / "zico-demo-zico.svg").string();
  static_phase.svg_path = (std::filesystem::path(options.out_dir) / "zico-demo-static.svg").string();
  if (!write_timeline_svg(setup, zico_pids, zico_phase, zico_phase.svg_path, &why) ||
      !write_timeline_svg(setup, static_pids, static_phase, static_phase.svg_path, &why)) {
    return fail(why);
  }
  const double wall_s = std::chrono::duration<double>(Clock::now() - begin).count();
  const zico::demo::Prediction predicted = predict(setup, plan);
  if (options.json) {
    print_json(setup, zico_phase, static_phase, predicted, wall_s);
  } else {
    print_table(setup, zico_phase, static_phase, predicted, wall_s);
  }
  return zico_phase.samples_over_budget + static_phase.samples_over_budget == 0 ? 0 : 1;
}
