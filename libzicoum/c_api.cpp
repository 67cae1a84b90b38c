// The C API of zicoum/zicoum.h.
#include <algorithm>
#include <cstring>
#include <new>

#include "api_calls.h"
#include "last_error.h"
#include "launch_observer.h"
#include "node_client.h"
#include "runtime.h"
#include "sim_driver.h"
#include "sizes.h"
#include "zicoum/zicoum.h"

namespace zico {
namespace {

zico_status_t to_c(Status status) {
  switch (status.code()) {
    case Errc::kOk: return ZICO_OK;
    case Errc::kOutOfMemory:
    case Errc::kYield: return ZICO_ERROR_OUT_OF_MEMORY;
    case Errc::kInvalidArgument:
    case Errc::kNotFound: return ZICO_ERROR_INVALID_VALUE;
    case Errc::kConfigError: return ZICO_ERROR_CONFIG;
    case Errc::kNoDriver:
    case Errc::kNoDevice: return ZICO_ERROR_NO_DEVICE;
    case Errc::kNotSupported: return ZICO_ERROR_NOT_SUPPORTED;
    case Errc::kDriverError: return ZICO_ERROR_DRIVER;
    case Errc::kOsError:
    case Errc::kFenceViolation:
    case Errc::kInjectedFault: return ZICO_ERROR_INTERNAL;
    case Errc::kSuspended: return ZICO_ERROR_SUSPENDED;
  }
  return ZICO_ERROR_INTERNAL;
}

StreamHandle stream_of(void* stream) { return StreamHandle{reinterpret_cast<uintptr_t>(stream)}; }

// Converts `status`, leaving a reason for zico_last_error() when it failed.
zico_status_t report(Status status, const char* what, int device) {
  if (!status.is_ok()) {
    try {
      const Runtime& runtime = Runtime::instance();
      set_last_error(!runtime.init_status().is_ok()
                         ? runtime.init_error()
                         : std::string(what) + " on device " + std::to_string(device) + ": " + status.message());
    } catch (...) {
    }
  }
  return to_c(status);
}

}  // namespace
}  // namespace zico

using zico::Runtime;

