// UM mode's swapped arena (swap_arena_driver.h) on SimDriver: a page that
// leaves gives its device memory back to the device at once, comes back with
// its bytes, and is an illegal address while it is away.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "device_allocator.h"
#include "swap_arena_driver.h"
#include "sim_driver.h"

namespace zico::testing {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kPage = 2 * kMiB;
constexpr PrefetchTarget kToDevice{false, DeviceId{0}};
constexpr PrefetchTarget kToHost{true, DeviceId{0}};

// A 16 MiB device and a swapped arena of 8 pages on it.
class SwapArena : public ::testing::Test {
 protected:
  SwapArena() : sim_(small_device()), swap_(sim_) {}
  static SimOptions small_device() {
    SimOptions o;
    o.capacity = 16 * kMiB;
    return o;
  }
  void SetUp() override {
    ASSERT_TRUE(swap_.reserve(DeviceId{0}, 8 * kPage, 0, &arena_).is_ok());
    ASSERT_TRUE(sim_.stream_create(DeviceId{0}, &stream_).is_ok());
  }
  void TearDown() override {
    ASSERT_TRUE(sim_.stream_destroy(stream_).is_ok());
    ASSERT_TRUE(swap_.unreserve(arena_).is_ok());
    EXPECT_EQ(sim_.counters().live_chunks, 0u) << "unreserve gave every chunk back";
  }
  VaRange page(size_t i, size_t count = 1) const { return VaRange{arena_.base + i * kPage, count * kPage}; }
  Status move(VaRange range, PrefetchTarget target) {
    return swap_.managed_prefetch_batch(std::span<const VaRange>(&range, 1), target, stream_);
  }
  size_t device_used() {
    size_t free_bytes = 0, total = 0;
    EXPECT_TRUE(sim_.memory_info(DeviceId{0}, &free_bytes, &total).is_ok());
    return total - free_bytes;
  }
  // Writes `value` over the page through a copy from the host, and reads it back.
  void write(size_t i, uint8_t value) {
    std::vector<uint8_t> bytes(kPage, value);
    ASSERT_TRUE(sim_.copy_async(page(i).ptr(), bytes.data(), kPage, CopyKind::kHostToDevice, stream_).is_ok());
    ASSERT_TRUE(sim_.stream_synchronize(stream_).is_ok());
  }
  std::vector<uint8_t> read(size_t i) {
    std::vector<uint8_t> bytes(kPage);
    EXPECT_TRUE(sim_.copy_async(bytes.data(), page(i).ptr(), kPage, CopyKind::kDeviceToHost, stream_).is_ok());
    EXPECT_TRUE(sim_.stream_synchronize(stream_).is_ok());
    return bytes;
  }
  Status run(VaRange range) { return sim_.run_kernel(std::span<const VaRange>(&range, 1), 1000, stream_); }

