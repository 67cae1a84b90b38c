// PagedArenaDriver: what UM mode's allocator sees of an arena whose pages
// the pager moves (managed_arena_driver.h, swap_arena_driver.h).
//
// The allocator (device_allocator.h) reserves an arena and maps chunks into
// it. Here the arena is all there is: which of its pages hold device memory
// is the pager's business (prefetch/um_pager.h), so a chunk stands for no
// memory and mapping it is bookkeeping:
//   create     -> a handle, once the inner driver's host_room says the host
//                 can hold it (its pages go there when the budget pushes
//                 them off: refused here, as an out-of-memory the allocator
//                 reports, rather than an OOM kill once it is written);
//   release, set_access, unmap -> nothing;
//   map        -> checked to lie inside an arena (in_arena);
//   export/import -> kNotSupported (a UM job's memory is its own).
// The derived driver makes the arena (reserve, unreserve) and says where it is.
#pragma once

#include <atomic>

#include "forwarding_driver.h"

namespace zico {

class PagedArenaDriver : public ForwardingDriver {
 public:
  explicit PagedArenaDriver(Driver& inner) : ForwardingDriver(inner) {}

  Status create(DeviceId device, size_t bytes, PhysHandle* out) noexcept override;
  Status release(PhysHandle handle) noexcept override;
  Status map(VaRange range, PhysHandle handle) noexcept override;
  Status set_access(DeviceId, VaRange) noexcept override { return Status::ok(); }
  Status unmap(VaRange) noexcept override { return Status::ok(); }
  Status export_fd(PhysHandle, int*) noexcept override { return Status(Errc::kNotSupported); }
  Status import_fd(int, PhysHandle*) noexcept override { return Status(Errc::kNotSupported); }

 protected:
  // Whether `range` lies inside one of the arenas this driver made.
  [[nodiscard]] virtual bool in_arena(VaRange range) const = 0;

 private:
  std::atomic<uint64_t> next_handle_{1};
};

}  // namespace zico