extern "C" {

const char* zico_status_string(zico_status_t status) {
  switch (status) {
    case ZICO_OK: return "success";
    case ZICO_ERROR_OUT_OF_MEMORY: return "out of memory: the budget or the device is full";
    case ZICO_ERROR_INVALID_VALUE: return "invalid value";
    case ZICO_ERROR_CONFIG: return "invalid ZICO_* configuration (see stderr or zico_last_error)";
    case ZICO_ERROR_NO_DEVICE: return "no CUDA driver or no such device";
    case ZICO_ERROR_NOT_SUPPORTED: return "not supported by this device or driver";
    case ZICO_ERROR_DRIVER: return "the CUDA driver reported an error";
    case ZICO_ERROR_INTERNAL: return "internal error";
    case ZICO_ERROR_SUSPENDED: return "suspended: the device's memory is evicted until zico_resume()";
  }
  return "unknown status";
}

const char* zico_last_error(void) { return zico::thread_last_error().c_str(); }

zico_status_t zico_init(void) {
  return zico::report(Runtime::instance().init_status(), "initialization", 0);
}

zico_status_t zico_malloc(void** ptr, size_t size, int device, void* stream) {
  if (ptr == nullptr) return zico::report(zico::Status(zico::Errc::kInvalidArgument), "zico_malloc(ptr=NULL)", device);
  *ptr = nullptr;
  if (size == 0) return ZICO_OK;
  return zico::to_c(zico::api_allocate(size, zico::DeviceId{device}, zico::stream_of(stream), ptr));
}

zico_status_t zico_free(void* ptr, void* stream) {
  if (ptr == nullptr) return ZICO_OK;
  return zico::to_c(zico::api_free(ptr, zico::stream_of(stream)));
}

zico_status_t zico_record_stream(void* ptr, void* stream) {
  return zico::to_c(zico::api_record_stream(ptr, zico::stream_of(stream)));
}

zico_status_t zico_get_stats(int device, zico_stats_t* stats) {
  if (stats == nullptr || stats->struct_size < sizeof(size_t)) return ZICO_ERROR_INVALID_VALUE;
  zico::DeviceAllocator* allocator = nullptr;
  const zico::Status status = Runtime::instance().allocator(zico::DeviceId{device}, &allocator);
  if (!status.is_ok()) return zico::report(status, "zico_get_stats", device);
  const zico::AllocatorStats s = allocator->stats();
  zico_stats_t full{};
  full.struct_size = sizeof(zico_stats_t);
  full.budget_bytes = s.budget_bytes;
  // Under zico-umd the job's own budget is only the device's size: what binds is the daemon's share.
  if (const zico::sharing::NodeClient* node = Runtime::instance().node()) {
    if (const uint64_t share = node->share_bytes(zico::DeviceId{device}); share != 0) {
      full.budget_bytes = std::min<uint64_t>(full.budget_bytes, share);
    }
  }
  full.allocated_bytes = s.allocated_bytes;
  full.peak_allocated_bytes = s.peak_allocated_bytes;
  full.mapped_bytes = s.mapped_bytes;
  full.peak_mapped_bytes = s.peak_mapped_bytes;
  full.allocations = s.allocations;
  full.frees = s.frees;
  full.failed_allocations = s.failed_allocations;
  full.chunk_maps = s.chunk_maps;
  full.chunk_unmaps = s.chunk_unmaps;
  full.iterations = s.iterations;
  full.last_iteration_peak_bytes = s.last_iteration_peak_bytes;
  full.outside_bytes = Runtime::instance().outside_bytes(zico::DeviceId{device});
  if (const zico::prefetch::UmPager* pager = Runtime::instance().pager(zico::DeviceId{device})) {
    const zico::prefetch::UmPagerStats p = pager->stats();
    full.resident_bytes = pager->resident_bytes();
    full.peak_resident_bytes = p.peak_resident_bytes;
    full.faulted_pages = p.faulted_pages;
    full.prefetched_pages = p.prefetches;
    full.evicted_pages = p.evictions + p.room_evictions + p.budget_evictions;
    const zico::LaunchCounts launches = zico::launch_counts();
    full.kernels = launches.launches;
    full.kernels_without_blocks = launches.without_blocks;
    full.copies = launches.copies;
    full.unnamed_faults = p.unnamed_faults;
    full.learnt_pages = p.learnt_pages;
    full.unasked_arrivals = p.unasked_arrivals;
    full.peak_over_budget_bytes = p.peak_over_budget_bytes;
    if (auto* sim = dynamic_cast<zico::SimDriver*>(Runtime::instance().driver())) {
      full.modelled_ns = sim->managed_stats().now_ns;
    }
  }
  // An older caller's struct is a prefix of ours: copy only what it has room for.
  const size_t caller_size = stats->struct_size;
  std::memcpy(stats, &full, std::min(caller_size, sizeof full));
  stats->struct_size = std::min(caller_size, sizeof full);
  return ZICO_OK;
}

zico_status_t zico_mark_iteration(void) {
  Runtime& runtime = Runtime::instance();
  if (!runtime.init_status().is_ok()) return zico::report(runtime.init_status(), "zico_mark_iteration", 0);
  runtime.pause_point();
  // Under zico-umd the iteration starts when the time-shift schedule says so.
  if (zico::sharing::NodeClient* node = runtime.node()) {
    node->iteration_gate(true, [&runtime] { runtime.pause_point(); });
  }
  // Only devices already in use have an iteration to mark.
  for (int device = 0; device < Runtime::kMaxDevices; ++device) {
    if (zico::DeviceAllocator* allocator = runtime.existing_allocator(zico::DeviceId{device})) allocator->mark_iteration();
    if (zico::prefetch::UmPager* pager = runtime.pager(zico::DeviceId{device})) pager->on_iteration();
  }
  return ZICO_OK;
}

zico_status_t zico_op_begin(uint64_t op_id, const void* const* ptrs, size_t count, uint64_t expected_ns) {
  return zico::to_c(zico::api_op_begin(op_id, ptrs, count, expected_ns));
}

zico_status_t zico_op_end(void) { return zico::to_c(zico::api_op_end()); }

zico_status_t zico_reset_peak_stats(int device) {
  zico::DeviceAllocator* allocator = nullptr;
  const zico::Status status = Runtime::instance().allocator(zico::DeviceId{device}, &allocator);
  if (status.is_ok()) allocator->reset_peaks();
  return zico::report(status, "zico_reset_peak_stats", device);
}

zico_status_t zico_mem_get_info(int device, size_t* free_bytes, size_t* total_bytes) {
  if (free_bytes == nullptr || total_bytes == nullptr) return ZICO_ERROR_INVALID_VALUE;
  const zico::Status status = Runtime::instance().memory_info(zico::DeviceId{device}, free_bytes, total_bytes);
  return zico::report(status, "zico_mem_get_info", device);
}

zico_status_t zico_empty_cache(int device) {
  zico::DeviceAllocator* allocator = nullptr;
  zico::Status status = Runtime::instance().allocator(zico::DeviceId{device}, &allocator);
  if (status.is_ok()) status = allocator->trim();
  return zico::report(status, "zico_empty_cache", device);
}

zico_status_t zico_suspend(int device, zico_store_t store) {
  if (store != ZICO_STORE_HOST && store != ZICO_STORE_NVME) {
    return zico::report(zico::Status(zico::Errc::kInvalidArgument), "zico_suspend(store must be HOST or NVME)", device);
  }
  zico::DeviceAllocator* allocator = nullptr;
  zico::BackingStore* backing = nullptr;
  zico::Status status = Runtime::instance().allocator(zico::DeviceId{device}, &allocator);
  if (status.is_ok()) {
    status = Runtime::instance().backing_store(zico::DeviceId{device},
                                               store == ZICO_STORE_HOST ? zico::Residency::kHost : zico::Residency::kNvme,
                                               &backing);
  }
  if (!status.is_ok() && backing == nullptr && allocator != nullptr) return zico::to_c(status);  // reason already set
  if (status.is_ok()) status = allocator->suspend(*backing);
  return zico::report(status, "zico_suspend", device);
}

zico_status_t zico_resume(int device) {
  zico::DeviceAllocator* allocator = nullptr;
  zico::Status status = Runtime::instance().allocator(zico::DeviceId{device}, &allocator);
  if (status.is_ok()) status = allocator->resume();
  return zico::report(status, "zico_resume", device);
}

zico_status_t zico_parse_size(const char* text, uint64_t* bytes) {
  if (text == nullptr || bytes == nullptr) return ZICO_ERROR_INVALID_VALUE;
  const std::optional<uint64_t> parsed = zico::parse_size(text);
  if (!parsed) return ZICO_ERROR_INVALID_VALUE;
  *bytes = *parsed;
  return ZICO_OK;
}

}  // extern "C"
