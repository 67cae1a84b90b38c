// SwapArenaDriver: UM mode's arena as device memory swapped explicitly
// (ZICO_UM_MEMORY=swap), so that what the budget takes off a job is the
// device's again, for any process.
//
// A managed arena keeps the device memory of a page that left: the UVM driver
// gives a block's chunks back to the GPU only when its range is destroyed, so
// the device reports the job's high-water mark in use whatever its budget
// (docs/architecture.md, "UM mode"). Here the arena is a reservation of
// addresses instead, and each of its pages (the device's granularity) is at
// any time one of:
//   mapped   a chunk of device memory of its own, mapped and accessible;
//   leaving  mapped, its copy to the host queued; unmapped once it ends;
//   on host  unmapped, its bytes in a pinned host slot (host_store.h);
//   empty    unmapped, holding nothing (never written, or discarded).
// The pager moves pages with the managed-memory calls, as it moves the UVM
// driver's (um_pager.h); here they mean:
//   managed_prefetch_batch to the device  a chunk (kept from a page that left,
//       or created) mapped for each page not mapped, its host bytes copied in
//       on the stream (the copy engine's rate; no fault path, no CPU page
//       tables);
//   managed_prefetch_batch to the host    each mapped page copied to its host
//       slot on the stream (the pager queued it behind the last kernel that
//       named the page), the copies waited for, then the page unmapped and
//       its chunk released (or kept, within the job's budget: below): the
//       device has the memory back at once;
//   managed_discard_batch                 after the stream's queued work,
//       unmapped and released without a copy, its host bytes dropped;
//   managed_discard_and_prefetch_batch    a fresh chunk mapped, nothing copied.
// The allocator sees what ManagedArenaDriver gives it: chunks that stand for
// no memory, in an arena that is all there is (paged_arena_driver.h).
//
// The safety rule: an unmapped page is an illegal address, not a fault. The
// pager fetches every page a launch names before its kernel runs
// (Capabilities::absent_pages_unmapped), beyond the budget if it must, and
// unmaps a page only once the copy out queued behind the kernels that may
// still use it has ended (um_pager.h). So memory a kernel reaches without
// its launch naming it (pointer tables written on the device, library
// workspaces a library keeps to itself, CUDA graphs; tables copied from the
// host are read: pointer_table.h) must not live here: such a job keeps
// ZICO_UM_MEMORY=managed, where an unnamed page faults in. SimDriver refuses a kernel that touches an unmapped
// page (run_kernel: an illegal address), so a test that breaks the rule fails.
//
// Chunks kept for reuse: creating and releasing a chunk costs the driver's
// host time on every trip (the calibration's P8), so a page that leaves may
// leave its chunk in a pool for the next page to come in, as long as the
// chunks mapped and pooled on its device stay within set_held_limit (the
// job's budget; 0, the default: none is kept). A smaller limit releases
// pooled chunks at once.
//
// Thread-safe: one mutex (the pager's two threads call in at once). A fetch
// of a page that is leaving waits until it has left. The GPU order of a
// page's copies on different streams is the caller's, as for managed
// memory: the pager makes an eviction wait for the page's queued fetch.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "host_store.h"
#include "paged_arena_driver.h"

namespace zico {

// What the swap did so far.
struct SwapArenaStats {
  uint64_t pages_in = 0;          // pages mapped for a fetch
  uint64_t copies_in = 0;         // of those, the ones whose host bytes were copied in
  uint64_t pages_out = 0;         // pages copied to the host and unmapped
  uint64_t discarded = 0;         // pages whose bytes were dropped
  uint64_t move_calls = 0;        // prefetch calls (a batch is one; discards are not)
  uint64_t mapped_bytes = 0;      // device memory the arenas' pages hold now
  uint64_t peak_mapped_bytes = 0;
  uint64_t pooled_bytes = 0;      // device memory kept unmapped for the next page in, now
  uint64_t peak_held_bytes = 0;   // mapped and pooled together, at most
  uint64_t chunks_reused = 0;     // pages in that took a pooled chunk instead of a new one
  uint64_t host_bytes = 0;        // host slots holding pages' bytes
};

class SwapArenaDriver final : public PagedArenaDriver {
 public:
  // `inner` must outlive this and have virtual memory management.
  explicit SwapArenaDriver(Driver& inner) : PagedArenaDriver(inner) {}
  // Unmaps and releases what the arenas still hold.
  ~SwapArenaDriver() override;

  [[nodiscard]] SwapArenaStats stats() const;
  // The device memory the arenas on `device` may hold, mapped and pooled
  // together, before a chunk a page lets go is released rather than kept.
  // Pooled chunks beyond it are released now.
  void set_held_limit(DeviceId device, uint64_t bytes);

