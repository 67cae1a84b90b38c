// ChunkMap: which chunks of an arena are backed by physical memory.
//
// The arena is cut into fixed chunks (the driver's granularity or a multiple).
// Each chunk is either unmapped (VA only) or mapped (a physical chunk obtained
// from the ChunkSource, mapped and made accessible; the handle is released at
// once, so the memory lives exactly as long as the mapping, or as long as the
// node daemon that lent it keeps it). Each chunk counts its bytes in use:
// bytes that lie outside the arena's free SpanHeap (live blocks, slabs, and
// blocks cached per stream). Counting bytes rather than blocks means cached
// spans can merge and split without touching the counts. Only mapped chunks
// with no bytes in use may be unmapped (trim), and only after the caller has
// fenced the GPU work that last touched them.
//
// Budget: mapped_bytes() is what counts against the device budget; the owner
// checks it before map_range(). Not thread-safe: the owner's lock covers it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <span>

#include "backing_store.h"
#include "chunk_source.h"
#include "driver.h"
#include "chunk_residency.h"

namespace zico {

class ChunkMap {
 public:
  ChunkMap(Driver& driver, ChunkSource& source, DeviceId device, VaRange arena, size_t chunk_bytes);
  ~ChunkMap();
  ChunkMap(const ChunkMap&) = delete;
  ChunkMap& operator=(const ChunkMap&) = delete;

  [[nodiscard]] size_t chunk_bytes() const { return chunk_bytes_; }
  // On every allocation's path: a shift for the usual power-of-two chunk.
  [[nodiscard]] size_t index_of(uintptr_t addr) const {
    const uintptr_t offset = addr - arena_.base;
    return chunk_shift_ >= 0 ? offset >> chunk_shift_ : offset / chunk_bytes_;
  }
  [[nodiscard]] uintptr_t address_of(size_t index) const { return arena_.base + index * chunk_bytes_; }

  // Bytes that map_range(addr, bytes) would newly map.
  [[nodiscard]] size_t unmapped_bytes_in(uintptr_t addr, size_t bytes) const;
  // Maps every unmapped chunk overlapping the range, obtaining the chunks in
  // one batch. All or nothing: on failure the chunks mapped by this call are
  // unmapped again. kYield passes the source's request on (chunk_source.h).
  [[nodiscard]] Status map_range(uintptr_t addr, size_t bytes, Patience patience = Patience::kDefault);
  // Makes sure at least `count` chunks are obtained ahead of the
  // map_range()/restore() calls that will use them, so that several calls
  // share one request to the source.
  [[nodiscard]] Status obtain_spares(size_t count, Patience patience);
  // Gives back spares that no call used.
  void drop_spares();

  // [addr, addr+bytes) leaves / returns to the free SpanHeap.
  void ref(uintptr_t addr, size_t bytes);
  void unref(uintptr_t addr, size_t bytes);

  // Bytes held by mapped chunks that no block references.
  [[nodiscard]] size_t idle_bytes() const { return idle_chunks_ * chunk_bytes_; }
  // Unmaps idle chunks outside `keep` until at least `want` bytes are freed
  // (want = SIZE_MAX: all of them). *freed gets the bytes unmapped.
  [[nodiscard]] Status trim(size_t want, VaRange keep, size_t* freed);
  // Unmaps every mapped chunk regardless of references (teardown only).
  void unmap_all();

  // --- eviction (chunk_residency.h) ---------------------------------------------------
  [[nodiscard]] Residency residency(size_t index) const { return entries_[index].residency; }
  // Mapped chunks that hold blocks: what an eviction must save.
  [[nodiscard]] std::vector<size_t> chunks_in_use() const;
  // Forgets the contents of evicted chunks, giving their slots back to
  // `store` (an allocator destroyed while suspended).
  void discard_evicted(BackingStore& store);
  // Chunks whose contents are in a store.
  [[nodiscard]] std::vector<size_t> evicted_chunks() const;
  // Saves the chunks (mapped, quiet on the GPU) to `store` and unmaps them.
  // All or nothing: on failure every chunk is still mapped with its data.
  [[nodiscard]] Status evict(std::span<const size_t> indices, BackingStore& store, StreamHandle stream);
  // Maps the chunks again (same addresses) and loads their contents. All or
  // nothing: on failure every chunk is still in the store.
  [[nodiscard]] Status restore(std::span<const size_t> indices, BackingStore& store, StreamHandle stream,
                               Patience patience = Patience::kDefault);

  [[nodiscard]] size_t mapped_bytes() const { return mapped_chunks_ * chunk_bytes_; }
  [[nodiscard]] uint64_t maps() const { return maps_; }
  [[nodiscard]] uint64_t unmaps() const { return unmaps_; }

 private:
  struct Entry {
    uint64_t used = 0;  // bytes of this chunk outside the free SpanHeap
    uint64_t id = 0;    // the source's id for the chunk while mapped
    Residency residency = Residency::kEmpty;
    uint32_t slot = 0;  // backing-store slot while kHost or kNvme
    [[nodiscard]] bool mapped() const { return residency == Residency::kMapped; }
  };
  // Calls fn(entry, overlap_bytes) for each chunk overlapping the range.
  template <typename Fn>
  void for_each_overlap(uintptr_t addr, size_t bytes, Fn fn);

  // Maps a spare at `index`, and makes it accessible unless the caller does
  // that itself for a whole run of chunks (map_range: one cuMemSetAccess per
  // run, not one per chunk).
  [[nodiscard]] Status map_one(size_t index, bool with_access = true);
  // Unmaps; the chunk's id waits in returns_ until flush_returns().
  [[nodiscard]] Status unmap_one(size_t index);
  void flush_returns();
  [[nodiscard]] size_t last_index(uintptr_t addr, size_t bytes) const { return index_of(addr + bytes - 1); }

  Driver& driver_;
  ChunkSource& source_;
  DeviceId device_;
  VaRange arena_;
  size_t chunk_bytes_;
  int chunk_shift_;  // log2(chunk_bytes_), or -1 when it is not a power of two
  std::vector<Entry> entries_;
  std::vector<SourcedChunk> spares_;  // obtained, not mapped yet
  std::vector<uint64_t> returns_;     // unmapped, not given back yet
  size_t mapped_chunks_ = 0;
  size_t idle_chunks_ = 0;  // mapped with used == 0
  uint64_t maps_ = 0;
  uint64_t unmaps_ = 0;
};

}  // namespace zico
