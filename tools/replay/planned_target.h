// PlannedTarget: zicoum's online allocator plus a lifetime plan.
//
// Iterations up to and including the observed one run on the online
// allocator. When the next iteration starts, one region of the plan's size
// is allocated, and at every planned iteration's start the online cache is
// trimmed; from then on the n-th
// allocation of each iteration is placed at its planned offset inside the
// region if its size matches the plan and the range is free right now (a
// live-range check, so a changed pattern can never corrupt anything);
// everything else falls back to the online allocator.
#pragma once

#include <map>
#include <memory>

#include "lifetime_plan.h"
#include "sim_targets.h"

namespace zico::replay {

class PlannedTarget final : public ReplayTarget {
 public:
  [[nodiscard]] static Status create(LifetimePlan plan, std::unique_ptr<PlannedTarget>* out, std::string* why);
  const char* name() const override { return "zicoum+plan"; }
  Status allocate(uint32_t block, size_t bytes, void** out) override;
  void free(uint32_t block, void* ptr) override;
  void iteration_started(uint32_t iteration) override;
  uint64_t mapped_bytes() const override { return online_->mapped_bytes(); }
  uint64_t map_calls() const override { return online_->map_calls(); }
  uint64_t unmap_calls() const override { return online_->unmap_calls(); }

  [[nodiscard]] const LifetimePlan& plan() const { return plan_; }
  [[nodiscard]] uint64_t planned_allocations() const { return planned_; }
  // Allocations with a planned slot that went to the online allocator instead:
  [[nodiscard]] uint64_t fallbacks() const { return mismatched_ + busy_; }
  [[nodiscard]] uint64_t mismatched() const { return mismatched_; }  // the size or order changed
  [[nodiscard]] uint64_t busy() const { return busy_; }  // the planned range was still in use

 private:
  PlannedTarget(LifetimePlan plan, std::unique_ptr<ZicoumTarget> online)
      : plan_(std::move(plan)), online_(std::move(online)) {}
  [[nodiscard]] bool range_is_free(uint64_t offset, uint64_t bytes) const;

  LifetimePlan plan_;
  std::unique_ptr<ZicoumTarget> online_;
  uintptr_t region_ = 0;  // 0 until the first planned iteration
  size_t ordinal_ = 0;    // allocations so far in this iteration
  std::map<uint64_t, uint64_t> live_;  // planned blocks in use: offset -> end
  uint64_t planned_ = 0;
  uint64_t mismatched_ = 0;
  uint64_t busy_ = 0;
};

}  // namespace zico::replay