  SimDriver sim_;
  SwapArenaDriver swap_;
  VaRange arena_{};
  StreamHandle stream_{};
};

TEST_F(SwapArena, LooksLikeManagedMemoryWhosePagesCannotFault) {
  Capabilities caps;
  ASSERT_TRUE(swap_.capabilities(DeviceId{0}, &caps).is_ok());
  EXPECT_TRUE(caps.managed_memory);
  EXPECT_TRUE(caps.discard_releases_device_pages);
  EXPECT_TRUE(caps.absent_pages_unmapped);
  EXPECT_FALSE(caps.posix_fd_export);
  std::string why;
  EXPECT_EQ(swap_.start_fault_reports(DeviceId{0}, &why).code(), Errc::kNotSupported);
  EXPECT_NE(why.find("never fault"), std::string::npos) << why;
}

TEST_F(SwapArena, APageAwayIsAnIllegalAddressNotAFault) {
  EXPECT_EQ(run(page(0)).code(), Errc::kInvalidArgument) << "never brought in: unmapped";
  ASSERT_TRUE(move(page(0), kToDevice).is_ok());
  EXPECT_TRUE(run(page(0)).is_ok());
  ASSERT_TRUE(move(page(0), kToHost).is_ok());
  EXPECT_EQ(run(page(0)).code(), Errc::kInvalidArgument) << "sent away: unmapped";
  EXPECT_EQ(sim_.managed_stats().faulted_pages, 0u);
}

TEST_F(SwapArena, APageThatLeavesGivesItsDeviceMemoryBackAndComesBackWithItsBytes) {
  const size_t before = device_used();
  ASSERT_TRUE(move(page(0, 4), kToDevice).is_ok());
  EXPECT_EQ(device_used(), before + 4 * kPage);
  for (size_t i = 0; i < 4; ++i) write(i, static_cast<uint8_t>(0x10 + i));
  ASSERT_TRUE(move(page(1, 2), kToHost).is_ok());
  EXPECT_EQ(device_used(), before + 2 * kPage) << "the device has the pages' memory back at once";
  EXPECT_EQ(swap_.stats().host_bytes, 2 * kPage);
  // Another allocation can take it: the device is 16 MiB, the arena holds 4 of it.
  std::array<PhysHandle, 6> others{};
  for (PhysHandle& chunk : others) ASSERT_TRUE(sim_.create(DeviceId{0}, kPage, &chunk).is_ok());
  for (PhysHandle chunk : others) ASSERT_TRUE(sim_.release(chunk).is_ok());
  ASSERT_TRUE(move(page(1, 2), kToDevice).is_ok());
  for (size_t i = 0; i < 4; ++i) {
    const std::vector<uint8_t> bytes = read(i);
    EXPECT_EQ(bytes.front(), 0x10 + i) << "page " << i;
    EXPECT_EQ(bytes.back(), 0x10 + i) << "page " << i;
  }
  const SwapArenaStats s = swap_.stats();
  EXPECT_EQ(s.pages_out, 2u);
  EXPECT_EQ(s.copies_in, 2u);
  EXPECT_EQ(s.peak_mapped_bytes, 4 * kPage);
}

TEST_F(SwapArena, ADiscardedPageCopiesNothingEitherWay) {
  ASSERT_TRUE(move(page(0), kToDevice).is_ok());
  write(0, 0x5a);
  ASSERT_TRUE(move(page(0), kToHost).is_ok());
  const VaRange range = page(0);
  ASSERT_TRUE(swap_.managed_discard_batch(std::span<const VaRange>(&range, 1), stream_).is_ok());
  EXPECT_EQ(swap_.stats().host_bytes, 0u) << "its host bytes dropped";
  ASSERT_TRUE(swap_.managed_discard_and_prefetch_batch(std::span<const VaRange>(&range, 1), kToDevice, stream_).is_ok());
  EXPECT_TRUE(run(page(0)).is_ok());
  EXPECT_EQ(swap_.stats().copies_in, 0u);
  // Discarded on the device, the page leaves it without a copy.
  const size_t used = device_used();
  ASSERT_TRUE(swap_.managed_discard_batch(std::span<const VaRange>(&range, 1), stream_).is_ok());
  EXPECT_EQ(device_used(), used - kPage);
  EXPECT_EQ(swap_.stats().pages_out, 1u) << "only its first trip out copied";
}

// The pager's two threads call at once: one brings pages in while the other
// sends pages out, the same pages among them. Nothing is lost: every page
// ends with the bytes it was given, and once all have left the device holds
// nothing of the arena's (no chunk leaked, none released twice).
TEST_F(SwapArena, PagesMovedByTwoThreadsAtOnceKeepTheirBytes) {
  ASSERT_TRUE(move(page(0, 8), kToDevice).is_ok());
  for (size_t i = 0; i < 8; ++i) write(i, static_cast<uint8_t>(0xa0 + i));
  swap_.set_held_limit(DeviceId{0}, 4 * kPage);  // chunks kept and reused along the way too
  StreamHandle out_stream{};
  ASSERT_TRUE(sim_.stream_create(DeviceId{0}, &out_stream).is_ok());
  const auto churn = [this](PrefetchTarget target, StreamHandle stream, unsigned seed) {
    std::mt19937 random(seed);
    for (int step = 0; step < 400; ++step) {
      const size_t first = random() % 8;
      const size_t count = 1 + random() % std::min<size_t>(3, 8 - first);
      const VaRange range = page(first, count);
      EXPECT_TRUE(swap_.managed_prefetch_batch(std::span<const VaRange>(&range, 1), target, stream).is_ok());
    }
  };
  std::thread in([&] { churn(kToDevice, stream_, 1); });
  std::thread out([&] { churn(kToHost, out_stream, 2); });
  in.join();
  out.join();
  ASSERT_TRUE(move(page(0, 8), kToDevice).is_ok());
  for (size_t i = 0; i < 8; ++i) {
    const std::vector<uint8_t> bytes = read(i);
    EXPECT_EQ(bytes.front(), 0xa0 + i) << "page " << i;
    EXPECT_EQ(bytes[kPage / 2], 0xa0 + i) << "page " << i;
    EXPECT_EQ(bytes.back(), 0xa0 + i) << "page " << i;
  }
  ASSERT_TRUE(move(page(0, 8), kToHost).is_ok());
  swap_.set_held_limit(DeviceId{0}, 0);
  EXPECT_EQ(device_used(), 0u) << "a chunk outlived its page";
  ASSERT_TRUE(sim_.stream_destroy(out_stream).is_ok());
}

TEST_F(SwapArena, RefusesRangesThatAreNotWholePagesAndPassesOthersOn) {
  const VaRange half{arena_.base, kPage / 2};
  EXPECT_EQ(swap_.managed_prefetch_batch(std::span<const VaRange>(&half, 1), kToDevice, stream_).code(),
            Errc::kInvalidArgument);
  void* managed = nullptr;
  ASSERT_TRUE(sim_.managed_allocate(kPage, &managed).is_ok());
  EXPECT_TRUE(swap_.managed_prefetch(managed, kPage, kToDevice, stream_).is_ok()) << "managed memory is the driver's";
  EXPECT_EQ(sim_.managed_stats().prefetched_pages, 1u);
  ASSERT_TRUE(sim_.managed_free(managed).is_ok());
}

// Each virtual-memory call on a chunk costs the calling thread host time on
// the modelled clock (SimManagedCosts::chunk_*_ns: the calibration's P8), so
// a kernel launched after four pages came in starts no earlier than their
// creates, maps and accesses; and a chunk kept in the pool (within the held
// limit) is neither released nor created again.
TEST(SwapArenaCosts, EachChunkCallTakesTheCallersHostTimeAndThePoolSavesTwo) {
  SimOptions o;
  o.capacity = 16 * kMiB;
  o.managed_costs.chunk_create_ns = 100'000;
  o.managed_costs.chunk_map_ns = 200'000;
  o.managed_costs.chunk_access_ns = 300'000;
  o.managed_costs.chunk_unmap_ns = 400'000;
  o.managed_costs.chunk_release_ns = 500'000;
  o.managed_costs.h2d_bytes_per_s = 0;  // copies take no time: only the calls count
  o.managed_costs.d2h_bytes_per_s = 0;
  SimDriver sim(o);
  SwapArenaDriver swap(sim);
  VaRange arena{};
  ASSERT_TRUE(swap.reserve(DeviceId{0}, 8 * kPage, 0, &arena).is_ok());
  const VaRange four{arena.base, 4 * kPage};
  const auto kernel_end_after = [&](PrefetchTarget target) {
    EXPECT_TRUE(swap.managed_prefetch_batch(std::span<const VaRange>(&four, 1), target, StreamHandle{}).is_ok());
    EXPECT_TRUE(sim.run_kernel(std::span<const VaRange>(&four, target.to_host ? 0 : 1), 1000).is_ok());
    return sim.managed_stats().now_ns;
  };
  EXPECT_EQ(kernel_end_after(kToDevice), 4 * 600'000u + 1000u);
  // No pool: the copies out start after that kernel; then four unmaps and releases.
  uint64_t before = sim.managed_stats().now_ns;
  EXPECT_EQ(kernel_end_after(kToHost), before + 4 * 900'000u + 1000u);
  // Kept within a limit of four pages: back in without creates, out without releases. (A fetch
  // starts at the launching thread's clock, the last kernel's launch: 1000 ns before its end.)
  swap.set_held_limit(DeviceId{0}, 4 * kPage);
  before = sim.managed_stats().now_ns;
  EXPECT_EQ(kernel_end_after(kToDevice), before + 4 * 600'000u) << "the pool was empty: four creates";
  before = sim.managed_stats().now_ns;
  EXPECT_EQ(kernel_end_after(kToHost), before + 4 * 400'000u + 1000u) << "kept: unmapped, not released";
  EXPECT_EQ(swap.stats().pooled_bytes, 4 * kPage);
  before = sim.managed_stats().now_ns;
  EXPECT_EQ(kernel_end_after(kToDevice), before + 4 * 500'000u) << "reused: mapped, not created";
  EXPECT_EQ(swap.stats().chunks_reused, 4u);
  // A smaller limit releases what the pool holds beyond it.
  (void)kernel_end_after(kToHost);
  size_t free_bytes = 0, total = 0;
  ASSERT_TRUE(sim.memory_info(DeviceId{0}, &free_bytes, &total).is_ok());
  EXPECT_EQ(total - free_bytes, 4 * kPage) << "the pool's chunks are device memory";
  swap.set_held_limit(DeviceId{0}, kPage);
  ASSERT_TRUE(sim.memory_info(DeviceId{0}, &free_bytes, &total).is_ok());
  EXPECT_EQ(total - free_bytes, kPage);
  EXPECT_EQ(swap.stats().peak_held_bytes, 4 * kPage);
  ASSERT_TRUE(swap.unreserve(arena).is_ok());
  ASSERT_TRUE(sim.memory_info(DeviceId{0}, &free_bytes, &total).is_ok());
  EXPECT_EQ(total - free_bytes, 0u) << "the last arena gone, the pool went with it";
}

// The allocator on a swapped arena holds more than the device: its chunks
// are bookkeeping, the pages are the pager's (here moved by hand).
TEST(SwapArenaAllocator, HoldsMoreThanTheDevice) {
  SimOptions o;
  o.capacity = 16 * kMiB;
  SimDriver sim(o);
  SwapArenaDriver swap(sim);
  AllocatorOptions options;
  options.arena_bytes = 256 * kMiB;
  options.budget_bytes = SIZE_MAX;
  std::unique_ptr<DeviceAllocator> allocator;
  std::string why;
  ASSERT_TRUE(DeviceAllocator::create(swap, DeviceId{0}, options, &allocator, &why).is_ok()) << why;
  std::vector<void*> blocks;
  for (int i = 0; i < 8; ++i) {
    void* p = nullptr;
    ASSERT_TRUE(allocator->allocate(8 * kMiB, StreamHandle{}, &p).is_ok()) << i;
    blocks.push_back(p);
  }
  EXPECT_EQ(sim.counters().creates, 0u) << "no device memory until the pager brings a page in";
  for (void* p : blocks) ASSERT_TRUE(allocator->deallocate(p, kNoPendingWork).is_ok());
  ASSERT_TRUE(allocator->trim().is_ok());
}

}  // namespace
}  // namespace zico::testing
