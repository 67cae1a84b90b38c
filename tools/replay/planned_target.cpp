#include "planned_target.h"

namespace zico::replay {

Status PlannedTarget::create(LifetimePlan plan, std::unique_ptr<PlannedTarget>* out, std::string* why) {
  std::unique_ptr<ZicoumTarget> online;
  ZICO_RETURN_IF_ERROR(ZicoumTarget::create(&online, why));
  out->reset(new PlannedTarget(std::move(plan), std::move(online)));
  return Status::ok();
}

void PlannedTarget::iteration_started(uint32_t iteration) {
  online_->iteration_started(iteration);
  ordinal_ = 0;
  if (iteration <= plan_.observed_iteration || plan_.arena_bytes == 0) return;
  // The online cache holds what the region now serves (last iteration's
  // transient blocks, then the blocks from before the switch): return it.
  (void)online_->allocator().trim();
  if (region_ != 0) return;
  void* region = nullptr;
  if (online_->allocator().allocate(plan_.arena_bytes, StreamHandle{}, &region).is_ok()) {
    region_ = reinterpret_cast<uintptr_t>(region);
  }
}

bool PlannedTarget::range_is_free(uint64_t offset, uint64_t bytes) const {
  auto next = live_.lower_bound(offset);
  if (next != live_.end() && next->first < offset + bytes) return false;
  return next == live_.begin() || std::prev(next)->second <= offset;
}

Status PlannedTarget::allocate(uint32_t block, size_t bytes, void** out) {
  const size_t ordinal = ordinal_++;
  if (region_ != 0 && ordinal < plan_.slots.size() && plan_.slots[ordinal].planned) {
    const PlanSlot& slot = plan_.slots[ordinal];
    if (slot.bytes != bytes) {
      ++mismatched_;
    } else if (!range_is_free(slot.offset, bytes)) {
      ++busy_;
    } else {
      live_.emplace(slot.offset, slot.offset + bytes);
      *out = reinterpret_cast<void*>(region_ + slot.offset);
      ++planned_;
      return Status::ok();
    }
  }
  return online_->allocate(block, bytes, out);
}

void PlannedTarget::free(uint32_t block, void* ptr) {
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  if (region_ != 0 && addr >= region_ && addr < region_ + plan_.arena_bytes) {
    live_.erase(addr - region_);
    return;
  }
  online_->free(block, ptr);
}

}  // namespace zico::replay
