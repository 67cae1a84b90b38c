// `zico-umctl budget get | set`: the node budget of a GPU, and a job's
// minimum and maximum on it. Every argument is checked before anything is
// sent, so a typo never changes half of what was asked.
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

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
    "Usage: zico-umctl budget get [--gpu N] [--json] [--socket PATH]\n"
    "       zico-umctl budget set [--gpu N] SIZE [--socket PATH]\n"
    "       zico-umctl budget set [--gpu N] --job ID [--min SIZE] [--max SIZE] [--socket PATH]\n"
    "Show or change how much GPU memory zico-umd lends.\n"
    "\n"
    "get: the node budget of each GPU (or of GPU N) and how much of it jobs hold.\n"
    "set SIZE: the node budget of GPU N (default 0); root, zico-umd's user or its --admin-group.\n"
    "set --job ID: the job's guaranteed minimum and/or its maximum on GPU N; --max unlimited\n"
    "lifts the maximum. The job's owner may change them too.\n"
    "\n"
    "  --gpu N         the daemon's GPU index (zico-umctl status lists them; default 0 for set)\n"
    "  --job ID        a job id (zico-umctl jobs lists them)\n"
    "  --min SIZE      the job's minimum\n"
    "  --max SIZE      the job's maximum, or unlimited\n"
    "  --json          get: {\"gpus\":[GPU...]} as in zico-umctl status --json\n"
    "%s"
    "\n"
    "SIZE is %s.\n"
    "Exit status: 0, 1 if zico-umd refused (its reason is on stderr), 2 for bad usage,\n"
    "3 if no zico-umd runs.\n";

constexpr const char* kCommand = "budget";

int print_usage() {
  std::printf(kUsage, kSocketOptionHelp, kSizeForm);
  return kExitOk;
}

struct GetOptions {
  std::optional<uint32_t> gpu;
  bool json = false;
  std::string socket;
};

int run_get(const GetOptions& options) {
  NodeConnection daemon(kCommand);
  if (const int status = daemon.connect(socket_path(options.socket)); status != kExitOk) return status;
  proto::StatusReply reply;
  if (const int status = daemon.ask(proto::StatusQuery{}, &reply); status != kExitOk) return status;
  std::vector<proto::GpuStatus> gpus;
  for (const proto::GpuStatus& gpu : reply.gpus) {
    if (!options.gpu || gpu.index == *options.gpu) gpus.push_back(gpu);
  }
  if (options.gpu && gpus.empty()) {
    std::fprintf(stderr, "zico-umctl budget: no GPU %u (this node has %zu)\n", *options.gpu, reply.gpus.size());
    return kExitFailed;
  }
  if (options.json) {
    JsonWriter json;
    json.begin_object();
    json.key("gpus");
    json.begin_array();
    for (const proto::GpuStatus& gpu : gpus) write_gpu_json(json, gpu);
    json.end_array();
    json.end_object();
    std::printf("%s\n", json.text().c_str());
    return kExitOk;
  }
  using Align = TextTable::Align;
  TextTable table({{"GPU", Align::kRight},
                   {"BUDGET", Align::kRight},
                   {"GRANTED", Align::kRight},
                   {"WAITING", Align::kRight},
                   {"CHUNK", Align::kRight}});
  for (const proto::GpuStatus& gpu : gpus) {
    table.add_row({std::to_string(gpu.index), format_size(gpu.budget_bytes), format_size(gpu.granted_bytes),
                   format_size(gpu.waiting_bytes), format_size(gpu.chunk_bytes)});
  }
  std::fputs(table.render().c_str(), stdout);
  return kExitOk;
}

struct SetOptions {
  uint32_t gpu = 0;
  std::optional<uint64_t> job;
  std::optional<uint64_t> min;
  std::optional<uint64_t> max;  // UINT64_MAX: unlimited
  std::optional<uint64_t> node;
  std::string socket;
};

// Sends one SetBudget and prints the daemon's answer.
int set_one(NodeConnection& daemon, const proto::SetBudget& request) {
  proto::Result result;
  if (const int status = daemon.ask(request, &result); status != kExitOk) return status;
  if (result.errc != 0) {
    std::fprintf(stderr, "zico-umctl budget: %s\n", result.message.c_str());
    return kExitFailed;
  }
  std::printf("%s\n", result.message.c_str());
  return kExitOk;
}

int run_set(const SetOptions& options) {
  NodeConnection daemon(kCommand);
  if (const int status = daemon.connect(socket_path(options.socket)); status != kExitOk) return status;
  if (options.node) return set_one(daemon, {proto::BudgetTarget::kNode, options.gpu, 0, *options.node});

  const uint64_t job = *options.job;
  const proto::SetBudget min{proto::BudgetTarget::kJobMin, options.gpu, job, options.min.value_or(0)};
  const proto::SetBudget max{proto::BudgetTarget::kJobMax, options.gpu, job, options.max.value_or(0)};
  if (!options.min || !options.max) return set_one(daemon, options.min ? min : max);
  // Two messages, each checked on its own: raising both must move the
  // maximum first, lowering both the minimum first.
  proto::StatusReply reply;
  if (const int status = daemon.ask(proto::StatusQuery{}, &reply); status != kExitOk) return status;
  bool max_first = false;
  for (const proto::JobStatus& entry : reply.jobs) {
    if (entry.id == job && entry.gpu == options.gpu) max_first = *options.min > entry.max_bytes;
  }
  for (const proto::SetBudget& request : max_first ? std::vector{max, min} : std::vector{min, max}) {
    if (const int status = set_one(daemon, request); status != kExitOk) return status;
  }
  return kExitOk;
}

