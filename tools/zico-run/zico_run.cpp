// zico-run: runs a command with libzicoum preloaded and configured.
//
// Everything is checked before exec, including ZICO_* variables inherited
// from the caller's environment: a typo in a size or backend is reported here,
// with the accepted form, instead of surfacing later inside the child as a
// failed first allocation, possibly after the job has spent minutes loading
// data. Exit codes follow env(1): 2 for our own usage errors, 126 when the
// command cannot be executed, 127 when it is not found.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "config.h"
#include "sizes.h"

namespace {

namespace fs = std::filesystem;

constexpr int kUsageError = 2;
constexpr int kCannotExecute = 126;
constexpr int kNotFound = 127;
constexpr const char* kLibraryName = "libzicoum.so";

constexpr const char* kUsage =
    "Usage: zico-run [OPTION]... -- COMMAND [ARG]...\n"
    "Run COMMAND with libzicoum preloaded, so its cudaMalloc and cudaFree go through zicoum.\n"
    "\n"
    "  --budget SIZE       cap on device memory per GPU (sets ZICO_BUDGET), e.g. 6GiB\n"
    "  --backend cuda|sim  sim runs on a simulated device in host memory (sets ZICO_BACKEND)\n"
    "  --mode vmm|um       um: unified memory, pages beyond the budget move to host\n"
    "                      memory and back instead of failing (sets ZICO_MODE)\n"
    "  --log error|warn|info|debug\n"
    "                      how much zicoum logs to stderr (sets ZICO_LOG)\n"
    "  --library PATH      libzicoum.so to preload (default: $ZICO_LIBRARY, else\n"
    "                      ../lib/libzicoum.so beside zico-run)\n"
    "  --list-env          print every ZICO_* variable with its default and form\n"
    "  -h, --help          print this help\n"
    "  --version           print the version\n"
    "\n"
    "Other ZICO_* variables in the environment pass through to COMMAND and are\n"
    "checked first. Exit status: COMMAND's, or 2 for a usage error, 126 if COMMAND\n"
    "cannot be executed, 127 if it is not found.\n";

struct Options {
  std::optional<std::string> budget;
  std::optional<std::string> backend;
  std::optional<std::string> mode;
  std::optional<std::string> log;
  std::optional<std::string> library;
  bool help = false;
  bool version = false;
  bool list_env = false;
  char** command = nullptr;  // NULL-terminated, as execvp wants it
};

int usage_error(const std::string& message) {
  std::fprintf(stderr, "zico-run: %s\nTry 'zico-run --help'.\n", message.c_str());
  return kUsageError;
}

// Returns an exit code when parsing must stop there.
std::optional<int> parse_args(int argc, char** argv, Options* options) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") {
      if (i + 1 == argc) return usage_error("no command given after --");
      options->command = argv + i + 1;
      return std::nullopt;
    }
    if (arg == "-h") {
      options->help = true;
      continue;
    }
    if (!arg.starts_with("--")) {
      return usage_error("unexpected '" + std::string(arg) + "'; put the command after --, e.g. zico-run -- " +
                         std::string(arg));
    }
    const size_t equals = arg.find('=');
    const std::string name(arg.substr(0, equals));
    const std::optional<std::string> inline_value =
        equals == std::string_view::npos ? std::nullopt : std::optional<std::string>(arg.substr(equals + 1));

    bool* flag = name == "--help"       ? &options->help
                 : name == "--version"  ? &options->version
                 : name == "--list-env" ? &options->list_env
                                        : nullptr;
    if (flag != nullptr) {
      if (inline_value) return usage_error(name + " takes no value");
      *flag = true;
      continue;
    }
    std::optional<std::string>* slot = name == "--budget"    ? &options->budget
                                       : name == "--backend" ? &options->backend
                                       : name == "--mode"    ? &options->mode
                                       : name == "--log"     ? &options->log
                                       : name == "--library" ? &options->library
                                                             : nullptr;
    if (slot == nullptr) return usage_error("unknown option '" + name + "'");
    if (inline_value) {
      *slot = inline_value;
    } else if (i + 1 < argc && std::string_view(argv[i + 1]) != "--") {
      *slot = argv[++i];
    } else {
      return usage_error(name + " needs a value");
    }
  }
  if (options->help || options->version || options->list_env) return std::nullopt;
  return usage_error("no command given; put it after --, e.g. zico-run --budget 6GiB -- python train.py");
}

bool is_one_of(const std::string& value, std::initializer_list<std::string_view> accepted) {
  return std::find(accepted.begin(), accepted.end(), value) != accepted.end();
}

