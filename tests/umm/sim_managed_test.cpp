// SimDriver's unified memory: residency under the capacity, faults, prefetches
// and evictions on the modelled clock, and discards that really drop data.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "sim_driver.h"

namespace zico::testing {
namespace {

constexpr size_t kPage = size_t{2} << 20;
constexpr DeviceId kDevice{0};

// An 8-page device with round migration costs: 1 ms per page each way by
// prefetch, 2 ms per page by fault, 100 us per fault batch of 4 pages.
SimOptions options() {
  SimOptions o;
  o.capacity = 8 * kPage;
  o.managed_costs.h2d_bytes_per_s = static_cast<double>(kPage) * 1000;
  o.managed_costs.d2h_bytes_per_s = static_cast<double>(kPage) * 1000;
  o.managed_costs.fault_bytes_per_s = static_cast<double>(kPage) * 500;
  o.managed_costs.fault_batch_pages = 4;
  o.managed_costs.fault_batch_ns = 100'000;
  o.managed_costs.duplex_factor = 1;  // each direction at its full rate, whatever the other does
  return o;
}

constexpr uint64_t kMs = 1'000'000;

class SimManagedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(driver_.managed_allocate(16 * kPage, &base_).is_ok());
    ASSERT_TRUE(driver_.stream_create(kDevice, &to_host_).is_ok());
    ASSERT_TRUE(driver_.stream_create(kDevice, &to_device_).is_ok());
    ASSERT_TRUE(driver_.event_create(kDevice, &kernels_done_).is_ok());
  }
  void TearDown() override {
    EXPECT_TRUE(driver_.event_destroy(kernels_done_).is_ok());
    EXPECT_TRUE(driver_.stream_destroy(to_device_).is_ok());
    EXPECT_TRUE(driver_.stream_destroy(to_host_).is_ok());
    EXPECT_TRUE(driver_.managed_free(base_).is_ok());
  }

  VaRange pages(size_t first, size_t count) const {
    return VaRange{reinterpret_cast<uintptr_t>(base_) + first * kPage, count * kPage};
  }
  std::byte* at(size_t page) const { return static_cast<std::byte*>(base_) + page * kPage; }
  Status kernel(size_t first, size_t count, uint64_t duration_ns) {
    const VaRange range = pages(first, count);
    return driver_.run_kernel(std::span<const VaRange>(&range, 1), duration_ns);
  }
  // A migration after the kernels launched so far (kernels run on the legacy
  // stream), on a stream of its direction's own, as a pager issues it.
  Status prefetch(size_t first, size_t count, bool to_host) {
    const VaRange range = pages(first, count);
    const StreamHandle stream = to_host ? to_host_ : to_device_;
    if (Status status = driver_.event_record(kernels_done_, StreamHandle{}); !status.is_ok()) return status;
    if (Status status = driver_.stream_wait_event(stream, kernels_done_); !status.is_ok()) return status;
    return driver_.managed_prefetch(range.ptr(), range.bytes, PrefetchTarget{to_host, kDevice}, stream);
  }

  SimDriver driver_{options()};
  void* base_ = nullptr;
  StreamHandle to_host_{};
  StreamHandle to_device_{};
  EventHandle kernels_done_{};
};

TEST_F(SimManagedTest, AllocationsAreAlignedToAPageAndStartOnTheHost) {
  EXPECT_EQ(reinterpret_cast<uintptr_t>(base_) % kPage, 0u);
  EXPECT_EQ(driver_.managed_stats().resident_bytes, 0u);
  size_t free_bytes = 0, total = 0;
  ASSERT_TRUE(driver_.memory_info(kDevice, &free_bytes, &total).is_ok());
  EXPECT_EQ(free_bytes, total);
}

