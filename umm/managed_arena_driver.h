// ManagedArenaDriver: the driver as the allocator sees it in UM mode.
//
// The allocator (device_allocator.h) reserves an arena and maps chunks into
// it. In UM mode the arena is one managed (unified) allocation instead, so
// its memory can leave the GPU under a live pointer and fault back; there is
// nothing to map. This decorator gives the allocator exactly that, and
// forwards everything else to the real driver:
//   reserve    -> managed_allocate (aligned as asked), advised to live on the
//                 device (not accessed-by it: see reserve);
//   create     -> a handle that stands for no memory (the chunk is a part of
//                 the arena already), once the inner driver's host_room says
//                 the host can hold it; release/map/unmap -> bookkeeping only;
//   set_access -> nothing more (the advice covers the whole arena);
//   export/import -> kNotSupported (a UM job's memory is its own).
// Which pages are on the GPU is the pager's business (prefetch/um_pager.h),
// not the allocator's: its budget binds resident bytes, not the arena.
#pragma once

#include <atomic>
#include <map>
#include <mutex>

#include "forwarding_driver.h"

namespace zico {

class ManagedArenaDriver final : public ForwardingDriver {
 public:
  // `inner` must outlive this and have managed memory on the devices used.
  explicit ManagedArenaDriver(Driver& inner) : ForwardingDriver(inner) {}
  ~ManagedArenaDriver() override;

  // As the inner driver's, without fd export (chunks here are not memory).
  Status capabilities(DeviceId device, Capabilities* caps) noexcept override;
  Status reserve(DeviceId device, size_t bytes, size_t alignment, VaRange* out) noexcept override;
  Status unreserve(VaRange range) noexcept override;
  Status create(DeviceId device, size_t bytes, PhysHandle* out) noexcept override;
  Status release(PhysHandle handle) noexcept override;
  Status map(VaRange range, PhysHandle handle) noexcept override;
  Status set_access(DeviceId device, VaRange range) noexcept override;
  Status unmap(VaRange range) noexcept override;
  Status export_fd(PhysHandle, int*) noexcept override { return Status(Errc::kNotSupported); }
  Status import_fd(int, PhysHandle*) noexcept override { return Status(Errc::kNotSupported); }

 private:
  struct Arena {
    void* allocation = nullptr;  // what managed_allocate returned (the arena may start above it)
    size_t bytes = 0;
    DeviceId device{};
  };

  std::mutex mutex_;
  std::map<uintptr_t, Arena> arenas_;  // by the arena's base
  std::atomic<uintptr_t> next_handle_{1};
};

}  // namespace zico
