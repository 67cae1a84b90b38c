#include "device_allocator.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "driver_contract_test.h"
#include "sim_driver.h"

namespace zico::testing {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

class DeviceAllocatorTest : public ::testing::Test {
 protected:
  void make(size_t budget, SimOptions sim = {}, size_t chunk = 0) {
    allocator_.reset();  // before the driver it uses
    sim.capacity = size_t{1} << 30;
    driver_ = std::make_unique<SimDriver>(sim);
    AllocatorOptions options;
    options.budget_bytes = budget;
    options.chunk_bytes = chunk;
    std::string why;
    ASSERT_TRUE(DeviceAllocator::create(*driver_, DeviceId{0}, options, &allocator_, &why).is_ok()) << why;
  }
  void* alloc(size_t bytes, StreamHandle stream = {}) {
    void* p = nullptr;
    const Status status = allocator_->allocate(bytes, stream, &p);
    EXPECT_TRUE(status.is_ok()) << status.message();
    return p;
  }
  StreamHandle new_stream() {
    StreamHandle s;
    EXPECT_TRUE(driver_->stream_create(DeviceId{0}, &s).is_ok());
    return s;
  }
  // `stream` is busy: a write of `value` over the block stays queued there
  // until the stream is released or synchronized.
  void busy_writing(void* block, size_t bytes, uint8_t value, StreamHandle stream) {
    driver_->hold_stream(stream);
    ZICO_ASSERT_OK(driver_->memset_async(block, value, bytes, stream));
  }
  std::unique_ptr<SimDriver> driver_;
  std::unique_ptr<DeviceAllocator> allocator_;
};

TEST_F(DeviceAllocatorTest, BlocksAreWritableAlignedAndDisjoint) {
  make(256 * kMiB);
  std::vector<std::pair<uint8_t*, size_t>> blocks;
  for (size_t bytes : {size_t{1}, size_t{700}, size_t{4096}, size_t{100000}, kSmallMax, kSmallMax + 1, 3 * kMiB,
                       5 * kMiB + 3}) {
    auto* p = static_cast<uint8_t*>(alloc(bytes));
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kBlockAlign, 0u);
    EXPECT_GE(allocator_->block_size(p), bytes);
    std::memset(p, static_cast<int>(blocks.size() + 1), bytes);
    blocks.emplace_back(p, bytes);
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    EXPECT_EQ(blocks[i].first[0], i + 1);
    EXPECT_EQ(blocks[i].first[blocks[i].second - 1], i + 1) << "block " << i << " was overwritten";
  }
  for (auto& [p, bytes] : blocks) ZICO_ASSERT_OK(allocator_->deallocate(p, {}));
  EXPECT_EQ(allocator_->stats().allocated_bytes, 0u);
}

TEST_F(DeviceAllocatorTest, BudgetCapsMappedMemoryAndRecovers) {
  make(64 * kMiB);
  std::vector<void*> blocks;
  void* p = nullptr;
  while (allocator_->allocate(kMiB, {}, &p).is_ok()) blocks.push_back(p);
  EXPECT_EQ(blocks.size(), 64u);
  EXPECT_EQ(allocator_->allocate(kMiB, {}, &p).code(), Errc::kOutOfMemory);
  AllocatorStats stats = allocator_->stats();
  EXPECT_LE(stats.peak_mapped_bytes, 64 * kMiB);
  EXPECT_EQ(stats.failed_allocations, 2u);
  ZICO_ASSERT_OK(allocator_->deallocate(blocks.back(), {}));
  blocks.pop_back();
  ZICO_ASSERT_OK(allocator_->allocate(kMiB, {}, &p));
  blocks.push_back(p);
  for (void* b : blocks) ZICO_ASSERT_OK(allocator_->deallocate(b, {}));
}

