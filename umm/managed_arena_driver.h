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

#include "driver.h"

namespace zico {

class ManagedArenaDriver final : public Driver {
 public:
  // `inner` must outlive this and have managed memory on the devices used.
  explicit ManagedArenaDriver(Driver& inner) : inner_(inner) {}
  ~ManagedArenaDriver() override;

  [[nodiscard]] Driver& inner() { return inner_; }

  const char* name() const noexcept override { return inner_.name(); }
  Status device_count(int* count) noexcept override { return inner_.device_count(count); }
  // As the inner driver's, without fd export (chunks here are not memory).
  Status capabilities(DeviceId device, Capabilities* caps) noexcept override;
  Status current_device(DeviceId* out) noexcept override { return inner_.current_device(out); }
  Status memory_info(DeviceId device, size_t* free_bytes, size_t* total_bytes) noexcept override {
    return inner_.memory_info(device, free_bytes, total_bytes);
  }
  Status reserve(DeviceId device, size_t bytes, size_t alignment, VaRange* out) noexcept override;
  Status unreserve(VaRange range) noexcept override;
  Status create(DeviceId device, size_t bytes, PhysHandle* out) noexcept override;
  Status release(PhysHandle handle) noexcept override;
  Status map(VaRange range, PhysHandle handle) noexcept override;
  Status set_access(DeviceId device, VaRange range) noexcept override;
  Status unmap(VaRange range) noexcept override;
  Status export_fd(PhysHandle, int*) noexcept override { return Status(Errc::kNotSupported); }
  Status import_fd(int, PhysHandle*) noexcept override { return Status(Errc::kNotSupported); }
  Status stream_create(DeviceId device, StreamHandle* out) noexcept override { return inner_.stream_create(device, out); }
  Status stream_destroy(StreamHandle stream) noexcept override { return inner_.stream_destroy(stream); }
  Status stream_synchronize(StreamHandle stream) noexcept override { return inner_.stream_synchronize(stream); }
  Status stream_capture_state(StreamHandle stream, CaptureState* state) noexcept override {
    return inner_.stream_capture_state(stream, state);
  }
  Status event_create(DeviceId device, EventHandle* out) noexcept override { return inner_.event_create(device, out); }
  Status event_destroy(EventHandle event) noexcept override { return inner_.event_destroy(event); }
  Status event_record(EventHandle event, StreamHandle stream) noexcept override {
    return inner_.event_record(event, stream);
  }
  Status event_query(EventHandle event, bool* done) noexcept override { return inner_.event_query(event, done); }
  Status event_synchronize(EventHandle event) noexcept override { return inner_.event_synchronize(event); }
  Status stream_wait_event(StreamHandle stream, EventHandle event) noexcept override {
    return inner_.stream_wait_event(stream, event);
  }
  Status device_synchronize(DeviceId device) noexcept override { return inner_.device_synchronize(device); }
  Status copy_async(void* dst, const void* src, size_t bytes, CopyKind kind, StreamHandle stream) noexcept override {
    return inner_.copy_async(dst, src, bytes, kind, stream);
  }
  Status memset_async(void* dst, uint8_t value, size_t bytes, StreamHandle stream) noexcept override {
    return inner_.memset_async(dst, value, bytes, stream);
  }
  Status host_register(void* ptr, size_t bytes) noexcept override { return inner_.host_register(ptr, bytes); }
  Status host_unregister(void* ptr) noexcept override { return inner_.host_unregister(ptr); }
  Status managed_allocate(size_t bytes, void** out) noexcept override { return inner_.managed_allocate(bytes, out); }
  Status managed_free(void* ptr) noexcept override { return inner_.managed_free(ptr); }
  Status managed_advise(void* ptr, size_t bytes, ManagedAdvice advice, DeviceId device) noexcept override {
    return inner_.managed_advise(ptr, bytes, advice, device);
  }
  Status managed_prefetch(void* ptr, size_t bytes, PrefetchTarget target, StreamHandle stream) noexcept override {
    return inner_.managed_prefetch(ptr, bytes, target, stream);
  }
  Status managed_prefetch_batch(std::span<const VaRange> ranges, PrefetchTarget target,
                                StreamHandle stream) noexcept override {
    return inner_.managed_prefetch_batch(ranges, target, stream);
  }
  Status managed_discard(void* ptr, size_t bytes, StreamHandle stream) noexcept override {
    return inner_.managed_discard(ptr, bytes, stream);
  }
  Status managed_discard_batch(std::span<const VaRange> ranges, StreamHandle stream) noexcept override {
    return inner_.managed_discard_batch(ranges, stream);
  }
  Status managed_discard_and_prefetch_batch(std::span<const VaRange> ranges, PrefetchTarget target,
                                            StreamHandle stream) noexcept override {
    return inner_.managed_discard_and_prefetch_batch(ranges, target, stream);
  }
  Status process_memory(int pid, DeviceId device, uint64_t* bytes) noexcept override {
    return inner_.process_memory(pid, device, bytes);
  }

 private:
  struct Arena {
    void* allocation = nullptr;  // what managed_allocate returned (the arena may start above it)
    size_t bytes = 0;
    DeviceId device{};
  };

  Driver& inner_;
  std::mutex mutex_;
  std::map<uintptr_t, Arena> arenas_;  // by the arena's base
  std::atomic<uintptr_t> next_handle_{1};
};

}  // namespace zico
