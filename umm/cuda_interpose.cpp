// CUDA memory calls answered by zicoum when libzicoum is preloaded
// (LD_PRELOAD, zico-run) or linked ahead of libcudart/libcuda.
//
// Only the memory calls below are defined here, plus cudaStreamDestroy and
// cuStreamDestroy_v2, which fence the dying stream's cached blocks and then
// call the real function. Every other CUDA call goes to the real libraries
// untouched. A pointer zicoum did not allocate is handed to the real function
// (found with dlsym(RTLD_NEXT)), so memory from before the preload or from
// other allocators keeps working. Programs that link libcudart statically
// (nvcc's default) never reach these symbols: link with -cudart shared.
//
// cudaFree and cuMemFree synchronize the device first, as the real ones do,
// so the memory is reusable at once by any stream. The *_ptsz variants are
// what programs built with --default-stream per-thread call; their stream 0
// is the calling thread's default stream.
#include <dlfcn.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "api_calls.h"
#include "runtime.h"

namespace zico {
namespace {

template <typename Fn>
Fn next_symbol(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_NEXT, name));
}

cudaError_t to_runtime_error(Status status) {
  switch (status.code()) {
    case Errc::kOk: return cudaSuccess;
    case Errc::kOutOfMemory:
    case Errc::kSuspended:
    case Errc::kYield: return cudaErrorMemoryAllocation;
    case Errc::kInvalidArgument:
    case Errc::kNotFound: return cudaErrorInvalidValue;
    case Errc::kConfigError: return cudaErrorInitializationError;
    case Errc::kNoDriver: return cudaErrorNoDevice;
    case Errc::kNoDevice: return cudaErrorInvalidDevice;
    case Errc::kNotSupported: return cudaErrorNotSupported;
    default: return cudaErrorUnknown;
  }
}

CUresult to_driver_error(Status status) {
  switch (status.code()) {
    case Errc::kOk: return CUDA_SUCCESS;
    case Errc::kOutOfMemory:
    case Errc::kSuspended:
    case Errc::kYield: return CUDA_ERROR_OUT_OF_MEMORY;
    case Errc::kInvalidArgument:
    case Errc::kNotFound: return CUDA_ERROR_INVALID_VALUE;
    case Errc::kConfigError: return CUDA_ERROR_NOT_INITIALIZED;
    case Errc::kNoDriver: return CUDA_ERROR_NO_DEVICE;
    case Errc::kNoDevice: return CUDA_ERROR_INVALID_DEVICE;
    case Errc::kNotSupported: return CUDA_ERROR_NOT_SUPPORTED;
    default: return CUDA_ERROR_UNKNOWN;
  }
}

// The device the calling thread works on: the CUDA runtime's answer when its
// symbols are visible, else the driver's current context (cudart loaded with
// RTLD_LOCAL hides cudaGetDevice), else device 0. SimDriver always says 0.
DeviceId current_device() {
  Runtime& runtime = Runtime::instance();
  if (runtime.driver() == nullptr) return DeviceId{0};
  if (runtime.config().backend == Backend::kCuda) {
    using GetDevice = cudaError_t (*)(int*);
    static const auto runtime_get_device = next_symbol<GetDevice>("cudaGetDevice");
    int device = 0;
    if (runtime_get_device != nullptr && runtime_get_device(&device) == cudaSuccess) return DeviceId{device};
  }
  DeviceId device{0};
  return runtime.driver()->current_device(&device).is_ok() ? device : DeviceId{0};
}

Status allocate(void** ptr, size_t size, StreamHandle stream) {
  if (ptr == nullptr) return Status(Errc::kInvalidArgument);
  *ptr = nullptr;
  if (size == 0) return Status::ok();  // as cudaMalloc: success and NULL
  return api_allocate(size, current_device(), stream, ptr);
}

Status memory_info(size_t* free_bytes, size_t* total_bytes) {
  if (free_bytes == nullptr || total_bytes == nullptr) return Status(Errc::kInvalidArgument);
  return Runtime::instance().memory_info(current_device(), free_bytes, total_bytes);
}

StreamHandle stream_of(const void* stream) { return StreamHandle{reinterpret_cast<uintptr_t>(stream)}; }

}  // namespace
}  // namespace zico

