// Real allocators as replay targets, each on its own SimDriver.
//
// The replayer never touches memory, and SimDriver's memfd chunks cost no RAM
// until written, so traces of 80 GiB jobs replay on a small machine against
// the allocator code that ships, not a model of it.
#pragma once

#include <memory>

#include "device_allocator.h"
#include "naive_allocator.h"
#include "replay_target.h"
#include "sim_driver.h"

namespace zico::replay {

// A simulated device large enough for any trace we replay.
[[nodiscard]] SimOptions replay_device_options();

// zicoum's DeviceAllocator, the online allocator of libzicoum.
class ZicoumTarget final : public ReplayTarget {
 public:
  [[nodiscard]] static Status create(std::unique_ptr<ZicoumTarget>* out, std::string* why);
  const char* name() const override { return "zicoum"; }
  Status allocate(uint32_t block, size_t bytes, void** out) override;
  void free(uint32_t block, void* ptr) override;
  void iteration_started(uint32_t iteration) override;
  uint64_t mapped_bytes() const override { return allocator_->stats().mapped_bytes; }
  uint64_t map_calls() const override { return allocator_->stats().chunk_maps; }
  uint64_t unmap_calls() const override { return allocator_->stats().chunk_unmaps; }
  [[nodiscard]] DeviceAllocator& allocator() { return *allocator_; }

 private:
  ZicoumTarget() : driver_(replay_device_options()) {}
  SimDriver driver_;
  std::unique_ptr<DeviceAllocator> allocator_;
};

// One mapping per allocation: the allocator with no cache.
class NaiveTarget final : public ReplayTarget {
 public:
  [[nodiscard]] static Status create(std::unique_ptr<NaiveTarget>* out, std::string* why);
  const char* name() const override { return "naive"; }
  Status allocate(uint32_t block, size_t bytes, void** out) override;
  void free(uint32_t block, void* ptr) override;
  uint64_t mapped_bytes() const override { return allocator_->mapped_bytes(); }
  uint64_t map_calls() const override { return maps_; }
  uint64_t unmap_calls() const override { return unmaps_; }

 private:
  NaiveTarget() : driver_(replay_device_options()) {}
  SimDriver driver_;
  std::unique_ptr<NaiveAllocator> allocator_;
  uint64_t maps_ = 0;
  uint64_t unmaps_ = 0;
};

}  // namespace zico::replay
