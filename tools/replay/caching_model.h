// CachingAllocatorModel: PyTorch's CUDA caching allocator, as a replay target.
//
// A model of DeviceCachingAllocator (c10/cuda/CUDACachingAllocator.cpp) in its
// default configuration, used as the baseline that zicoum's numbers are
// compared against. It calls no driver and owns no device memory: "segments"
// are fake address ranges carved from a counter and never dereferenced. What
// it reports is what PyTorch would report: reserved bytes (mapped_bytes) and
// cudaMalloc/cudaFree counts (map_calls/unmap_calls).
//
// What is modelled, by PyTorch's own names:
// - round_size: every request is rounded up to a multiple of kMinBlockSize
//   (512 B), and at least 512 B (roundup_power2_divisions is off by default).
// - Two pools. The small pool takes rounded requests <= kSmallSize (1 MiB) and
//   grows by kSmallBuffer (2 MiB) segments. The large pool takes the rest:
//   requests below kMinLargeAlloc (10 MiB) grow it by kLargeBuffer (20 MiB)
//   segments; larger ones get a segment of the request rounded up to
//   kRoundLarge (2 MiB) (get_allocation_size). A free block never moves
//   between pools.
// - get_free_block: best fit, the smallest free block >= the request, ties
//   broken by the lower address (BlockComparatorSize on a single stream).
// - should_split: the tail of the chosen block becomes a free block if it is
//   >= kMinBlockSize in the small pool or > kSmallSize in the large pool;
//   otherwise the whole block is handed out (and counted as allocated).
// - free_block: the freed block merges with free neighbours of its own
//   segment (try_merge_blocks).
// - Segments are never returned (no empty_cache), except on the OOM path of
//   malloc: when a new segment would take reserved bytes past `limit_bytes`
//   (set_per_process_memory_fraction, or the device being full), every fully
//   free segment of both pools is released (release_cached_blocks), the
//   segment is tried once more (num_alloc_retries), and then the request fails
//   with Errc::kOutOfMemory (num_ooms). Released segments stay released.
// - A request of 0 bytes returns nullptr and allocates nothing, as
//   CUDACachingAllocator::allocate does.
//
// What is not modelled:
// - Streams and events: one stream, so no per-stream pools, recordStream or
//   deferred frees; a freed block is reusable at once.
// - expandable_segments (cuMemMap-grown segments), CUDA graph private pools,
//   free-memory callbacks.
// - garbage_collection_threshold: its age-based release of cached blocks only
//   runs with a memory fraction set and a threshold > 0 (off by default).
// - max_split_size and its oversize rule (blocks >= max_split_size are not
//   split, serve only requests within kLargeBuffer of their size, and are
//   released first on OOM by release_available_cached_blocks). The default
//   max_split_size is SIZE_MAX, which makes every one of those checks a
//   no-op, so the default behaviour modelled here is exact without them.
// - roundup_power2_divisions, pinned host memory, IPC, and what the driver
//   adds on top of cudaMalloc (context, fragmentation of the device heap).
// - Addresses: real cudaMalloc may hand back a released range again and places
//   segments where it likes; here segment addresses only grow, so ties broken
//   by address can differ from a real run in which segments were released.
//
// Cost: O(log n) per allocate and free (an ordered set of free blocks by
// (size, address) per pool, an ordered map of all blocks by address); the OOM
// path is linear in the free blocks, as PyTorch's is.
// Thread-safety: none; the replayer drives it from one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "replay_target.h"

namespace zico::replay {

class CachingAllocatorModel final : public ReplayTarget {
 public:
  // PyTorch's constants, under their PyTorch names.
  static constexpr uint64_t kMinBlockSize = 512;
  static constexpr uint64_t kSmallSize = uint64_t{1} << 20;
  static constexpr uint64_t kSmallBuffer = uint64_t{2} << 20;
  static constexpr uint64_t kLargeBuffer = uint64_t{20} << 20;
  static constexpr uint64_t kMinLargeAlloc = uint64_t{10} << 20;
  static constexpr uint64_t kRoundLarge = uint64_t{2} << 20;
  static constexpr uint64_t kUnlimited = UINT64_MAX;

  // `limit_bytes`: the most the model may reserve, as a memory fraction or a
  // device's capacity would cap cudaMalloc.
  explicit CachingAllocatorModel(uint64_t limit_bytes = kUnlimited);

  [[nodiscard]] const char* name() const override { return "pytorch-caching"; }
  [[nodiscard]] Status allocate(uint32_t block, size_t bytes, void** out) override;
  // Unknown or already-freed pointers are ignored (PyTorch would throw).
  void free(uint32_t block, void* ptr) override;
  [[nodiscard]] uint64_t mapped_bytes() const override { return reserved_bytes_; }
  [[nodiscard]] uint64_t map_calls() const override { return segment_allocs_; }
  [[nodiscard]] uint64_t unmap_calls() const override { return segment_frees_; }

  // PyTorch's other counters: "allocated_bytes" (sizes of the blocks handed
  // out, after rounding and unsplit tails), num_alloc_retries, num_ooms.
  [[nodiscard]] uint64_t allocated_bytes() const { return allocated_bytes_; }
  [[nodiscard]] uint64_t alloc_retries() const { return alloc_retries_; }
  [[nodiscard]] uint64_t ooms() const { return ooms_; }

  // One reserved segment, as torch.cuda.memory_snapshot() lists it.
  struct Segment {
    uintptr_t address = 0;
    uint64_t bytes = 0;
    bool small_pool = false;
    uint64_t allocated_bytes = 0;
  };
  // In address order; linear in the number of blocks.
  [[nodiscard]] std::vector<Segment> segments() const;

  // round_size and get_allocation_size.
  [[nodiscard]] static uint64_t round_size(uint64_t bytes);
  [[nodiscard]] static uint64_t allocation_size(uint64_t rounded);

 private:
  struct Block {
    uint64_t bytes = 0;
    uintptr_t segment = 0;  // the segment's base address
    bool small_pool = false;
    bool allocated = false;
  };
  using FreeSet = std::set<std::pair<uint64_t, uintptr_t>>;  // (bytes, address)

  [[nodiscard]] FreeSet& pool(bool small_pool) { return small_pool ? small_free_ : large_free_; }
  // alloc_block: false when the limit forbids it.
  [[nodiscard]] bool create_segment(uint64_t bytes, bool small_pool, uintptr_t* address);
  // release_cached_blocks: returns every segment that is one free block.
  void release_cached_segments();

  uint64_t limit_bytes_;
  uintptr_t next_address_;
  std::map<uintptr_t, Block> blocks_;      // every block, free or allocated, by address
  std::map<uintptr_t, uint64_t> segment_bytes_;  // base -> size
  FreeSet small_free_;
  FreeSet large_free_;
  uint64_t reserved_bytes_ = 0;
  uint64_t allocated_bytes_ = 0;
  uint64_t segment_allocs_ = 0;
  uint64_t segment_frees_ = 0;
  uint64_t alloc_retries_ = 0;
  uint64_t ooms_ = 0;
};

}  // namespace zico::replay
