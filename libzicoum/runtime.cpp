#include "runtime.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <thread>
#include <cstdlib>
#include <mutex>

#include "driver_factory.h"
#include "gpu_calibration.h"
#include "host_link.h"
#include "host_store.h"
#include "node_client.h"
#include "nvme_store.h"
#include "last_error.h"
#include "launch_observer.h"
#include "log.h"
#include "sim_driver.h"
#include "sizes.h"

extern char** environ;

namespace zico {

namespace {
std::atomic<Runtime*> g_created{nullptr};

// A UM job's pager as zico-umd's client sees it: the resident grants are its
// budget (and, its pages swapped, what the swap may hold of the device).
class PagerShare final : public sharing::ResidentPages {
 public:
  PagerShare(prefetch::UmPager& pager, SwapArenaDriver* swap, DeviceId device)
      : pager_(pager), swap_(swap), device_(device) {}
  uint64_t limit_to(uint64_t bytes) noexcept override {
    const uint64_t budget = pager_.set_budget(bytes);
    if (swap_ != nullptr) swap_->set_held_limit(device_, budget);
    return budget;
  }
  uint64_t floor_bytes() const noexcept override { return pager_.floor_bytes(); }
  uint64_t link_bytes_per_second() const noexcept override { return pager_.link_bytes_per_second(); }

