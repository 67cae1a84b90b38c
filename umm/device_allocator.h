// DeviceAllocator: the caching allocator for one device, over one VA arena.
//
// Addresses: one arena (a VA reservation, 4x device memory by default) is
// reserved for the allocator's life; every block lives inside it and keeps
// its address while the physical chunks behind it come and go.
//
// Blocks: requests up to kSmallMax are rounded to a size class and carved
// from pages (a chunk cut into pages of up to 256 KiB, each page serving one
// class); larger ones are rounded to 512 bytes and placed best-fit anywhere
// in the arena (SpanHeap), spanning chunks and sharing boundary chunks with
// neighbours; blocks of 16 MiB and more take the high end of their span and
// smaller ones the low end, which keeps medium long-lived blocks out of the
// holes that large activations leave. Chunks are mapped on demand
// (ChunkMap); mapped bytes never exceed the budget.
//
// Stream-ordered reuse: a block freed on stream S goes to S's cache and is
// reused by S at once (stream order makes that safe). Large blocks in a
// stream's cache coalesce with their cached neighbours, so a stream that
// frees its activations gets one contiguous span back, not splinters.
// Other streams get it only after an event recorded on S has completed: on
// a cache miss, other streams' caches are handed over in batches behind one
// event each ("fences"), and completed fences are collected. A block that
// other streams used too (record_stream, PyTorch's Tensor.record_stream)
// skips S's cache when freed: it waits behind an event on each of those
// streams and on S, then goes to the shared pools. An allocation
// that would break the budget first waits for all fences, returns empty
// pages and unmaps idle chunks (after a device synchronize, since unmap does
// not wait for the GPU), and only then fails with kOutOfMemory, leaving every
// existing block intact. A request larger than the budget minus live memory
// fails at once, without disturbing the cache.
//
// Suspend and resume: suspend() waits for all GPU work, returns idle memory,
// and evicts every chunk that holds blocks to a BackingStore, releasing all
// of the device memory; allocations fail with kSuspended until resume() maps
// the chunks again at the same addresses and loads their contents. A failed
// suspend leaves everything mapped (in the rare case where undoing it fails
// too, the allocator stays suspended with its data safe in the store, and
// resume() finishes the job); a failed resume leaves the rest in the store,
// and resume() may be called again.
//
// Under the node manager the chunks are lent by zico-umd (a ChunkSource that
// may wait): before asking for more, the allocator reuses its own idle chunks,
// and when the daemon picks it to break a deadlock (kYield) it parks its data
// in the yield store, gives everything back and waits for it all to return,
// inside the allocation call. That rests on one assumption: while a thread
// is inside this allocator, no other thread of the process launches GPU work
// on the allocator's memory (the caching allocators of PyTorch and of CUDA
// applications allocate on the thread that launches).
//
// Thread-safety: all methods lock one mutex; owns() is lock-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "backing_store.h"
#include "chunk_map.h"
#include "chunk_source.h"
#include "driver.h"
#include "size_classes.h"
#include "span_heap.h"

namespace zico {

// At most this many chunks per arena (16 bytes of bookkeeping each).
inline constexpr size_t kMaxArenaChunks = size_t{1} << 22;

// Passed to deallocate() when no GPU work can still touch the block (the
// caller synchronized): the block is reusable by every stream at once.
inline constexpr StreamHandle kNoPendingWork{~uintptr_t{0}};

struct AllocatorOptions {
  size_t budget_bytes = SIZE_MAX;  // cap on mapped bytes
  size_t chunk_bytes = 0;          // 0: the driver's granularity
  size_t arena_bytes = 0;          // 0: 4x the device's memory
  // Where chunks come from; nullptr: the driver (standalone). Must outlive the allocator.
  ChunkSource* source = nullptr;
  // Where a yield (chunk_source.h) parks the job's data; nullptr: yielding fails.
  BackingStore* yield_store = nullptr;
};

struct AllocatorStats {
  size_t budget_bytes = 0;
  size_t allocated_bytes = 0;  // live blocks, rounded sizes
  size_t peak_allocated_bytes = 0;
  size_t mapped_bytes = 0;
  size_t peak_mapped_bytes = 0;
  size_t cached_bytes = 0;  // freed blocks awaiting reuse (per stream, fenced, or ready)
  uint64_t allocations = 0;
  uint64_t frees = 0;
  uint64_t failed_allocations = 0;
  uint64_t chunk_maps = 0;
  uint64_t chunk_unmaps = 0;
  uint64_t iterations = 0;
  size_t last_iteration_peak_bytes = 0;
  size_t last_iteration_low_bytes = 0;  // live throughout the last iteration: persistent memory
  uint64_t yields = 0;                  // times the node manager made this job give all back
};

class DeviceAllocator {
 public:
  // Reserves the arena. *why explains a failure (bad chunk size, no VA).
  [[nodiscard]] static Status create(Driver& driver, DeviceId device, const AllocatorOptions& options,
                                     std::unique_ptr<DeviceAllocator>* out, std::string* why);
  // Unmaps everything and frees the arena: outstanding pointers die with it.
  // If suspended, the evicted contents are dropped and their slots returned.
  ~DeviceAllocator();
  DeviceAllocator(const DeviceAllocator&) = delete;
  DeviceAllocator& operator=(const DeviceAllocator&) = delete;

