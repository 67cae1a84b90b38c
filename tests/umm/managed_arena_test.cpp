// The allocator on a managed arena (UM mode): the same allocator, its chunks
// only bookkeeping, its memory unified, so that it can hold more than the
// device while the pager keeps what is on the device within the budget.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "device_allocator.h"
#include "managed_arena_driver.h"
#include "sim_driver.h"

namespace zico::testing {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

SimOptions small_device() {
  SimOptions o;
  o.capacity = 16 * kMiB;
  return o;
}

TEST(ManagedArena, TheAllocatorHoldsMoreThanTheDeviceAndKernelsRunOnIt) {
  SimDriver sim(small_device());
  ManagedArenaDriver driver(sim);
  AllocatorOptions options;
  options.arena_bytes = 256 * kMiB;
  std::unique_ptr<DeviceAllocator> allocator;
  std::string why;
  ASSERT_TRUE(DeviceAllocator::create(driver, DeviceId{0}, options, &allocator, &why).is_ok()) << why;
  std::vector<void*> blocks;
  for (int i = 0; i < 8; ++i) {  // 64 MiB: four times the device
    void* p = nullptr;
    ASSERT_TRUE(allocator->allocate(8 * kMiB, StreamHandle{}, &p).is_ok()) << i;
    std::memset(p, i + 1, 8 * kMiB);  // unified memory: the CPU may write it anywhere
    blocks.push_back(p);
  }
  EXPECT_EQ(sim.counters().creates, 0u) << "no physical chunk: the arena is managed";
  for (int i = 0; i < 8; ++i) {
    const VaRange used{reinterpret_cast<uintptr_t>(blocks[static_cast<size_t>(i)]), 8 * kMiB};
    ASSERT_TRUE(sim.run_kernel(std::span<const VaRange>(&used, 1), 1000).is_ok()) << i;
    EXPECT_LE(sim.managed_stats().resident_bytes, 16 * kMiB);
    EXPECT_EQ(static_cast<int>(static_cast<char*>(blocks[static_cast<size_t>(i)])[8 * kMiB - 1]), i + 1);
  }
  EXPECT_GT(sim.managed_stats().driver_evictions, 0u) << "without a pager the driver makes room itself";
  for (void* p : blocks) ASSERT_TRUE(allocator->deallocate(p, kNoPendingWork).is_ok());
  ASSERT_TRUE(allocator->trim().is_ok());
}

TEST(ManagedArena, ChunksCannotLeaveTheProcess) {
  SimDriver sim(small_device());
  ManagedArenaDriver driver(sim);
  Capabilities caps;
  ASSERT_TRUE(driver.capabilities(DeviceId{0}, &caps).is_ok());
  EXPECT_FALSE(caps.posix_fd_export);
  PhysHandle handle;
  ASSERT_TRUE(driver.create(DeviceId{0}, 2 * kMiB, &handle).is_ok());
  int fd = -1;
  EXPECT_EQ(driver.export_fd(handle, &fd).code(), Errc::kNotSupported);
  const VaRange outside{0x1000, 2 * kMiB};
  EXPECT_EQ(driver.map(outside, handle).code(), Errc::kInvalidArgument) << "a chunk belongs inside an arena";
}

TEST(ManagedArena, APageTheDriverEvictedFaultsBackWhenUsed) {
  SimDriver sim(small_device());  // 16 MiB
  ManagedArenaDriver driver(sim);
  VaRange arena;
  ASSERT_TRUE(driver.reserve(DeviceId{0}, 64 * kMiB, 2 * kMiB, &arena).is_ok());
  const VaRange first{arena.base, 12 * kMiB}, second{arena.base + 12 * kMiB, 8 * kMiB};
  ASSERT_TRUE(sim.run_kernel(std::span<const VaRange>(&first, 1), 1000).is_ok());
  ASSERT_TRUE(sim.run_kernel(std::span<const VaRange>(&second, 1), 1000).is_ok());  // the driver evicts 4 MiB of `first`
  ASSERT_GT(sim.managed_stats().driver_evictions, 0u);
  // Used again, the evicted pages come back: had the arena been advised
  // accessed-by the device, the driver would have mapped them on the host,
  // and kernels would read them over the link at every access, uncounted.
  ASSERT_TRUE(sim.run_kernel(std::span<const VaRange>(&first, 1), 1000).is_ok());
  EXPECT_EQ(sim.managed_stats().remote_pages, 0u);
  ASSERT_TRUE(driver.unreserve(arena).is_ok());
}

}  // namespace
}  // namespace zico::testing