TEST_F(DeviceAllocatorTest, OutOfMemoryLeavesExistingBlocksIntact) {
  make(8 * kMiB);
  auto* keep = static_cast<uint8_t*>(alloc(5 * kMiB));
  std::memset(keep, 0x5E, 5 * kMiB);
  void* p = nullptr;
  EXPECT_EQ(allocator_->allocate(4 * kMiB, {}, &p).code(), Errc::kOutOfMemory);
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(keep[0], 0x5E);
  EXPECT_EQ(keep[5 * kMiB - 1], 0x5E);
  ZICO_ASSERT_OK(allocator_->allocate(2 * kMiB, {}, &p));
}

TEST_F(DeviceAllocatorTest, CacheTrimmedToFitADifferentShape) {
  // Fill the budget with small blocks, free them, then ask for one large block:
  // slabs must be returned and their chunks reused before reporting OOM.
  make(16 * kMiB);
  std::vector<void*> smalls;
  void* p = nullptr;
  while (allocator_->allocate(4096, {}, &p).is_ok()) smalls.push_back(p);
  EXPECT_GT(smalls.size(), 3000u);
  for (void* s : smalls) ZICO_ASSERT_OK(allocator_->deallocate(s, {}));
  ZICO_ASSERT_OK(allocator_->allocate(15 * kMiB, {}, &p));
  EXPECT_LE(allocator_->stats().peak_mapped_bytes, 16 * kMiB);
}

TEST_F(DeviceAllocatorTest, SameStreamReusesAtOnce) {
  make(64 * kMiB);
  const StreamHandle s = new_stream();
  void* a = alloc(4096, s);
  ZICO_ASSERT_OK(allocator_->deallocate(a, s));
  EXPECT_EQ(alloc(4096, s), a);
  void* big = alloc(3 * kMiB, s);
  ZICO_ASSERT_OK(allocator_->deallocate(big, s));
  EXPECT_EQ(alloc(3 * kMiB, s), big);
}

TEST_F(DeviceAllocatorTest, CachedSpanGrowsIntoFreeNeighboursInsteadOfMappingMore) {
  make(64 * kMiB);
  const StreamHandle s = new_stream();
  // [a: 3 MiB][b: 3 MiB] then free b to the stream cache: a request for 4 MiB
  // fits b's span plus the untouched arena after it, without a fourth chunk.
  void* a = alloc(3 * kMiB, s);
  auto* b = static_cast<uint8_t*>(alloc(3 * kMiB, s));
  ZICO_ASSERT_OK(allocator_->deallocate(b, s));
  const size_t mapped_before = allocator_->stats().mapped_bytes;
  auto* grown = static_cast<uint8_t*>(alloc(4 * kMiB, s));
  EXPECT_EQ(grown, b) << "the cached span was extended in place";
  std::memset(grown, 7, 4 * kMiB);
  EXPECT_LE(allocator_->stats().mapped_bytes, mapped_before + 2 * kMiB);
  ZICO_ASSERT_OK(allocator_->deallocate(grown, s));
  ZICO_ASSERT_OK(allocator_->deallocate(a, s));
  ZICO_ASSERT_OK(allocator_->trim());
  EXPECT_EQ(allocator_->stats().mapped_bytes, 0u) << "byte counts stayed consistent through the extension";
}

TEST_F(DeviceAllocatorTest, OtherStreamWaitsForTheFence) {
  make(64 * kMiB);
  const StreamHandle a = new_stream();
  const StreamHandle b = new_stream();
  auto* block = static_cast<uint8_t*>(alloc(3 * kMiB, a));
  busy_writing(block, 3 * kMiB, 0x11, a);  // stream a is still busy writing the block...
  ZICO_ASSERT_OK(allocator_->deallocate(block, a));  // ...when it is freed
  void* on_b = alloc(3 * kMiB, b);
  EXPECT_NE(on_b, block) << "handed to stream b while stream a may still write it";
  ZICO_ASSERT_OK(allocator_->deallocate(on_b, b));
  ZICO_ASSERT_OK(driver_->release_stream(a));
}

