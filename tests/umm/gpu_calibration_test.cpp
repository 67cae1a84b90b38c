#include "gpu_calibration.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include "sim_managed.h"

namespace zico {
namespace {

// Every model key, as the GPU suite's calibration step writes them.
constexpr const char* kGoodFile = R"({
  "device": "NVIDIA H100 80GB HBM3", "driver": "580.159.04", "cuda": "13.0",
  "commit": "7e2c819", "date": "2026-12-01",
  "model": {
    "h2d_bytes_per_s": 5.1e10, "d2h_bytes_per_s": 4.9e10, "duplex_factor": 0.85,
    "fault_bytes_per_s": 7.5e9, "fault_block_ns": 120000, "call_ns": 31000.4, "range_ns": 9000,
    "block_ns": 41000, "to_host_sync": 1, "cpu_map_block_ns": 60000, "discard_call_ns": 25000,
    "launch_ns": 4000, "chunk_create_ns": 30000, "chunk_map_ns": 20000,
    "chunk_access_ns": 60000, "chunk_unmap_ns": 45000, "chunk_release_ns": 25000
  },
  "sources": {"h2d_bytes_per_s": "P2: 256 contiguous blocks, median of 5", "to_host_sync": "P1: \"blocks\"\n"}
})";

TEST(GpuCalibration, ReadsEveryKey) {
  GpuCalibration c;
  std::string error;
  ASSERT_TRUE(parse_gpu_calibration(kGoodFile, &c, &error).is_ok()) << error;
  EXPECT_EQ(c.device, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(c.driver, "580.159.04");
  EXPECT_EQ(c.cuda, "13.0");
  EXPECT_EQ(c.commit, "7e2c819");
  EXPECT_EQ(c.date, "2026-12-01");
  EXPECT_EQ(c.h2d_bytes_per_s, 5.1e10);
  EXPECT_EQ(c.d2h_bytes_per_s, 4.9e10);
  EXPECT_EQ(c.duplex_factor, 0.85);
  EXPECT_EQ(c.fault_bytes_per_s, 7.5e9);
  EXPECT_EQ(c.fault_block_ns, 120000u);
  EXPECT_EQ(c.call_ns, 31000u) << "nanoseconds are rounded";
  EXPECT_EQ(c.range_ns, 9000u);
  EXPECT_EQ(c.block_ns, 41000u);
  EXPECT_EQ(c.to_host_sync, true);
  EXPECT_EQ(c.cpu_map_block_ns, 60000u);
  EXPECT_EQ(c.discard_call_ns, 25000u);
  EXPECT_EQ(c.launch_ns, 4000u);
  EXPECT_EQ(c.chunk_create_ns, 30000u);
  EXPECT_EQ(c.chunk_map_ns, 20000u);
  EXPECT_EQ(c.chunk_access_ns, 60000u);
  EXPECT_EQ(c.chunk_unmap_ns, 45000u);
  EXPECT_EQ(c.chunk_release_ns, 25000u);
  ASSERT_EQ(c.sources.size(), 2u);
  EXPECT_EQ(c.sources.at("h2d_bytes_per_s"), "P2: 256 contiguous blocks, median of 5");
  EXPECT_EQ(c.sources.at("to_host_sync"), "P1: \"blocks\"\n") << "escapes decoded";
}

TEST(GpuCalibration, AbsentKeysStayUnset) {
  GpuCalibration c;
  std::string error;
  ASSERT_TRUE(parse_gpu_calibration(R"({"model": {"d2h_bytes_per_s": 2e10}})", &c, &error).is_ok()) << error;
  EXPECT_EQ(c.d2h_bytes_per_s, 2e10);
  EXPECT_FALSE(c.h2d_bytes_per_s.has_value());
  EXPECT_FALSE(c.to_host_sync.has_value());
  EXPECT_FALSE(c.call_ns.has_value());
  EXPECT_TRUE(c.device.empty());
  ASSERT_TRUE(parse_gpu_calibration("{}", &c, &error).is_ok()) << error;
  EXPECT_FALSE(c.d2h_bytes_per_s.has_value()) << "a second parse starts afresh";
}

// The model's own defaults where the file is silent; the file's figures where it speaks.
TEST(GpuCalibration, SetsOnlyTheFiguresItHolds) {
  GpuCalibration c;
  std::string error;
  ASSERT_TRUE(parse_gpu_calibration(R"({"model": {"d2h_bytes_per_s": 2e10, "call_ns": 30000, "to_host_sync": 1}})",
                                    &c, &error)
                  .is_ok());
  const SimManagedCosts defaults;
  const SimManagedCosts costs = with_calibration(defaults, c);
  EXPECT_EQ(costs.d2h_bytes_per_s, 2e10);
  EXPECT_EQ(costs.call_ns, 30000u);
  EXPECT_TRUE(costs.to_host_sync);
  EXPECT_EQ(costs.h2d_bytes_per_s, defaults.h2d_bytes_per_s);
  EXPECT_EQ(costs.fault_bytes_per_s, defaults.fault_bytes_per_s);
  EXPECT_EQ(costs.duplex_factor, defaults.duplex_factor);
  EXPECT_EQ(costs.block_ns, 0u);

  ASSERT_TRUE(parse_gpu_calibration(kGoodFile, &c, &error).is_ok());
  const SimManagedCosts all = with_calibration(defaults, c);
  EXPECT_EQ(all.h2d_bytes_per_s, 5.1e10);
  EXPECT_EQ(all.duplex_factor, 0.85);
  EXPECT_EQ(all.fault_bytes_per_s, 7.5e9);
  EXPECT_EQ(all.fault_block_ns, 120000u);
  EXPECT_EQ(all.range_ns, 9000u);
  EXPECT_EQ(all.block_ns, 41000u);
  EXPECT_EQ(all.cpu_map_block_ns, 60000u);
  EXPECT_EQ(all.discard_call_ns, 25000u);
  EXPECT_EQ(all.chunk_create_ns, 30000u);
  EXPECT_EQ(all.chunk_release_ns, 25000u);
  EXPECT_EQ(all.launch_ns, 4000u);
}

// Each kind of bad input: the error is one line naming the key or value and the accepted form.
TEST(GpuCalibration, BadInputNamesTheKeyOrValueAndTheForm) {
  const std::vector<std::tuple<std::string, std::vector<std::string>>> cases = {
      {"", {"not JSON at line 1, column 1"}},
      {"{\"model\": {\"call_ns\": 1,}}", {"not JSON at line 1, column 25", "expected a key"}},
      {"{\n  \"model\": {\"call_ns\" 1}\n}", {"line 2, column 23", "expected ':'"}},
      {"{\"model\": {}} x", {"text after the JSON value"}},
      {"{\"date\": \"2026", {"a string that does not end"}},
      {"{\"model\": {\"call_ns\": 01}}", {"not JSON", "expected ',' or '}'"}},
      {"{\"model\": {\"call_ns\": -}}", {"a number without digits"}},
      {"{\"model\": {\"call_ns\": 1e999}}", {"a number out of range"}},
      {"[1, 2]", {"[1, 2]", "expected a JSON object"}},
      {"{\"model\": {\"h2d_gbps\": 55}}", {"unknown model key \"h2d_gbps\"", "expected one of h2d_bytes_per_s"}},
      {"{\"modle\": {}}", {"unknown key \"modle\"", "expected device, driver, cuda, commit, date, model or sources"}},
      {"{\"sources\": {\"call_us\": \"P2\"}}", {"unknown sources key \"call_us\"", "expected one of"}},
      {"{\"sources\": {\"call_ns\": 3}}", {"sources key \"call_ns\" is 3", "expected a string"}},
      {"{\"sources\": []}", {"key \"sources\" is []", "expected an object"}},
      {"{\"model\": 5}", {"key \"model\" is 5", "expected an object"}},
      {"{\"device\": 80}", {"key \"device\" is 80", "expected a string"}},
      {"{\"model\": {\"h2d_bytes_per_s\": -5e10}}", {"\"h2d_bytes_per_s\" is -5e10", "a number above 0"}},
      {"{\"model\": {\"d2h_bytes_per_s\": 0}}", {"\"d2h_bytes_per_s\" is 0", "a number above 0"}},
      {"{\"model\": {\"fault_bytes_per_s\": \"20e9\"}}", {"\"fault_bytes_per_s\" is \"20e9\"", "a number above 0"}},
      {"{\"model\": {\"duplex_factor\": 1.5}}", {"\"duplex_factor\" is 1.5", "a number in (0, 1]"}},
      {"{\"model\": {\"duplex_factor\": 0}}", {"\"duplex_factor\" is 0", "a number in (0, 1]"}},
      {"{\"model\": {\"call_ns\": -1}}", {"\"call_ns\" is -1", "nanoseconds from 0"}},
      {"{\"model\": {\"launch_ns\": null}}", {"\"launch_ns\" is null", "nanoseconds from 0"}},
      {"{\"model\": {\"block_ns\": true}}", {"\"block_ns\" is true", "nanoseconds"}},
      {"{\"model\": {\"fault_block_ns\": 2e15}}", {"\"fault_block_ns\" is 2e15", "from 0 to 1e15"}},
      {"{\"model\": {\"to_host_sync\": 2}}", {"\"to_host_sync\" is 2", "0 or 1"}},
      {"{\"model\": {\"to_host_sync\": true}}", {"\"to_host_sync\" is true", "0 or 1"}},
      {"{\"model\": {\"call_ns\": 1, \"call_ns\": 2}}", {"model key \"call_ns\" appears twice"}},
      {"{\"date\": \"a\", \"date\": \"b\"}", {"key \"date\" appears twice"}},
  };
  for (const auto& [text, expected] : cases) {
    GpuCalibration c;
    std::string error;
    const Status status = parse_gpu_calibration(text, &c, &error);
    EXPECT_EQ(status.code(), Errc::kConfigError) << text;
    for (const std::string& part : expected) EXPECT_NE(error.find(part), std::string::npos) << text << " -> " << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << "one line: " << error;
  }
}

TEST(GpuCalibration, ReadsAFileAndNamesOneItCannotRead) {
  char path[] = "/tmp/gpu_calibration_testXXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  const std::string text = kGoodFile;
  ASSERT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  ::close(fd);
  GpuCalibration c;
  std::string error;
  EXPECT_TRUE(read_gpu_calibration_file(path, &c, &error).is_ok()) << error;
  EXPECT_EQ(c.launch_ns, 4000u);
  std::remove(path);

  EXPECT_EQ(read_gpu_calibration_file(path, &c, &error).code(), Errc::kConfigError);
  EXPECT_NE(error.find(std::string("cannot read '") + path + "'"), std::string::npos) << error;
  EXPECT_EQ(read_gpu_calibration_file("/tmp", &c, &error).code(), Errc::kConfigError) << "a directory";
  EXPECT_NE(error.find("cannot read '/tmp'"), std::string::npos) << error;
}

}  // namespace
}  // namespace zico
