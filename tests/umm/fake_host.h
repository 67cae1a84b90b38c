// A fake /proc and /sys under a temporary folder, for what reads the host's
// memory (host_memory.h's root): tests write the files they need.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace zico::testing {

class FakeHost {
 public:
  FakeHost() {
    root_ = std::filesystem::temp_directory_path() /
            ("zicoum-host-" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::remove_all(root_);
  }
  ~FakeHost() { std::filesystem::remove_all(root_); }
  FakeHost(const FakeHost&) = delete;
  FakeHost& operator=(const FakeHost&) = delete;

  void write(const std::string& path, const std::string& text) const {
    const std::filesystem::path file = root_ / path.substr(1);
    std::filesystem::create_directories(file.parent_path());
    std::ofstream(file) << text;
  }
  // A machine of `total_kib` KiB with `available_kib` available, in no memory cgroup.
  void meminfo(uint64_t total_kib, uint64_t available_kib) const {
    write("/proc/meminfo", "MemTotal:       " + std::to_string(total_kib) + " kB\nMemFree: 1 kB\nMemAvailable:   " +
                               std::to_string(available_kib) + " kB\n");
  }
  // 16 GiB of RAM, 12 GiB available.
  void meminfo() const { meminfo(16777216, 12582912); }
  [[nodiscard]] std::string root() const { return root_.string(); }

 private:
  std::filesystem::path root_;
};

}  // namespace zico::testing
