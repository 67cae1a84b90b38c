// Physical memory the process makes itself through the driver's VMM calls
// (cuMemCreate: PyTorch's expandable segments, NCCL's buffers, JAX), held to
// the budget beside zicoum's own when libzicoum is preloaded: see
// Runtime::charge_outside. zicoum's own chunks never come through here (its
// CudaDriver calls the driver through the table cuGetProcAddress gave it).
//
// The memory is counted from cuMemCreate until it is really freed: a handle
// may be released while mapped (NCCL does so right after mapping), and the
// driver frees the memory only when its last mapping goes, so the count
// follows cuMemMap / cuMemUnmap too.
#include <algorithm>
#include <cinttypes>
#include <map>
#include <mutex>
#include <new>
#include <unordered_map>

#include <cuda.h>

#include "interposed.h"
#include "log.h"
#include "real_function.h"
#include "runtime.h"
#include "sizes.h"

namespace zico {
namespace {

struct Allocation {
  DeviceId device;
  size_t bytes = 0;
  bool released = false;  // cuMemRelease was called
  uint32_t mappings = 0;
};

class OutsideMemory {
 public:
  // Never destroyed (frees may come from atexit handlers), and made without
  // allocating, so that no exception can leave the hooks.
  static OutsideMemory& instance() noexcept {
    alignas(OutsideMemory) static unsigned char storage[sizeof(OutsideMemory)];
    static OutsideMemory* memory = new (storage) OutsideMemory();
    return *memory;
  }

  void created(CUmemGenericAllocationHandle handle, DeviceId device, size_t bytes) {
    std::lock_guard lock(mutex_);
    try {
      allocations_[handle] = Allocation{device, bytes};
    } catch (const std::bad_alloc&) {
      // Unknown to us from now on: its charge stays (the budget errs safe).
    }
  }
  // The real release runs under the lock: once it returns, the driver may
  // give the same handle value to another thread's cuMemCreate, whose record
  // must not be taken for this one.
  CUresult release(CUmemGenericAllocationHandle handle, CUresult (*real)(CUmemGenericAllocationHandle)) {
    std::lock_guard lock(mutex_);
    const CUresult result = real(handle);
    if (result != CUDA_SUCCESS) return result;
    auto it = allocations_.find(handle);
    if (it == allocations_.end()) return result;
    it->second.released = true;
    settle(it);
    return result;
  }
  void mapped(CUdeviceptr ptr, size_t size, CUmemGenericAllocationHandle handle) {
    std::lock_guard lock(mutex_);
    auto it = allocations_.find(handle);
    if (it == allocations_.end()) return;
    try {
      mappings_[ptr] = Mapping{size, handle};
      ++it->second.mappings;
    } catch (const std::bad_alloc&) {
    }
  }
  // Every mapping that starts inside [ptr, ptr + size) goes.
  void unmapped(CUdeviceptr ptr, size_t size) {
    std::lock_guard lock(mutex_);
    for (auto m = mappings_.lower_bound(ptr); m != mappings_.end() && m->first < ptr + size;) {
      auto it = allocations_.find(m->second.handle);
      m = mappings_.erase(m);
      if (it == allocations_.end()) continue;
      --it->second.mappings;
      settle(it);
    }
  }

 private:
  struct Mapping {
    size_t size;
    CUmemGenericAllocationHandle handle;
  };
  using Allocations = std::unordered_map<CUmemGenericAllocationHandle, Allocation>;

  // Released and unmapped: the driver freed it.
  void settle(Allocations::iterator it) {
    if (!it->second.released || it->second.mappings != 0) return;
    Runtime::instance().release_outside(it->second.device, it->second.bytes);
    allocations_.erase(it);
  }

  std::mutex mutex_;
  Allocations allocations_;
  std::map<CUdeviceptr, Mapping> mappings_;
};

}  // namespace
}  // namespace zico

#pragma GCC visibility push(default)
extern "C" {

CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                             unsigned long long flags) {
  static zico::RealFunction<decltype(&cuMemCreate)> real("cuMemCreate");
  const auto create = real.get();
  if (create == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (handle == nullptr || prop == nullptr || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return create(handle, size, prop, flags);  // host memory, or the driver's error to give
  }
  zico::Runtime& runtime = zico::Runtime::instance();
  const zico::DeviceId device{prop->location.id};
  if (runtime.init_status().is_ok() && !runtime.charge_outside(device, size).is_ok()) {
    try {
      ZICO_LOG(kWarn,
               "cuMemCreate of %s on device %d refused: with the process's own driver allocations (%s) and "
               "zicoum's, it would pass the budget (ZICO_BUDGET=%s)",
               zico::format_size(size).c_str(), device.value, zico::format_size(runtime.outside_bytes(device)).c_str(),
               zico::format_size(runtime.config().budget.value_or(0)).c_str());
    } catch (...) {
    }
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const CUresult result = create(handle, size, prop, flags);
  if (!runtime.init_status().is_ok()) return result;
  if (result != CUDA_SUCCESS) {
    runtime.release_outside(device, size);
  } else {
    zico::OutsideMemory::instance().created(*handle, device, size);
  }
  return result;
}

CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
  static zico::RealFunction<decltype(&cuMemRelease)> real("cuMemRelease");
  const auto release = real.get();
  if (release == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  return zico::OutsideMemory::instance().release(handle, release);
}

CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                          unsigned long long flags) {
  static zico::RealFunction<decltype(&cuMemMap)> real("cuMemMap");
  const auto map = real.get();
  if (map == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult result = map(ptr, size, offset, handle, flags);
  if (result == CUDA_SUCCESS) zico::OutsideMemory::instance().mapped(ptr, size, handle);
  return result;
}

CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) {
  static zico::RealFunction<decltype(&cuMemUnmap)> real("cuMemUnmap");
  const auto unmap = real.get();
  if (unmap == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult result = unmap(ptr, size);
  if (result == CUDA_SUCCESS) zico::OutsideMemory::instance().unmapped(ptr, size);
  return result;
}

}  // extern "C"
#pragma GCC visibility pop
