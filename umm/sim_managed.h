// SimManagedMemory: unified (managed) memory on SimDriver's device 0, page by
// page, with a capacity, real data movement and a modelled clock.
//
// What it models (the UVM driver's behaviour, as docs/architecture.md and the
// prefetch/ transfer model describe it):
//   - A managed allocation is virtual: its pages live on the host or the
//     device. Their chunks take at most `limit` bytes of the device (its
//     capacity less what VMM chunks take); a page that must come in when the
//     device is full takes an unused chunk back, or else pushes out the least
//     recently migrated page that the kernel in hand does not use, as the
//     driver does (a *driver eviction*).
//   - Kernels (run_kernel) use ranges. A page they use that is not on the
//     device is a fault: the device stalls for fault batches (a fixed cost per
//     batch of `fault_batch_pages`, then the migration at the fault path's
//     rate, write-backs first). A page on its way (prefetched, not yet
//     arrived) stalls the kernel until it arrives. Then the kernel runs for its
//     duration. Every page a kernel uses is taken to hold data afterwards.
//   - Prefetches to the device queue on the host-to-device copy engine,
//     prefetches to the host (evictions) on the device-to-host engine; both run
//     while kernels do, each engine one copy after another, and each starts no
//     earlier than the caller says (its stream's order, sim_timeline.h). A
//     page comes in with a copy only when the host holds data for it, and
//     goes out with one unless it was discarded.
//   - Device memory: a page that comes to the device takes a chunk of it
//     (a 2 MiB root chunk in the UVM driver), and keeps that chunk when it
//     leaves: an eviction (a prefetch to the host) or a discard only marks
//     the chunk unused (uvm_va_block.c, block_clear_resident_processor), so
//     the device's used memory stays at the pages' high-water mark, as NVML
//     showed on an H100. A page coming back reuses its own chunk. Unused
//     chunks go back to the device only when something needs memory: a page
//     without a chunk when the device is full, or a chunk created beside
//     the managed pages (release_unused), the least recently left first; a
//     page the driver evicts to make room gives its chunk to the newcomer,
//     and an allocation that unused chunks cannot satisfy evicts pages in
//     use (give_up). Freeing an allocation returns all of its chunks.
//   - Discard drops a page's contents wherever they are, and a page on the
//     device leaves it without a copy (its chunk kept, unused). As in the UVM driver, a migration the
//     application asks for (a prefetch either way) revokes the discard: the
//     page is populated where it lands, so a discarded page prefetched to
//     the host moves no bytes but comes back later with a full copy.
//   - Accessed-by the device (set_accessed_by) maps a page on the host into
//     the device's page tables, as the UVM driver does: when the advice comes
//     while the page is on the host holding data, when the driver evicts it to make room,
//     and when a prefetch sends it to the host unless the device is its
//     preferred location (set_preferred_on_device), which the driver leaves
//     unmapped so that its touch migrates the page back. A kernel that uses
//     a mapped page on the host reads it there over the link instead of
//     faulting it in: it stays on the host, and the kernel waits for one pass
//     over its bytes at the fault path's rate (a floor: a real kernel that
//     reads it again crosses the link again).
//
// The bytes stay where the caller sees them: the CPU may read and write
// managed memory wherever its pages are, as on CUDA (which migrates them), so
// migration is modelled, not copied. What can lose data under unified memory
// is a discard of memory still in use, and that is real: a discarded page
// reads back as zeros, so a pager that discards live data is caught.
//
// Not thread-safe: SimDriver calls it under its own mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <vector>

#include "status.h"
#include "types.h"

