#include "managed_arena_driver.h"

namespace zico {

ManagedArenaDriver::~ManagedArenaDriver() {
  for (auto& [base, arena] : arenas_) (void)inner_.managed_free(arena.allocation);
}

Status ManagedArenaDriver::capabilities(DeviceId device, Capabilities* caps) noexcept {
  ZICO_RETURN_IF_ERROR(inner_.capabilities(device, caps));
  if (!caps->managed_memory) return Status(Errc::kNotSupported);
  caps->posix_fd_export = false;
  caps->gpu_direct_rdma = false;
  return Status::ok();
}

Status ManagedArenaDriver::reserve(DeviceId device, size_t bytes, size_t alignment, VaRange* out) noexcept {
  if (bytes == 0 || (alignment & (alignment - 1)) != 0 || bytes > SIZE_MAX - alignment) {
    return Status(Errc::kInvalidArgument);
  }
  void* allocation = nullptr;
  ZICO_RETURN_IF_ERROR(inner_.managed_allocate(bytes + alignment, &allocation));
  const auto start = reinterpret_cast<uintptr_t>(allocation);
  const uintptr_t base = alignment == 0 ? start : (start + alignment - 1) & ~(uintptr_t{alignment} - 1);
  // Preferred on the device: a page the pager brought in stays until it
  // sends it out, and one the GPU touches while it is on the host migrates
  // back (the pager's plans count on that). Not accessed-by the device: the
  // UVM driver maps the pages it evicts itself (when the GPU fills up) into
  // an accessed-by GPU's page tables, so kernels would read them over PCIe
  // in place, at every access, instead of faulting them back once. (The
  // pages the pager sends out are left unmapped either way: the GPU is
  // their preferred location.)
  const Status status = inner_.managed_advise(reinterpret_cast<void*>(base), bytes,
                                              ManagedAdvice::kSetPreferredLocationDevice, device);
  if (!status.is_ok()) {
    (void)inner_.managed_free(allocation);
    return status;
  }
  std::lock_guard lock(mutex_);
  arenas_[base] = Arena{allocation, bytes, device};
  *out = VaRange{base, bytes};
  return Status::ok();
}

Status ManagedArenaDriver::unreserve(VaRange range) noexcept {
  void* allocation = nullptr;
  {
    std::lock_guard lock(mutex_);
    auto it = arenas_.find(range.base);
    if (it == arenas_.end() || it->second.bytes != range.bytes) return Status(Errc::kInvalidArgument);
    allocation = it->second.allocation;
    arenas_.erase(it);
  }
  return inner_.managed_free(allocation);
}

bool ManagedArenaDriver::in_arena(VaRange range) const {
  std::lock_guard lock(mutex_);
  auto it = arenas_.upper_bound(range.base);
  return it != arenas_.begin() && VaRange{std::prev(it)->first, std::prev(it)->second.bytes}.contains(range);
}

}  // namespace zico