int parse_get(int argc, char** argv) {
  GetOptions options;
  std::string gpu;
  ArgReader args(argc, argv);
  while (args.next()) {
    if (args.flag("--help") || args.flag("-h")) return print_usage();
    if (args.flag("--json")) {
      options.json = true;
    } else if (args.option("--gpu", &gpu) || args.option("--socket", &options.socket)) {
      continue;
    } else if (args.unknown_option()) {
      return usage_error(kCommand, "unknown option '" + std::string(args.current()) + "' for budget get");
    } else {
      return usage_error(kCommand, "budget get takes no argument ('" + std::string(args.current()) + "')");
    }
  }
  if (!args.error().empty()) return usage_error(kCommand, args.error());
  if (!gpu.empty()) {
    const std::optional<uint64_t> index = parse_decimal(gpu);
    if (!index || *index > UINT32_MAX) return usage_error(kCommand, "--gpu '" + gpu + "' is not a GPU index (0, 1, ...)");
    options.gpu = static_cast<uint32_t>(*index);
  }
  return run_get(options);
}

int parse_set(int argc, char** argv) {
  SetOptions options;
  std::string gpu;
  std::string job;
  std::string min;
  std::string max;
  std::vector<std::string> operands;
  ArgReader args(argc, argv);
  while (args.next()) {
    if (args.flag("--help") || args.flag("-h")) return print_usage();
    if (args.option("--gpu", &gpu) || args.option("--job", &job) || args.option("--min", &min) ||
        args.option("--max", &max) || args.option("--socket", &options.socket)) {
      continue;
    } else if (args.unknown_option()) {
      return usage_error(kCommand, "unknown option '" + std::string(args.current()) + "' for budget set");
    } else {
      operands.emplace_back(args.current());
    }
  }
  if (!args.error().empty()) return usage_error(kCommand, args.error());

  if (!gpu.empty()) {
    const std::optional<uint64_t> index = parse_decimal(gpu);
    if (!index || *index > UINT32_MAX) return usage_error(kCommand, "--gpu '" + gpu + "' is not a GPU index (0, 1, ...)");
    options.gpu = static_cast<uint32_t>(*index);
  }
  if (operands.size() > 1) {
    return usage_error(kCommand, "budget set takes one SIZE, not " + std::to_string(operands.size()) + " ('" +
                                     operands[0] + "', '" + operands[1] + "'...)");
  }
  if (job.empty()) {
    if (!min.empty() || !max.empty()) return usage_error(kCommand, "--min and --max set a job's limits: name it with --job ID");
    if (operands.empty()) return usage_error(kCommand, "budget set needs a SIZE (the node budget), e.g. 40GiB");
    const std::optional<uint64_t> size = parse_size(operands[0]);
    if (!size || *size == 0) return usage_error(kCommand, size_above_zero_error("budget", operands[0]));
    options.node = *size;
    return run_set(options);
  }

  const std::optional<uint64_t> id = parse_decimal(job);
  if (!id || *id == 0) return usage_error(kCommand, "--job '" + job + "' is not a job id (1, 2, ...; zico-umctl jobs lists them)");
  options.job = *id;
  if (!operands.empty()) {
    return usage_error(kCommand, "'" + operands[0] + "': with --job, give the sizes as --min SIZE and/or --max SIZE");
  }
  if (min.empty() && max.empty()) return usage_error(kCommand, "--job needs --min SIZE, --max SIZE or both");
  if (!min.empty()) {
    options.min = parse_size(min);
    if (!options.min) return usage_error(kCommand, size_error("--min", min));
  }
  if (!max.empty()) {
    options.max = max == "unlimited" ? std::optional<uint64_t>(UINT64_MAX) : parse_size(max);
    if (!options.max) {
      const std::string error = size_error("--max", max);
      return usage_error(kCommand, error.ends_with(kSizeForm) ? error + ", or unlimited" : error);
    }
  }
  if (options.min && options.max && *options.min > *options.max) {
    return usage_error(kCommand, "--min " + min + " is above --max " + max);
  }
  return run_set(options);
}

}  // namespace

int run_budget(int argc, char** argv) {
  if (argc == 0) return usage_error(kCommand, "get or set?");
  const std::string action = argv[0];
  if (action == "--help" || action == "-h") return print_usage();
  if (action == "get") return parse_get(argc - 1, argv + 1);
  if (action == "set") return parse_set(argc - 1, argv + 1);
  return usage_error(kCommand, "'" + action + "' is not get or set");
}

}  // namespace zico::umctl
