#include "config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

namespace zico {
namespace {

Status load(const std::map<std::string, std::string>& env, Config* config, std::string* error) {
  return load_config(
      [&env](const char* name) -> const char* {
        auto it = env.find(name);
        return it == env.end() ? nullptr : it->second.c_str();
      },
      config, error);
}

TEST(Config, DefaultsWhenNothingIsSet) {
  Config config;
  std::string error;
  ASSERT_TRUE(load({}, &config, &error).is_ok());
  EXPECT_EQ(config.backend, Backend::kCuda);
  EXPECT_FALSE(config.budget.has_value());
  EXPECT_EQ(config.log_level, LogLevel::kWarn);
  EXPECT_EQ(config.mode, Mode::kVmm);
  EXPECT_EQ(config.paging_policy, "zico");
  EXPECT_FALSE(config.host_bytes_per_second.has_value()) << "the transfer model's own";
}

TEST(Config, ReadsEveryVariable) {
  Config config;
  std::string error;
  ASSERT_TRUE(load({{"ZICO_BACKEND", "sim"},
                    {"ZICO_BUDGET", "6GiB"},
                    {"ZICO_LOG", "debug"},
                    {"ZICO_CHUNK_SIZE", "4MiB"},
                    {"ZICO_ARENA_SIZE", "1TiB"},
                    {"ZICO_SIM_CAPACITY", "16GiB"},
                    {"ZICO_SIM_GRANULARITY", "64KiB"},
                    {"ZICO_SIM_DEVICES", "2"},
                    {"ZICO_MODE", "um"},
                    {"ZICO_PAGING_POLICY", "deepum"},
                    {"ZICO_FAULT_REPORTS", "on"},
                    {"ZICO_UM_MEMORY", "swap"},
                    {"ZICO_HOST_BANDWIDTH", "25GB/s"},
                    {"ZICO_JOB_NAME", "bert fine-tune #3"}},
                   &config, &error)
                  .is_ok())
      << error;
  EXPECT_EQ(config.backend, Backend::kSim);
  EXPECT_EQ(config.budget, uint64_t{6} << 30);
  EXPECT_EQ(config.log_level, LogLevel::kDebug);
  EXPECT_EQ(config.chunk_size, uint64_t{4} << 20);
  EXPECT_EQ(config.arena_size, uint64_t{1} << 40);
  EXPECT_EQ(config.sim_capacity, uint64_t{16} << 30);
  EXPECT_EQ(config.sim_granularity, uint64_t{64} << 10);
  EXPECT_EQ(config.sim_devices, 2);
  EXPECT_EQ(config.mode, Mode::kUm);
  EXPECT_EQ(config.paging_policy, "deepum");
  EXPECT_TRUE(config.fault_reports);
  EXPECT_TRUE(config.um_swap);
  EXPECT_EQ(config.host_bytes_per_second, 25e9);
  EXPECT_EQ(config.job_name, "bert fine-tune #3");
}

TEST(Config, BadValuesNameTheVariableValueAndForm) {
  const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
      {"ZICO_BUDGET", "12XB", "MiB"},       {"ZICO_BUDGET", "0", "ZICO_BUDGET='0' is not a size above 0"},
      {"ZICO_BUDGET", "-1", "MiB"},          {"ZICO_BACKEND", "rocm", "cuda or sim"},
      {"ZICO_LOG", "loud", "debug"},         {"ZICO_SIM_GRANULARITY", "3MiB", "power of two"},
      {"ZICO_SIM_DEVICES", "0", "1 to 64"},  {"ZICO_SIM_DEVICES", "2x", "1 to 64"},
      {"ZICO_CHUNK_SIZE", "", "MiB"},
      {"ZICO_NVME_QUEUE_DEPTH", "0", "1 to 4096"},  {"ZICO_NVME_QUEUE_DEPTH", " 8", "1 to 4096"},
      {"ZICO_SIM_DEVICES", "+2", "1 to 64"},  {"ZICO_NVME_STAGING_BUFFERS", "1", "2 to 1024"},
      {"ZICO_NVME_IO_SIZE", "1000", "multiple of 4KiB"}, {"ZICO_SWAP_DIR", "", "directory"},
      {"ZICO_MODE", "foo", "vmm or um"},     {"ZICO_MODE", "UM", "vmm or um"},
      {"ZICO_PAGING_POLICY", "lru", "zico, deepum, autoswap or um"},
      {"ZICO_JOB_NAME", "", "printable ASCII"},      {"ZICO_JOB_NAME", "a\tb", "printable ASCII"},
      {"ZICO_STATIC_RUNTIMES", "yes", "on or off"},  {"ZICO_FAULT_REPORTS", "cupti", "on or off"},
      {"ZICO_UM_MEMORY", "vmm", "managed or swap"},
      {"ZICO_HOST_BANDWIDTH", "fast", "e.g. 25GB/s"},  {"ZICO_HOST_BANDWIDTH", "0GB/s", "above 0"},
      {"ZICO_HOST_BANDWIDTH", "/s", "size per second"},
      {"ZICO_GPU_CALIBRATION", "", "calibration file"},
      {"ZICO_GPU_CALIBRATION", "/nonexistent/calibration.json", "expected a readable calibration file"},
  };
  for (const auto& [name, value, form] : cases) {
    Config config;
    std::string error;
    const Status status = load({{name, value}}, &config, &error);
    EXPECT_EQ(status.code(), Errc::kConfigError) << name << "=" << value;
    EXPECT_NE(error.find(name + "='" + value + "'"), std::string::npos) << error;
    EXPECT_NE(error.find(form), std::string::npos) << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << "one line";
  }
}

// A calibration file in the environment: its figures are read when the
// configuration is, and a bad one fails it, naming the file and the key.
TEST(Config, ReadsTheGpuCalibrationFile) {
  char path[] = "/tmp/config_calibration_testXXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ::close(fd);
  const auto write = [&path](const std::string& text) { std::ofstream(path) << text; };
  Config config;
  std::string error;
  ASSERT_TRUE(load({}, &config, &error).is_ok());
  EXPECT_FALSE(config.gpu_calibration.has_value()) << "the models' own figures";

  write(R"({"model": {"d2h_bytes_per_s": 2.5e10, "call_ns": 40000}, "sources": {"call_ns": "P2"}})");
  ASSERT_TRUE(load({{"ZICO_GPU_CALIBRATION", path}}, &config, &error).is_ok()) << error;
  ASSERT_TRUE(config.gpu_calibration.has_value());
  EXPECT_EQ(config.gpu_calibration->d2h_bytes_per_s, 2.5e10);
  EXPECT_EQ(config.gpu_calibration->call_ns, 40000u);
  EXPECT_FALSE(config.gpu_calibration->h2d_bytes_per_s.has_value());

  write(R"({"model": {"call_ns": -3}})");
  EXPECT_EQ(load({{"ZICO_GPU_CALIBRATION", path}}, &config, &error).code(), Errc::kConfigError);
  EXPECT_NE(error.find(std::string("ZICO_GPU_CALIBRATION='") + path + "' is not valid"), std::string::npos) << error;
  EXPECT_NE(error.find("\"call_ns\" is -3; expected a number of nanoseconds"), std::string::npos) << error;
  write(R"({"model": {"h2d_gbps": 55}})");
  EXPECT_EQ(load({{"ZICO_GPU_CALIBRATION", path}}, &config, &error).code(), Errc::kConfigError);
  EXPECT_NE(error.find("unknown model key \"h2d_gbps\""), std::string::npos) << error;
  std::remove(path);
}

TEST(Config, UnknownZicoVariablesAreReported) {
  char budget_typo[] = "ZICO_BUDJET=1GiB";
  char known[] = "ZICO_BUDGET=1GiB";
  char other[] = "PATH=/bin";
  char* environment[] = {budget_typo, known, other, nullptr};
  EXPECT_EQ(unknown_variables(environment), "ZICO_BUDJET");
}

TEST(Config, EveryVariableIsDocumentedInTheReadme) {
  std::ifstream readme(std::string(ZICO_SOURCE_DIR) + "/README.md");
  ASSERT_TRUE(readme.good()) << "README.md not found";
  std::stringstream text;
  text << readme.rdbuf();
  for (const OptionInfo& option : option_table()) {
    EXPECT_NE(text.str().find(std::string("`") + option.name + "`"), std::string::npos)
        << option.name << " is missing from README.md's configuration table";
  }
}

}  // namespace
}  // namespace zico
