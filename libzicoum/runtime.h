// Runtime: the process-wide state behind every entry point.
//
// Created on first use from the environment (ZICO_*): the configuration, one
// driver (CudaDriver or SimDriver) and, lazily, one DeviceAllocator per device.
// A bad configuration or a missing driver does not crash anything: init_status()
// keeps the failure, it is logged once on stderr, and every call fails with it.
//
// Lifetime: never destroyed. CUDA programs and PyTorch free memory from atexit
// handlers and static destructors; a runtime that died first would turn those
// frees into use-after-free. The OS reclaims everything at exit.
#pragma once

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "config.h"
#include "backing_store.h"
#include "device_allocator.h"
#include "driver.h"
#include "managed_arena_driver.h"
#include "swap_arena_driver.h"
#include "um_pager.h"

namespace zico {
namespace sharing {
class NodeClient;
}

class Runtime {
 public:
  static constexpr int kMaxDevices = 64;

  [[nodiscard]] static Runtime& instance() noexcept;
  // The runtime if something already created it, else nullptr: for calls
  // that concern only memory zicoum allocated (frees, stream destruction),
  // so that a process that never allocated through zicoum does not start it
  // (cuInit, registering with zico-umd) to hear that a pointer is not ours.
  [[nodiscard]] static Runtime* if_created() noexcept;

  [[nodiscard]] Status init_status() const { return init_status_; }
  [[nodiscard]] const std::string& init_error() const { return init_error_; }
  [[nodiscard]] const Config& config() const { return config_; }
  [[nodiscard]] Driver* driver() const { return driver_.get(); }
  // The link to zico-umd, or nullptr when running standalone.
  [[nodiscard]] sharing::NodeClient* node() const { return node_link_.load(std::memory_order_acquire); }

  // The allocator of `device`, created on first use. *out stays valid forever.
  [[nodiscard]] Status allocator(DeviceId device, DeviceAllocator** out) noexcept;
  // Why `device` cannot be used, in words (configuration, driver, creation).
  [[nodiscard]] std::string device_error(DeviceId device, Status status) const;
  // The allocator of `device` if one was created already, else nullptr.
  [[nodiscard]] DeviceAllocator* existing_allocator(DeviceId device) const noexcept;
  // UM mode (ZICO_MODE=um): the pager of `device`, created with its
  // allocator; nullptr in VMM mode or before the allocator exists.
  [[nodiscard]] prefetch::UmPager* pager(DeviceId device) const noexcept;
  // UM mode under zico-umd: a kernel about to use `bytes` of `device`'s
  // pages, more than the pager's budget, first waits for the daemon to lend
  // the rest (at most ZICO_WAIT_TIMEOUT), so that it runs within its share.
  // Where the daemon lends nothing more, the driver pages it (said once).
  void make_room_for_kernel(DeviceId device, uint64_t bytes) noexcept;
  // The allocator whose arena holds `ptr`, or nullptr. Lock-free.
  [[nodiscard]] DeviceAllocator* owner_of(const void* ptr) const noexcept;
  // The device's store for `kind` (kHost or kNvme), created on first use.
  [[nodiscard]] Status backing_store(DeviceId device, Residency kind, BackingStore** out) noexcept;
  // Where a job pauses when zico-umctl suspend asked it to: evicts every
  // device's memory, waits for zico-umctl resume, restores. Called at every
  // allocation and iteration mark; one atomic load otherwise.
  // A suspension that fails on any device is undone and reported (the job
  // keeps its memory); a resumption that cannot restore a device's memory
  // reports it and leaves that device suspended, its allocations failing.
  void pause_point() noexcept;
  // At exit: unlinks the swap files (a suspended job's data dies with it anyway).
  void close_swap_files() noexcept;
  // UM mode, at exit: stops each device's pager threads (their moves run
  // first), then logs what the pager did at the info level (the launches
  // seen, faults, migrations, the peak against the budget).
  void end_paging() noexcept;
  // What the job may still use: total = budget, free = budget - allocated,
  // also capped by what the device really has free (other processes). In UM
  // mode the arena, which may hold more than the budget: total = arena,
  // free = arena - allocated.
  [[nodiscard]] Status memory_info(DeviceId device, size_t* free_bytes, size_t* total_bytes) noexcept;

