// CUDA memory calls answered by zicoum when libzicoum is preloaded
// (LD_PRELOAD, zico-run) or linked ahead of libcudart/libcuda.
//
// Only the memory calls below are defined here, plus cudaStreamDestroy and
// cuStreamDestroy_v2, which fence the dying stream's cached blocks and then
// call the real function. Every other CUDA call goes to the real libraries
// untouched. A pointer zicoum did not allocate is handed to the real function
// (RealFunction below), so memory from before the preload or from other
// allocators keeps working. Programs that link libcudart statically
// (nvcc's default) never reach these symbols: link with -cudart shared.
//
// cudaFree and cuMemFree synchronize the device first, as the real ones do,
// so the memory is reusable at once by any stream. The *_ptsz variants are
// what programs built with --default-stream per-thread call; their stream 0
// is the calling thread's default stream.
#include <dlfcn.h>
#include <link.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "api_calls.h"
#include "interposed.h"
#include "node_client.h"
#include "real_function.h"
#include "runtime.h"

namespace zico {
namespace {

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
    static RealFunction<cudaError_t (*)(int*)> runtime_get_device("cudaGetDevice");
    int device = 0;
    if (const auto get = runtime_get_device.get(); get != nullptr && get(&device) == cudaSuccess) {
      return DeviceId{device};
    }
  }
  DeviceId device{0};
  return runtime.driver()->current_device(&device).is_ok() ? device : DeviceId{0};
}

Status allocate(void** ptr, size_t size, StreamHandle stream) {
  if (ptr == nullptr) return Status(Errc::kInvalidArgument);
  *ptr = nullptr;
  if (size == 0) return Status::ok();  // as cudaMalloc: success and NULL
  const sharing::AllocationWaitScope one_timeout;  // current_device() may build the runtime, which registers
  return api_allocate(size, current_device(), stream, ptr);
}

Status memory_info(size_t* free_bytes, size_t* total_bytes) {
  if (free_bytes == nullptr || total_bytes == nullptr) return Status(Errc::kInvalidArgument);
  return Runtime::instance().memory_info(current_device(), free_bytes, total_bytes);
}

StreamHandle stream_of(const void* stream) { return StreamHandle{reinterpret_cast<uintptr_t>(stream)}; }

// Whether zicoum allocated `ptr` (without starting zicoum to find out).
bool owns(const void* ptr) {
  const Runtime* runtime = Runtime::if_created();
  return runtime != nullptr && runtime->owner_of(ptr) != nullptr;
}

// What an allocation returns. A failed cudaMalloc also leaves
// cudaErrorMemoryAllocation for cudaGetLastError, which getLastCudaError()-
// style checks read; only the real runtime can set that, so it is asked for
// an allocation no device can satisfy.
cudaError_t allocation_result(Status status) {
  const cudaError_t error = to_runtime_error(status);
  if (error == cudaErrorMemoryAllocation) {
    static RealFunction<cudaError_t (*)(void**, size_t)> real_malloc("cudaMalloc");
    void* never = nullptr;
    if (const auto real = real_malloc.get(); real != nullptr && real(&never, SIZE_MAX) == cudaSuccess) {
      static RealFunction<cudaError_t (*)(void*)> real_free("cudaFree");
      if (const auto release = real_free.get()) (void)release(never);
    }
  }
  return error;
}

// In a per-thread-default-stream build, stream 0 is the calling thread's stream.
StreamHandle per_thread_stream_of(const void* stream) {
  return stream == nullptr ? kPerThreadStream : stream_of(stream);
}

using DriverAllocAsync = CUresult (*)(CUdeviceptr*, size_t, CUstream);
using DriverFreeAsync = CUresult (*)(CUdeviceptr, CUstream);

