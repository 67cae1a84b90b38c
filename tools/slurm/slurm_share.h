// What the SPANK plugin (spank_zicoum.cpp) decides for a job step, without
// Slurm: its plugstack.conf arguments, the --zico-budget value, the job's
// memory share read from Slurm's per-node GRES request, and the names and
// variables a task gets. Pure functions, so the rules are tested without a
// cluster (tests/slurm/slurm_share_test.cpp).
//
// The share: a countable GRES (by default `gpumem`) whose count is bytes,
// written as Slurm writes counts (an integer with an optional K, M, G, T
// suffix, powers of 1024): `--gres=gpumem:20G` asks for 20 GiB on each node.
// Each task's ZICO_BUDGET is --zico-budget if given, else the node's share
// divided by the step's tasks on the node.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace zico::slurm {

// The plugin's arguments in plugstack.conf: `socket=PATH`, `library=PATH`,
// `gres=NAME`. Unknown or malformed arguments are errors.
struct PluginArgs {
  std::string socket = "/run/zicoum/zicoum.sock";
  std::string library;  // empty: do not preload libzicoum
  std::string gres = "gpumem";
};
// nullopt with *why naming the argument and the accepted form.
[[nodiscard]] std::optional<PluginArgs> parse_plugin_args(const std::vector<std::string>& args, std::string* why);

// --zico-budget=SIZE, parsed as ZICO_BUDGET is (umm/sizes.h), > 0.
// nullopt with *why naming the value and the accepted form.
[[nodiscard]] std::optional<uint64_t> parse_budget_option(std::string_view text, std::string* why);

// The bytes of `gres` in a job's per-node TRES request, as Slurm reports it
// (job_info_t::tres_per_node: "gres:gpumem:20M", "gres:gpu:a100:2,gres:gpumem:20G",
// also "gres/gpumem=20M"). nullopt when the GRES is not requested or its
// count is not a count.
[[nodiscard]] std::optional<uint64_t> gres_bytes(std::string_view tres_per_node, std::string_view gres);

// "slurm-<job>.<step>"; Slurm's special steps by their names ("batch",
// "interactive", "extern"), as sacct writes them.
[[nodiscard]] std::string job_name(uint32_t job_id, uint32_t step_id);

// Each task's budget: the option if given, else the node's share over the
// step's local tasks (nullopt when neither is known, or the share is less
// than a byte per task).
[[nodiscard]] std::optional<uint64_t> task_budget(std::optional<uint64_t> option, std::optional<uint64_t> node_share,
                                                  uint32_t local_tasks);

// LD_PRELOAD for the task: the library first, then what the job had.
[[nodiscard]] std::string preload_value(const std::string& library, std::string_view inherited);

}  // namespace zico::slurm
