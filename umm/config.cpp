#include "config.h"

#include <pwd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <utility>

#include "sizes.h"


namespace zico {
namespace {

constexpr OptionInfo kOptions[] = {
    {"ZICO_BACKEND", "cuda", "cuda | sim",
     "cuda: the GPU through libcuda.so.1; sim: simulated device in host memory (no GPU needed)"},
    {"ZICO_MODE", "vmm", "vmm | um",
     "vmm: physical memory mapped on demand, allocations beyond the budget fail; um: unified memory, "
     "pages beyond the budget move to host memory and back (beyond capacity)"},
    {"ZICO_BUDGET", "device memory", "size > 0, e.g. 6GiB",
     "vmm: cap on physical memory mapped per device, allocations beyond it fail with out-of-memory; "
     "um: cap on the job's pages on each GPU"},
    {"ZICO_PAGING_POLICY", "zico", "zico | deepum | autoswap | um",
     "UM mode: how pages move (zico: planned from the learned iteration; deepum: correlation prefetching; "
     "autoswap: swap planning per iteration; um: on demand only)"},
    {"ZICO_UM_MEMORY", "managed", "managed | swap",
     "UM mode: managed: unified memory, a page no launch names faults in, but the device keeps the memory of "
     "pages sent away; swap: device memory swapped to host memory explicitly, given back to the device as pages "
     "leave (every page a kernel touches must be named by its launch: an unnamed one is an illegal address)"},
    {"ZICO_LOG", "warn", "error | warn | info | debug", "how much the library logs to stderr"},
    {"ZICO_FAULT_REPORTS", "off", "on | off",
     "UM mode: learn what kernels use beyond their parameters from the GPU's fault reports (CUPTI, loaded at run "
     "time; on an H100 it cost a PyTorch MLP 4% of its time, hence off)"},
    {"ZICO_STATIC_RUNTIMES", "off (on under ZICO_UM_MEMORY=swap)", "on | off",
     "on: libraries with the CUDA runtime inside them (cuBLAS, cuDNN) allocate and launch through zicoum too "
     "(their dlsym of the driver's cuGetProcAddress gets zicoum's; x86-64; one GPU run so far)"},
    {"ZICO_CHUNK_SIZE", "driver granularity", "power-of-two size, a multiple of the granularity",
     "unit of physical memory mapped and unmapped (2 MiB on H100)"},
    {"ZICO_ARENA_SIZE", "vmm: 4 x device memory; um: the device's free memory", "size > 0",
     "address space reserved per device; allocations keep their addresses inside it (UM mode: the managed memory "
     "the job may allocate; more than the GPU has free can hang some GPUs)"},
    {"ZICO_HOST_BANDWIDTH", "55GB/s", "size per second > 0, e.g. 25GB/s",
     "UM mode: the host link each way (PCIe Gen5 x16 about 55GB/s, Gen4 about 25GB/s): what the pager plans "
     "its moves with, and the sim backend's device moves them at; the fault path scales with it"},
    {"ZICO_GPU_CALIBRATION", "none", "a calibration file (JSON, docs/gpu-report.md)",
     "UM mode: the costs the GPU suite's calibration step measured (calibration.json: link rates, fault path, host "
     "time per call): what the pager plans its moves with, and the sim backend's device charges; "
     "ZICO_HOST_BANDWIDTH, also set, then moves the link's rates to its own"},
    {"ZICO_SIM_CAPACITY", "80GiB", "size > 0", "sim backend: memory of each simulated device"},
    {"ZICO_SIM_GRANULARITY", "2MiB", "power of two, 4KiB..1GiB", "sim backend: allocation granularity"},
    {"ZICO_SIM_DEVICES", "1", "integer 1..64", "sim backend: number of simulated devices"},
    {"ZICO_SIM_CAPTURING_STREAM", "none", "a stream handle in hex, e.g. 0x5000",
     "sim backend: a stream the driver reports as capturing a CUDA graph (tests of what zicoum refuses there)"},
    {"ZICO_SIM_PROCESS_MEMORY", "on", "on | off",
     "sim backend: whether the driver can tell what a process holds (off: as the CUDA backend, which cannot yet)"},
    {"ZICO_SIM_DEVICE_BOARD", "none", "a file path (created if missing)",
     "sim backend: processes naming the same file share their simulated devices' memory, as processes share a GPU "
     "(what each reports free, and unified memory's kept pages handed to another's allocation)"},
    {"ZICO_SWAP_DIR", "/var/tmp/zicoum-<uid>", "a directory on a file system with O_DIRECT",
     "where zico_suspend(..., ZICO_STORE_NVME) writes the job's swap file; not a symbolic link, owned by the user "
     "or root, not writable by every user unless sticky"},
    {"ZICO_NVME_QUEUE_DEPTH", "32", "integer 1..4096", "io_uring requests in flight for the swap file"},
    {"ZICO_NVME_STAGING_BUFFERS", "4", "integer 2..1024", "pinned chunk-sized buffers between the GPU and the disk"},
    {"ZICO_NVME_IO_SIZE", "512KiB", "size, a multiple of 4KiB", "size of each swap-file read or write"},
    {"ZICO_LIBRARY", "found beside the tool", "path to libzicoum.so",
     "zico-run and the Python package: which libzicoum to load"},
    {"ZICO_SOCKET", "/run/zicoum/zicoum.sock", "a socket path, or off",
     "zico-umd's socket; when it exists the job borrows memory from the node manager, else it runs standalone"},
    {"ZICO_WAIT_TIMEOUT", "60s", kDurationForm,
     "how long an allocation waits for zico-umd to register the job or lend memory before it fails with out-of-memory"},
    {"ZICO_DAEMON_USER", "root", "a user name or uid",
     "who may run the zico-umd the job trusts: a listener on ZICO_SOCKET owned by anyone else (nor by the job's own "
     "user) gets no memory through it"},
    {"ZICO_JOB_NAME", "the program and its first argument", "printable ASCII, 1-255 characters",
     "how zico-umd, zico-umctl jobs/top and the metrics name this job"},
    {"ZICO_ON_DEADLOCK", "yield", "yield | fail",
     "zico-umd: when every job waits, one gives its memory back for a while (yield) or the youngest fails (fail)"},
};

// Digits only: strtol would also take leading spaces and a sign.
std::optional<long> parse_decimal(const char* text) {
  long value = 0;
  if (*text == '\0') return std::nullopt;
  for (const char* c = text; *c != '\0'; ++c) {
    if (*c < '0' || *c > '9' || value > 1'000'000'000) return std::nullopt;
    value = value * 10 + (*c - '0');
  }
  return value;
}

std::string bad_value(const char* name, const char* value, const char* accepted) {
  return std::string(name) + "='" + value + "' is not valid; expected " + accepted;
}

Status parse_size_option(const char* name, const char* value, std::optional<uint64_t>* out, std::string* error) {
  const std::optional<uint64_t> parsed = parse_size(value);
  if (!parsed || *parsed == 0) {
    *error = size_above_zero_error(std::string(name) + "=", value);
    return Status(Errc::kConfigError);
  }
  *out = parsed;
  return Status::ok();
}

}  // namespace

std::span<const OptionInfo> option_table() noexcept { return kOptions; }

Status load_config(const EnvLookup& lookup, Config* out, std::string* error) {
  Config config;
  if (const char* v = lookup("ZICO_BACKEND")) {
    if (std::strcmp(v, "cuda") == 0) {
      config.backend = Backend::kCuda;
    } else if (std::strcmp(v, "sim") == 0) {
      config.backend = Backend::kSim;
    } else {
      *error = bad_value("ZICO_BACKEND", v, "cuda or sim");
      return Status(Errc::kConfigError);
    }
  }
  if (const char* v = lookup("ZICO_MODE")) {
    if (std::strcmp(v, "vmm") == 0) {
      config.mode = Mode::kVmm;
    } else if (std::strcmp(v, "um") == 0) {
      config.mode = Mode::kUm;
    } else {
      *error = bad_value("ZICO_MODE", v, "vmm or um");
      return Status(Errc::kConfigError);
    }
  }
  if (const char* v = lookup("ZICO_PAGING_POLICY")) {
    // The names of prefetch/'s policies (kPolicyNames; a paging test keeps
    // the two lists in step).
    static constexpr const char* kPolicies[] = {"zico", "deepum", "autoswap", "um"};
    if (std::none_of(std::begin(kPolicies), std::end(kPolicies), [v](const char* p) { return std::strcmp(v, p) == 0; })) {
      *error = bad_value("ZICO_PAGING_POLICY", v, "zico, deepum, autoswap or um");
      return Status(Errc::kConfigError);
    }
    config.paging_policy = v;
  }
  if (const char* v = lookup("ZICO_JOB_NAME")) {
    const std::string_view name(v);
    if (name.empty() || name.size() > 255 ||
        std::any_of(name.begin(), name.end(), [](char c) { return c < 0x20 || c > 0x7e; })) {
      *error = bad_value("ZICO_JOB_NAME", v, "printable ASCII, 1 to 255 characters");
      return Status(Errc::kConfigError);
    }
    config.job_name = v;
  }
  if (const char* v = lookup("ZICO_BUDGET")) ZICO_RETURN_IF_ERROR(parse_size_option("ZICO_BUDGET", v, &config.budget, error));
  if (const char* v = lookup("ZICO_LOG")) {
    static constexpr std::pair<const char*, LogLevel> kLevels[] = {
        {"error", LogLevel::kError}, {"warn", LogLevel::kWarn}, {"info", LogLevel::kInfo}, {"debug", LogLevel::kDebug}};
    bool found = false;
    for (const auto& [text, level] : kLevels) {
      if (std::strcmp(v, text) == 0) {
        config.log_level = level;
        found = true;
      }
    }
    if (!found) {
      *error = bad_value("ZICO_LOG", v, "error, warn, info or debug");
      return Status(Errc::kConfigError);
    }
  }
  if (const char* v = lookup("ZICO_CHUNK_SIZE")) {
    ZICO_RETURN_IF_ERROR(parse_size_option("ZICO_CHUNK_SIZE", v, &config.chunk_size, error));
  }
  if (const char* v = lookup("ZICO_ARENA_SIZE")) {
    ZICO_RETURN_IF_ERROR(parse_size_option("ZICO_ARENA_SIZE", v, &config.arena_size, error));
  }
  if (const char* v = lookup("ZICO_HOST_BANDWIDTH")) {
    const std::optional<uint64_t> bytes = parse_rate(v);
    if (!bytes) {
      *error = bad_value("ZICO_HOST_BANDWIDTH", v, kRateForm);
      return Status(Errc::kConfigError);
    }
    config.host_bytes_per_second = static_cast<double>(*bytes);
  }
  if (const char* v = lookup("ZICO_GPU_CALIBRATION")) {
    GpuCalibration calibration;
    std::string why;
    if (*v == '\0' || !read_gpu_calibration_file(v, &calibration, &why).is_ok()) {
      if (why.empty()) why = "expected the path of a calibration file (JSON)";
      *error = std::string("ZICO_GPU_CALIBRATION='") + v + "' is not valid: " + why;
      return Status(Errc::kConfigError);
    }
    config.gpu_calibration = std::move(calibration);
  }
  std::optional<uint64_t> size;
  if (const char* v = lookup("ZICO_SIM_CAPACITY")) {
    ZICO_RETURN_IF_ERROR(parse_size_option("ZICO_SIM_CAPACITY", v, &size, error));
    config.sim_capacity = *size;
  }
  if (const char* v = lookup("ZICO_SIM_GRANULARITY")) {
    const std::optional<uint64_t> g = parse_size(v);
    if (!g || *g < 4096 || *g > (uint64_t{1} << 30) || (*g & (*g - 1)) != 0) {
      *error = bad_value("ZICO_SIM_GRANULARITY", v, "a power of two from 4KiB to 1GiB");
      return Status(Errc::kConfigError);
    }
    config.sim_granularity = *g;
  }
  if (const char* v = lookup("ZICO_SIM_DEVICES")) {
    const std::optional<long> n = parse_decimal(v);
    if (!n || *n < 1 || *n > 64) {
      *error = bad_value("ZICO_SIM_DEVICES", v, "an integer from 1 to 64");
      return Status(Errc::kConfigError);
    }
    config.sim_devices = static_cast<int>(*n);
  }
  if (const char* v = lookup("ZICO_SIM_CAPTURING_STREAM")) {
    char* end = nullptr;
    errno = 0;
    const unsigned long long handle = std::strtoull(v, &end, 16);
    if (std::strncmp(v, "0x", 2) != 0 || v[2] == '\0' || *end != '\0' || errno != 0 || handle == 0) {
      *error = bad_value("ZICO_SIM_CAPTURING_STREAM", v, "a non-zero stream handle in hex, e.g. 0x5000");
      return Status(Errc::kConfigError);
    }
    config.sim_capturing_stream = static_cast<uintptr_t>(handle);
  }
  if (const char* v = lookup("ZICO_UM_MEMORY")) {
    if (std::strcmp(v, "managed") != 0 && std::strcmp(v, "swap") != 0) {
      *error = bad_value("ZICO_UM_MEMORY", v, "managed or swap");
      return Status(Errc::kConfigError);
    }
    config.um_swap = std::strcmp(v, "swap") == 0;
  }
  if (const char* v = lookup("ZICO_FAULT_REPORTS")) {
    if (std::strcmp(v, "on") != 0 && std::strcmp(v, "off") != 0) {
      *error = bad_value("ZICO_FAULT_REPORTS", v, "on or off");
      return Status(Errc::kConfigError);
    }
    config.fault_reports = std::strcmp(v, "on") == 0;
  }
  if (const char* v = lookup("ZICO_STATIC_RUNTIMES")) {
    if (std::strcmp(v, "on") != 0 && std::strcmp(v, "off") != 0) {
      *error = bad_value("ZICO_STATIC_RUNTIMES", v, "on or off");
      return Status(Errc::kConfigError);
    }
    config.static_runtimes = std::strcmp(v, "on") == 0;
  }
  if (const char* v = lookup("ZICO_SIM_PROCESS_MEMORY")) {
    if (std::strcmp(v, "on") != 0 && std::strcmp(v, "off") != 0) {
      *error = bad_value("ZICO_SIM_PROCESS_MEMORY", v, "on or off");
      return Status(Errc::kConfigError);
    }
    config.sim_process_memory = std::strcmp(v, "on") == 0;
  }
  if (const char* v = lookup("ZICO_SIM_DEVICE_BOARD")) {
    if (*v == '\0') {
      *error = bad_value("ZICO_SIM_DEVICE_BOARD", v, "a file path");
      return Status(Errc::kConfigError);
    }
    config.sim_device_board = v;
  }
  if (const char* v = lookup("ZICO_SWAP_DIR")) {
    if (*v == '\0') {
      *error = bad_value("ZICO_SWAP_DIR", v, "a directory path");
      return Status(Errc::kConfigError);
    }
    config.swap_dir = v;
  }
  const auto integer = [&](const char* name, long lo, long hi, uint32_t* value) -> Status {
    const char* v = lookup(name);
    if (v == nullptr) return Status::ok();
    const std::optional<long> n = parse_decimal(v);
    if (!n || *n < lo || *n > hi) {
      *error = bad_value(name, v, ("an integer from " + std::to_string(lo) + " to " + std::to_string(hi)).c_str());
      return Status(Errc::kConfigError);
    }
    *value = static_cast<uint32_t>(*n);
    return Status::ok();
  };
  ZICO_RETURN_IF_ERROR(integer("ZICO_NVME_QUEUE_DEPTH", 1, 4096, &config.nvme_queue_depth));
  ZICO_RETURN_IF_ERROR(integer("ZICO_NVME_STAGING_BUFFERS", 2, 1024, &config.nvme_staging_buffers));
  if (const char* v = lookup("ZICO_NVME_IO_SIZE")) {
    const std::optional<uint64_t> bytes = parse_size(v);
    if (!bytes || *bytes == 0 || *bytes % 4096 != 0) {
      *error = bad_value("ZICO_NVME_IO_SIZE", v, "a size that is a multiple of 4KiB, e.g. 512KiB");
      return Status(Errc::kConfigError);
    }
    config.nvme_io_bytes = *bytes;
  }
  if (const char* v = lookup("ZICO_SOCKET")) {
    if (*v == '\0') {
      *error = bad_value("ZICO_SOCKET", v, "a socket path, or off");
      return Status(Errc::kConfigError);
    }
    config.socket_path = v;
  }
  if (const char* v = lookup("ZICO_WAIT_TIMEOUT")) {
    const std::optional<uint64_t> ns = parse_duration_ns(v);
    if (!ns) {
      *error = bad_value("ZICO_WAIT_TIMEOUT", v, kDurationForm);
      return Status(Errc::kConfigError);
    }
    config.wait_timeout_ns = *ns;
  }
  if (const char* v = lookup("ZICO_DAEMON_USER")) {
    const std::optional<long> number = parse_decimal(v);
    passwd entry{};
    passwd* found = nullptr;
    char buffer[4096];
    if (number && *number >= 0 && *number < INT32_MAX) {
      config.daemon_uid = static_cast<uint32_t>(*number);
    } else if (*v != '\0' && ::getpwnam_r(v, &entry, buffer, sizeof buffer, &found) == 0 && found != nullptr) {
      config.daemon_uid = found->pw_uid;
    } else {
      *error = bad_value("ZICO_DAEMON_USER", v, "a user name of this machine or a uid");
      return Status(Errc::kConfigError);
    }
  }
  if (const char* v = lookup("ZICO_ON_DEADLOCK")) {
    if (std::strcmp(v, "yield") != 0 && std::strcmp(v, "fail") != 0) {
      *error = bad_value("ZICO_ON_DEADLOCK", v, "yield or fail");
      return Status(Errc::kConfigError);
    }
  }
  if (config.sim_capacity < config.sim_granularity) {
    *error = "ZICO_SIM_CAPACITY must be at least ZICO_SIM_GRANULARITY (" + format_size(config.sim_granularity) + ")";
    return Status(Errc::kConfigError);
  }
  *out = config;
  return Status::ok();
}

std::string unknown_variables(char** environment) {
  std::string unknown;
  for (char** entry = environment; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string_view text(*entry);
    if (!text.starts_with("ZICO_")) continue;
    const std::string_view name = text.substr(0, text.find('='));
    bool known = false;
    for (const OptionInfo& option : kOptions) known = known || name == option.name;
    if (!known) {
      if (!unknown.empty()) unknown += ", ";
      unknown += name;
    }
  }
  return unknown;
}

Status load_config_from_environment(Config* out, std::string* error) {
  return load_config([](const char* name) { return std::getenv(name); }, out, error);
}

}  // namespace zico