TEST_F(DeviceAllocatorTest, BudgetPressureWaitsForFencesInsteadOfFailing) {
  make(4 * kMiB);
  const StreamHandle a = new_stream();
  const StreamHandle b = new_stream();
  auto* block = static_cast<uint8_t*>(alloc(4 * kMiB, a));
  busy_writing(block, 4 * kMiB, 0x22, a);
  ZICO_ASSERT_OK(allocator_->deallocate(block, a));
  // The only memory is a's freed block: b gets it once a's work has finished.
  auto* on_b = static_cast<uint8_t*>(alloc(4 * kMiB, b));
  ASSERT_EQ(on_b, block);
  EXPECT_EQ(on_b[4 * kMiB - 1], 0x22) << "stream a's queued write completed before reuse";
}

TEST_F(DeviceAllocatorTest, IdleStreamsShareFreedBlocksWithoutBudgetPressure) {
  make(64 * kMiB);
  const StreamHandle a = new_stream();
  const StreamHandle b = new_stream();
  void* block = alloc(3 * kMiB, a);
  ZICO_ASSERT_OK(allocator_->deallocate(block, a));  // a has no work queued: its fence completes at once
  EXPECT_EQ(alloc(3 * kMiB, b), block) << "a miss on b hands a's idle cache over";
}

TEST_F(DeviceAllocatorTest, FinishedBlocksAreReusableByEveryStream) {
  make(64 * kMiB);
  const StreamHandle a = new_stream();
  const StreamHandle b = new_stream();
  void* block = alloc(3 * kMiB, a);
  driver_->hold_stream(a);  // even with a busy, a synchronized free needs no fence
  ZICO_ASSERT_OK(allocator_->deallocate(block, kNoPendingWork));
  EXPECT_EQ(alloc(3 * kMiB, b), block);
  ZICO_ASSERT_OK(driver_->release_stream(a));
}

// PyTorch's Tensor.record_stream: a block allocated for stream a and read on
// stream b is not reused, even by a, before b's work is done.
TEST_F(DeviceAllocatorTest, RecordedStreamDelaysReuseUntilItsWorkIsDone) {
  make(64 * kMiB);
  const StreamHandle a = new_stream();
  const StreamHandle b = new_stream();
  for (const size_t bytes : {size_t{3 * kMiB}, size_t{4096}}) {
    auto* block = static_cast<uint8_t*>(alloc(bytes, a));
    ZICO_ASSERT_OK(allocator_->record_stream(block, b));
    EXPECT_EQ(allocator_->stream_uses(block), std::vector<StreamHandle>{b});
    busy_writing(block, bytes, 0x44, b);  // stream b still works on the block...
    ZICO_ASSERT_OK(allocator_->deallocate(block, a));  // ...when it is freed on a
    EXPECT_TRUE(allocator_->stream_uses(block).empty());
    void* again = alloc(bytes, a);
    EXPECT_NE(again, block) << bytes << " bytes: reused on stream a while stream b may still write it";
    ZICO_ASSERT_OK(allocator_->deallocate(again, a));
    ZICO_ASSERT_OK(driver_->release_stream(b));
  }
}

// Under budget pressure the allocator waits for such a block, and gets it
// with the other stream's work done.
TEST_F(DeviceAllocatorTest, RecordedStreamBlockReturnsOnceItsWorkIsDone) {
  make(4 * kMiB);
  const StreamHandle a = new_stream();
  const StreamHandle b = new_stream();
  auto* block = static_cast<uint8_t*>(alloc(4 * kMiB, a));
  ZICO_ASSERT_OK(allocator_->record_stream(block, b));
  busy_writing(block, 4 * kMiB, 0x44, b);
  ZICO_ASSERT_OK(allocator_->deallocate(block, a));
  auto* again = static_cast<uint8_t*>(alloc(4 * kMiB, a));
  ASSERT_EQ(again, block);
  EXPECT_EQ(again[4 * kMiB - 1], 0x44) << "stream b's queued write completed before reuse";
  ZICO_ASSERT_OK(allocator_->deallocate(again, a));
}