  // The inner driver's, as managed memory whose absent pages are unmapped;
  // kNotSupported without virtual memory management.
  Status capabilities(DeviceId device, Capabilities* caps) noexcept override;
  // The arena: addresses only, every page empty.
  Status reserve(DeviceId device, size_t bytes, size_t alignment, VaRange* out) noexcept override;
  Status unreserve(VaRange range) noexcept override;
  // The page moves above, for ranges of whole pages inside an arena; other
  // ranges go to the inner driver. Advice means nothing here.
  Status managed_advise(void* ptr, size_t bytes, ManagedAdvice advice, DeviceId device) noexcept override;
  Status managed_prefetch(void* ptr, size_t bytes, PrefetchTarget target, StreamHandle stream) noexcept override;
  Status managed_prefetch_batch(std::span<const VaRange> ranges, PrefetchTarget target,
                                StreamHandle stream) noexcept override;
  Status managed_discard(void* ptr, size_t bytes, StreamHandle stream) noexcept override;
  Status managed_discard_batch(std::span<const VaRange> ranges, StreamHandle stream) noexcept override;
  Status managed_discard_and_prefetch_batch(std::span<const VaRange> ranges, PrefetchTarget target,
                                            StreamHandle stream) noexcept override;
  // Swapped pages never fault: there is nothing to report.
  Status start_fault_reports(DeviceId device, std::string* why) noexcept override;
  Status take_fault_reports(VaRange, std::vector<ManagedFault>*) noexcept override {
    return Status(Errc::kNotSupported);
  }

 private:
  bool in_arena(VaRange range) const override;

  enum class PageState : uint8_t { kEmpty, kMapped, kLeaving, kOnHost };
  static constexpr uint32_t kNoSlot = UINT32_MAX;
  struct Page {
    PageState state = PageState::kEmpty;
    PhysHandle chunk{};         // mapped, leaving
    uint32_t slot = kNoSlot;    // on host (and kept while mapped again: its next trip out reuses it)
  };
  struct Arena {
    VaRange range{};
    DeviceId device{};
    size_t page_bytes = 0;
    std::vector<Page> pages;
    std::unique_ptr<HostStore> host;  // made at the first page out
  };
  // A page of an arena, by its address.
  struct PageRef {
    Arena* arena = nullptr;
    size_t index = 0;
    [[nodiscard]] Page& page() const { return arena->pages[index]; }
    [[nodiscard]] VaRange range() const {
      return VaRange{arena->range.base + index * arena->page_bytes, arena->page_bytes};
    }
  };

  // Whether the first of `ranges` touches an arena (the batch is the
  // arenas'), else the inner driver's.
  [[nodiscard]] bool touches_an_arena(std::span<const VaRange> ranges) const;
  // The pages `ranges` cover, in order, into *out; false when a range is not
  // whole pages of one arena. Holds mutex_.
  bool pages_of(std::span<const VaRange> ranges, std::vector<PageRef>* out);
  // Waits until no page of `pages` is leaving. Holds mutex_ through `lock`.
  void wait_until_left(std::unique_lock<std::mutex>& lock, std::span<const PageRef> pages);
  // Gives the page a chunk of device memory, mapped and accessible, and
  // queues the copy of its host bytes unless `copy` is false (their bytes
  // dropped). Holds mutex_.
  Status bring_in(const PageRef& ref, bool copy, StreamHandle stream);
  // Unmaps the page and releases its chunk. Holds mutex_.
  Status let_go(const PageRef& ref);
  // Drops the page's host bytes, if it has any. Holds mutex_.
  void drop_host_copy(const PageRef& ref);
  // One prefetch call's moves (each counts one move call), to the host and
  // to the device. Take mutex_.
  Status send_out(std::span<const VaRange> ranges, StreamHandle stream);
  Status fetch(std::span<const VaRange> ranges, bool discard_first, StreamHandle stream);
  void note_held();
  // Per device: what set_held_limit allows, the chunks kept, the bytes
  // mapped, a chunk's size (the device's granularity).
  struct DeviceChunks {
    uint64_t limit = 0;
    std::vector<PhysHandle> pool;
    uint64_t mapped = 0;
    size_t page_bytes = 0;
    [[nodiscard]] uint64_t held() const { return mapped + pool.size() * page_bytes; }
  };
  DeviceChunks& chunks_of(DeviceId device) { return devices_[device.value]; }
  // Releases pooled chunks while the device holds more than its limit.
  void trim_pool(DeviceChunks& chunks);
  // The arena whose addresses hold `address`; null if none. Holds mutex_.
  [[nodiscard]] const Arena* arena_at(uintptr_t address) const;
  [[nodiscard]] Arena* arena_at(uintptr_t address) {
    return const_cast<Arena*>(static_cast<const SwapArenaDriver*>(this)->arena_at(address));
  }

  mutable std::mutex mutex_;
  std::condition_variable left_;  // a leaving page left
  std::map<uintptr_t, Arena> arenas_;  // by base
  std::map<int, DeviceChunks> devices_;
  SwapArenaStats stats_;
};

}  // namespace zico