  // Physical memory the process makes itself with the driver's cuMemCreate
  // (PyTorch's expandable segments, NCCL's buffers), beside zicoum's. With a
  // budget (ZICO_BUDGET) and no zico-umd, in VMM mode, it counts against the
  // budget: the allocator's share shrinks by it (idle memory is returned), and
  // a charge that would break the budget is refused with kOutOfMemory.
  // Otherwise it is only counted (zico-umd's audit sees the process's memory).
  [[nodiscard]] Status charge_outside(DeviceId device, size_t bytes) noexcept;
  void release_outside(DeviceId device, size_t bytes) noexcept;
  [[nodiscard]] size_t outside_bytes(DeviceId device) const noexcept;

 private:
  Runtime() noexcept;
  // Resumes each allocator (see pause_point); false if one could not be.
  bool restore(const std::vector<DeviceAllocator*>& paused) noexcept;
  // A UM job's devices after the resumption: each is lent a first chunk again.
  bool page_in(const std::vector<DeviceId>& paged_out) noexcept;
  // Registers with zico-umd if its socket exists (config_.socket_path). A
  // daemon that refuses or does not answer within ZICO_WAIT_TIMEOUT leaves
  // node_error_ set: no allocator is created until a later call gets in.
  // In the constructor, or with create_mutex_ held.
  void connect_to_node();
  // Client mode: the daemon's chunk size, its chunk source and a host store
  // for yields (*borrowed). Standalone (ok, not borrowed) without a daemon or
  // for a GPU it does not manage; an error (*why) when it does not open it.
  Status borrow_from_node(DeviceId device, AllocatorOptions* options, bool* borrowed, std::string* why);
  // UM mode: the allocator on a managed arena, and its pager. Under
  // zico-umd the pager's budget is what the daemon lends (resident grants,
  // see node_client.h). With create_mutex_ held.
  Status create_um(DeviceId device, const Capabilities& caps, std::unique_ptr<DeviceAllocator>* allocator,
                   std::string* why);
  // UM mode under zico-umd: opens the device as pageable (*opened; not
  // when the daemon does not manage it) with its chunk size and first grant.
  Status open_pageable(DeviceId device, bool* opened, size_t* chunk_bytes, uint64_t* lent, std::string* why);

  Status init_status_;
  std::string init_error_;
  Config config_;
  std::unique_ptr<Driver> driver_;
  // UM mode: what the allocators see (and, swapping, the pagers too):
  // managed memory (ZICO_UM_MEMORY=managed), or device memory swapped (swap).
  std::unique_ptr<ForwardingDriver> managed_driver_;
  std::unique_ptr<sharing::NodeClient> node_;  // set once, in the constructor or under create_mutex_
  std::atomic<sharing::NodeClient*> node_link_{nullptr};  // node_, for readers that hold no lock
  std::string node_error_;  // why registering failed although a daemon listens; guarded by create_mutex_
  mutable std::mutex create_mutex_;  // serializes allocator creation; guards the two below
  // A device whose allocator could not be created stays failed: retrying on
  // every cudaMalloc would only repeat the same error line.
  std::array<Status, kMaxDevices> creation_status_{};
  std::array<std::string, kMaxDevices> creation_error_{};
  std::array<std::atomic<DeviceAllocator*>, kMaxDevices> allocators_{};
  std::array<std::atomic<prefetch::UmPager*>, kMaxDevices> pagers_{};  // set before allocators_, never reset
  std::mutex pause_mutex_;  // one thread pauses the job; the others wait behind it
  std::mutex store_mutex_;  // guards the stores below
  std::array<std::unique_ptr<BackingStore>, kMaxDevices> host_stores_{};
  std::array<std::unique_ptr<BackingStore>, kMaxDevices> nvme_stores_{};
  mutable std::mutex outside_mutex_;  // guards outside_bytes_
  std::array<size_t, kMaxDevices> outside_bytes_{};
  // Whether charge_outside() holds outside memory to the budget.
  [[nodiscard]] bool outside_counts_against_budget() const;
};

}  // namespace zico