// The stream a block was recorded for is destroyed before the block is
// freed: its work is waited for then, as its handle may go to a new stream.
TEST_F(DeviceAllocatorTest, ADestroyedRecordedStreamIsWaitedFor) {
  make(4 * kMiB);
  const StreamHandle a = new_stream();
  const StreamHandle b = new_stream();
  auto* block = static_cast<uint8_t*>(alloc(4 * kMiB, a));
  ZICO_ASSERT_OK(allocator_->record_stream(block, b));
  busy_writing(block, 4 * kMiB, 0x77, b);
  allocator_->fence_stream(b);  // the application destroys b
  EXPECT_TRUE(allocator_->stream_uses(block).empty());
  EXPECT_EQ(block[4 * kMiB - 1], 0x77) << "b's queued work ran before it was forgotten";
}

TEST_F(DeviceAllocatorTest, RecordStreamNamesOnlyLiveBlocks) {
  make(64 * kMiB);
  const StreamHandle s = new_stream();
  auto* large = static_cast<uint8_t*>(alloc(3 * kMiB, s));
  auto* small = static_cast<uint8_t*>(alloc(1000, s));
  int on_stack = 0;
  EXPECT_EQ(allocator_->record_stream(&on_stack, s).code(), Errc::kNotFound);
  EXPECT_EQ(allocator_->record_stream(large + 512, s).code(), Errc::kInvalidArgument);
  EXPECT_EQ(allocator_->record_stream(small + 8, s).code(), Errc::kInvalidArgument);
  ZICO_ASSERT_OK(allocator_->deallocate(large, s));
  EXPECT_EQ(allocator_->record_stream(large, s).code(), Errc::kInvalidArgument) << "freed";
  ZICO_ASSERT_OK(allocator_->record_stream(small, s));
  ZICO_ASSERT_OK(allocator_->deallocate(small, kNoPendingWork));
  EXPECT_TRUE(allocator_->stream_uses(small).empty()) << "a synchronized free forgets the streams";
}

TEST_F(DeviceAllocatorTest, DestroyedStreamHandleReuseWaitsForTheOldWork) {
  make(64 * kMiB);
  const StreamHandle s = new_stream();
  auto* block = static_cast<uint8_t*>(alloc(3 * kMiB, s));
  busy_writing(block, 3 * kMiB, 0x33, s);
  ZICO_ASSERT_OK(allocator_->deallocate(block, s));
  allocator_->fence_stream(s);  // the application destroys s; a new stream may get the same handle
  EXPECT_NE(alloc(3 * kMiB, s), block) << "the old stream's work may still be writing it";
  ZICO_ASSERT_OK(driver_->release_stream(s));
}

// cuMemSetAccess synchronizes: one call per run of chunks mapped together,
// not one per chunk (a 20 MiB block is 10 chunks of 2 MiB, one run).
TEST_F(DeviceAllocatorTest, ABlockOfManyChunksGetsAccessInOneCall) {
  make(64 * kMiB);
  const SimCounters before = driver_->counters();
  auto* p = static_cast<uint8_t*>(alloc(20 * kMiB));
  ASSERT_NE(p, nullptr);
  const SimCounters after = driver_->counters();
  EXPECT_EQ(after.maps - before.maps, 10u);
  EXPECT_EQ(after.set_accesses - before.set_accesses, 1u);
  std::memset(p, 0x5a, 20 * kMiB);  // all of it accessible
  EXPECT_EQ(p[20 * kMiB - 1], 0x5a);
}