  // bytes > 0. The block is ready for work on `stream` when this returns.
  [[nodiscard]] Status allocate(size_t bytes, StreamHandle stream, void** out) noexcept;
  // `stream` is where the block was last used. kInvalidArgument for a pointer
  // that is not a live block of this allocator (double free, interior pointer).
  [[nodiscard]] Status deallocate(void* ptr, StreamHandle stream) noexcept;
  // Work queued on `stream` may use the live block at `ptr` (which was
  // allocated for another stream): when the block is freed, it is not reused
  // until that work is done (a block freed while such a stream captures a
  // graph is never reused). kNotFound outside the arena, kInvalidArgument for
  // an address that is not a live block's start.
  [[nodiscard]] Status record_stream(void* ptr, StreamHandle stream) noexcept;
  // The streams record_stream() named for the live block at `ptr` (none if
  // host memory for the copy runs out).
  [[nodiscard]] std::vector<StreamHandle> stream_uses(const void* ptr) const noexcept;
  // `stream` is about to be destroyed (its handle may be reused by a new
  // stream): hand its cache over behind a fence now, and wait for its work if
  // a live block was recorded for it.
  void fence_stream(StreamHandle stream) noexcept;
  // Rounded size of a live block, 0 if `ptr` is not one.
  [[nodiscard]] size_t block_size(const void* ptr) const noexcept;
  [[nodiscard]] bool owns(const void* ptr) const noexcept { return arena_.contains(reinterpret_cast<uintptr_t>(ptr)); }

  // Waits for all fences and returns every idle chunk to the driver.
  [[nodiscard]] Status trim() noexcept;
  // Returns idle chunks until `want` bytes are freed, keeping `keep_idle`
  // bytes of them (what the caller expects to allocate again soon), unless
  // another thread holds the allocator (then *freed = 0 at once: a reclaim
  // must never wait on an allocation that is itself waiting for memory).
  [[nodiscard]] Status try_trim(size_t want, size_t* freed, size_t keep_idle = 0) noexcept;
  // stats() unless another thread holds the allocator; false then.
  [[nodiscard]] bool try_stats(AllocatorStats* out) const noexcept;
  // Future maps obey the new budget; shrinking also trims idle memory.
  [[nodiscard]] Status set_budget(size_t bytes) noexcept;
  void mark_iteration() noexcept;
  // The caller keeps `store` alive until resume() has succeeded. No other
  // thread may launch work on this allocator's memory while suspended.
  [[nodiscard]] Status suspend(BackingStore& store) noexcept;
  [[nodiscard]] Status resume() noexcept;
  [[nodiscard]] bool suspended() const noexcept;
  [[nodiscard]] AllocatorStats stats() const noexcept;
  // The peaks start again from now (PyTorch's reset_peak_memory_stats).
  void reset_peaks() noexcept;

  [[nodiscard]] DeviceId device() const { return device_; }
  [[nodiscard]] VaRange arena() const { return arena_; }
  [[nodiscard]] size_t chunk_bytes() const { return chunks_.chunk_bytes(); }

 private:
  // A page serves blocks of one size class while `assigned`.
  struct SmallPage {
    bool assigned = false;
    uint32_t size_class = 0;
    uint32_t live = 0;             // allocated slots
    std::vector<uint64_t> in_use;  // one bit per slot: catches double frees
  };
  // A chunk given over to small blocks.
  struct SmallChunk {
    std::vector<SmallPage> pages;
    size_t assigned_pages = 0;
  };
  // Free blocks that one stream may reuse without a fence.
  struct StreamCache {
    StreamHandle stream;
    std::array<std::vector<uintptr_t>, kNumSizeClasses> small;
    size_t small_blocks = 0;
    SpanHeap large{VaRange{}};  // coalescing, best fit
    [[nodiscard]] bool empty() const { return small_blocks == 0 && large.span_count() == 0; }
  };
  struct CachedBlock {
    uintptr_t addr;
    size_t bytes;  // rounded size
    bool small;
  };
  // Blocks handed over from a stream cache, usable by all once `event`
  // completes; a block used on several streams also waits for `more_events`.
  struct Fence {
    EventHandle event;
    std::vector<EventHandle> more_events;
    std::vector<CachedBlock> blocks;
  };

  DeviceAllocator(Driver& driver, DeviceId device, VaRange arena, size_t chunk_bytes, const AllocatorOptions& options);

