// The routes by which libraries get driver functions without calling them by
// name: cuGetProcAddress (cuBLAS, NCCL, Triton's and PyTorch's driver
// wrappers) and the runtime's cudaGetDriverEntryPoint[ByVersion] (which
// PyTorch's expandable segments use). LD_PRELOAD reaches neither route, so
// the memory calls handed out there would escape the budget: each hook asks
// the real function, then swaps the driver's memory calls (and its kernel
// launches, copies and memsets, observed in UM mode) for the ones libzicoum
// defines (the same ones a program linked with -lcuda gets).
//
// A swap happens only where the caller gets exactly that function's ABI: the
// name asked for, at a version at least the one that introduced it (an older
// version gets the older ABI, e.g. cuMemAlloc with a 32-bit size, and is left
// alone), and the per-thread-default-stream twin where the flags ask for it.
// What libraries resolve by dlopen + dlsym on libcuda themselves stays out of
// reach (see README, limits).
#include <algorithm>
#include <climits>
#include <cstring>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "driver_entry_points.h"
#include "interposed.h"
#include "real_function.h"

#undef cuGetProcAddress  // cuda.h renames it to the 12.0 ABI; the 11.3 one is a symbol of its own
extern "C" CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags);

namespace zico {
namespace {

// The runtime's lookups (cudaGetDriverEntryPoint is deprecated, so no decltype of it).
using RuntimeEntryPoint = cudaError_t (*)(const char*, void**, unsigned long long, cudaDriverEntryPointQueryResult*);
using RuntimeEntryPointByVersion = cudaError_t (*)(const char*, void**, unsigned int, unsigned long long,
                                                   cudaDriverEntryPointQueryResult*);

struct Substitute {
  const char* symbol;  // the name callers ask for
  int since;           // the CUDA version whose ABI libzicoum's function has...
  int until;           // ...up to this one, exclusive (0: still current)
  void* legacy;        // what the legacy default stream build gets
  void* per_thread;    // what the per-thread default stream build gets (null: the driver's own)...
  int per_thread_since;  // ...from this version on (0: since `since`)
};

void* fn(auto function) { return reinterpret_cast<void*>(function); }

const Substitute kSubstitutes[] = {
    {"cuMemAlloc", 3020, 0, fn(&cuMemAlloc_v2), fn(&cuMemAlloc_v2), 0},
    {"cuMemFree", 3020, 0, fn(&cuMemFree_v2), fn(&cuMemFree_v2), 0},
    {"cuMemGetInfo", 3020, 0, fn(&cuMemGetInfo_v2), fn(&cuMemGetInfo_v2), 0},
    {"cuStreamDestroy", 4000, 0, fn(&cuStreamDestroy_v2), fn(&cuStreamDestroy_v2), 0},
    {"cuMemAllocAsync", 11020, 0, fn(&cuMemAllocAsync), fn(&cuMemAllocAsync_ptsz), 0},
    {"cuMemFreeAsync", 11020, 0, fn(&cuMemFreeAsync), fn(&cuMemFreeAsync_ptsz), 0},
    {"cuMemCreate", 10020, 0, fn(&cuMemCreate), fn(&cuMemCreate), 0},
    {"cuMemRelease", 10020, 0, fn(&cuMemRelease), fn(&cuMemRelease), 0},
    {"cuMemMap", 10020, 0, fn(&cuMemMap), fn(&cuMemMap), 0},
    {"cuMemUnmap", 10020, 0, fn(&cuMemUnmap), fn(&cuMemUnmap), 0},
    {"cuLaunchKernel", 4000, 0, fn(&cuLaunchKernel), fn(&cuLaunchKernel_ptsz), 7000},
    {"cuLaunchKernelEx", 11060, 0, fn(&cuLaunchKernelEx), fn(&cuLaunchKernelEx_ptsz), 0},
    // Copies and memsets (copy_interpose.cpp); their per-thread twins stay the driver's.
    {"cuMemcpy", 4000, 0, fn(&cuMemcpy), nullptr, 0},
    {"cuMemcpyAsync", 4000, 0, fn(&cuMemcpyAsync), nullptr, 0},
    {"cuMemcpyHtoD", 3020, 0, fn(&cuMemcpyHtoD_v2), nullptr, 0},
    {"cuMemcpyHtoDAsync", 3020, 0, fn(&cuMemcpyHtoDAsync_v2), nullptr, 0},
    {"cuMemcpyDtoH", 3020, 0, fn(&cuMemcpyDtoH_v2), nullptr, 0},
    {"cuMemcpyDtoHAsync", 3020, 0, fn(&cuMemcpyDtoHAsync_v2), nullptr, 0},
    {"cuMemcpyDtoD", 3020, 0, fn(&cuMemcpyDtoD_v2), nullptr, 0},
    {"cuMemcpyDtoDAsync", 3020, 0, fn(&cuMemcpyDtoDAsync_v2), nullptr, 0},
    {"cuMemsetD8", 3020, 0, fn(&cuMemsetD8_v2), nullptr, 0},
    {"cuMemsetD8Async", 3020, 0, fn(&cuMemsetD8Async), nullptr, 0},
    {"cuMemsetD16", 3020, 0, fn(&cuMemsetD16_v2), nullptr, 0},
    {"cuMemsetD16Async", 3020, 0, fn(&cuMemsetD16Async), nullptr, 0},
    {"cuMemsetD32", 3020, 0, fn(&cuMemsetD32_v2), nullptr, 0},
    {"cuMemsetD32Async", 3020, 0, fn(&cuMemsetD32Async), nullptr, 0},
    {"cuModuleUnload", 2000, 0, fn(&cuModuleUnload), fn(&cuModuleUnload), 0},
    {"cuLibraryUnload", 12000, 0, fn(&cuLibraryUnload), fn(&cuLibraryUnload), 0},
    // The lookup itself, so that what is found through it is swapped too.
    {"cuGetProcAddress", 11030, 12000, fn(&cuGetProcAddress), fn(&cuGetProcAddress), 0},
    {"cuGetProcAddress", 12000, 0, fn(&cuGetProcAddress_v2), fn(&cuGetProcAddress_v2), 0},
};

// After a successful lookup of `symbol` at `version`: libzicoum's function
// instead of the driver's where it has the same ABI.
void substitute(const char* symbol, int version, bool per_thread, void** pfn) {
  if (symbol == nullptr || pfn == nullptr || *pfn == nullptr) return;
  for (const Substitute& s : kSubstitutes) {
    if (std::strcmp(symbol, s.symbol) != 0 || version < s.since || (s.until != 0 && version >= s.until)) continue;
    if (!per_thread) {
      *pfn = s.legacy;
    } else if (s.per_thread != nullptr && version >= s.per_thread_since) {
      *pfn = s.per_thread;
    }
    return;
  }
}

// One lookup: the real one answers, then libzicoum's function replaces the
// driver's where substitute() says so. `rest` is what the lookup takes after
// (symbol, pfn); `unavailable` is returned when the real lookup is missing.
template <typename Fn, typename Result, typename... Rest>
Result swap_after(RealFunction<Fn>& real, Result unavailable, Result success, int version, bool per_thread,
                  const char* symbol, void** pfn, Rest... rest) {
  const auto lookup = real.get();
  if (lookup == nullptr) return unavailable;
  const Result result = lookup(symbol, pfn, rest...);
  if (result == success) substitute(symbol, version, per_thread, pfn);
  return result;
}

int clamped(unsigned version) { return static_cast<int>(std::min(version, unsigned{INT_MAX})); }

}  // namespace

void* substitute_driver_lookup(const char* name, void* found) noexcept {
  void* ours = nullptr;
  if (std::strcmp(name, "cuGetProcAddress_v2") == 0) {
    ours = fn(&cuGetProcAddress_v2);
  } else if (std::strcmp(name, "cuGetProcAddress") == 0) {
    ours = fn(&cuGetProcAddress);
  }
  return ours != nullptr && found != ours ? ours : found;
}

}  // namespace zico

