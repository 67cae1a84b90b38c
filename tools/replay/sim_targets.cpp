#include "sim_targets.h"

namespace zico::replay {

SimOptions replay_device_options() {
  SimOptions options;
  options.capacity = size_t{1} << 40;  // 1 TiB: traces are never limited by the device
  return options;
}

Status ZicoumTarget::create(std::unique_ptr<ZicoumTarget>* out, std::string* why) {
  std::unique_ptr<ZicoumTarget> target(new ZicoumTarget());
  ZICO_RETURN_IF_ERROR(DeviceAllocator::create(target->driver_, DeviceId{0}, AllocatorOptions{}, &target->allocator_, why));
  *out = std::move(target);
  return Status::ok();
}

Status ZicoumTarget::allocate(uint32_t /*block*/, size_t bytes, void** out) {
  return allocator_->allocate(bytes, StreamHandle{}, out);
}

void ZicoumTarget::free(uint32_t /*block*/, void* ptr) { (void)allocator_->deallocate(ptr, StreamHandle{}); }

void ZicoumTarget::iteration_started(uint32_t /*iteration*/) { allocator_->mark_iteration(); }

Status NaiveTarget::create(std::unique_ptr<NaiveTarget>* out, std::string* why) {
  std::unique_ptr<NaiveTarget> target(new NaiveTarget());
  const Status status = NaiveAllocator::create(target->driver_, DeviceId{0}, &target->allocator_);
  if (!status.is_ok()) {
    *why = "naive allocator: " + status.message();
    return status;
  }
  *out = std::move(target);
  return Status::ok();
}

Status NaiveTarget::allocate(uint32_t /*block*/, size_t bytes, void** out) {
  ZICO_RETURN_IF_ERROR(allocator_->allocate(bytes, StreamHandle{}, out));
  ++maps_;
  return Status::ok();
}

void NaiveTarget::free(uint32_t /*block*/, void* ptr) {
  if (allocator_->deallocate(ptr, StreamHandle{}).is_ok()) ++unmaps_;
}

}  // namespace zico::replay
