// The SPANK plugin that puts a Slurm job's tasks under zico-umd: Slurm places
// jobs by the GPU memory they ask for (a countable GRES, `gpumem`), and this
// plugin hands each task that share as its zicoum budget (docs/cluster.md).
//
// Where each part runs:
//   srun / sbatch / salloc (local and allocator contexts): the option
//     --zico-budget=SIZE is parsed here first, so a bad value fails the
//     submission with a message naming it.
//   slurmstepd (remote context), slurm_spank_user_init, once per step and
//     node, before the tasks start: reads the step's share (the option, or
//     the job's per-node GRES request from slurmctld) and sets ZICO_BUDGET,
//     ZICO_SOCKET, ZICO_JOB_NAME and LD_PRELOAD in the tasks' environment.
//
// Nothing is registered with zico-umd from here: each task's libzicoum
// registers itself under ZICO_JOB_NAME when it first allocates, never asks
// the daemon for more than its ZICO_BUDGET, and zico-umd takes its memory
// back when its process exits, however it ends (scancel, a time limit,
// SIGKILL). So there is nothing to clean up at the job's end either.
//
// Slurm's functions (slurm_load_job, slurm_error ...) are not linked: they
// come from the Slurm program that loads the plugin.
// spank.h declares the plugin's entry points outside its extern "C".
extern "C" {
#include <slurm/slurm.h>
#include <slurm/spank.h>
}

#include <optional>
#include <string>
#include <vector>

#include "slurm_share.h"

// What SPANK_PLUGIN(zicoum, 1) defines, with the linkage and visibility a
// C++ file needs for Slurm's plugin loader to find them.
#define ZICO_SPANK_EXPORT extern "C" __attribute__((visibility("default")))
ZICO_SPANK_EXPORT const char plugin_name[] = "zicoum";
ZICO_SPANK_EXPORT const char plugin_type[] = "spank";
ZICO_SPANK_EXPORT const unsigned int plugin_version = SLURM_VERSION_NUMBER;
ZICO_SPANK_EXPORT const unsigned int spank_plugin_version = 1;

namespace {

using zico::slurm::PluginArgs;

// Set by the option callback, in whichever process parses the options.
std::optional<uint64_t> budget_option;
PluginArgs plugin_args;

int on_budget_option(int, const char* optarg, int) {
  std::string why;
  budget_option = zico::slurm::parse_budget_option(optarg != nullptr ? optarg : "", &why);
  if (!budget_option) {
    slurm_error("zicoum: %s", why.c_str());
    return -1;
  }
  return 0;
}

spank_option budget_spank_option = {
    const_cast<char*>("zico-budget"), const_cast<char*>("SIZE"),
    const_cast<char*>("zicoum: each task's GPU memory budget (ZICO_BUDGET), e.g. 20GiB; default: the job's "
                      "gpumem GRES on the node over its tasks there"),
    1, 0, on_budget_option};

// The job's per-node request of the share's GRES, from slurmctld.
std::optional<uint64_t> node_share(uint32_t job_id) {
  job_info_msg_t* info = nullptr;
  if (slurm_load_job(&info, job_id, SHOW_DETAIL) != SLURM_SUCCESS || info == nullptr) {
    slurm_verbose("zicoum: cannot read job %u from slurmctld; no gpumem share known", job_id);
    return std::nullopt;
  }
  std::optional<uint64_t> bytes;
  if (info->record_count > 0 && info->job_array[0].tres_per_node != nullptr) {
    bytes = zico::slurm::gres_bytes(info->job_array[0].tres_per_node, plugin_args.gres);
  }
  slurm_free_job_info_msg(info);
  return bytes;
}

bool set_env(spank_t sp, const char* name, const std::string& value) {
  if (spank_setenv(sp, name, value.c_str(), 1) == ESPANK_SUCCESS) return true;
  slurm_error("zicoum: cannot set %s for the job's tasks", name);
  return false;
}

}  // namespace

ZICO_SPANK_EXPORT int slurm_spank_init(spank_t sp, int ac, char** av) {
  std::string why;
  std::optional<PluginArgs> args = zico::slurm::parse_plugin_args(std::vector<std::string>(av, av + ac), &why);
  if (!args) {
    slurm_error("zicoum: %s", why.c_str());
    return -1;
  }
  plugin_args = *args;
  if (spank_option_register(sp, &budget_spank_option) != ESPANK_SUCCESS) {
    slurm_error("zicoum: cannot register --zico-budget");
    return -1;
  }
  return 0;
}

ZICO_SPANK_EXPORT int slurm_spank_user_init(spank_t sp, int, char**) {
  uint32_t job_id = 0;
  uint32_t step_id = 0;
  uint32_t local_tasks = 0;
  if (spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS ||
      spank_get_item(sp, S_JOB_STEPID, &step_id) != ESPANK_SUCCESS ||
      spank_get_item(sp, S_JOB_LOCAL_TASK_COUNT, &local_tasks) != ESPANK_SUCCESS) {
    slurm_error("zicoum: cannot read the job and step ids");
    return -1;
  }
  if (step_id == SLURM_EXTERN_CONT) return 0;  // runs no task of the user's
  const std::optional<uint64_t> budget =
      zico::slurm::task_budget(budget_option, budget_option ? std::nullopt : node_share(job_id), local_tasks);
  if (budget && !set_env(sp, "ZICO_BUDGET", std::to_string(*budget))) return -1;
  if (!set_env(sp, "ZICO_SOCKET", plugin_args.socket) ||
      !set_env(sp, "ZICO_JOB_NAME", zico::slurm::job_name(job_id, step_id))) {
    return -1;
  }
  if (!plugin_args.library.empty()) {
    char inherited[4096] = "";
    const spank_err_t found = spank_getenv(sp, "LD_PRELOAD", inherited, sizeof inherited);
    if (found == ESPANK_ENV_NOEXIST) {
      inherited[0] = '\0';
    } else if (found != ESPANK_SUCCESS) {
      slurm_error("zicoum: cannot read the job's LD_PRELOAD (%s); libzicoum not preloaded", spank_strerror(found));
      return -1;
    }
    if (!set_env(sp, "LD_PRELOAD", zico::slurm::preload_value(plugin_args.library, inherited))) return -1;
  }
  slurm_verbose("zicoum: %s budget %s", zico::slurm::job_name(job_id, step_id).c_str(),
                budget ? std::to_string(*budget).c_str() : "none");
  return 0;
}