TEST_F(SimManagedTest, AFirstTouchFaultsWithoutACopy) {
  ASSERT_TRUE(kernel(0, 2, 5 * kMs).is_ok());
  const SimManagedStats s = driver_.managed_stats();
  EXPECT_EQ(s.faulted_pages, 2u);
  EXPECT_EQ(s.fault_batches, 1u);
  EXPECT_EQ(s.h2d_bytes, 0u) << "nothing to copy: the pages never held data";
  EXPECT_EQ(s.fault_ns, 100'000u);
  EXPECT_EQ(s.now_ns, 100'000u + 5 * kMs);
  EXPECT_EQ(s.resident_bytes, 2 * kPage);
}

TEST_F(SimManagedTest, APrefetchedPageIsWaitedForNotFaulted) {
  ASSERT_TRUE(kernel(0, 1, 0).is_ok());      // holds data now
  ASSERT_TRUE(prefetch(0, 1, true).is_ok());  // out: 1 ms on the D2H engine
  const uint64_t before = driver_.managed_stats().now_ns;
  ASSERT_TRUE(prefetch(0, 1, false).is_ok());  // back once it is out: 1 ms more
  ASSERT_TRUE(kernel(0, 1, 0).is_ok());
  const SimManagedStats s = driver_.managed_stats();
  EXPECT_EQ(s.faulted_pages, 1u) << "only the first touch";
  EXPECT_EQ(s.prefetched_pages, 1u);
  EXPECT_EQ(s.evicted_pages, 1u);
  EXPECT_EQ(s.now_ns - before, 2 * kMs) << "the kernel waited for the copies out and in";
  EXPECT_EQ(s.stall_ns, 2 * kMs);
}

TEST_F(SimManagedTest, APageAccessedByTheDeviceIsReadInPlaceOnTheHost) {
  ASSERT_TRUE(kernel(0, 2, 0).is_ok());        // on the device, holding data
  ASSERT_TRUE(prefetch(0, 2, true).is_ok());   // out
  const VaRange first = pages(0, 1);
  ASSERT_TRUE(driver_.managed_advise(first.ptr(), first.bytes, ManagedAdvice::kSetAccessedBy, kDevice).is_ok());
  const SimManagedStats before = driver_.managed_stats();
  ASSERT_TRUE(kernel(0, 2, 0).is_ok());
  const SimManagedStats s = driver_.managed_stats();
  EXPECT_EQ(s.remote_pages - before.remote_pages, 1u) << "page 0: mapped, read over the link";
  EXPECT_EQ(s.faulted_pages - before.faulted_pages, 1u) << "page 1: faulted back";
  EXPECT_EQ(s.resident_bytes, kPage) << "only the faulted page came back";
  // One fault batch, 2 ms for page 1's migration and 2 ms for the pass over
  // page 0, both at the fault path's rate.
  EXPECT_EQ(s.now_ns - before.now_ns, 100'000u + 2 * kMs + 2 * kMs);
  ASSERT_TRUE(driver_.managed_advise(first.ptr(), first.bytes, ManagedAdvice::kUnsetAccessedBy, kDevice).is_ok());
  ASSERT_TRUE(kernel(0, 1, 0).is_ok());
  EXPECT_EQ(driver_.managed_stats().resident_bytes, 2 * kPage) << "unset: it faults in like the rest";
}

TEST_F(SimManagedTest, APagePreferredOnTheDeviceIsNotMappedThereWhenPrefetchedOut) {
  const VaRange all = pages(0, 16);
  ASSERT_TRUE(driver_.managed_advise(all.ptr(), all.bytes, ManagedAdvice::kSetPreferredLocationDevice, kDevice).is_ok());
  ASSERT_TRUE(driver_.managed_advise(all.ptr(), all.bytes, ManagedAdvice::kSetAccessedBy, kDevice).is_ok());
  ASSERT_TRUE(kernel(0, 2, 0).is_ok());
  ASSERT_TRUE(prefetch(0, 2, true).is_ok());  // sent out: the driver leaves its preferred device unmapped
  ASSERT_TRUE(kernel(0, 2, 0).is_ok());
  EXPECT_EQ(driver_.managed_stats().remote_pages, 0u);
  EXPECT_EQ(driver_.managed_stats().resident_bytes, 2 * kPage) << "both faulted back";
}

TEST_F(SimManagedTest, APageTheDriverEvictsStaysMappedForAnAccessedByDevice) {
  const VaRange all = pages(0, 16);
  ASSERT_TRUE(driver_.managed_advise(all.ptr(), all.bytes, ManagedAdvice::kSetPreferredLocationDevice, kDevice).is_ok());
  ASSERT_TRUE(driver_.managed_advise(all.ptr(), all.bytes, ManagedAdvice::kSetAccessedBy, kDevice).is_ok());
  ASSERT_TRUE(kernel(0, 8, 0).is_ok());  // the device is full
  ASSERT_TRUE(kernel(8, 2, 0).is_ok());  // the driver evicts pages 0 and 1 to make room, mapping them
  ASSERT_TRUE(kernel(0, 2, 0).is_ok());
  EXPECT_EQ(driver_.managed_stats().remote_pages, 2u) << "read over the link, in place";
  ASSERT_TRUE(driver_.managed_advise(all.ptr(), all.bytes, ManagedAdvice::kUnsetAccessedBy, kDevice).is_ok());
  ASSERT_TRUE(kernel(0, 2, 0).is_ok());
  EXPECT_EQ(driver_.managed_stats().remote_pages, 2u) << "unmapped: faulted back";
}

TEST_F(SimManagedTest, PrefetchesOverlapTheKernelsBetweenThem) {
  ASSERT_TRUE(kernel(0, 4, 0).is_ok());
  ASSERT_TRUE(prefetch(0, 4, true).is_ok());
  const uint64_t start = driver_.managed_stats().now_ns;
  ASSERT_TRUE(prefetch(0, 4, false).is_ok());  // page i back at i + 2 ms (out at i + 1 ms)
  ASSERT_TRUE(kernel(4, 1, 3 * kMs).is_ok());  // 3.1 ms meanwhile (a first touch: one fault batch)
  ASSERT_TRUE(kernel(0, 4, 1 * kMs).is_ok());  // waits for page 3 at 5 ms, then 1 ms
  EXPECT_EQ(driver_.managed_stats().now_ns - start, 6 * kMs) << "the copies ran while the first kernel did";
}

TEST_F(SimManagedTest, TheDeviceNeverHoldsMoreThanItsCapacity) {
  // 16 pages through an 8-page device, three at a time.
  for (int round = 0; round < 3; ++round) {
    for (size_t first = 0; first + 3 <= 16; first += 3) {
      ASSERT_TRUE(kernel(first, 3, kMs).is_ok());
      EXPECT_LE(driver_.managed_stats().resident_bytes, 8 * kPage);
    }
  }
  const SimManagedStats s = driver_.managed_stats();
  EXPECT_EQ(s.peak_resident_bytes, 8 * kPage);
  EXPECT_GT(s.driver_evictions, 0u);
  EXPECT_GT(s.d2h_bytes, 0u) << "evicted pages held data and were written back";
  size_t free_bytes = 0, total = 0;
  ASSERT_TRUE(driver_.memory_info(kDevice, &free_bytes, &total).is_ok());
  EXPECT_EQ(free_bytes, total - s.chunk_bytes);
  EXPECT_LE(s.peak_chunk_bytes, 8 * kPage);
}

TEST_F(SimManagedTest, AKernelThatNeedsMoreThanTheDeviceIsOutOfMemory) {
  EXPECT_EQ(kernel(0, 9, 0).code(), Errc::kOutOfMemory);
}

TEST_F(SimManagedTest, ChunksAndManagedPagesShareTheCapacity) {
  ASSERT_TRUE(kernel(0, 6, 0).is_ok());
  PhysHandle chunk;
  ASSERT_TRUE(driver_.create(kDevice, 2 * kPage, &chunk).is_ok());  // the free memory
  // Full now: the next kernel's pages push out older ones, never the chunk.
  ASSERT_TRUE(kernel(6, 2, 0).is_ok());
  EXPECT_EQ(driver_.managed_stats().resident_bytes, 6 * kPage);
  PhysHandle too_big;
  EXPECT_EQ(driver_.create(kDevice, 8 * kPage, &too_big).code(), Errc::kOutOfMemory)
      << "the chunk already there is not managed memory to take";
  EXPECT_EQ(driver_.managed_stats().resident_bytes, 6 * kPage) << "a refused chunk takes nothing";
  ASSERT_TRUE(driver_.release(chunk).is_ok());
}

// The UVM driver keeps a page's 2 MiB root chunk when the page leaves
// (block_clear_resident_processor marks it unused): the device reports the
// pages' high-water mark in use, as NVML showed on an H100, and a page that
// comes back takes its own chunk again without new memory.
TEST_F(SimManagedTest, APageThatLeavesKeepsItsDeviceMemory) {
  ASSERT_TRUE(kernel(0, 6, 0).is_ok());
  ASSERT_TRUE(prefetch(0, 4, true).is_ok());
  SimManagedStats s = driver_.managed_stats();
  EXPECT_EQ(s.resident_bytes, 2 * kPage);
  EXPECT_EQ(s.chunk_bytes, 6 * kPage);
  size_t free_bytes = 0, total = 0;
  ASSERT_TRUE(driver_.memory_info(kDevice, &free_bytes, &total).is_ok());
  EXPECT_EQ(free_bytes, 2 * kPage) << "the evicted pages' chunks still count as used";
  const VaRange dead = pages(4, 1);
  ASSERT_TRUE(driver_.managed_discard(dead.ptr(), dead.bytes, StreamHandle{}).is_ok());
  EXPECT_EQ(driver_.managed_stats().chunk_bytes, 6 * kPage) << "a discarded page keeps its chunk too";
  ASSERT_TRUE(prefetch(0, 2, false).is_ok());
  s = driver_.managed_stats();
  EXPECT_EQ(s.resident_bytes, 3 * kPage);
  EXPECT_EQ(s.chunk_bytes, 6 * kPage) << "pages that come back reuse their own chunks";
  EXPECT_EQ(s.chunks_taken, 0u);
}

// When the device is full, a page without a chunk takes an unused one (the
// least recently left first) without a copy; only when none is left does
// the driver evict a page, which then gives its chunk to the newcomer.
TEST_F(SimManagedTest, UnusedChunksGoToWhatNeedsMemoryBeforeAnyPageIsEvicted) {
  ASSERT_TRUE(kernel(0, 8, 0).is_ok());  // the device is full
  ASSERT_TRUE(prefetch(0, 1, true).is_ok());
  ASSERT_TRUE(prefetch(1, 1, true).is_ok());
  SimManagedStats before = driver_.managed_stats();
  ASSERT_TRUE(kernel(8, 1, 0).is_ok());  // takes page 0's chunk
  SimManagedStats s = driver_.managed_stats();
  EXPECT_EQ(s.driver_evictions, before.driver_evictions);
  EXPECT_EQ(s.d2h_bytes, before.d2h_bytes);
  EXPECT_EQ(s.chunks_taken, 1u);
  EXPECT_EQ(s.chunk_bytes, 8 * kPage);
  ASSERT_TRUE(kernel(1, 1, 0).is_ok());  // page 1 still holds its own: no memory needed
  EXPECT_EQ(driver_.managed_stats().chunks_taken, 1u);
  before = driver_.managed_stats();
  ASSERT_TRUE(kernel(0, 1, 0).is_ok());  // page 0 lost its chunk and none is unused: an eviction
  s = driver_.managed_stats();
  EXPECT_EQ(s.driver_evictions, before.driver_evictions + 1);
  EXPECT_EQ(s.d2h_bytes, before.d2h_bytes + kPage);
  EXPECT_EQ(s.chunk_bytes, 8 * kPage);
  EXPECT_LE(s.peak_chunk_bytes, 8 * kPage);
}

// Another allocation (a chunk here; another process's cudaMalloc on a GPU)
// gets managed pages' memory, as the UVM driver's eviction hands it over:
// unused chunks first, without a copy, then chunks in use, whose pages are
// copied out. Freeing the managed allocation returns all of them.
TEST_F(SimManagedTest, AChunkCreatedOnAFullDeviceTakesManagedMemoryUnusedFirst) {
  ASSERT_TRUE(kernel(0, 8, 0).is_ok());
  ASSERT_TRUE(prefetch(0, 3, true).is_ok());
  PhysHandle handle;
  SimManagedStats before = driver_.managed_stats();
  ASSERT_TRUE(driver_.create(kDevice, 2 * kPage, &handle).is_ok());
  SimManagedStats s = driver_.managed_stats();
  EXPECT_EQ(s.chunk_bytes, 6 * kPage);
  EXPECT_EQ(s.resident_bytes, 5 * kPage) << "no page in use lost its memory";
  EXPECT_EQ(s.chunks_taken, 2u);
  EXPECT_EQ(s.d2h_bytes, before.d2h_bytes);
  PhysHandle more;
  before = s;
  ASSERT_TRUE(driver_.create(kDevice, 2 * kPage, &more).is_ok());  // one unused chunk, then a page in use
  s = driver_.managed_stats();
  EXPECT_EQ(s.chunk_bytes, 4 * kPage);
  EXPECT_EQ(s.resident_bytes, 4 * kPage);
  EXPECT_EQ(s.d2h_bytes - before.d2h_bytes, kPage) << "the page in use was copied out";
  ASSERT_TRUE(driver_.release(more).is_ok());
  ASSERT_TRUE(driver_.release(handle).is_ok());
  size_t free_bytes = 0, total = 0;
  ASSERT_TRUE(driver_.memory_info(kDevice, &free_bytes, &total).is_ok());
  EXPECT_EQ(free_bytes, 4 * kPage);
  void* other = nullptr;
  ASSERT_TRUE(driver_.managed_allocate(2 * kPage, &other).is_ok());
  ASSERT_TRUE(driver_.managed_free(base_).is_ok());
  base_ = other;  // TearDown frees it
  ASSERT_TRUE(driver_.memory_info(kDevice, &free_bytes, &total).is_ok());
  EXPECT_EQ(free_bytes, total) << "a freed allocation returns every chunk it held";
}

TEST_F(SimManagedTest, DataSurvivesEvictionsAndComesBack) {
  for (size_t page = 0; page < 16; ++page) std::memset(at(page), static_cast<int>(page + 1), kPage);
  for (size_t first = 0; first < 16; first += 4) ASSERT_TRUE(kernel(first, 4, 0).is_ok());
  ASSERT_TRUE(prefetch(0, 16, true).is_ok());
  for (size_t page = 0; page < 16; ++page) {
    ASSERT_TRUE(kernel(page, 1, 0).is_ok());
    EXPECT_EQ(static_cast<int>(at(page)[kPage - 1]), static_cast<int>(page + 1)) << "page " << page;
  }
}

TEST_F(SimManagedTest, DiscardDropsWholePagesOnly) {
  for (size_t page = 0; page < 4; ++page) std::memset(at(page), 0x5a, kPage);
  ASSERT_TRUE(kernel(0, 4, 0).is_ok());
  // Half of page 0 and all of pages 1 and 2: page 0 keeps its bytes.
  const VaRange range{reinterpret_cast<uintptr_t>(base_) + kPage / 2, kPage / 2 + 2 * kPage};
  ASSERT_TRUE(driver_.managed_discard(range.ptr(), range.bytes, StreamHandle{}).is_ok());
  EXPECT_EQ(static_cast<int>(at(0)[kPage - 1]), 0x5a);
  EXPECT_EQ(static_cast<int>(at(1)[0]), 0) << "a discarded page reads back as zeros";
  EXPECT_EQ(static_cast<int>(at(2)[kPage - 1]), 0);
  EXPECT_EQ(static_cast<int>(at(3)[0]), 0x5a);
  EXPECT_EQ(driver_.managed_stats().discarded_pages, 2u);
  // A discarded page leaves without a copy.
  const uint64_t d2h = driver_.managed_stats().d2h_bytes;
  ASSERT_TRUE(prefetch(1, 2, true).is_ok());
  EXPECT_EQ(driver_.managed_stats().d2h_bytes, d2h);
}

// A discarded page leaves the device without a copy (the UVM driver puts a
// wholly discarded block's chunk on its unused list). A migration the
// application asks for revokes the discard (uvm_va_block_make_resident_finish,
// cause API_MIGRATE): sent to the host, the page is populated there and comes
// back as a full copy; touched by a kernel instead, it faults in with none.
TEST_F(SimManagedTest, ADiscardReleasesThePageAndAPrefetchToTheHostRevokesIt) {
  ASSERT_TRUE(kernel(0, 8, 0).is_ok());  // eight pages holding data fill the device
  const VaRange dead = pages(0, 2);
  ASSERT_TRUE(driver_.managed_discard(dead.ptr(), dead.bytes, StreamHandle{}).is_ok());
  EXPECT_EQ(driver_.managed_stats().resident_bytes, 6 * kPage) << "the discarded pages still hold device memory";
  SimManagedStats before = driver_.managed_stats();
  ASSERT_TRUE(prefetch(0, 1, true).is_ok());   // page 0 to the host by request: no copy, discard revoked
  ASSERT_TRUE(prefetch(0, 1, false).is_ok());  // and back: a copy of what it held
  SimManagedStats s = driver_.managed_stats();
  EXPECT_EQ(s.d2h_bytes - before.d2h_bytes, 0u);
  EXPECT_EQ(s.h2d_bytes - before.h2d_bytes, kPage) << "the revoked page came back as a copy";

  before = driver_.managed_stats();
  ASSERT_TRUE(kernel(1, 1, 0).is_ok());
  s = driver_.managed_stats();
  EXPECT_EQ(s.faulted_pages - before.faulted_pages, 1u);
  EXPECT_EQ(s.h2d_bytes - before.h2d_bytes, 0u) << "page 1, still discarded, faulted back without a copy";
}

// Stream order on the modelled clock: a migration queued behind a kernel on
// the kernel's own stream starts when the kernel ends, and a kernel made to
// wait for a migration starts when it ends.
TEST_F(SimManagedTest, AStreamRunsItsWorkInOrderOnTheModelledClock) {
  ASSERT_TRUE(kernel(0, 1, 5 * kMs).is_ok());  // [0, 5.1 ms): one fault batch, then 5 ms
  const VaRange page = pages(0, 1);
  ASSERT_TRUE(driver_.managed_prefetch(page.ptr(), page.bytes, PrefetchTarget{true, kDevice}, StreamHandle{}).is_ok());
  ASSERT_TRUE(driver_.event_record(kernels_done_, StreamHandle{}).is_ok());
  ASSERT_TRUE(driver_.stream_wait_event(to_device_, kernels_done_).is_ok());
  ASSERT_TRUE(driver_.managed_prefetch(page.ptr(), page.bytes, PrefetchTarget{false, kDevice}, to_device_).is_ok());
  ASSERT_TRUE(kernel(1, 1, 0).is_ok());  // the legacy stream: after the eviction (6.1 ms), a first touch
  EXPECT_EQ(driver_.managed_stats().now_ns, 6 * kMs + 200'000) << "the eviction waited for the kernel before it";
  ASSERT_TRUE(driver_.event_record(kernels_done_, to_device_).is_ok());
  ASSERT_TRUE(driver_.stream_wait_event(StreamHandle{}, kernels_done_).is_ok());
  ASSERT_TRUE(kernel(1, 1, 0).is_ok());
  EXPECT_EQ(driver_.managed_stats().now_ns, 7 * kMs + 100'000) << "the kernel waited for the page's return";
  EXPECT_EQ(driver_.managed_stats().stall_ns, 0u) << "waiting on its stream is no stall on a page";
}

// The host's side: each call costs the calling thread host time, and a move
// to the host makes it wait for the copy and the CPU's page tables, so the
// kernel it launches next cannot start before.
TEST(SimManagedHostTime, TheCallerPaysForItsCallsAndWaitsForMovesToTheHost) {
  SimOptions o = options();
  o.managed_costs.call_ns = 10'000;
  o.managed_costs.range_ns = 5'000;
  o.managed_costs.block_ns = 1'000;
  o.managed_costs.to_host_sync = true;
  o.managed_costs.cpu_map_block_ns = 20'000;
  o.managed_costs.launch_ns = 2'000;
  SimDriver driver(o);
  void* base = nullptr;
  ASSERT_TRUE(driver.managed_allocate(4 * kPage, &base).is_ok());
  const VaRange two{reinterpret_cast<uintptr_t>(base), 2 * kPage};
  ASSERT_TRUE(driver.run_kernel(std::span<const VaRange>(&two, 1), 0).is_ok());  // launched at 2 us
  StreamHandle out{};
  ASSERT_TRUE(driver.stream_create(kDevice, &out).is_ok());
  // Issued at 2 us + 15 us, in no order with the kernel: copies at
  // [17 us, 1.017 ms) and [1.017, 2.017 ms); the caller waits for them, then
  // maps the CPU (2 x 20 us).
  ASSERT_TRUE(driver.managed_prefetch(two.ptr(), two.bytes, PrefetchTarget{true, kDevice}, out).is_ok());
  const VaRange other{reinterpret_cast<uintptr_t>(base) + 2 * kPage, kPage};
  ASSERT_TRUE(driver.run_kernel(std::span<const VaRange>(&other, 1), 0).is_ok());
  const SimManagedStats s = driver.managed_stats();
  // Launched at 2.057 ms + 2 us, one fault batch.
  EXPECT_EQ(s.now_ns, 17'000 + 2 * kMs + 40'000 + 2'000 + 100'000)
      << "the second kernel was launched only after the move to the host returned";
  EXPECT_EQ(s.idle_ns, 2'000 + (17'000 + 2 * kMs + 42'000 - 102'000));
  EXPECT_TRUE(driver.stream_destroy(out).is_ok());
  EXPECT_TRUE(driver.managed_free(base).is_ok());
}

// Copies both ways at once share the link: each direction gets
// duplex_factor of its rate while the other's engine is busy.
TEST(SimManagedDuplex, CopiesBothWaysAtOnceShareTheLink) {
  for (const double share : {1.0, 0.5}) {
    SimOptions o = options();
    o.managed_costs.duplex_factor = share;
    SimDriver driver(o);
    void* base = nullptr;
    ASSERT_TRUE(driver.managed_allocate(4 * kPage, &base).is_ok());
    const auto page = [&](size_t i) { return VaRange{reinterpret_cast<uintptr_t>(base) + i * kPage, kPage}; };
    const VaRange all{reinterpret_cast<uintptr_t>(base), 4 * kPage};
    ASSERT_TRUE(driver.run_kernel(std::span<const VaRange>(&all, 1), 0).is_ok());  // [0, 0.1 ms): first touch
    const PrefetchTarget host{true, kDevice}, device{false, kDevice};
    ASSERT_TRUE(driver.managed_prefetch(page(3).ptr(), kPage, host, StreamHandle{}).is_ok());    // out [0.1, 1.1 ms)
    ASSERT_TRUE(driver.managed_prefetch(page(0).ptr(), kPage, host, StreamHandle{}).is_ok());    // out [1.1, 2.1 ms)
    StreamHandle in{};
    ASSERT_TRUE(driver.stream_create(kDevice, &in).is_ok());
    ASSERT_TRUE(driver.managed_prefetch(page(3).ptr(), kPage, device, in).is_ok());  // in from 1.1 ms, beside page 0's copy out
    const VaRange three = page(3);
    ASSERT_TRUE(driver.run_kernel(std::span<const VaRange>(&three, 1), 0).is_ok());  // waits for page 3
    EXPECT_EQ(driver.managed_stats().now_ns, 1'100'000 + static_cast<uint64_t>(1e6 / share)) << "share " << share;
    EXPECT_TRUE(driver.stream_destroy(in).is_ok());
    EXPECT_TRUE(driver.managed_free(base).is_ok());
  }
}

// Pages on the host that hold data come to the device discarded: no copy,
// and they read back as zeros.
TEST_F(SimManagedTest, DiscardAndPrefetchBringsPagesWithoutACopy) {
  for (size_t page = 0; page < 4; ++page) std::memset(at(page), 0x3c, kPage);
  ASSERT_TRUE(kernel(0, 4, 0).is_ok());
  ASSERT_TRUE(prefetch(0, 4, true).is_ok());
  const SimManagedStats before = driver_.managed_stats();
  const VaRange ranges[] = {pages(0, 1), pages(2, 2)};
  ASSERT_TRUE(driver_.managed_discard_and_prefetch_batch(ranges, PrefetchTarget{false, kDevice}, StreamHandle{}).is_ok());
  const SimManagedStats after = driver_.managed_stats();
  EXPECT_EQ(after.h2d_bytes, before.h2d_bytes) << "a discarded page was copied";
  EXPECT_EQ(after.prefetched_pages, before.prefetched_pages + 3);
  EXPECT_EQ(after.resident_bytes, before.resident_bytes + 3 * kPage);
  EXPECT_EQ(static_cast<int>(at(0)[0]), 0);
  EXPECT_EQ(static_cast<int>(at(1)[0]), 0x3c) << "a page outside the ranges was discarded";
  EXPECT_EQ(static_cast<int>(at(3)[kPage - 1]), 0);
  ASSERT_TRUE(kernel(0, 4, 0).is_ok());
  EXPECT_EQ(driver_.managed_stats().faulted_pages, after.faulted_pages + 1) << "only the page left out faults";
}

TEST_F(SimManagedTest, CopiesIntoManagedMemoryBringItToTheDevice) {
  std::vector<std::byte> source(kPage, std::byte{7});
  ASSERT_TRUE(driver_.copy_async(at(3), source.data(), kPage, CopyKind::kHostToDevice, StreamHandle{}).is_ok());
  EXPECT_EQ(driver_.managed_stats().faulted_pages, 1u);
  EXPECT_EQ(at(3)[kPage - 1], std::byte{7});
}

// What UmPager learns unseen uses from: each page a kernel or a copy faults
// in, the kernel's under its thread's tag, once started and taken once.
TEST_F(SimManagedTest, FaultReportsNameEachFaultedPageAndTheTagOfItsKernel) {
  std::vector<ManagedFault> reports;
  ASSERT_TRUE(kernel(0, 1, 0).is_ok());
  ASSERT_TRUE(driver_.take_fault_reports(pages(0, 16), &reports).is_ok());
  EXPECT_TRUE(reports.empty()) << "reported before start_fault_reports";

  std::string why;
  EXPECT_EQ(driver_.start_fault_reports(DeviceId{1}, &why).code(), Errc::kNotSupported);
  EXPECT_NE(why.find("device 1"), std::string::npos) << why;
  ASSERT_TRUE(driver_.start_fault_reports(kDevice, &why).is_ok());
  driver_.tag_work(7);
  ASSERT_TRUE(prefetch(2, 1, false).is_ok());  // asked for: no fault
  ASSERT_TRUE(kernel(0, 4, 0).is_ok());        // page 0 resident, 2 prefetched, 1 and 3 fault
  driver_.untag_work();
  std::vector<std::byte> source(kPage, std::byte{7});
  ASSERT_TRUE(driver_.copy_async(at(5), source.data(), kPage, CopyKind::kHostToDevice, StreamHandle{}).is_ok());
  // Each device's pager takes the reports of its own arena's range.
  ASSERT_TRUE(driver_.take_fault_reports(pages(4, 12), &reports).is_ok());
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].tag, 0u) << "a copy carries no kernel's tag";
  EXPECT_EQ(reports[0].address, pages(5, 1).base);
  reports.clear();
  ASSERT_TRUE(driver_.take_fault_reports(pages(0, 16), &reports).is_ok());
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_EQ(reports[0].tag, 7u);
  EXPECT_EQ(reports[0].address, pages(1, 1).base);
  EXPECT_EQ(reports[1].tag, 7u);
  EXPECT_EQ(reports[1].address, pages(3, 1).base);
  reports.clear();
  ASSERT_TRUE(driver_.take_fault_reports(pages(0, 16), &reports).is_ok());
  EXPECT_TRUE(reports.empty()) << "a report was taken twice";
}

TEST_F(SimManagedTest, BadRangesAreRefused) {
  const VaRange outside{reinterpret_cast<uintptr_t>(base_) + 16 * kPage, kPage};
  EXPECT_EQ(driver_.run_kernel(std::span<const VaRange>(&outside, 1), 0).code(), Errc::kInvalidArgument);
  EXPECT_EQ(driver_.managed_prefetch(outside.ptr(), outside.bytes, PrefetchTarget{false, kDevice}, StreamHandle{})
                .code(),
            Errc::kInvalidArgument);
  EXPECT_EQ(driver_.managed_free(outside.ptr()).code(), Errc::kInvalidArgument);
}

}  // namespace
}  // namespace zico::testing