namespace zico {

// The costs of migration. Defaults: those of the paging planners' transfer
// model (prefetch/transfer_model.h), without its size efficiency (pages here
// are whole UM blocks).
struct SimManagedCosts {
  double h2d_bytes_per_s = 55e9;
  double d2h_bytes_per_s = 55e9;
  double fault_bytes_per_s = 20e9;
  uint32_t fault_batch_pages = 256;
  uint64_t fault_batch_ns = 45000;
  // Each direction's share of its rate while the other direction copies too
  // (prefetch/transfer_model.h's figure).
  double duplex_factor = 0.9;
  // The GPU's stall per faulted page beyond its copy and its batch's share:
  // the UVM driver fills a faulted 2 MiB block 64 KiB at a time over several
  // fault-and-replay rounds (uvm_perf_prefetch.c), warps waiting.
  uint64_t fault_block_ns = 0;
  // Host time on the calling thread (SimDriver charges it, sim_timeline.h):
  // per migration call, per contiguous range in it (the UVM driver's migrate
  // ioctl takes one range), per page moved (its block's locks, page tables
  // and copy pushes).
  uint64_t call_ns = 0;
  uint64_t range_ns = 0;
  uint64_t block_ns = 0;
  // A move to the host returns only once its copy has ended, and then maps
  // each page for the CPU (uvm_va_block.c maps the CPU after the copy, 512
  // PTEs a 2 MiB block): the caller waits for both.
  bool to_host_sync = false;
  uint64_t cpu_map_block_ns = 0;
  // A migration call on a stream waits, on the calling thread, for the
  // stream's earlier work (the driver's migrate ioctl takes no "after this"
  // input, so the ordering is the library's to enforce).
  bool ordered_call_waits = false;
  uint64_t discard_call_ns = 0;  // host time per discard call
  uint64_t launch_ns = 0;        // host time of launching a kernel
  // Host time of each virtual-memory call on a chunk (create, map, set
  // access, unmap, release): what a swapped page's trip in and out costs
  // beyond its copies. Charged per call, set access and unmap per chunk
  // their range covers.
  uint64_t chunk_create_ns = 0;
  uint64_t chunk_map_ns = 0;
  uint64_t chunk_access_ns = 0;
  uint64_t chunk_unmap_ns = 0;
  uint64_t chunk_release_ns = 0;
};

// What the device's unified memory did so far.
struct SimManagedStats {
  uint64_t now_ns = 0;            // when the last kernel ended (stalls and faults included)
  uint64_t kernels = 0;
  uint64_t kernel_ns = 0;         // the kernels' own durations
  uint64_t idle_ns = 0;           // no kernel running: the next one not yet launched, or its stream waiting
  uint64_t stall_ns = 0;          // kernels waiting for prefetched pages to arrive
  uint64_t fault_ns = 0;          // kernels waiting for fault batches
  uint64_t faulted_pages = 0;
  uint64_t fault_batches = 0;
  uint64_t remote_pages = 0;      // used by kernels in place on the host (accessed-by)
  uint64_t prefetched_pages = 0;  // brought in by managed_prefetch
  uint64_t evicted_pages = 0;     // sent to the host by managed_prefetch
  uint64_t driver_evictions = 0;  // pushed out by the driver to make room
  uint64_t discarded_pages = 0;
  uint64_t h2d_bytes = 0;         // copies that carried data, every path
  uint64_t d2h_bytes = 0;
  uint64_t resident_bytes = 0;
  uint64_t peak_resident_bytes = 0;
  // Device memory the pages hold: resident pages' chunks and the unused
  // chunks of pages that left (what the device reports in use for them).
  uint64_t chunk_bytes = 0;
  uint64_t peak_chunk_bytes = 0;
  uint64_t chunks_taken = 0;  // unused chunks given back for other memory
};

class SimManagedMemory {
 public:
  SimManagedMemory(size_t page_bytes, const SimManagedCosts& costs);
  ~SimManagedMemory();
  SimManagedMemory(const SimManagedMemory&) = delete;
  SimManagedMemory& operator=(const SimManagedMemory&) = delete;

  [[nodiscard]] size_t page_bytes() const { return page_bytes_; }
  // A new allocation of `bytes` rounded up to whole pages and aligned to one,
  // every page on the host and holding no data (zeros).
  [[nodiscard]] Status allocate(size_t bytes, void** out);
  [[nodiscard]] Status free(void* ptr, size_t* resident_freed);
  // True when `range` lies inside one allocation.
  [[nodiscard]] bool contains(VaRange range) const;

  // The operations below take `limit`: the bytes of device memory managed
  // pages may hold now (their chunks, used or not). Their ranges must lie inside one allocation each.
  // Migrations start no earlier than `start_ns` (the caller's stream order);
  // *done_ns receives when the range's last copy ends (no earlier than start_ns).
  [[nodiscard]] Status prefetch_to_device(VaRange range, uint64_t limit, uint64_t start_ns, uint64_t* done_ns);
  [[nodiscard]] Status prefetch_to_host(VaRange range, uint64_t start_ns, uint64_t* done_ns);
  void discard(VaRange range);
  // cudaMemAdvise's accessed-by the device and preferred location the
  // device, set or unset on `range`'s pages.
  void set_accessed_by(VaRange range, bool accessed_by);
  void set_preferred_on_device(VaRange range, bool preferred);
  // A kernel that uses `ranges` (managed ones; others are ignored) and then
  // computes for `duration_ns`, started no earlier than `start_ns` (its
  // stream's order) nor before the previous kernel ended (one compute
  // engine). *faulted, if given, receives the address of each page it
  // faulted in (appended). Afterwards now_ns is when it ended.
  [[nodiscard]] Status run_kernel(std::span<const VaRange> ranges, uint64_t duration_ns, uint64_t limit,
                                  uint64_t start_ns = 0, std::vector<uintptr_t>* faulted = nullptr);
  // The device memory managed pages are on.
  [[nodiscard]] uint64_t resident_bytes() const { return stats_.resident_bytes; }
  // The device memory managed pages hold: resident, or kept unused.
  [[nodiscard]] uint64_t chunk_bytes() const { return stats_.chunk_bytes; }
  // Gives back unused chunks, the least recently left first, until `bytes`
  // are given back or none is left; returns what was given back (whole pages).
  uint64_t release_unused(uint64_t bytes);
  // Where a page needs memory beyond `limit` and this memory has no unused
  // chunk left: `lend(bytes)` returns what it could take elsewhere (another
  // process's unused chunks, which the UVM driver hands over before evicting
  // a chunk in use), counted above the limit until the operation ends.
  void set_lender(std::function<uint64_t(uint64_t)> lend) { lend_ = std::move(lend); }
  // An explicit copy of `bytes` between pinned host memory and device memory
  // (cudaMemcpyAsync; no managed page involved) on the copy engine of its
  // direction, shared with the migrations, no earlier than `start_ns`;
  // returns when it ends.
  [[nodiscard]] uint64_t copy(bool to_device, uint64_t bytes, uint64_t start_ns);
  // Gives up `bytes` of device memory another allocation took: unused chunks
  // first, then pages in use, the least recently migrated first, copied out
  // (the UVM driver evicts chunks in use last).
  void give_up(uint64_t bytes);
  [[nodiscard]] const SimManagedStats& stats() const { return stats_; }

