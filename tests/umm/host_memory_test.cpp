#include "host_memory.h"

#include <gtest/gtest.h>

#include <string>

#include "fake_host.h"

namespace zico {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;

// The machine's and the cgroup's figures, read from a fake root.
class FakeHost : public testing::FakeHost {
 public:
  [[nodiscard]] HostMemory read() const { return read_host_memory(root()); }
};

TEST(HostMemory, WithoutACgroupLimitItIsTheMachines) {
  FakeHost host;
  host.meminfo();
  host.write("/proc/self/cgroup", "0::/user.slice\n");
  host.write("/sys/fs/cgroup/user.slice/memory.max", "max\n");
  host.write("/sys/fs/cgroup/user.slice/memory.current", "1073741824\n");
  const HostMemory memory = host.read();
  ASSERT_TRUE(memory.known);
  EXPECT_EQ(memory.total_bytes, 16 * kGiB);
  EXPECT_EQ(memory.available_bytes, 12 * kGiB);
}

TEST(HostMemory, ACgroupV2LimitBelowTheMachineIsWhatCounts) {
  FakeHost host;
  host.meminfo();
  host.write("/proc/self/cgroup", "0::/job\n");
  host.write("/sys/fs/cgroup/job/memory.max", std::to_string(4 * kGiB) + "\n");
  host.write("/sys/fs/cgroup/job/memory.current", std::to_string(3 * kGiB) + "\n");
  // Half a GiB of it is page cache the kernel gives back under pressure.
  host.write("/sys/fs/cgroup/job/memory.stat", "anon 1\ninactive_file " + std::to_string(kGiB / 2) + "\nfile 9\n");
  const HostMemory memory = host.read();
  ASSERT_TRUE(memory.known);
  EXPECT_EQ(memory.total_bytes, 4 * kGiB);
  EXPECT_EQ(memory.available_bytes, kGiB + kGiB / 2);
}

TEST(HostMemory, ACgroupLimitAboveTheMachineDoesNotRaiseIt) {
  // A container allowed more than the host has: the machine's figures count.
  FakeHost host;
  host.meminfo();
  host.write("/proc/self/cgroup", "0::/job\n");
  host.write("/sys/fs/cgroup/job/memory.max", std::to_string(64 * kGiB) + "\n");
  host.write("/sys/fs/cgroup/job/memory.current", std::to_string(kGiB) + "\n");
  const HostMemory memory = host.read();
  ASSERT_TRUE(memory.known);
  EXPECT_EQ(memory.total_bytes, 16 * kGiB);
  EXPECT_EQ(memory.available_bytes, 12 * kGiB) << "the cgroup's 63 GiB left is more than the machine has";
}

TEST(HostMemory, ACgroupV1AncestorsTighterLimitCounts) {
  FakeHost host;
  host.meminfo();
  host.write("/proc/self/cgroup", "5:cpu,cpuacct:/a/b\n4:memory:/a/b\n0::/\n");
  host.write("/sys/fs/cgroup/memory/a/b/memory.limit_in_bytes", "9223372036854771712\n");
  host.write("/sys/fs/cgroup/memory/a/b/memory.usage_in_bytes", "1024\n");
  host.write("/sys/fs/cgroup/memory/a/memory.limit_in_bytes", std::to_string(2 * kGiB) + "\n");
  host.write("/sys/fs/cgroup/memory/a/memory.usage_in_bytes", std::to_string(2 * kGiB) + "\n");
  const HostMemory memory = host.read();
  ASSERT_TRUE(memory.known);
  EXPECT_EQ(memory.total_bytes, 2 * kGiB);
  EXPECT_EQ(memory.available_bytes, 0u) << "the limit is reached: nothing is left, which is not 'unknown'";
}

TEST(HostMemory, InsideACgroupNamespaceTheMountsRootIsRead) {
  FakeHost host;
  host.meminfo();
  // The process's cgroup path names nothing under the namespaced mount.
  host.write("/proc/self/cgroup", "0::/kubepods/pod1/c1\n");
  host.write("/sys/fs/cgroup/memory.max", std::to_string(8 * kGiB) + "\n");
  host.write("/sys/fs/cgroup/memory.current", std::to_string(kGiB) + "\n");
  const HostMemory memory = host.read();
  EXPECT_EQ(memory.total_bytes, 8 * kGiB);
  EXPECT_EQ(memory.available_bytes, 7 * kGiB);
}

TEST(HostMemory, ACgroupPathWithoutItsLeadingSlashEnds) {
  FakeHost host;
  host.meminfo();
  host.write("/proc/self/cgroup", "0::job\n");  // not what a kernel writes: read, and no further up
  const HostMemory memory = host.read();
  EXPECT_TRUE(memory.known);
  EXPECT_EQ(memory.total_bytes, 16 * kGiB);
}

TEST(HostMemory, NothingReadableIsUnknown) {
  FakeHost host;
  host.write("/proc/self/cgroup", "garbage\n");
  const HostMemory memory = host.read();
  EXPECT_FALSE(memory.known);
  EXPECT_EQ(memory.total_bytes, 0u);
  EXPECT_EQ(memory.available_bytes, 0u);
}

TEST(HostMemory, ThisMachineIsReadable) {
  const HostMemory memory = read_host_memory();
  ASSERT_TRUE(memory.known) << "/proc/meminfo should be readable on Linux";
  EXPECT_GT(memory.total_bytes, 0u);
  EXPECT_LE(memory.available_bytes, memory.total_bytes);
}

}  // namespace
}  // namespace zico
