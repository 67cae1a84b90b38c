// zico-umctl: the command-line tool for zicoum. Each command lives in its own
// file; this one only dispatches.
#include <cstdio>
#include <string_view>
#include <utility>

#include "node_commands.h"
#include "page_command.h"
#include "replay_command.h"
#include "simulate_command.h"

namespace {

constexpr const char* kUsage =
    "Usage: zico-umctl COMMAND [ARG]...\n"
    "\n"
    "Commands that talk to zico-umd, the node daemon:\n"
    "  status   the daemon, its GPUs' budgets and what is granted\n"
    "  jobs     the jobs it serves and their memory\n"
    "  top      a live view of GPUs and jobs\n"
    "  budget   show or set a GPU's node budget, or a job's minimum and maximum\n"
    "  suspend  make a job evict its memory and give it back\n"
    "  resume   let a suspended job take its memory back and continue\n"
    "\n"
    "Offline:\n"
    "  replay   replay memory traces against zicoum and baseline allocators\n"
    "  simulate jobs from traces sharing one virtual GPU under a memory policy\n"
    "  page     one job beyond its GPU's memory, under paging policies\n"
    "\n"
    "'zico-umctl COMMAND --help' (or 'zico-umctl help COMMAND') describes a command.\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  // "help COMMAND" is "COMMAND --help".
  char help_flag[] = "--help";
  char* help_argv[] = {argv[0], argc > 2 ? argv[2] : nullptr, help_flag, nullptr};
  if (std::string_view(argv[1]) == "help" && argc > 2) {
    argc = 3;
    argv = help_argv;
  }
  const std::string_view command = argv[1];
  if (command == "--help" || command == "-h" || command == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (command == "--version") {
    std::printf("zico-umctl (zicoum) %s\n", ZICO_VERSION);
    return 0;
  }
  using Command = int (*)(int, char**);
  static constexpr std::pair<std::string_view, Command> kCommands[] = {
      {"replay", zico::umctl::run_replay}, {"status", zico::umctl::run_status},   {"jobs", zico::umctl::run_jobs},
      {"top", zico::umctl::run_top},       {"budget", zico::umctl::run_budget},   {"suspend", zico::umctl::run_suspend},
      {"resume", zico::umctl::run_resume}, {"simulate", zico::umctl::run_simulate},
      {"page", zico::umctl::run_page},
  };
  for (const auto& [name, run] : kCommands) {
    if (command == name) return run(argc - 2, argv + 2);
  }
  std::fprintf(stderr, "zico-umctl: unknown command '%s'\n%s", argv[1], kUsage);
  return 2;
}
