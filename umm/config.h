// Configuration: the one table of ZICO_* environment variables.
//
// Every variable the library or its tools read is listed in option_table()
// with its default and accepted form; README.md's table mirrors it (a test
// keeps them in step) and `zico-run --list-env` prints it. A malformed value
// is never guessed at: load_config() fails with a message that names the
// variable, the offending value and the accepted form.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>

#include "gpu_calibration.h"
#include "log.h"
#include "status.h"

namespace zico {

enum class Backend : uint8_t { kCuda, kSim };
// vmm: physical chunks mapped into the arena, capped by the budget (an
// allocation beyond it fails). um: the arena is unified memory, which can
// hold more than the budget; the pager keeps the pages on the GPU within it.
enum class Mode : uint8_t { kVmm, kUm };

struct Config {
  Backend backend = Backend::kCuda;
  Mode mode = Mode::kVmm;
  std::string paging_policy = "zico";  // UM mode: one of prefetch/'s kPolicyNames
  bool fault_reports = false;          // UM mode: the pager learns from the driver's fault reports
  // UM mode: the arena is device memory swapped explicitly
  // (swap_arena_driver.h) instead of managed memory.
  bool um_swap = false;
  std::optional<uint64_t> budget;      // per device; nullopt: the device's memory
  LogLevel log_level = LogLevel::kWarn;
  bool static_runtimes = false;  // libzicoum/dlsym_interpose.cpp reads it itself, before any runtime
  std::optional<uint64_t> chunk_size;  // nullopt: the driver's granularity
  std::optional<uint64_t> arena_size;  // VA per device; nullopt: 4x device memory
  // UM mode: the host link's rate each way; nullopt: the transfer model's
  // (an H100 on PCIe Gen5). The pager plans with it, and the sim backend's
  // device moves pages at it.
  std::optional<double> host_bytes_per_second;
  // UM mode: the figures of a calibration file (ZICO_GPU_CALIBRATION), set
  // on the pager's transfer model and the sim backend's managed costs before
  // host_bytes_per_second, which wins where both give the link's rate.
  std::optional<GpuCalibration> gpu_calibration;
  uint64_t sim_capacity = uint64_t{80} << 30;
  uint64_t sim_granularity = uint64_t{2} << 20;
  int sim_devices = 1;
  bool sim_process_memory = true;
  uintptr_t sim_capturing_stream = 0;
  std::string sim_device_board;  // "" : the simulated devices are this process's alone
  std::string swap_dir;             // "": the NVMe store's default directory
  uint32_t nvme_queue_depth = 32;
  uint32_t nvme_staging_buffers = 4;
  uint64_t nvme_io_bytes = uint64_t{512} << 10;
  std::string socket_path = "/run/zicoum/zicoum.sock";  // "off": never use zico-umd
  uint64_t wait_timeout_ns = uint64_t{60} * 1'000'000'000;  // waiting for zico-umd to lend memory
  uint32_t daemon_uid = 0;  // besides the job's own user, who may run the zico-umd it trusts
  std::string job_name;     // "": the program and its first argument
};

inline constexpr const char* kDefaultSocketPath = "/run/zicoum/zicoum.sock";

struct OptionInfo {
  const char* name;
  const char* default_text;
  const char* accepted;
  const char* meaning;
};

[[nodiscard]] std::span<const OptionInfo> option_table() noexcept;

using EnvLookup = std::function<const char*(const char* name)>;

// Reads every variable in the table. On the first bad value returns
// kConfigError and sets *error to one line naming it. Unknown ZICO_* names in
// `environment` (NULL-terminated, like environ) are reported in *warnings.
[[nodiscard]] Status load_config(const EnvLookup& lookup, Config* out, std::string* error);
[[nodiscard]] std::string unknown_variables(char** environment);

// The process environment.
[[nodiscard]] Status load_config_from_environment(Config* out, std::string* error);

}  // namespace zico