#pragma GCC visibility push(default)
extern "C" {

CUresult CUDAAPI cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                                     CUdriverProcAddressQueryResult* symbolStatus) {
  static zico::RealFunction<decltype(&cuGetProcAddress_v2)> real("cuGetProcAddress_v2");
  return zico::swap_after(real, CUDA_ERROR_NOT_INITIALIZED, CUDA_SUCCESS, cudaVersion,
                          (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0, symbol, pfn, cudaVersion,
                          flags, symbolStatus);
}

// The CUDA 11.3 ABI, without symbolStatus.
CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) {
  static zico::RealFunction<CUresult (*)(const char*, void**, int, cuuint64_t)> real("cuGetProcAddress");
  return zico::swap_after(real, CUDA_ERROR_NOT_INITIALIZED, CUDA_SUCCESS, cudaVersion,
                          (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0, symbol, pfn, cudaVersion,
                          flags);
}

// The runtime asks the driver for the version it was built for, so every
// substitute's ABI applies. The _ptsz twins are what per-thread-default-stream
// builds call; there the default flags mean per-thread.
cudaError_t CUDARTAPI cudaGetDriverEntryPoint(const char* symbol, void** funcPtr, unsigned long long flags,
                                              cudaDriverEntryPointQueryResult* driverStatus) {
  static zico::RealFunction<zico::RuntimeEntryPoint> real("cudaGetDriverEntryPoint");
  return zico::swap_after(real, cudaErrorSymbolNotFound, cudaSuccess, INT_MAX,
                          (flags & cudaEnablePerThreadDefaultStream) != 0, symbol, funcPtr, flags, driverStatus);
}

cudaError_t CUDARTAPI cudaGetDriverEntryPoint_ptsz(const char* symbol, void** funcPtr, unsigned long long flags,
                                                   cudaDriverEntryPointQueryResult* driverStatus);
cudaError_t CUDARTAPI cudaGetDriverEntryPoint_ptsz(const char* symbol, void** funcPtr, unsigned long long flags,
                                                   cudaDriverEntryPointQueryResult* driverStatus) {
  static zico::RealFunction<zico::RuntimeEntryPoint> real("cudaGetDriverEntryPoint_ptsz");
  return zico::swap_after(real, cudaErrorSymbolNotFound, cudaSuccess, INT_MAX, (flags & cudaEnableLegacyStream) == 0,
                          symbol, funcPtr, flags, driverStatus);
}

cudaError_t CUDARTAPI cudaGetDriverEntryPointByVersion(const char* symbol, void** funcPtr, unsigned int cudaVersion,
                                                       unsigned long long flags,
                                                       cudaDriverEntryPointQueryResult* driverStatus) {
  static zico::RealFunction<zico::RuntimeEntryPointByVersion> real("cudaGetDriverEntryPointByVersion");
  return zico::swap_after(real, cudaErrorSymbolNotFound, cudaSuccess, zico::clamped(cudaVersion),
                          (flags & cudaEnablePerThreadDefaultStream) != 0, symbol, funcPtr, cudaVersion, flags,
                          driverStatus);
}

cudaError_t CUDARTAPI cudaGetDriverEntryPointByVersion_ptsz(const char* symbol, void** funcPtr,
                                                            unsigned int cudaVersion, unsigned long long flags,
                                                            cudaDriverEntryPointQueryResult* driverStatus);
cudaError_t CUDARTAPI cudaGetDriverEntryPointByVersion_ptsz(const char* symbol, void** funcPtr,
                                                            unsigned int cudaVersion, unsigned long long flags,
                                                            cudaDriverEntryPointQueryResult* driverStatus) {
  static zico::RealFunction<zico::RuntimeEntryPointByVersion> real("cudaGetDriverEntryPointByVersion_ptsz");
  return zico::swap_after(real, cudaErrorSymbolNotFound, cudaSuccess, zico::clamped(cudaVersion),
                          (flags & cudaEnableLegacyStream) == 0, symbol, funcPtr, cudaVersion, flags, driverStatus);
}

}  // extern "C"
#pragma GCC visibility pop