#pragma GCC visibility push(default)
extern "C" {

cudaError_t CUDARTAPI cudaMalloc(void** devPtr, size_t size) {
  return zico::to_runtime_error(zico::allocate(devPtr, size, zico::StreamHandle{}));
}

cudaError_t CUDARTAPI cudaMallocAsync(void** devPtr, size_t size, cudaStream_t hStream) {
  return zico::to_runtime_error(zico::allocate(devPtr, size, zico::stream_of(hStream)));
}

cudaError_t CUDARTAPI cudaFree(void* devPtr) {
  if (devPtr != nullptr) {
    const zico::Status status = zico::api_free_synchronous(devPtr);
    if (status.code() != zico::Errc::kNotFound) return zico::to_runtime_error(status);
  }
  // Not ours, or cudaFree(NULL) (the idiom that initializes the CUDA context).
  using Free = cudaError_t (*)(void*);
  static const auto real_free = zico::next_symbol<Free>("cudaFree");
  if (real_free != nullptr) return real_free(devPtr);
  return devPtr == nullptr ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t CUDARTAPI cudaFreeAsync(void* devPtr, cudaStream_t hStream) {
  if (devPtr == nullptr) return cudaSuccess;
  const zico::Status status = zico::api_free(devPtr, zico::stream_of(hStream));
  if (status.code() != zico::Errc::kNotFound) return zico::to_runtime_error(status);
  using FreeAsync = cudaError_t (*)(void*, cudaStream_t);
  static const auto real_free_async = zico::next_symbol<FreeAsync>("cudaFreeAsync");
  return real_free_async != nullptr ? real_free_async(devPtr, hStream) : cudaErrorInvalidValue;
}

cudaError_t CUDARTAPI cudaMemGetInfo(size_t* free, size_t* total) {
  return zico::to_runtime_error(zico::memory_info(free, total));
}

CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  if (dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  void* ptr = nullptr;
  // cuMemAlloc rejects size 0, unlike cudaMalloc.
  if (bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  const zico::Status status = zico::allocate(&ptr, bytesize, zico::StreamHandle{});
  if (status.is_ok()) *dptr = reinterpret_cast<CUdeviceptr>(ptr);
  return zico::to_driver_error(status);
}

CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr) {
  void* ptr = reinterpret_cast<void*>(dptr);
  if (ptr != nullptr) {
    const zico::Status status = zico::api_free_synchronous(ptr);
    if (status.code() != zico::Errc::kNotFound) return zico::to_driver_error(status);
  }
  using Free = CUresult (*)(CUdeviceptr);
  static const auto real_free = zico::next_symbol<Free>("cuMemFree_v2");
  return real_free != nullptr ? real_free(dptr) : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuMemGetInfo_v2(size_t* free, size_t* total) {
  return zico::to_driver_error(zico::memory_info(free, total));
}

// Per-thread default stream builds (nvcc --default-stream per-thread).
cudaError_t CUDARTAPI cudaMallocAsync_ptsz(void** devPtr, size_t size, cudaStream_t hStream) {
  const zico::StreamHandle stream = hStream == nullptr ? zico::kPerThreadStream : zico::stream_of(hStream);
  return zico::to_runtime_error(zico::allocate(devPtr, size, stream));
}

cudaError_t CUDARTAPI cudaFreeAsync_ptsz(void* devPtr, cudaStream_t hStream) {
  if (devPtr == nullptr) return cudaSuccess;
  const zico::StreamHandle stream = hStream == nullptr ? zico::kPerThreadStream : zico::stream_of(hStream);
  const zico::Status status = zico::api_free(devPtr, stream);
  if (status.code() != zico::Errc::kNotFound) return zico::to_runtime_error(status);
  using FreeAsync = cudaError_t (*)(void*, cudaStream_t);
  static const auto real_free_async = zico::next_symbol<FreeAsync>("cudaFreeAsync_ptsz");
  return real_free_async != nullptr ? real_free_async(devPtr, hStream) : cudaErrorInvalidValue;
}

// A destroyed stream's handle can be handed to the next new stream while the
// old one's work still runs: fence its cached blocks before it goes.
cudaError_t CUDARTAPI cudaStreamDestroy(cudaStream_t stream) {
  zico::api_stream_destroyed(zico::stream_of(stream));
  using Destroy = cudaError_t (*)(cudaStream_t);
  static const auto real_destroy = zico::next_symbol<Destroy>("cudaStreamDestroy");
  return real_destroy != nullptr ? real_destroy(stream) : cudaErrorInvalidResourceHandle;
}

CUresult CUDAAPI cuStreamDestroy_v2(CUstream stream) {
  zico::api_stream_destroyed(zico::stream_of(stream));
  using Destroy = CUresult (*)(CUstream);
  static const auto real_destroy = zico::next_symbol<Destroy>("cuStreamDestroy_v2");
  return real_destroy != nullptr ? real_destroy(stream) : CUDA_ERROR_INVALID_HANDLE;
}

}  // extern "C"
#pragma GCC visibility pop
