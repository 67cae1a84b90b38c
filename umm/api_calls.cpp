#include "api_calls.h"

#include "last_error.h"
#include "log.h"
#include "runtime.h"
#include "sizes.h"

namespace zico {

Status api_allocate(size_t bytes, DeviceId device, StreamHandle stream, void** out) noexcept {
  Runtime& runtime = Runtime::instance();
  DeviceAllocator* allocator = nullptr;
  Status status = runtime.allocator(device, &allocator);
  if (!status.is_ok()) {
    try {
      set_last_error(!runtime.init_error().empty() ? runtime.init_error()
                                                  : "device " + std::to_string(device.value) + ": " + status.message());
    } catch (...) {
    }
    return status;
  }
  status = allocator->allocate(bytes, stream, out);
  if (!status.is_ok()) {
    try {
      const AllocatorStats stats = allocator->stats();
      std::string text = "device " + std::to_string(device.value) + ": cannot allocate " + format_size(bytes) + ": " +
                         status.message() + "; " + format_size(stats.allocated_bytes) + " of the " +
                         format_size(stats.budget_bytes) + " budget allocated, " + format_size(stats.mapped_bytes) +
                         " mapped";
      ZICO_LOG(kInfo, "%s", text.c_str());
      set_last_error(std::move(text));
    } catch (...) {
    }
  }
  return status;
}

Status api_free(void* ptr, StreamHandle stream) noexcept {
  DeviceAllocator* allocator = Runtime::instance().owner_of(ptr);
  if (allocator == nullptr) return Status(Errc::kNotFound);
  const Status status = allocator->deallocate(ptr, stream);
  if (!status.is_ok()) {
    try {
      set_last_error("free of " + std::to_string(reinterpret_cast<uintptr_t>(ptr)) +
                     " failed: not a live allocation (double free or interior pointer)");
    } catch (...) {
    }
  }
  return status;
}

}  // namespace zico
