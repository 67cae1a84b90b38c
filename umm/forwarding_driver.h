// ForwardingDriver: a driver that hands every call to another one.
//
// The base of the decorators UM mode puts between the allocator (and the
// pager) and the real driver (managed_arena_driver.h, swap_arena_driver.h):
// each overrides what it changes and inherits the rest from here.
#pragma once

#include "driver.h"

namespace zico {

class ForwardingDriver : public Driver {
 public:
  // `inner` must outlive this.
  explicit ForwardingDriver(Driver& inner) : inner_(inner) {}

  [[nodiscard]] Driver& inner() { return inner_; }

  const char* name() const noexcept override { return inner_.name(); }
  Status device_count(int* count) noexcept override { return inner_.device_count(count); }
  Status capabilities(DeviceId device, Capabilities* caps) noexcept override {
    return inner_.capabilities(device, caps);
  }
  Status current_device(DeviceId* out) noexcept override { return inner_.current_device(out); }
  Status memory_info(DeviceId device, size_t* free_bytes, size_t* total_bytes) noexcept override {
    return inner_.memory_info(device, free_bytes, total_bytes);
  }
  Status reserve(DeviceId device, size_t bytes, size_t alignment, VaRange* out) noexcept override {
    return inner_.reserve(device, bytes, alignment, out);
  }
  Status unreserve(VaRange range) noexcept override { return inner_.unreserve(range); }
  Status create(DeviceId device, size_t bytes, PhysHandle* out) noexcept override {
    return inner_.create(device, bytes, out);
  }
  Status release(PhysHandle handle) noexcept override { return inner_.release(handle); }
  Status map(VaRange range, PhysHandle handle) noexcept override { return inner_.map(range, handle); }
  Status set_access(DeviceId device, VaRange range) noexcept override { return inner_.set_access(device, range); }
  Status unmap(VaRange range) noexcept override { return inner_.unmap(range); }
  Status export_fd(PhysHandle handle, int* fd) noexcept override { return inner_.export_fd(handle, fd); }
  Status import_fd(int fd, PhysHandle* out) noexcept override { return inner_.import_fd(fd, out); }
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
  Status start_fault_reports(DeviceId device, std::string* why) noexcept override {
    return inner_.start_fault_reports(device, why);
  }
  void tag_work(uint64_t tag) noexcept override { inner_.tag_work(tag); }
  void untag_work() noexcept override { inner_.untag_work(); }
  void charge_host_time_to(uint32_t timeline) noexcept override { inner_.charge_host_time_to(timeline); }
  Status take_fault_reports(VaRange range, std::vector<ManagedFault>* out) noexcept override {
    return inner_.take_fault_reports(range, out);
  }
  Status host_room(DeviceId device, size_t bytes) noexcept override { return inner_.host_room(device, bytes); }
  Status process_memory(int pid, DeviceId device, uint64_t* bytes) noexcept override {
    return inner_.process_memory(pid, device, bytes);
  }
  Status process_holds(int pid, DeviceId device, std::span<const PhysHandle> chunks,
                       std::vector<bool>* held) noexcept override {
    return inner_.process_holds(pid, device, chunks, held);
  }

 protected:
  Driver& inner_;
};

}  // namespace zico