// Unmapping waits for the device only if a block was freed since it last
// did: two budget cuts in a row, with no free between, synchronize once.
TEST_F(DeviceAllocatorTest, UnmappingWaitsForTheDeviceOnlyAfterAFree) {
  make(16 * kMiB);
  std::vector<void*> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(alloc(2 * kMiB));
  for (void* p : blocks) ZICO_ASSERT_OK(allocator_->deallocate(p, {}));
  const uint64_t before = driver_->counters().device_syncs;
  ZICO_ASSERT_OK(allocator_->set_budget(12 * kMiB));
  EXPECT_EQ(driver_->counters().device_syncs - before, 1u);
  EXPECT_LE(allocator_->stats().mapped_bytes, 12 * kMiB);
  ZICO_ASSERT_OK(allocator_->set_budget(8 * kMiB));
  EXPECT_EQ(driver_->counters().device_syncs - before, 1u) << "nothing was freed since the last wait";
  EXPECT_LE(allocator_->stats().mapped_bytes, 8 * kMiB);
  void* p = alloc(2 * kMiB);
  ZICO_ASSERT_OK(allocator_->deallocate(p, {}));
  ZICO_ASSERT_OK(allocator_->set_budget(2 * kMiB));
  EXPECT_EQ(driver_->counters().device_syncs - before, 2u) << "a free since: the next unmap waits";
}

// A stream capturing a CUDA graph keeps its cached blocks: a fence recorded
// there would become a node of the graph, never a fence.
TEST_F(DeviceAllocatorTest, NoFenceIsRecordedOnACapturingStream) {
  SimOptions sim;
  sim.capturing_stream = 0x5000;
  make(64 * kMiB, sim);
  const StreamHandle capturing{0x5000};
  const StreamHandle other = new_stream();
  void* p = alloc(4 * kMiB, capturing);
  ZICO_ASSERT_OK(allocator_->deallocate(p, capturing));  // cached for the capturing stream
  void* q = alloc(4 * kMiB, other);                       // another stream misses its cache
  EXPECT_NE(q, p) << "a block cached by a capturing stream went to another stream";
  EXPECT_EQ(driver_->counters().captured_records, 0u);
}

// A block that a capturing stream used is never reused once freed (the
// graph's replays may use it at any time): not even when the rest of its page
// is freed and the allocator gives empty pages back.
TEST_F(DeviceAllocatorTest, ABlockACapturingStreamUsedIsNeverReused) {
  SimOptions sim;
  sim.capturing_stream = 0x5000;
  make(64 * kMiB, sim);
  const StreamHandle s = new_stream();
  for (const size_t bytes : {size_t{4096}, size_t{3 * kMiB}}) {
    void* block = alloc(bytes, s);
    ZICO_ASSERT_OK(allocator_->record_stream(block, StreamHandle{0x5000}));
    ZICO_ASSERT_OK(allocator_->deallocate(block, s));
    ZICO_ASSERT_OK(allocator_->trim());
    std::vector<void*> again;
    for (size_t i = 0; i < 48 * kMiB / bytes && i < 64; ++i) {
      void* p = alloc(bytes, s);
      EXPECT_NE(p, block) << bytes << " bytes: reused while a graph may use it";
      again.push_back(p);
    }
    for (void* p : again) ZICO_ASSERT_OK(allocator_->deallocate(p, s));
  }
}

TEST_F(DeviceAllocatorTest, HopelessRequestFailsWithoutFlushingTheCache) {
  make(64 * kMiB);
  std::vector<void*> blocks;
  for (int i = 0; i < 12; ++i) blocks.push_back(alloc(4 * kMiB));
  for (size_t i = 2; i < blocks.size(); ++i) ZICO_ASSERT_OK(allocator_->deallocate(blocks[i], {}));
  const AllocatorStats before = allocator_->stats();
  void* p = nullptr;
  EXPECT_EQ(allocator_->allocate(100 * kMiB, {}, &p).code(), Errc::kOutOfMemory);
  const AllocatorStats after = allocator_->stats();
  EXPECT_EQ(after.mapped_bytes, before.mapped_bytes) << "nothing unmapped for a request that could never fit";
  EXPECT_EQ(after.chunk_unmaps, before.chunk_unmaps);
  EXPECT_EQ(driver_->counters().device_syncs, 0u);
}