std::optional<int> validate(const Options& options) {
  if (options.budget) {
    const std::optional<uint64_t> bytes = zico::parse_size(*options.budget);
    if (!bytes || *bytes == 0) return usage_error(zico::size_above_zero_error("--budget", *options.budget));
    // In VMM mode nothing smaller than a chunk is ever mapped (2 MiB, every
    // NVIDIA GPU's granularity; a larger ZICO_CHUNK_SIZE the library checks,
    // and a smaller simulated one, ZICO_SIM_GRANULARITY, too).
    constexpr uint64_t kChunk = uint64_t{2} << 20;
    const char* env_mode = std::getenv("ZICO_MODE");
    const std::string mode = options.mode.value_or(env_mode != nullptr ? env_mode : "vmm");
    if (mode == "vmm" && std::getenv("ZICO_SIM_GRANULARITY") == nullptr && *bytes < kChunk) {
      return usage_error("--budget " + zico::format_size(*bytes) + " is smaller than one chunk (2 MiB), the least " +
                         "that is mapped: nothing could ever be allocated; use at least 2MiB");
    }
  }
  if (options.backend && !is_one_of(*options.backend, {"cuda", "sim"})) {
    return usage_error("--backend '" + *options.backend + "' is not valid; expected cuda or sim");
  }
  if (options.mode && !is_one_of(*options.mode, {"vmm", "um"})) {
    return usage_error("--mode '" + *options.mode + "' is not valid; expected vmm or um");
  }
  if (options.log && !is_one_of(*options.log, {"error", "warn", "info", "debug"})) {
    return usage_error("--log '" + *options.log + "' is not valid; expected error, warn, info or debug");
  }
  return std::nullopt;
}

// `text` wrapped at 80 columns, each line indented by four spaces.
void print_wrapped(const std::string& text) {
  constexpr size_t kWidth = 80;
  const std::string indent = "    ";
  std::string line = indent;
  size_t at = 0;
  while (at < text.size()) {
    const size_t start = text.find_first_not_of(' ', at);
    if (start == std::string::npos) break;
    const size_t end = std::min(text.find(' ', start), text.size());
    const std::string word = text.substr(start, end - start);
    if (line.size() > indent.size() && line.size() + 1 + word.size() > kWidth) {
      std::printf("%s\n", line.c_str());
      line = indent;
    }
    line += (line.size() > indent.size() ? " " : "") + word;
    at = end;
  }
  if (line.size() > indent.size()) std::printf("%s\n", line.c_str());
}

// One block per variable, to fit an 80-column terminal: its name, then its
// default and accepted values and what it means, wrapped and indented.
void print_option_table() {
  for (const zico::OptionInfo& option : zico::option_table()) {
    std::printf("%s\n", option.name);
    print_wrapped(std::string("default: ") + option.default_text + "; accepted: " + option.accepted);
    print_wrapped(option.meaning);
  }
}

// Where libzicoum.so may be, in order, each with why it was tried. An explicit
// choice is the only candidate: falling back from a path the user named would
// silently preload a different build.
std::vector<std::pair<fs::path, std::string>> library_candidates(const Options& options) {
  if (options.library) return {{*options.library, "--library"}};
  if (const char* env = std::getenv("ZICO_LIBRARY"); env != nullptr && *env != '\0') return {{env, "ZICO_LIBRARY"}};
  std::error_code error;
  const fs::path exe = fs::read_symlink("/proc/self/exe", error);
  if (error) return {};
  // The build tree always has lib/ beside bin/; the install tree has whatever
  // CMAKE_INSTALL_LIBDIR is relative to CMAKE_INSTALL_BINDIR.
  std::vector<std::pair<fs::path, std::string>> candidates{
      {exe.parent_path() / "../lib" / kLibraryName, "beside zico-run"}};
  const fs::path installed = exe.parent_path() / ZICO_RELATIVE_LIBDIR / kLibraryName;
  if (installed.lexically_normal() != candidates[0].first.lexically_normal()) {
    candidates.emplace_back(installed, "beside zico-run, installed");
  }
  return candidates;
}

std::optional<fs::path> find_library(const Options& options) {
  const auto candidates = library_candidates(options);
  std::string tried;
  for (const auto& [path, source] : candidates) {
    std::error_code error;
    fs::path absolute = fs::absolute(path, error).lexically_normal();
    if (error) absolute = path;
    if (fs::is_regular_file(absolute, error)) return absolute;
    tried += "\n  " + absolute.string() + " (" + source + ")";
  }
  std::fprintf(stderr,
               "zico-run: cannot find %s; tried:%s\n"
               "Pass --library PATH or set ZICO_LIBRARY to its location.\n",
               kLibraryName, tried.empty() ? " nothing (cannot read /proc/self/exe)" : tried.c_str());
  return std::nullopt;
}

