#include "naive_allocator.h"

#include <algorithm>
#include <new>

namespace zico::replay {

Status NaiveAllocator::create(Driver& driver, DeviceId device, std::unique_ptr<NaiveAllocator>* out) {
  Capabilities caps;
  ZICO_RETURN_IF_ERROR(driver.capabilities(device, &caps));
  if (caps.granularity == 0) return Status(Errc::kInvalidArgument);
  out->reset(new NaiveAllocator(driver, device, caps.granularity));
  return Status::ok();
}

NaiveAllocator::~NaiveAllocator() {
  (void)driver_.device_synchronize(device_);
  for (const auto& [base, mapping] : live_) (void)unmap_and_free(mapping);
}

Status NaiveAllocator::allocate(size_t bytes, StreamHandle stream, void** out) noexcept {
  (void)stream;  // a fresh mapping is ready for any stream
  if (bytes == 0) return Status(Errc::kInvalidArgument);
  const size_t rounded = (bytes + granularity_ - 1) / granularity_ * granularity_;
  Mapping mapping;
  ZICO_RETURN_IF_ERROR(driver_.reserve(device_, rounded, 0, &mapping.range));
  Status status = driver_.create(device_, rounded, &mapping.handle);
  if (status.is_ok()) {
    status = driver_.map(mapping.range, mapping.handle);
    if (status.is_ok()) {
      status = driver_.set_access(device_, mapping.range);
      if (!status.is_ok()) (void)driver_.unmap(mapping.range);
    }
    if (!status.is_ok()) (void)driver_.release(mapping.handle);
  }
  if (!status.is_ok()) {
    (void)driver_.unreserve(mapping.range);
    return status;
  }
  try {
    live_.emplace(mapping.range.base, mapping);
  } catch (const std::bad_alloc&) {
    (void)unmap_and_free(mapping);
    return Status(Errc::kOutOfMemory);
  }
  mapped_bytes_ += rounded;
  peak_mapped_bytes_ = std::max(peak_mapped_bytes_, mapped_bytes_);
  *out = mapping.range.ptr();
  return Status::ok();
}

Status NaiveAllocator::deallocate(void* ptr, StreamHandle stream) noexcept {
  auto it = live_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == live_.end()) return Status(Errc::kInvalidArgument);
  ZICO_RETURN_IF_ERROR(driver_.stream_synchronize(stream));
  const Mapping mapping = it->second;
  live_.erase(it);
  mapped_bytes_ -= mapping.range.bytes;
  return unmap_and_free(mapping);
}

Status NaiveAllocator::unmap_and_free(const Mapping& mapping) noexcept {
  Status status = driver_.unmap(mapping.range);
  const Status released = driver_.release(mapping.handle);
  const Status unreserved = driver_.unreserve(mapping.range);
  if (status.is_ok()) status = released;
  if (status.is_ok()) status = unreserved;
  return status;
}

}  // namespace zico::replay