// cuMemAllocAsync: in a capturing stream the driver's own (a graph memory
// node, whose memory lives with the graph), else zicoum's.
CUresult driver_alloc_async(CUdeviceptr* dptr, size_t bytes, CUstream hStream, StreamHandle stream,
                            RealFunction<DriverAllocAsync>& real) {
  if (dptr == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  const sharing::AllocationWaitScope one_timeout;  // the runtime's first use may register
  if (api_capture_state(stream) != CaptureState::kNone) {
    const auto function = real.get();
    return function != nullptr ? function(dptr, bytes, hStream) : CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  void* ptr = nullptr;
  const Status status = api_allocate(bytes, current_device(), stream, &ptr);
  if (status.is_ok()) *dptr = reinterpret_cast<CUdeviceptr>(ptr);
  return to_driver_error(status);
}

CUresult driver_free_async(CUdeviceptr dptr, CUstream hStream, StreamHandle stream, RealFunction<DriverFreeAsync>& real) {
  void* ptr = reinterpret_cast<void*>(dptr);
  if (ptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // A free captured into a graph happens at each replay, which zicoum cannot follow.
  if (owns(ptr) && api_capture_state(stream) == CaptureState::kCapturing) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  const Status status = api_free(ptr, stream);
  if (status.code() != Errc::kNotFound) return to_driver_error(status);
  const auto function = real.get();
  return function != nullptr ? function(dptr, hStream) : CUDA_ERROR_INVALID_VALUE;
}

}  // namespace
}  // namespace zico

#pragma GCC visibility push(default)
extern "C" {

cudaError_t CUDARTAPI cudaMalloc(void** devPtr, size_t size) {
  return zico::allocation_result(zico::allocate(devPtr, size, zico::StreamHandle{}));
}

// In a capturing stream cudaMallocAsync makes a graph memory node, whose
// memory lives with the graph: CUDA's own, outside the budget, but right.
cudaError_t CUDARTAPI cudaMallocAsync(void** devPtr, size_t size, cudaStream_t hStream) {
  if (zico::api_capture_state(zico::stream_of(hStream)) != zico::CaptureState::kNone) {
    static zico::RealFunction<cudaError_t (*)(void**, size_t, cudaStream_t)> real_malloc_async("cudaMallocAsync");
    const auto real = real_malloc_async.get();
    return real != nullptr ? real(devPtr, size, hStream) : cudaErrorStreamCaptureUnsupported;
  }
  return zico::allocation_result(zico::allocate(devPtr, size, zico::stream_of(hStream)));
}

cudaError_t CUDARTAPI cudaFree(void* devPtr) {
  if (devPtr != nullptr) {
    const zico::Status status = zico::api_free_synchronous(devPtr);
    if (status.code() != zico::Errc::kNotFound) return zico::to_runtime_error(status);
  }
  // Not ours, or cudaFree(NULL) (the idiom that initializes the CUDA context).
  static zico::RealFunction<cudaError_t (*)(void*)> real_free("cudaFree");
  if (const auto real = real_free.get()) return real(devPtr);
  return devPtr == nullptr ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t CUDARTAPI cudaFreeAsync(void* devPtr, cudaStream_t hStream) {
  if (devPtr == nullptr) return cudaSuccess;
  // A free captured into a graph happens at each replay, which zicoum cannot follow.
  if (zico::owns(devPtr) && zico::api_capture_state(zico::stream_of(hStream)) == zico::CaptureState::kCapturing) {
    return cudaErrorStreamCaptureUnsupported;
  }
  const zico::Status status = zico::api_free(devPtr, zico::stream_of(hStream));
  if (status.code() != zico::Errc::kNotFound) return zico::to_runtime_error(status);
  static zico::RealFunction<cudaError_t (*)(void*, cudaStream_t)> real_free_async("cudaFreeAsync");
  const auto real = real_free_async.get();
  return real != nullptr ? real(devPtr, hStream) : cudaErrorInvalidValue;
}

// When zicoum could not start (a bad ZICO_* value, no driver), the device's
// own numbers rather than an error: frameworks ask at start-up, before their
// first allocation would report the failure with its reason.
cudaError_t CUDARTAPI cudaMemGetInfo(size_t* free, size_t* total) {
  if (!zico::Runtime::instance().init_status().is_ok()) {
    static zico::RealFunction<cudaError_t (*)(size_t*, size_t*)> real_info("cudaMemGetInfo");
    if (const auto real = real_info.get()) return real(free, total);
  }
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
  static zico::RealFunction<CUresult (*)(CUdeviceptr)> real_free("cuMemFree_v2");
  const auto real = real_free.get();
  return real != nullptr ? real(dptr) : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuMemGetInfo_v2(size_t* free, size_t* total) {
  if (!zico::Runtime::instance().init_status().is_ok()) {
    static zico::RealFunction<CUresult (*)(size_t*, size_t*)> real_info("cuMemGetInfo_v2");
    if (const auto real = real_info.get()) return real(free, total);
  }
  return zico::to_driver_error(zico::memory_info(free, total));
}

// The driver's stream-ordered pair, as cudaMallocAsync / cudaFreeAsync.
CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  static zico::RealFunction<zico::DriverAllocAsync> real("cuMemAllocAsync");
  return zico::driver_alloc_async(dptr, bytesize, hStream, zico::stream_of(hStream), real);
}

CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
  static zico::RealFunction<zico::DriverFreeAsync> real("cuMemFreeAsync");
  return zico::driver_free_async(dptr, hStream, zico::stream_of(hStream), real);
}

CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream hStream) {
  static zico::RealFunction<zico::DriverAllocAsync> real("cuMemAllocAsync_ptsz");
  return zico::driver_alloc_async(dptr, bytesize, hStream, zico::per_thread_stream_of(hStream), real);
}

CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
  static zico::RealFunction<zico::DriverFreeAsync> real("cuMemFreeAsync_ptsz");
  return zico::driver_free_async(dptr, hStream, zico::per_thread_stream_of(hStream), real);
}