TEST_F(DeviceAllocatorTest, TrimUnmapsIdleChunksWithoutFenceViolations) {
  make(64 * kMiB);
  const StreamHandle s = new_stream();
  std::vector<void*> blocks;
  for (int i = 0; i < 10; ++i) blocks.push_back(alloc(i % 2 ? 3 * kMiB : 8192, s));
  driver_->hold_stream(s);
  for (void* b : blocks) ZICO_ASSERT_OK(driver_->memset_async(b, 1, 64, s));
  for (void* b : blocks) ZICO_ASSERT_OK(allocator_->deallocate(b, s));
  EXPECT_GT(allocator_->stats().mapped_bytes, 0u);
  ZICO_ASSERT_OK(allocator_->trim());  // SimDriver fails an unmap that races queued work
  EXPECT_EQ(allocator_->stats().mapped_bytes, 0u);
  EXPECT_EQ(driver_->counters().live_chunks, 0u);
}

// A trim in mid-iteration keeps idle chunks for what is still to come, and
// gives back the rest, waiting for the stream's work first.
TEST_F(DeviceAllocatorTest, TrimKeepsTheIdleChunksAskedFor) {
  make(64 * kMiB);
  const StreamHandle s = new_stream();
  void* live = alloc(4 * kMiB, s);
  void* freed = alloc(24 * kMiB, s);
  driver_->hold_stream(s);
  ZICO_ASSERT_OK(driver_->memset_async(freed, 1, 64, s));
  ZICO_ASSERT_OK(allocator_->deallocate(freed, s));
  const size_t mapped = allocator_->stats().mapped_bytes;
  size_t given = 0;
  ZICO_ASSERT_OK(allocator_->try_trim(SIZE_MAX, &given, 10 * kMiB));
  EXPECT_EQ(given, 24 * kMiB - 10 * kMiB) << "all the idle chunks but the 10 MiB kept";
  EXPECT_EQ(allocator_->stats().mapped_bytes, mapped - given);
  ZICO_ASSERT_OK(allocator_->try_trim(SIZE_MAX, &given, 10 * kMiB));
  EXPECT_EQ(given, 0u) << "nothing idle beyond what is kept";
  ZICO_ASSERT_OK(allocator_->try_trim(2 * kMiB, &given, 4 * kMiB));
  EXPECT_EQ(given, 2 * kMiB) << "at most what is wanted";
  ZICO_ASSERT_OK(allocator_->deallocate(live, s));
}

TEST_F(DeviceAllocatorTest, RejectsDoubleFreeInteriorAndForeignPointers) {
  make(64 * kMiB);
  auto* small = static_cast<uint8_t*>(alloc(1000));
  auto* large = static_cast<uint8_t*>(alloc(3 * kMiB));
  EXPECT_EQ(allocator_->deallocate(small + 256, {}).code(), Errc::kInvalidArgument);
  EXPECT_EQ(allocator_->deallocate(large + 512, {}).code(), Errc::kInvalidArgument);
  int on_stack = 0;
  EXPECT_EQ(allocator_->deallocate(&on_stack, {}).code(), Errc::kNotFound);
  ZICO_ASSERT_OK(allocator_->deallocate(small, {}));
  ZICO_ASSERT_OK(allocator_->deallocate(large, {}));
  EXPECT_EQ(allocator_->deallocate(small, {}).code(), Errc::kInvalidArgument);
  EXPECT_EQ(allocator_->deallocate(large, {}).code(), Errc::kInvalidArgument);
  EXPECT_EQ(allocator_->stats().frees, 2u);
}