 private:
  prefetch::UmPager& pager_;
  SwapArenaDriver* const swap_;  // null: managed pages
  const DeviceId device_;
};
}  // namespace

Runtime& Runtime::instance() noexcept {
  static Runtime* runtime = [] {
    auto* created = new Runtime();  // intentionally leaked; see runtime.h
    g_created.store(created, std::memory_order_release);
    return created;
  }();
  return *runtime;
}

Runtime* Runtime::if_created() noexcept { return g_created.load(std::memory_order_acquire); }

Runtime::Runtime() noexcept {
  try {
    init_status_ = load_config_from_environment(&config_, &init_error_);
    if (!init_status_.is_ok()) {
      ZICO_LOG(kError, "%s; allocations will fail until it is fixed", init_error_.c_str());
      return;
    }
    set_log_level(config_.log_level);
    if (const std::string unknown = unknown_variables(environ); !unknown.empty()) {
      ZICO_LOG(kWarn, "ignoring unknown variable(s) %s; `zico-run --list-env` lists the known ones", unknown.c_str());
    }
    if (config_.mode == Mode::kUm && config_.um_swap && config_.backend == Backend::kCuda &&
        std::getenv("ZICO_STATIC_RUNTIMES") != nullptr && !config_.static_runtimes) {
      ZICO_LOG(kWarn, "ZICO_UM_MEMORY=swap with ZICO_STATIC_RUNTIMES=off: kernels that libraries carrying the CUDA "
                      "runtime (cuBLAS, cuDNN) launch go unseen, and a page they touch that is not on the GPU is an "
                      "illegal address; leave ZICO_STATIC_RUNTIMES unset (on under swap) or use "
                      "ZICO_UM_MEMORY=managed");
    }
    if (config_.mode != Mode::kUm && (config_.um_swap || config_.fault_reports)) {
      ZICO_LOG(kWarn, "%s applies to ZICO_MODE=um only: ignored under ZICO_MODE=vmm",
               config_.um_swap ? "ZICO_UM_MEMORY=swap" : "ZICO_FAULT_REPORTS=on");
    }
    init_status_ = open_driver(config_, &driver_, &init_error_);
    if (!init_status_.is_ok()) {
      ZICO_LOG(kError, "%s", init_error_.c_str());
      return;
    }
    ZICO_LOG(kInfo, "backend=%s budget=%s", driver_->name(),
             config_.budget ? format_size(*config_.budget).c_str() : "device memory");
    connect_to_node();
  } catch (const std::exception& e) {
    init_status_ = Status(Errc::kOutOfMemory);
    init_error_ = std::string("initialization failed: ") + e.what();
  }
}

void Runtime::connect_to_node() {
  if (config_.socket_path == "off") return;
  sharing::NodeClientOptions options;
  options.socket_path = config_.socket_path;
  options.wait_timeout_ns = config_.wait_timeout_ns;
  options.daemon_uid = config_.daemon_uid;
  options.job_name = config_.job_name;
  std::string why;
  std::unique_ptr<sharing::NodeClient> client;
  // One deadline for all of it: a socket file nobody answers on (the daemon
  // is restarting) is tried again until then, as an allocation would wait,
  // rather than run outside the node's budget. Inside an allocation call it
  // is the call's deadline (AllocationWaitScope): a call that built the
  // runtime and then tries again, or that goes on to open the GPU and borrow
  // memory, still waits one timeout in all.
  const auto give_up = sharing::AllocationWaitScope::deadline(config_.wait_timeout_ns);
  // This call spent its timeout on the attempt that failed: the next call asks again.
  if (!node_error_.empty() && std::chrono::steady_clock::now() >= give_up) return;
  const auto left_ns = [&] {
    const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(give_up - std::chrono::steady_clock::now());
    return static_cast<uint64_t>(std::max<int64_t>(left.count(), 1'000'000));  // at least 1 ms
  };
  options.register_timeout_ns = left_ns();
  Status status = sharing::NodeClient::connect(*driver_, options, &client, &why);
  while (status.code() == Errc::kNotFound && status.detail() == ECONNREFUSED &&
         std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    options.register_timeout_ns = left_ns();
    status = sharing::NodeClient::connect(*driver_, options, &client, &why);
  }
  if (status.is_ok()) {
    ZICO_LOG(kInfo, "registered with zico-umd at %s as job %llu", config_.socket_path.c_str(),
             static_cast<unsigned long long>(client->job_id()));
    node_ = std::move(client);
    node_link_.store(node_.get(), std::memory_order_release);
    node_error_.clear();
  } else if (status.code() == Errc::kNotFound && status.detail() == ENOENT) {
    ZICO_LOG(kDebug, "no zico-umd at %s: standalone", config_.socket_path.c_str());
  } else {
    // Where a daemon's socket exists the job never runs outside the node's
    // budget: it may not allocate until the daemon lets it in.
    node_error_ = "cannot register with zico-umd at " + config_.socket_path + " (" + why +
                  "); no memory until it answers (each allocation asks again; ZICO_SOCKET=off runs the job outside "
                  "the node's budget)";
    ZICO_LOG(kError, "%s", node_error_.c_str());
  }
}

Status Runtime::borrow_from_node(DeviceId device, AllocatorOptions* options, bool* borrowed, std::string* why) {
  *borrowed = false;
  if (node_ == nullptr) return Status::ok();
  size_t chunk = 0;
  ChunkSource* source = nullptr;
  if (Status status = node_->open_gpu(device, &chunk, &source, why); !status.is_ok()) {
    // Only a GPU the daemon does not manage runs standalone.
    if (status.code() == Errc::kNotFound && node_->connected()) {
      ZICO_LOG(kInfo, "device %d runs standalone: %s", device.value, why->c_str());
      return Status::ok();
    }
    *why = "device " + std::to_string(device.value) + ": " + *why + "; no memory until zico-umd opens it";
    return status.code() == Errc::kOutOfMemory ? status : Status(Errc::kOutOfMemory);
  }
  std::string store_error;
  std::unique_ptr<HostStore> store;
  if (Status status = HostStore::create(*driver_, device, chunk, HostStoreOptions{}, &store, &store_error);
      !status.is_ok()) {
    ZICO_LOG(kWarn, "device %d: no host store for deadlock yields (%s)", device.value, store_error.c_str());
  } else {
    std::lock_guard lock(store_mutex_);
    options->yield_store = store.get();
    host_stores_[static_cast<size_t>(device.value)] = std::move(store);
  }
  options->chunk_bytes = chunk;
  options->source = source;
  *borrowed = true;
  return Status::ok();
}

Status Runtime::allocator(DeviceId device, DeviceAllocator** out) noexcept {
  if (!init_status_.is_ok()) return init_status_;
  if (device.value < 0 || device.value >= kMaxDevices) return Status(Errc::kNoDevice, device.value);
  auto& slot = allocators_[static_cast<size_t>(device.value)];
  if (DeviceAllocator* existing = slot.load(std::memory_order_acquire)) {
    *out = existing;
    return Status::ok();
  }
  std::lock_guard lock(create_mutex_);
  if (DeviceAllocator* existing = slot.load(std::memory_order_acquire)) {
    *out = existing;
    return Status::ok();
  }
  const auto index = static_cast<size_t>(device.value);
  if (!creation_status_[index].is_ok()) return creation_status_[index];
  int count = 0;
  ZICO_RETURN_IF_ERROR(driver_->device_count(&count));
  if (device.value >= count) return Status(Errc::kNoDevice, device.value);
  Capabilities caps;
  ZICO_RETURN_IF_ERROR(driver_->capabilities(device, &caps));
  if (config_.mode == Mode::kUm) {
    std::unique_ptr<DeviceAllocator> created;
    std::string why;
    Status status;
    try {
      status = create_um(device, caps, &created, &why);
    } catch (const std::bad_alloc&) {
      status = Status(Errc::kOutOfMemory);
      why = "out of host memory";
    }
    if (!status.is_ok()) {
      ZICO_LOG(kError, "%s", why.c_str());
      // Waiting on zico-umd (out of memory) may end: the next allocation asks again.
      if (status.code() != Errc::kOutOfMemory) creation_status_[index] = status;
      creation_error_[index] = why;
      return status;
    }
    *out = created.release();  // lives as long as the runtime: forever
    slot.store(*out, std::memory_order_release);
    return Status::ok();
  }
  if (config_.budget && *config_.budget > caps.total_memory) {
    ZICO_LOG(kWarn, "ZICO_BUDGET=%s is more than device %d has (%s): the device's memory binds first",
             format_size(*config_.budget).c_str(), device.value, format_size(caps.total_memory).c_str());
  }
  AllocatorOptions options;
  options.budget_bytes = config_.budget.value_or(caps.total_memory);
  options.chunk_bytes = config_.chunk_size.value_or(0);
  options.arena_bytes = config_.arena_size.value_or(0);
  std::unique_ptr<DeviceAllocator> created;
  std::string why;
  try {
    // Not registered although a daemon listens: ask again (it may have been
    // busy); no memory before it answers. Not remembered as the device's
    // failure, so that the next allocation asks again.
    if (!node_error_.empty()) connect_to_node();
    if (!node_error_.empty()) {
      creation_error_[index] = node_error_;
      return Status(Errc::kOutOfMemory);
    }
    bool borrowed = false;
    if (Status status = borrow_from_node(device, &options, &borrowed, &why); !status.is_ok()) {
      ZICO_LOG(kError, "%s", why.c_str());
      creation_error_[index] = why;
      return status;
    }
    creation_error_[index].clear();
    const Status status = DeviceAllocator::create(*driver_, device, options, &created, &why);
    if (!status.is_ok()) {
      // A setting the user can fix ends as a malformed variable's message does.
      ZICO_LOG(kError, "%s%s", why.c_str(),
               status.code() == Errc::kConfigError ? "; allocations will fail until it is fixed" : "");
      creation_status_[index] = status;
      creation_error_[index] = why;
      return status;
    }
    ZICO_LOG(kInfo, "device %d: budget %s, chunk %s, arena %s%s", device.value,
             format_size(options.budget_bytes).c_str(), format_size(created->chunk_bytes()).c_str(),
             format_size(created->arena().bytes).c_str(), borrowed ? ", memory lent by zico-umd" : "");
    if (borrowed) node_->attach(device, created.get());
  } catch (const std::bad_alloc&) {
    return Status(Errc::kOutOfMemory);
  }
  *out = created.release();  // lives as long as the runtime: forever
  slot.store(*out, std::memory_order_release);
  return Status::ok();
}

Status Runtime::create_um(DeviceId device, const Capabilities& caps, std::unique_ptr<DeviceAllocator>* allocator,
                          std::string* why) {
  const std::string name = "device " + std::to_string(device.value);
  // Swapped pages need virtual memory management; managed ones, managed
  // memory that faults in on demand.
  if (config_.um_swap) {
    if (!caps.virtual_memory || caps.granularity == 0) {
      *why = name + " has no virtual memory management, which ZICO_UM_MEMORY=swap needs; use ZICO_UM_MEMORY=managed";
      return Status(Errc::kNotSupported);
    }
  } else if (!caps.managed_memory) {
    *why = name + " has no managed (unified) memory, which ZICO_MODE=um needs; use ZICO_MODE=vmm";
    return Status(Errc::kNotSupported);
  } else if (!caps.concurrent_managed_access) {
    *why = name + " has managed memory but no concurrent managed access (a GPU before Pascal, Windows or WSL, "
                  "some vGPUs): its pages cannot fault in on demand, which ZICO_MODE=um needs; use ZICO_MODE=vmm";
    return Status(Errc::kNotSupported);
  }
  bool under_node = false;
  size_t node_chunk = 0;
  uint64_t lent = 0;
  ZICO_RETURN_IF_ERROR(open_pageable(device, &under_node, &node_chunk, &lent, why));
  if (managed_driver_ == nullptr && config_.um_swap) managed_driver_ = std::make_unique<SwapArenaDriver>(*driver_);
  if (managed_driver_ == nullptr) managed_driver_ = std::make_unique<ManagedArenaDriver>(*driver_);
  AllocatorOptions options;
  // The allocator's budget binds mapped bytes, which here are virtual: the
  // arena is the limit, and the pager keeps the GPU's share within the budget.
  options.budget_bytes = SIZE_MAX;
  options.chunk_bytes = config_.chunk_size.value_or(0);
  // By default what the device has free: asking some GPUs for more managed
  // memory than they have free can hang them, so paging beyond the device
  // itself (not only beyond the budget) takes an explicit ZICO_ARENA_SIZE.
  size_t device_free = 0;
  size_t device_total = 0;
  if (!config_.arena_size && !driver_->memory_info(device, &device_free, &device_total).is_ok()) {
    *why = name + ": cannot read the device's free memory for the UM arena; set ZICO_ARENA_SIZE";
    return Status(Errc::kDriverError);
  }
  // Under zico-umd a page is one of its chunks: grants are whole pages.
  if (under_node) options.chunk_bytes = node_chunk;
  const size_t chunk = under_node ? node_chunk : config_.chunk_size.value_or(caps.granularity);
  options.arena_bytes = config_.arena_size.value_or(chunk != 0 ? device_free / chunk * chunk : device_free);
  if (Status status = DeviceAllocator::create(*managed_driver_, device, options, allocator, why); !status.is_ok()) {
    *why = name + ": " + *why;
    return status;
  }
  prefetch::UmPagerOptions pager_options;
  pager_options.policy = config_.paging_policy;
  pager_options.learn_from_faults = config_.fault_reports;
  // On the simulated backend the moves run inline, each direction's host time
  // modelled as its own thread's, so that its modelled clock stays
  // deterministic (a real thread would land its calls wherever the OS runs it).
  pager_options.pager_threads = config_.backend != Backend::kSim;
  // The calibration's figures, then an explicit host link rate over its rates.
  if (config_.gpu_calibration) pager_options.model = with_calibration(pager_options.model, *config_.gpu_calibration);
  if (config_.host_bytes_per_second) {
    pager_options.model = on_host_link(pager_options.model, *config_.host_bytes_per_second);
  }
  pager_options.budget_bytes = under_node ? lent : config_.budget.value_or(caps.total_memory);
  if (config_.um_swap && !under_node) {
    // A swapped page needs a chunk the device has free when it comes in (a
    // fault cannot make room for it): without a budget, what is free now,
    // less a sixteenth for what others (contexts, libraries) take later.
    size_t free_now = 0;
    size_t total = 0;
    if (driver_->memory_info(device, &free_now, &total).is_ok()) {
      const uint64_t usable = free_now - free_now / 16;
      if (!config_.budget) {
        pager_options.budget_bytes = usable;
      } else if (*config_.budget > usable) {
        ZICO_LOG(kWarn, "device %d: ZICO_BUDGET %s is more than the %s the device has free for swapped pages; a "
                 "page that finds no memory when it comes in is an illegal address for its kernel",
                 device.value, format_size(*config_.budget).c_str(), format_size(usable).c_str());
      }
    }
  }
  std::unique_ptr<prefetch::UmPager> pager;
  // Managed pages move by the driver's own calls; swapped ones by the swap's.
  Driver& pages_driver = config_.um_swap ? static_cast<Driver&>(*managed_driver_) : *driver_;
  if (Status status = prefetch::UmPager::create(pages_driver, device, (*allocator)->arena(), (*allocator)->chunk_bytes(),
                                                pager_options, &pager, why);
      !status.is_ok()) {
    *why = name + ": " + *why;
    allocator->reset();
    return status;
  }
  ZICO_LOG(kInfo, "device %d: %s, arena %s, %s on the GPU at most, paging policy %s, planned on a "
           "%.1f GB/s host link", device.value, config_.um_swap ? "device memory swapped" : "unified memory",
           format_size((*allocator)->arena().bytes).c_str(),
           format_size(pager->budget_bytes()).c_str(), config_.paging_policy.c_str(),
           static_cast<double>(pager->link_bytes_per_second()) / 1e9);
  // Swapped, the chunks of pages that leave are kept for the next ones in,
  // within the budget.
  auto* swap = config_.um_swap ? static_cast<SwapArenaDriver*>(managed_driver_.get()) : nullptr;
  if (swap != nullptr) swap->set_held_limit(device, pager->budget_bytes());
  if (under_node) {
    // The daemon's grants set the pager's budget from now on, up to ZICO_BUDGET if one is set.
    node_->attach_pages(device, new PagerShare(*pager, swap, device), config_.budget.value_or(UINT64_MAX));  // forever
    node_->attach(device, allocator->get());
  }
  pagers_[static_cast<size_t>(device.value)].store(pager.release(), std::memory_order_release);  // forever
  static std::once_flag summary_registered;
  // The pagers' threads are this process's: a child forked from it has
  // none (and may find their locks held), so it leaves them alone at exit.
  static const pid_t paging_pid = ::getpid();
  std::call_once(summary_registered, [] {
    std::atexit([] {
      if (::getpid() == paging_pid) Runtime::instance().end_paging();
    });
  });
  return Status::ok();
}

void Runtime::end_paging() noexcept {
  const LaunchCounts launches = launch_counts();
  for (int device = 0; device < kMaxDevices; ++device) {
    prefetch::UmPager* pager = pagers_[static_cast<size_t>(device)].load(std::memory_order_acquire);
    if (pager == nullptr) continue;
    // Process exit: the pager's threads finish their moves and stop before
    // the driver's own exit handlers (registered before this one) run; the
    // counts below are then final.
    pager->go_inline();
    const prefetch::UmPagerStats s = pager->stats();
    ZICO_LOG(kInfo,
             "device %d, UM paging: %llu ops announced (%llu launches seen in the process, %llu without zicoum "
             "memory; %llu copies and memsets); %llu pages faulted in, %llu prefetched (%llu of them discarded on the "
             "way), %llu evicted, %llu discarded; %llu migration calls for %llu ranges; at most %s on the GPU, %s beyond the budget of the "
             "moment (%s now)",
             device, static_cast<unsigned long long>(s.kernels), static_cast<unsigned long long>(launches.launches),
             static_cast<unsigned long long>(launches.without_blocks), static_cast<unsigned long long>(launches.copies),
             static_cast<unsigned long long>(s.faulted_pages), static_cast<unsigned long long>(s.prefetches),
             static_cast<unsigned long long>(s.discarded_prefetches),
             static_cast<unsigned long long>(s.evictions + s.room_evictions + s.budget_evictions),
             static_cast<unsigned long long>(s.discards), static_cast<unsigned long long>(s.migration_calls),
             static_cast<unsigned long long>(s.migration_ranges), format_size(s.peak_resident_bytes).c_str(),
             format_size(s.peak_over_budget_bytes).c_str(), format_size(pager->budget_bytes()).c_str());
    if (s.found_iteration_kernels != 0) {
      ZICO_LOG(kInfo, "device %d, UM paging: no iteration marks; the iteration found in the launches: %llu ops",
               device, static_cast<unsigned long long>(s.found_iteration_kernels));
    }
    if (config_.um_swap) {
      const SwapArenaStats w = static_cast<SwapArenaDriver*>(managed_driver_.get())->stats();
      ZICO_LOG(kInfo, "device %d, swapped pages: %llu in (%llu copied), %llu out; device memory held at most %s, %s of "
               "it kept unmapped now for pages to come; %llu chunks reused",
               device, static_cast<unsigned long long>(w.pages_in), static_cast<unsigned long long>(w.copies_in),
               static_cast<unsigned long long>(w.pages_out), format_size(w.peak_held_bytes).c_str(),
               format_size(w.pooled_bytes).c_str(), static_cast<unsigned long long>(w.chunks_reused));
    }
    // The simulated device's own count of what crossed the link (a GPU's is nsys's to tell).
    if (auto* sim = dynamic_cast<SimDriver*>(driver_.get())) {
      const SimManagedStats m = sim->managed_stats();
      ZICO_LOG(kInfo, "device %d, simulated unified memory: %s copied to the GPU, %s to the host; %llu pages "
               "faulted in, %llu discarded",
               device, format_size(m.h2d_bytes).c_str(), format_size(m.d2h_bytes).c_str(),
               static_cast<unsigned long long>(m.faulted_pages), static_cast<unsigned long long>(m.discarded_pages));
    }
  }
}

Status Runtime::open_pageable(DeviceId device, bool* opened, size_t* chunk_bytes, uint64_t* lent, std::string* why) {
  *opened = false;
  // Not registered although a daemon listens: ask again; no memory before it answers.
  if (!node_error_.empty()) connect_to_node();
  if (!node_error_.empty()) {
    *why = node_error_;
    return Status(Errc::kOutOfMemory);
  }
  if (node_ == nullptr) return Status::ok();
  const std::string name = "device " + std::to_string(device.value);
  if (Status status = node_->open_pageable_gpu(device, chunk_bytes, lent, why); !status.is_ok()) {
    if (status.code() == Errc::kNotFound && node_->connected()) {
      ZICO_LOG(kInfo, "%s runs standalone: %s", name.c_str(), why->c_str());
      return Status::ok();
    }
    *why = name + ": " + *why + "; no memory until zico-umd lends some";
    return status.code() == Errc::kOutOfMemory ? status : Status(Errc::kOutOfMemory);
  }
  *opened = true;
  return Status::ok();
}

void Runtime::make_room_for_kernel(DeviceId device, uint64_t bytes) noexcept {
  sharing::NodeClient* node = node_link_.load(std::memory_order_acquire);
  if (node == nullptr) return;
  try {
    std::string why;
    if (Status status = node->need_resident(device, bytes, &why); !status.is_ok()) {
      static std::atomic<bool> said{false};
      if (!said.exchange(true)) {
        ZICO_LOG(kWarn, "device %d: a kernel uses %s of pages, more than zico-umd lent this job, which did not lend "
                        "the rest (%s): the driver pages it beyond the job's share",
                 device.value, format_size(bytes).c_str(), why.c_str());
      }
    }
  } catch (const std::bad_alloc&) {
    // No memory to ask with: the kernel runs on what is lent.
  }
}

prefetch::UmPager* Runtime::pager(DeviceId device) const noexcept {
  if (device.value < 0 || device.value >= kMaxDevices) return nullptr;
  return pagers_[static_cast<size_t>(device.value)].load(std::memory_order_acquire);
}

std::string Runtime::device_error(DeviceId device, Status status) const {
  if (!init_status_.is_ok()) return init_error_;
  if (device.value >= 0 && device.value < kMaxDevices) {
    std::lock_guard lock(create_mutex_);
    const std::string& why = creation_error_[static_cast<size_t>(device.value)];
    if (!why.empty()) return why;
  }
  return "device " + std::to_string(device.value) + ": " + status.message();
}

DeviceAllocator* Runtime::existing_allocator(DeviceId device) const noexcept {
  if (device.value < 0 || device.value >= kMaxDevices) return nullptr;
  return allocators_[static_cast<size_t>(device.value)].load(std::memory_order_acquire);
}

Status Runtime::backing_store(DeviceId device, Residency kind, BackingStore** out) noexcept {
  DeviceAllocator* allocator = nullptr;
  ZICO_RETURN_IF_ERROR(this->allocator(device, &allocator));
  std::lock_guard lock(store_mutex_);
  auto& slot = (kind == Residency::kHost ? host_stores_ : nvme_stores_)[static_cast<size_t>(device.value)];
  if (slot == nullptr) {
    std::string why;
    try {
      if (kind == Residency::kHost) {
        std::unique_ptr<HostStore> store;
        const Status status = HostStore::create(*driver_, device, allocator->chunk_bytes(), HostStoreOptions{}, &store, &why);
        if (!status.is_ok()) {
          ZICO_LOG(kError, "%s", why.c_str());
          set_last_error(why);
          return status;
        }
        slot = std::move(store);
      } else {
        NvmeStoreOptions options;
        options.directory = config_.swap_dir;
        options.queue_depth = config_.nvme_queue_depth;
        options.staging_buffers = config_.nvme_staging_buffers;
        options.io_bytes = config_.nvme_io_bytes;
        std::unique_ptr<NvmeStore> store;
        const Status status = NvmeStore::create(*driver_, device, allocator->chunk_bytes(), options, &store, &why);
        if (!status.is_ok()) {
          ZICO_LOG(kError, "%s", why.c_str());
          set_last_error(why);
          return status;
        }
        slot = std::move(store);
        // The runtime lives forever, so remove the swap files when the process exits normally.
        static std::once_flag registered;
        std::call_once(registered, [] { std::atexit([] { Runtime::instance().close_swap_files(); }); });
      }
    } catch (const std::bad_alloc&) {
      return Status(Errc::kOutOfMemory);
    }
  }
  *out = slot.get();
  return Status::ok();
}

void Runtime::pause_point() noexcept {
  Residency to = Residency::kHost;
  sharing::NodeClient* node = this->node();
  if (node == nullptr || !node->suspend_requested(&to)) return;
  const sharing::OutsideAllocationWait not_the_allocations_wait;
  std::lock_guard pause(pause_mutex_);
  if (!node->suspend_requested(&to)) return;  // another thread paused and resumed meanwhile
  std::vector<DeviceAllocator*> paused;
  try {
    paused.reserve(kMaxDevices);
  } catch (const std::bad_alloc&) {
    return;
  }
  std::vector<DeviceId> paged_out;  // UM devices: their pages left the GPU, their grants went back
  try {
    paged_out.reserve(kMaxDevices);
  } catch (const std::bad_alloc&) {
    return;
  }
  for (int device = 0; device < kMaxDevices; ++device) {
    DeviceAllocator* allocator = existing_allocator(DeviceId{device});
    if (allocator == nullptr) continue;
    if (pager(DeviceId{device}) != nullptr) {
      node->page_out(DeviceId{device});
      paged_out.push_back(DeviceId{device});
      continue;
    }
    BackingStore* store = nullptr;
    Status status = backing_store(DeviceId{device}, to, &store);
    if (status.is_ok()) status = allocator->suspend(*store);
    if (!status.is_ok()) {
      // All or nothing: a job half suspended would hold memory while the
      // daemon believes it gave everything back.
      ZICO_LOG(kError, "device %d: cannot suspend to %s (%s); the job runs on with all its memory", device,
               to_string(to), status.message().c_str());
      const bool restored = restore(paused);
      const bool paged_in = page_in(paged_out);
      node->report_failed();
      if (!restored || !paged_in) ZICO_LOG(kError, "suspension failed and rolled back only in part: see the lines above");
      return;
    }
    paused.push_back(allocator);
  }
  ZICO_LOG(kInfo, "suspended by zico-umd (%zu device(s) evicted to %s)", paused.size(), to_string(to));
  node->report_suspended(true);
  node->wait_for_resume();
  const bool restored = restore(paused);
  if (page_in(paged_out) && restored) {
    node->report_suspended(false);
    ZICO_LOG(kInfo, "resumed");
  } else {
    node->report_failed();
  }
}

bool Runtime::page_in(const std::vector<DeviceId>& paged_out) noexcept try {
  bool all = true;
  for (const DeviceId device : paged_out) {
    std::string why;
    // Its pages come back as its kernels use them; a first grant is all it waits for.
    if (Status status = node()->page_in(device, &why); !status.is_ok()) {
      ZICO_LOG(kError, "device %d: no memory lent after the resumption (%s); its kernels page on demand",
               device.value, why.c_str());
      all = false;
    }
  }
  return all;
} catch (const std::bad_alloc&) {
  return false;
}

bool Runtime::restore(const std::vector<DeviceAllocator*>& paused) noexcept {
  constexpr int kAttempts = 3;  // for failures other than waiting for memory
  bool all = true;
  for (DeviceAllocator* allocator : paused) {
    Status status = allocator->resume();
    // Waiting for memory (the node is full) is what a suspended job does
    // until others finish: its data stays safe in the store meanwhile. Any
    // other failure (a corrupt or truncated swap file, an I/O error) is
    // retried a little, then reported: the job gets an error, not a hang.
    for (int attempt = 1; !status.is_ok() && (status.code() == Errc::kOutOfMemory || attempt < kAttempts);
         ++attempt) {
      if (attempt % 50 == 1) {
        ZICO_LOG(kWarn, "device %d: resume failed (%s); trying again", allocator->device().value,
                 status.message().c_str());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      status = allocator->resume();
    }
    if (!status.is_ok()) {
      const std::string why = "device " + std::to_string(allocator->device().value) +
                              ": its memory could not be restored (" + status.message() +
                              "); allocations on it fail until zico_resume succeeds";
      ZICO_LOG(kError, "%s", why.c_str());
      set_last_error(why);
      all = false;
    }
  }
  return all;
}

void Runtime::close_swap_files() noexcept {
  // Unlink only: an allocator, or a late atexit handler, may still point at
  // the store, so the object must outlive every caller (the runtime does).
  std::lock_guard lock(store_mutex_);
  for (auto& store : nvme_stores_) {
    if (store != nullptr) static_cast<NvmeStore*>(store.get())->remove_file();
  }
}

DeviceAllocator* Runtime::owner_of(const void* ptr) const noexcept {
  for (const auto& slot : allocators_) {
    DeviceAllocator* allocator = slot.load(std::memory_order_acquire);
    if (allocator != nullptr && allocator->owns(ptr)) return allocator;
  }
  return nullptr;
}

Status Runtime::memory_info(DeviceId device, size_t* free_bytes, size_t* total_bytes) noexcept {
  DeviceAllocator* allocator = nullptr;
  ZICO_RETURN_IF_ERROR(this->allocator(device, &allocator));
  const AllocatorStats stats = allocator->stats();
  if (config_.mode == Mode::kUm) {
    *total_bytes = allocator->arena().bytes;
    *free_bytes = *total_bytes - std::min(*total_bytes, stats.allocated_bytes);
    return Status::ok();
  }
  size_t device_free = 0;
  size_t device_total = 0;
  ZICO_RETURN_IF_ERROR(driver_->memory_info(device, &device_free, &device_total));
  // Only whole chunks are ever mapped: what is reported is what can be allocated.
  // Under zico-umd, no more than the daemon could ever lend the job.
  const size_t chunk = allocator->chunk_bytes();
  // A budget above the device is bound by the device (said once at start).
  size_t limit = std::min<size_t>(stats.budget_bytes, device_total);
  if (const sharing::NodeClient* node = this->node(); node != nullptr) {
    if (const uint64_t share = node->share_bytes(device); share != 0) limit = std::min<uint64_t>(limit, share);
  }
  const size_t usable = chunk != 0 ? limit / chunk * chunk : limit;
  const size_t budget_left = usable - std::min(usable, stats.allocated_bytes);
  // The process's own driver allocations took their share of the budget.
  *total_bytes = std::min(device_total, usable + (outside_counts_against_budget() ? outside_bytes(device) : 0));
  *free_bytes = std::min(budget_left, device_free + stats.cached_bytes);
  return Status::ok();
}

bool Runtime::outside_counts_against_budget() const {
  return config_.budget.has_value() && node() == nullptr && config_.mode == Mode::kVmm;
}

Status Runtime::charge_outside(DeviceId device, size_t bytes) noexcept {
  if (device.value < 0 || device.value >= kMaxDevices) return Status::ok();  // the driver judges the device
  std::lock_guard lock(outside_mutex_);
  size_t& outside = outside_bytes_[device.value];
  const size_t after = outside + bytes;
  DeviceAllocator* allocator = nullptr;
  // Asked after the allocator exists: creating it may register with zico-umd,
  // whose budget the allocator then follows instead.
  if (outside_counts_against_budget() && this->allocator(device, &allocator).is_ok() &&
      outside_counts_against_budget()) {
    const size_t budget = *config_.budget;
    const bool fits = after <= budget && allocator->set_budget(budget - after).is_ok() &&
                      allocator->stats().mapped_bytes <= budget - after;
    if (!fits) {
      (void)allocator->set_budget(budget - std::min(budget, outside));
      return Status(Errc::kOutOfMemory);
    }
  }
  outside = after;
  return Status::ok();
}

void Runtime::release_outside(DeviceId device, size_t bytes) noexcept {
  if (device.value < 0 || device.value >= kMaxDevices) return;
  std::lock_guard lock(outside_mutex_);
  size_t& outside = outside_bytes_[device.value];
  outside -= std::min(outside, bytes);
  DeviceAllocator* allocator = existing_allocator(device);
  if (allocator != nullptr && outside_counts_against_budget()) {
    (void)allocator->set_budget(*config_.budget - std::min(*config_.budget, outside));
  }
}

size_t Runtime::outside_bytes(DeviceId device) const noexcept {
  if (device.value < 0 || device.value >= kMaxDevices) return 0;
  std::lock_guard lock(outside_mutex_);
  return outside_bytes_[device.value];
}

}  // namespace zico