// Per-thread default stream builds (nvcc --default-stream per-thread).
cudaError_t CUDARTAPI cudaMallocAsync_ptsz(void** devPtr, size_t size, cudaStream_t hStream) {
  const zico::StreamHandle stream = hStream == nullptr ? zico::kPerThreadStream : zico::stream_of(hStream);
  if (zico::api_capture_state(stream) != zico::CaptureState::kNone) {
    static zico::RealFunction<cudaError_t (*)(void**, size_t, cudaStream_t)> real_malloc_async("cudaMallocAsync_ptsz");
    const auto real = real_malloc_async.get();
    return real != nullptr ? real(devPtr, size, hStream) : cudaErrorStreamCaptureUnsupported;
  }
  return zico::allocation_result(zico::allocate(devPtr, size, stream));
}

cudaError_t CUDARTAPI cudaFreeAsync_ptsz(void* devPtr, cudaStream_t hStream) {
  if (devPtr == nullptr) return cudaSuccess;
  const zico::StreamHandle stream = hStream == nullptr ? zico::kPerThreadStream : zico::stream_of(hStream);
  if (zico::owns(devPtr) && zico::api_capture_state(stream) == zico::CaptureState::kCapturing) {
    return cudaErrorStreamCaptureUnsupported;
  }
  const zico::Status status = zico::api_free(devPtr, stream);
  if (status.code() != zico::Errc::kNotFound) return zico::to_runtime_error(status);
  static zico::RealFunction<cudaError_t (*)(void*, cudaStream_t)> real_free_async("cudaFreeAsync_ptsz");
  const auto real = real_free_async.get();
  return real != nullptr ? real(devPtr, hStream) : cudaErrorInvalidValue;
}

// A destroyed stream's handle can be handed to the next new stream while the
// old one's work still runs: fence its cached blocks before it goes.
cudaError_t CUDARTAPI cudaStreamDestroy(cudaStream_t stream) {
  zico::api_stream_destroyed(zico::stream_of(stream));
  static zico::RealFunction<cudaError_t (*)(cudaStream_t)> real_destroy("cudaStreamDestroy");
  const auto real = real_destroy.get();
  return real != nullptr ? real(stream) : cudaErrorInvalidResourceHandle;
}

CUresult CUDAAPI cuStreamDestroy_v2(CUstream stream) {
  zico::api_stream_destroyed(zico::stream_of(stream));
  static zico::RealFunction<CUresult (*)(CUstream)> real_destroy("cuStreamDestroy_v2");
  const auto real = real_destroy.get();
  return real != nullptr ? real(stream) : CUDA_ERROR_INVALID_HANDLE;
}

}  // extern "C"
#pragma GCC visibility pop