TEST_F(DeviceAllocatorTest, RejectsChunkSizesThatCannotTileTheArena) {
  SimDriver driver;
  for (size_t chunk : {3 * kMiB, 6 * kMiB, 128 * kMiB}) {  // not a multiple, not a power of two, over budget
    std::unique_ptr<DeviceAllocator> allocator;
    AllocatorOptions options;
    options.chunk_bytes = chunk;
    options.budget_bytes = 64 * kMiB;
    std::string why;
    EXPECT_EQ(DeviceAllocator::create(driver, DeviceId{0}, options, &allocator, &why).code(), Errc::kConfigError);
    EXPECT_NE(why.find("ZICO_CHUNK_SIZE"), std::string::npos) << why;
  }
}

// Larger chunks: small pages and large blocks must still never overlap.
TEST_F(DeviceAllocatorTest, LargerChunksKeepBlocksDisjoint) {
  for (size_t chunk : {4 * kMiB, 8 * kMiB}) {
    make(256 * kMiB, {}, chunk);
    EXPECT_EQ(allocator_->arena().base % chunk, 0u);
    std::vector<std::pair<uint8_t*, size_t>> blocks;
    for (size_t bytes : {size_t{100}, kMiB, size_t{5000}, 9 * kMiB, size_t{70000}, 3 * kMiB}) {
      auto* p = static_cast<uint8_t*>(alloc(bytes));
      std::memset(p, static_cast<int>(blocks.size() + 1), bytes);
      blocks.emplace_back(p, bytes);
    }
    for (size_t i = 0; i < blocks.size(); ++i) {
      EXPECT_EQ(blocks[i].first[0], i + 1) << "chunk " << chunk << ": block " << i << " overwritten";
      EXPECT_EQ(blocks[i].first[blocks[i].second - 1], i + 1);
    }
    EXPECT_EQ(allocator_->stats().mapped_bytes % chunk, 0u);
    for (auto& [p, bytes] : blocks) ZICO_ASSERT_OK(allocator_->deallocate(p, {}));
    ZICO_ASSERT_OK(allocator_->trim());
    EXPECT_EQ(allocator_->stats().mapped_bytes, 0u);
  }
}

TEST_F(DeviceAllocatorTest, FailedMapRollsBackAndTheNextCallSucceeds) {
  make(64 * kMiB);
  driver_->inject_failure(SimOp::kMap, 2);  // second chunk of a 3-chunk block
  void* p = nullptr;
  EXPECT_EQ(allocator_->allocate(5 * kMiB, {}, &p).code(), Errc::kInjectedFault);
  EXPECT_EQ(allocator_->stats().mapped_bytes, 0u) << "no chunk leaked by the failed call";
  ZICO_ASSERT_OK(allocator_->allocate(5 * kMiB, {}, &p));
}

TEST_F(DeviceAllocatorTest, ShrinkingTheBudgetReturnsIdleMemory) {
  make(64 * kMiB);
  void* keep = alloc(4 * kMiB);
  void* drop = alloc(20 * kMiB);
  ZICO_ASSERT_OK(allocator_->deallocate(drop, {}));
  EXPECT_GE(allocator_->stats().mapped_bytes, 24 * kMiB);
  ZICO_ASSERT_OK(allocator_->set_budget(8 * kMiB));
  EXPECT_LE(allocator_->stats().mapped_bytes, 8 * kMiB);
  void* p = nullptr;
  EXPECT_EQ(allocator_->allocate(6 * kMiB, {}, &p).code(), Errc::kOutOfMemory);
  ZICO_ASSERT_OK(allocator_->deallocate(keep, {}));
}

TEST_F(DeviceAllocatorTest, IterationMarksRecordThePeakOfEachIteration) {
  make(64 * kMiB);
  allocator_->mark_iteration();
  void* a = alloc(8 * kMiB);
  void* b = alloc(4 * kMiB);
  ZICO_ASSERT_OK(allocator_->deallocate(a, {}));
  ZICO_ASSERT_OK(allocator_->deallocate(b, {}));
  allocator_->mark_iteration();
  const AllocatorStats stats = allocator_->stats();
  EXPECT_EQ(stats.iterations, 2u);
  EXPECT_EQ(stats.last_iteration_peak_bytes, 12 * kMiB);
}

