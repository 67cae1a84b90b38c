// ManagedArenaDriver: the driver as the allocator sees it in UM mode.
//
// In UM mode the arena is one managed (unified) allocation, so its memory can
// leave the GPU under a live pointer and fault back; there is nothing to
// map. This decorator gives the allocator exactly that (chunks as
// paged_arena_driver.h says), and forwards everything else to the real
// driver:
//   reserve    -> managed_allocate (aligned as asked), advised to live on the
//                 device (not accessed-by it: see reserve).
// Which pages are on the GPU is the pager's business (prefetch/um_pager.h),
// not the allocator's: its budget binds resident bytes, not the arena.
#pragma once

#include <map>
#include <mutex>

#include "paged_arena_driver.h"

namespace zico {

class ManagedArenaDriver final : public PagedArenaDriver {
 public:
  // `inner` must outlive this and have managed memory on the devices used.
  explicit ManagedArenaDriver(Driver& inner) : PagedArenaDriver(inner) {}
  ~ManagedArenaDriver() override;

  // As the inner driver's, without fd export (chunks here are not memory).
  Status capabilities(DeviceId device, Capabilities* caps) noexcept override;
  Status reserve(DeviceId device, size_t bytes, size_t alignment, VaRange* out) noexcept override;
  Status unreserve(VaRange range) noexcept override;

 private:
  bool in_arena(VaRange range) const override;

  struct Arena {
    void* allocation = nullptr;  // what managed_allocate returned (the arena may start above it)
    size_t bytes = 0;
    DeviceId device{};
  };

  mutable std::mutex mutex_;
  std::map<uintptr_t, Arena> arenas_;  // by the arena's base
};

}  // namespace zico