  Status allocate_small(size_t cls, StreamHandle stream, void** out);
  Status allocate_large(size_t bytes, StreamHandle stream, void** out);
  bool take_cached_small(size_t cls, StreamCache& cache, void** out);
  bool take_cached_large(size_t bytes, StreamCache& cache, void** out);
  // Grows one of the stream's cached spans into the free arena around it.
  bool extend_cached_large(size_t bytes, StreamCache& cache, void** out);
  // Places a span from the free arena and maps it within the budget.
  Status place(size_t bytes, size_t alignment, uintptr_t* out);
  // Maps whatever of `range` is unmapped, unmapping idle chunks elsewhere if
  // the budget (or the device) requires it.
  Status map_within_budget(VaRange range);
  void give_large_block(uintptr_t addr, size_t bytes, void** out);
  // Assigns a free page (from a new small chunk if need be) to class `cls`.
  Status new_page(size_t cls);
  // Rounded size of the live block at `addr`, 0 if there is none.
  size_t live_block_bytes(uintptr_t addr) const;
  // The assigned page holding `addr`, or nullptr.
  SmallPage* page_of(uintptr_t addr) const;
  [[nodiscard]] bool in_small_chunk(uintptr_t addr) const {
    return small_chunk_of_[chunks_.index_of(addr)] != nullptr;
  }
  void mark_small_live(uintptr_t addr);
  void record_allocation(size_t bytes);

  StreamCache& cache_for(StreamHandle stream);
  // Hands every other stream's cache (all of them if except is null) over
  // behind a fence each.
  void fence_caches(const StreamHandle* except);
  [[nodiscard]] bool other_caches_hold_blocks(StreamHandle stream) const;
  void fence_cache(StreamCache& cache);
  // An event recorded on `stream`, from the spares if there are any.
  Status record_event(StreamHandle stream, EventHandle* out);
  // Frees a block that other streams used: behind events on them and on `freed_on`.
  void fence_block(const CachedBlock& block, StreamHandle freed_on, std::vector<StreamHandle> used_on);
  // Whether every event of `fence` completed; wait=true blocks until they have.
  Status fence_done(const Fence& fence, bool wait, bool* done);
  // Moves blocks whose fence completed to the shared pools; wait=true blocks.
  void collect_fences(bool wait);
  void make_ready(const CachedBlock& block);
  // Waits for every fence and returns empty pages and small chunks.
  void reclaim();
  // Synchronizes the device, then unmaps idle chunks outside `keep`.
  Status unmap_idle(size_t want, VaRange keep);
  // The node manager picked this job to break a deadlock while it was
  // mapping `range`: park every chunk in the yield store, give all memory
  // back, ask for it again with what `range` needs, and restore.
  Status yield_and_map(VaRange range);
  // Evicts every chunk that holds blocks to `store`; all or nothing.
  Status evict_in_use(BackingStore& store);
  // Maps the evicted chunks again and loads them; spares first obtained.
  Status restore_evicted(Patience patience);
  AllocatorStats stats_locked() const;
  void release_empty_pages();
  void update_peaks();

  Driver& driver_;
  const DeviceId device_;
  const VaRange arena_;
  const size_t page_bytes_;   // power of two dividing the chunk, <= kSmallPageMax
  const int page_shift_;      // log2(page_bytes_)
  const size_t small_limit_;  // largest request served from pages

  std::unique_ptr<ChunkSource> owned_source_;  // standalone: a DriverChunkSource
  ChunkSource& source_;
  const bool shared_source_;  // chunks are lent by zico-umd
  BackingStore* const yield_store_;

  mutable std::mutex mutex_;
  // Everything below is guarded by mutex_.
  ChunkMap chunks_;
  SpanHeap heap_;
  size_t budget_;
  // A block was freed since the device was last synchronized here: until
  // then, idle chunks may hold blocks whose last kernels still run, so an
  // unmap waits for the device first. After a synchronize with no free since,
  // every idle chunk's last use is over: unmapping needs no wait.
  bool freed_since_sync_ = true;
  // Waits for the device and notes it (freed_since_sync_).
  [[nodiscard]] Status synchronize_device();
  std::vector<std::unique_ptr<SmallChunk>> small_chunk_of_;  // indexed by chunk index
  std::vector<size_t> chunks_with_free_pages_;              // small chunk indices
  std::unordered_map<uintptr_t, size_t> large_live_;  // address -> rounded size
  // Live blocks that record_stream() named other streams for: address -> streams.
  std::unordered_map<uintptr_t, std::vector<StreamHandle>> stream_uses_;
  std::vector<std::unique_ptr<StreamCache>> caches_;
  StreamCache* last_cache_ = nullptr;
  std::array<std::vector<uintptr_t>, kNumSizeClasses> ready_small_;  // fenced, any stream
  std::deque<Fence> fences_;
  std::vector<EventHandle> spare_events_;
  AllocatorStats stats_;
  size_t iteration_peak_ = 0;
  size_t iteration_low_ = 0;
  BackingStore* suspended_to_ = nullptr;  // non-null while suspended
  StreamHandle copy_stream_{};            // for evictions; created on first use
  bool has_copy_stream_ = false;

  Status ensure_copy_stream();
};

}  // namespace zico