// Random sizes, random frees, several streams: data survives and the budget holds.
TEST_F(DeviceAllocatorTest, RandomChurnKeepsDataAndBudget) {
  make(48 * kMiB);
  const StreamHandle streams[] = {new_stream(), new_stream(), StreamHandle{}};
  struct Live {
    uint8_t* p;
    size_t bytes;
    uint8_t tag;
    StreamHandle stream;
  };
  std::vector<Live> live;
  std::mt19937_64 rng(42);
  size_t refused = 0;
  for (int op = 0; op < 30000; ++op) {
    if (!live.empty() && rng() % 100 < 48) {
      const size_t i = rng() % live.size();
      ASSERT_EQ(live[i].p[0], live[i].tag);
      ASSERT_EQ(live[i].p[live[i].bytes - 1], live[i].tag);
      ZICO_ASSERT_OK(allocator_->deallocate(live[i].p, streams[rng() % 3]));
      live[i] = live.back();
      live.pop_back();
      continue;
    }
    const size_t bytes = 1 + rng() % (size_t{512} << (rng() % 13));
    const StreamHandle stream = streams[rng() % 3];
    void* p = nullptr;
    const Status status = allocator_->allocate(bytes, stream, &p);
    if (status.code() == Errc::kOutOfMemory) {
      ++refused;
      continue;
    }
    ZICO_ASSERT_OK(status);
    const auto tag = static_cast<uint8_t>(rng());
    auto* bytes_ptr = static_cast<uint8_t*>(p);
    bytes_ptr[0] = tag;
    bytes_ptr[bytes - 1] = tag;
    live.push_back({bytes_ptr, bytes, tag, stream});
    ASSERT_LE(allocator_->stats().mapped_bytes, 48 * kMiB);
  }
  for (const Live& l : live) {
    ASSERT_EQ(l.p[0], l.tag);
    ZICO_ASSERT_OK(allocator_->deallocate(l.p, l.stream));
  }
  ZICO_ASSERT_OK(allocator_->trim());
  const AllocatorStats stats = allocator_->stats();
  EXPECT_EQ(stats.allocated_bytes, 0u);
  EXPECT_EQ(stats.mapped_bytes, 0u);
  EXPECT_LE(stats.peak_mapped_bytes, 48 * kMiB);
  RecordProperty("refused", static_cast<int>(refused));
}

TEST_F(DeviceAllocatorTest, ThreadsShareOneAllocatorSafely) {
  make(128 * kMiB);
  auto worker = [this](int seed) {
    std::mt19937_64 rng(static_cast<uint64_t>(seed));
    std::vector<std::pair<uint8_t*, uint8_t>> mine;
    for (int op = 0; op < 20000; ++op) {
      if (!mine.empty() && rng() % 2 == 0) {
        const auto [p, tag] = mine.back();
        mine.pop_back();
        if (*p != tag) ADD_FAILURE() << "data race corrupted a block";
        if (!allocator_->deallocate(p, StreamHandle{static_cast<uintptr_t>(seed)}).is_ok()) ADD_FAILURE();
      } else {
        void* p = nullptr;
        if (allocator_->allocate(512 + rng() % (2 * kMiB), StreamHandle{static_cast<uintptr_t>(seed)}, &p).is_ok()) {
          const auto tag = static_cast<uint8_t>(rng());
          *static_cast<uint8_t*>(p) = tag;
          mine.emplace_back(static_cast<uint8_t*>(p), tag);
        }
      }
    }
    for (auto [p, tag] : mine) EXPECT_TRUE(allocator_->deallocate(p, {}).is_ok());
  };
  std::thread t1(worker, 1), t2(worker, 2), t3(worker, 3);
  t1.join();
  t2.join();
  t3.join();
  EXPECT_EQ(allocator_->stats().allocated_bytes, 0u);
  EXPECT_LE(allocator_->stats().peak_mapped_bytes, 128 * kMiB);
}

}  // namespace
}  // namespace zico::testing
