#include "paged_arena_driver.h"

namespace zico {

Status PagedArenaDriver::create(DeviceId device, size_t bytes, PhysHandle* out) noexcept {
  if (bytes == 0) return Status(Errc::kInvalidArgument);
  ZICO_RETURN_IF_ERROR(inner_.host_room(device, bytes));
  *out = PhysHandle{next_handle_.fetch_add(1)};
  return Status::ok();
}

Status PagedArenaDriver::release(PhysHandle handle) noexcept {
  return handle.value != 0 ? Status::ok() : Status(Errc::kInvalidArgument);
}

Status PagedArenaDriver::map(VaRange range, PhysHandle handle) noexcept {
  if (handle.value == 0) return Status(Errc::kInvalidArgument);
  return in_arena(range) ? Status::ok() : Status(Errc::kInvalidArgument);
}

}  // namespace zico
