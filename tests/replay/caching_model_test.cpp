#include "caching_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

namespace zico::replay {
namespace {

constexpr uint64_t kKiB = uint64_t{1} << 10;
constexpr uint64_t kMiB = uint64_t{1} << 20;

using Model = CachingAllocatorModel;

uintptr_t alloc(Model& model, uint64_t bytes) {
  void* ptr = nullptr;
  const Status status = model.allocate(0, bytes, &ptr);
  EXPECT_TRUE(status.is_ok()) << status.message() << " for " << bytes << " bytes";
  return reinterpret_cast<uintptr_t>(ptr);
}

void release(Model& model, uintptr_t address) { model.free(0, reinterpret_cast<void*>(address)); }

TEST(CachingAllocatorModel, RoundsRequestsTo512Bytes) {
  EXPECT_EQ(Model::round_size(1), 512u);
  EXPECT_EQ(Model::round_size(512), 512u);
  EXPECT_EQ(Model::round_size(513), 1024u);
  EXPECT_EQ(Model::round_size(5 * kMiB + 1), 5 * kMiB + 512);

  Model model;
  alloc(model, 1);
  EXPECT_EQ(model.allocated_bytes(), 512u);
  alloc(model, 700);
  EXPECT_EQ(model.allocated_bytes(), 512u + 1024u);
}

TEST(CachingAllocatorModel, SegmentSizesFollowThePools) {
  EXPECT_EQ(Model::allocation_size(512), 2 * kMiB);
  EXPECT_EQ(Model::allocation_size(kMiB), 2 * kMiB);
  EXPECT_EQ(Model::allocation_size(kMiB + 512), 20 * kMiB);
  EXPECT_EQ(Model::allocation_size(10 * kMiB - 512), 20 * kMiB);
  EXPECT_EQ(Model::allocation_size(10 * kMiB), 10 * kMiB);
  EXPECT_EQ(Model::allocation_size(11 * kMiB), 12 * kMiB);
}

TEST(CachingAllocatorModel, SmallRequestsShareA2MiBSegment) {
  Model model;
  const uintptr_t a = alloc(model, 100 * kKiB);
  const uintptr_t b = alloc(model, 100 * kKiB);
  const uintptr_t c = alloc(model, 1000);
  EXPECT_EQ(b, a + 100 * kKiB) << "split from the front of the same segment";
  EXPECT_EQ(c, b + 100 * kKiB);
  EXPECT_EQ(model.map_calls(), 1u);
  EXPECT_EQ(model.mapped_bytes(), 2 * kMiB);
  // A 1 MiB request is still small; it fits in what is left of the segment.
  alloc(model, kMiB);
  EXPECT_EQ(model.map_calls(), 1u);
  // The tail is now under 1 MiB: the next 1 MiB needs another 2 MiB segment.
  alloc(model, kMiB);
  EXPECT_EQ(model.map_calls(), 2u);
  EXPECT_EQ(model.mapped_bytes(), 4 * kMiB);
}

TEST(CachingAllocatorModel, MidSizedRequestsShareA20MiBSegment) {
  Model model;
  const uintptr_t a = alloc(model, 5 * kMiB);
  EXPECT_EQ(model.map_calls(), 1u);
  EXPECT_EQ(model.mapped_bytes(), 20 * kMiB);
  const uintptr_t b = alloc(model, 5 * kMiB);
  EXPECT_EQ(b, a + 5 * kMiB) << "the second 5 MiB comes out of the 15 MiB tail";
  EXPECT_EQ(model.map_calls(), 1u);
  release(model, b);
  EXPECT_EQ(alloc(model, 5 * kMiB), b) << "and comes back to the same place after a free";
  EXPECT_EQ(model.map_calls(), 1u);
  EXPECT_EQ(model.mapped_bytes(), 20 * kMiB);
}

TEST(CachingAllocatorModel, LargeRequestsGetTheirOwnSegment) {
  Model model;
  alloc(model, 12 * kMiB);
  EXPECT_EQ(model.mapped_bytes(), 12 * kMiB);
  alloc(model, 11 * kMiB + 1);
  EXPECT_EQ(model.mapped_bytes(), 24 * kMiB) << "rounded up to kRoundLarge";
  EXPECT_EQ(model.map_calls(), 2u);
  // 12 MiB of a 12 MiB segment leaves nothing to split; 11 MiB + 512 of a
  // 12 MiB segment leaves under 1 MiB, which is not split off either.
  EXPECT_EQ(model.allocated_bytes(), 24 * kMiB);
}

TEST(CachingAllocatorModel, PoolsDoNotLendToEachOther) {
  Model model;
  release(model, alloc(model, 5 * kMiB));  // a free 20 MiB block in the large pool
  alloc(model, 4 * kKiB);
  EXPECT_EQ(model.map_calls(), 2u) << "a small request never takes a large-pool block";
  EXPECT_EQ(model.mapped_bytes(), 22 * kMiB);
}

TEST(CachingAllocatorModel, BestFitTakesTheSmallestFittingBlock) {
  Model model;
  // One 20 MiB segment: [a 4][x 2][b 3][y 2][tail 9], then a and b freed.
  const uintptr_t a = alloc(model, 4 * kMiB);
  alloc(model, 2 * kMiB);
  const uintptr_t b = alloc(model, 3 * kMiB);
  alloc(model, 2 * kMiB);
  release(model, a);
  release(model, b);
  ASSERT_EQ(model.map_calls(), 1u);
  EXPECT_EQ(alloc(model, 3 * kMiB), b) << "3 MiB fits b exactly";
  EXPECT_EQ(alloc(model, 3 * kMiB + kMiB / 2), a) << "then a (4 MiB) beats the 9 MiB tail";
  // The 512 KiB left of a is below the large pool's split threshold.
  EXPECT_EQ(model.allocated_bytes(), 4 * kMiB + 2 * kMiB + 3 * kMiB + 2 * kMiB);
  EXPECT_EQ(model.map_calls(), 1u);
}

TEST(CachingAllocatorModel, BestFitBreaksTiesByAddress) {
  Model model;
  const uintptr_t a = alloc(model, 2 * kMiB);
  alloc(model, 2 * kMiB);
  const uintptr_t b = alloc(model, 2 * kMiB);
  alloc(model, 2 * kMiB);
  release(model, b);
  release(model, a);
  EXPECT_EQ(alloc(model, 2 * kMiB), a);
  EXPECT_EQ(alloc(model, 2 * kMiB), b);
}

TEST(CachingAllocatorModel, CoalescingRestoresAWholeSegment) {
  Model model;
  const uintptr_t a = alloc(model, 5 * kMiB);
  const uintptr_t b = alloc(model, 5 * kMiB);
  const uintptr_t c = alloc(model, 5 * kMiB);
  release(model, b);  // merges with nothing
  release(model, a);  // merges with b
  release(model, c);  // merges with a+b and the free tail
  const std::vector<Model::Segment> segments = model.segments();
  ASSERT_EQ(segments.size(), 1u);
  EXPECT_EQ(segments[0].allocated_bytes, 0u);
  EXPECT_EQ(model.allocated_bytes(), 0u);
  // Only a whole 20 MiB free block can serve a 20 MiB request without a new segment.
  EXPECT_EQ(alloc(model, 20 * kMiB), a);
  EXPECT_EQ(model.map_calls(), 1u);
}

TEST(CachingAllocatorModel, SmallBlocksCoalesceToo) {
  Model model;
  std::vector<uintptr_t> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(alloc(model, 512 * kKiB));
  ASSERT_EQ(model.map_calls(), 1u);
  release(model, blocks[0]);
  release(model, blocks[2]);
  release(model, blocks[1]);
  release(model, blocks[3]);
  // Coalesced back into one 2 MiB block: four 512 KiB requests fit again.
  for (int i = 0; i < 4; ++i) EXPECT_EQ(alloc(model, 512 * kKiB), blocks[static_cast<size_t>(i)]);
  EXPECT_EQ(model.map_calls(), 1u);
}

TEST(CachingAllocatorModel, LimitReleasesCachedSegmentsThenFails) {
  Model model(40 * kMiB);
  release(model, alloc(model, 5 * kMiB));  // a cached, fully free 20 MiB segment
  const uintptr_t small = alloc(model, 100 * kKiB);
  EXPECT_EQ(model.mapped_bytes(), 22 * kMiB);

  // The cached 20 MiB block is too small for 22 MiB, and 22 + 22 > 40: the
  // free segment goes back to the driver, then 2 + 22 fits.
  alloc(model, 22 * kMiB);
  EXPECT_EQ(model.unmap_calls(), 1u);
  EXPECT_EQ(model.alloc_retries(), 1u);
  EXPECT_EQ(model.mapped_bytes(), 24 * kMiB);
  EXPECT_EQ(model.ooms(), 0u);

  // 24 + 22 > 40 and nothing is fully free: out of memory.
  void* ptr = nullptr;
  EXPECT_EQ(model.allocate(0, 22 * kMiB, &ptr).code(), Errc::kOutOfMemory);
  EXPECT_EQ(model.ooms(), 1u);
  EXPECT_EQ(model.alloc_retries(), 2u);
  EXPECT_EQ(model.unmap_calls(), 1u);
  EXPECT_EQ(model.mapped_bytes(), 24 * kMiB);

  // Free segments are released even when the retry still fails.
  release(model, small);
  EXPECT_EQ(model.allocate(0, 22 * kMiB, &ptr).code(), Errc::kOutOfMemory);
  EXPECT_EQ(model.unmap_calls(), 2u);
  EXPECT_EQ(model.mapped_bytes(), 22 * kMiB);
  EXPECT_EQ(model.ooms(), 2u);
  // A request that fits under the limit still succeeds afterwards.
  alloc(model, 10 * kMiB);
  EXPECT_EQ(model.mapped_bytes(), 32 * kMiB);
}

TEST(CachingAllocatorModel, CachedBlocksServeLargerRequestsBeforeTheLimitIsHit) {
  Model model(24 * kMiB);
  release(model, alloc(model, 5 * kMiB));
  const uintptr_t reused = alloc(model, 12 * kMiB);
  EXPECT_EQ(model.map_calls(), 1u) << "a 12 MiB request fits the cached 20 MiB block";
  EXPECT_EQ(model.alloc_retries(), 0u);
  EXPECT_EQ(model.segments().at(0).address, reused);
}

TEST(CachingAllocatorModel, LimitDoesNotReleasePartlyUsedSegments) {
  Model model(20 * kMiB);
  alloc(model, 5 * kMiB);
  release(model, alloc(model, 5 * kMiB));  // free, but inside a segment still in use
  void* ptr = nullptr;
  EXPECT_EQ(model.allocate(0, 100 * kKiB, &ptr).code(), Errc::kOutOfMemory);
  EXPECT_EQ(model.unmap_calls(), 0u);
  EXPECT_EQ(model.mapped_bytes(), 20 * kMiB);
}

TEST(CachingAllocatorModel, MappedBytesIsTheSumOfSegments) {
  Model model;
  alloc(model, 12 * kMiB);  // first, or it would fit the 20 MiB segment's tail
  alloc(model, 5 * kMiB);
  alloc(model, 64 * kKiB);
  EXPECT_EQ(model.map_calls(), 3u);
  EXPECT_EQ(model.mapped_bytes(), 2 * kMiB + 20 * kMiB + 12 * kMiB);
  uint64_t sum = 0;
  for (const Model::Segment& segment : model.segments()) sum += segment.bytes;
  EXPECT_EQ(sum, model.mapped_bytes());
}

TEST(CachingAllocatorModel, ZeroBytesAndUnknownPointers) {
  Model model;
  void* ptr = reinterpret_cast<void*>(1);
  ASSERT_TRUE(model.allocate(0, 0, &ptr).is_ok());
  EXPECT_EQ(ptr, nullptr);
  EXPECT_EQ(model.map_calls(), 0u);
  model.free(0, nullptr);
  const uintptr_t a = alloc(model, 4 * kKiB);
  release(model, a + 512);  // inside a block, not its start
  release(model, a);
  release(model, a);  // double free
  EXPECT_EQ(model.allocated_bytes(), 0u);
}

// Random traffic against the model's invariants: live blocks never overlap,
// lie inside one segment each, and the counters agree with the snapshot.
TEST(CachingAllocatorModel, RandomTrafficKeepsInvariants) {
  Model model(512 * kMiB);
  std::mt19937_64 rng(7);
  struct Live {
    uintptr_t address;
    uint64_t bytes;
  };
  std::vector<Live> live;
  std::uniform_int_distribution<int> kind(0, 9);
  for (int step = 0; step < 20000; ++step) {
    if (!live.empty() && kind(rng) < 5) {
      const size_t victim = rng() % live.size();
      release(model, live[victim].address);
      live[victim] = live.back();
      live.pop_back();
      continue;
    }
    const int k = kind(rng);
    const uint64_t bytes = k < 6 ? 1 + rng() % kMiB : (k < 9 ? kMiB + rng() % (9 * kMiB) : 10 * kMiB + rng() % (40 * kMiB));
    void* ptr = nullptr;
    if (model.allocate(0, bytes, &ptr).is_ok()) live.push_back({reinterpret_cast<uintptr_t>(ptr), bytes});
  }
  std::sort(live.begin(), live.end(), [](const Live& x, const Live& y) { return x.address < y.address; });
  for (size_t i = 1; i < live.size(); ++i) {
    ASSERT_LE(live[i - 1].address + live[i - 1].bytes, live[i].address) << "live blocks overlap";
  }
  const std::vector<Model::Segment> segments = model.segments();
  uint64_t reserved = 0;
  uint64_t allocated = 0;
  size_t s = 0;
  for (const Live& block : live) {
    while (s < segments.size() && segments[s].address + segments[s].bytes <= block.address) ++s;
    ASSERT_LT(s, segments.size());
    EXPECT_GE(block.address, segments[s].address);
    EXPECT_LE(block.address + block.bytes, segments[s].address + segments[s].bytes);
  }
  for (const Model::Segment& segment : segments) {
    reserved += segment.bytes;
    allocated += segment.allocated_bytes;
    EXPECT_LE(segment.allocated_bytes, segment.bytes);
  }
  EXPECT_EQ(reserved, model.mapped_bytes());
  EXPECT_EQ(allocated, model.allocated_bytes());
  EXPECT_LE(model.mapped_bytes(), 512 * kMiB);
  EXPECT_EQ(model.map_calls() - model.unmap_calls(), segments.size());
  EXPECT_GT(model.unmap_calls(), 0u) << "the traffic should reach the limit and release segments";
  EXPECT_GT(model.ooms(), 0u) << "and sometimes fail";

  for (const Live& block : live) release(model, block.address);
  EXPECT_EQ(model.allocated_bytes(), 0u);
  for (const Model::Segment& segment : model.segments()) EXPECT_EQ(segment.allocated_bytes, 0u);
}

}  // namespace
}  // namespace zico::replay