 private:
  struct Page {
    bool on_device = false;
    bool has_data = false;   // the host has bytes for it: coming in is a copy
    bool discarded = false;  // its bytes were dropped: going out is no copy
    uint64_t arrives_ns = 0;  // on the device: when its copy in has ended
    uint64_t left_ns = 0;     // on the host: when its copy out has ended
    uint64_t migrated = 0;    // on the device: its key in by_migration_
    uint64_t kept = 0;        // the operation that needs it on the device (never pushed out by it)
    bool accessed_by = false;         // advised accessed-by the device
    bool preferred_on_device = false;  // advised preferred location the device
    bool mapped_on_device = false;     // on the host and mapped in the device's page tables
    bool holds_chunk = false;  // device memory is kept for it (on the device, or unused)
    uint64_t unused_since = 0;  // not on the device and holding a chunk: its key in unused_
  };
  struct Allocation {
    size_t bytes = 0;
    std::vector<Page> pages;
  };
  struct PageRef {
    uintptr_t base = 0;  // the allocation's
    size_t index = 0;
  };

  // The allocation holding `range` (at *base), its first and last page; false if none.
  bool locate(VaRange range, uintptr_t* base, Allocation** allocation, size_t* first, size_t* last);
  // Brings the page in, making room first (pages kept by the current
  // operation stay). A prefetch queues its copy on the host-to-device engine;
  // a fault adds the copy to the kernel's fault time.
  // Copies start no earlier than `start_ns`.
  Status bring_in(uintptr_t base, Allocation& allocation, size_t index, uint64_t limit, bool fault,
                  uint64_t start_ns);
  // Gives the page a chunk of device memory, taking unused chunks back or
  // evicting pages (the least recently migrated this operation does not
  // need) while the device has no room; *room_at: when evictions end.
  Status take_chunk(Page& page, uint64_t limit, bool fault, uint64_t start_ns, uint64_t* room_at);
  // The page, off the device, keeps its chunk unused / gives it back.
  void keep_unused(Page& page, uintptr_t base, size_t index);
  void drop_chunk(Page& page);
  // Sends the page to the host, copied out unless discarded, no earlier than
  // `start_ns`; returns when the copy ends (start_ns for a fault, whose time
  // the kernel pays).
  uint64_t send_out(uintptr_t base, Allocation& allocation, size_t index, bool fault, uint64_t start_ns);

  // The share of its rate a copy starting at `start_ns` gets: duplex_factor
  // while the other direction's engine is still busy then (it is taken to
  // stay busy for the whole copy), else all of it.
  [[nodiscard]] double share_beside(uint64_t other_free_ns, uint64_t start_ns) const;

  const size_t page_bytes_;
  const SimManagedCosts costs_;
  std::map<uintptr_t, Allocation> allocations_;
  SimManagedStats stats_;
  uint64_t h2d_free_ns_ = 0;  // when each copy engine is next idle
  uint64_t d2h_free_ns_ = 0;
  uint64_t next_stamp_ = 1;
  uint64_t operation_ = 0;         // numbers each prefetch and kernel, for Page::kept
  uint64_t fault_ns_pending_ = 0;  // the current kernel's fault-path copies
  std::map<uint64_t, PageRef> by_migration_;  // pages on the device, least recently migrated first
  std::map<uint64_t, PageRef> unused_;        // pages off the device holding a chunk, least recently left first
  std::function<uint64_t(uint64_t)> lend_;    // set_lender's
  uint64_t lent_ = 0;                         // what lend_ gave the current operation beyond its limit
};

}  // namespace zico