void set_env(const char* name, const std::string& value) {
  if (setenv(name, value.c_str(), 1) != 0) {
    std::fprintf(stderr, "zico-run: cannot set %s: %s\n", name, std::strerror(errno));
    std::exit(kUsageError);
  }
}

// PyTorch's expandable segments map memory with the driver's own calls
// (cuMemCreate through cuGetProcAddress), which no preload sees: its
// tensors would live outside the budget. zico-run turns them off, saying so.
void turn_off_expandable_segments() {
  const auto trim = [](std::string text) {
    const size_t first = text.find_first_not_of(" \t");
    const size_t last = text.find_last_not_of(" \t");
    return first == std::string::npos ? std::string() : text.substr(first, last - first + 1);
  };
  for (const char* name : {"PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"}) {
    const char* value = std::getenv(name);
    if (value == nullptr) continue;
    // PyTorch reads "key:value" items split by commas, spaces allowed.
    std::string rebuilt;
    bool changed = false;
    std::string text = value;
    for (size_t start = 0; start <= text.size();) {
      const size_t comma = std::min(text.find(',', start), text.size());
      std::string item = text.substr(start, comma - start);
      if (const size_t colon = item.find(':'); colon != std::string::npos &&
                                                trim(item.substr(0, colon)) == "expandable_segments") {
        const std::string setting = trim(item.substr(colon + 1));
        if (setting == "True" || setting == "true" || setting == "1") {
          item = "expandable_segments:False";
          changed = true;
        }
      }
      rebuilt += (start == 0 ? "" : ",") + item;
      start = comma + 1;
    }
    if (changed) {
      std::fprintf(stderr,
                   "zico-run: %s asks for expandable_segments, whose memory PyTorch maps itself, outside zicoum's "
                   "budget; the command runs with %s=%s\n",
                   name, name, rebuilt.c_str());
      set_env(name, rebuilt);
    }
  }
}

// Sets the child's environment; returns an exit code on failure.
std::optional<int> prepare_environment(const Options& options, const fs::path& library) {
  const std::string path = library.string();
  // ld.so splits LD_PRELOAD at colons and spaces; such a path cannot be preloaded.
  if (path.find_first_of(": ") != std::string::npos) {
    return usage_error("cannot preload '" + path + "': LD_PRELOAD paths may not contain ':' or ' '");
  }
  const char* inherited = std::getenv("LD_PRELOAD");
  set_env("LD_PRELOAD", inherited != nullptr && *inherited != '\0' ? path + ":" + inherited : path);
  // The zicoum Python package loads this same copy: two copies in one process
  // would be two managers, each with its own budget.
  set_env("ZICO_LIBRARY", path);
  if (options.budget) set_env("ZICO_BUDGET", *options.budget);
  if (options.backend) set_env("ZICO_BACKEND", *options.backend);
  if (options.mode) set_env("ZICO_MODE", *options.mode);
  if (options.log) set_env("ZICO_LOG", *options.log);
  turn_off_expandable_segments();

  // Our own options were checked already, so a failure here is inherited.
  zico::Config config;
  std::string error;
  if (!zico::load_config_from_environment(&config, &error).is_ok()) {
    std::fprintf(stderr, "zico-run: %s (inherited from the environment)\n", error.c_str());
    return kUsageError;
  }
  const std::string unknown = zico::unknown_variables(environ);
  if (!unknown.empty()) {
    std::fprintf(stderr, "zico-run: warning: zicoum ignores unknown %s (see zico-run --list-env)\n",
                 unknown.c_str());
  }
  return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  if (const std::optional<int> exit_code = parse_args(argc, argv, &options)) return *exit_code;
  if (options.help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (options.version) {
    std::printf("zico-run (zicoum) %s\n", ZICO_VERSION);
    return 0;
  }
  if (options.list_env) {
    print_option_table();
    return 0;
  }
  if (const std::optional<int> exit_code = validate(options)) return *exit_code;
  const std::optional<fs::path> library = find_library(options);
  if (!library) return kUsageError;
  if (const std::optional<int> exit_code = prepare_environment(options, *library)) return *exit_code;

  execvp(options.command[0], options.command);
  const int error = errno;
  // As for execvp, a name without a slash is looked for on PATH only.
  std::string where;
  if (error == ENOENT && std::strchr(options.command[0], '/') == nullptr) {
    where = " (not found on PATH";
    if (::access(options.command[0], F_OK) == 0) {
      where += std::string("; for the file here, write ./") + options.command[0];
    }
    where += ")";
  }
  std::fprintf(stderr, "zico-run: '%s': %s%s\n", options.command[0], std::strerror(error), where.c_str());
  return error == ENOENT || error == ENOTDIR ? kNotFound : kCannotExecute;
}
