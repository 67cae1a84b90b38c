// zico-umctl: the command-line tool for zicoum. Each command lives in its own
// file; this one only dispatches.
#include <cstdio>
#include <cstring>
#include <string_view>

#include "replay_command.h"

namespace {

constexpr const char* kUsage =
    "Usage: zico-umctl COMMAND [ARG]...\n"
    "\n"
    "Commands:\n"
    "  replay   replay memory traces against zicoum and baseline allocators\n"
    "\n"
    "'zico-umctl COMMAND --help' describes a command.\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return 2;
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
  if (command == "replay") return zico::umctl::run_replay(argc - 2, argv + 2);
  std::fprintf(stderr, "zico-umctl: unknown command '%s'\n%s", argv[1], kUsage);
  return 2;
}
