// Copies and memsets, by the routes frameworks take: the runtime's
// cudaMemcpy[Async] and cudaMemset[Async] (PyTorch's copy_, its H2D and D2H
// transfers and zeroing), with their per-thread-default-stream twins, and the
// driver's one-dimensional cuMemcpy* and cuMemsetD* (also handed out by
// cuGetProcAddress: driver_entry_points.cpp). Each is observed
// (launch_observer.h: in UM mode the zicoum blocks it reads or writes come to
// the GPU within the budget first) and then made by the real function. As for
// launches, the runtime reaches the driver inside cudart, so no copy is seen
// twice. 2D/3D and peer copies are not observed (their pages fault in).
#include <cuda.h>
#include <cuda_runtime_api.h>

#include "launch_observer.h"
#include "real_function.h"

namespace zico {
namespace {

const void* device_pointer(CUdeviceptr ptr) { return reinterpret_cast<const void*>(static_cast<uintptr_t>(ptr)); }

CUstream driver_stream(cudaStream_t stream) { return reinterpret_cast<CUstream>(stream); }

// A runtime copy's kind for its observer: from the host where the call says so.
CopyOp copy_op(cudaMemcpyKind kind) { return kind == cudaMemcpyHostToDevice ? CopyOp::kFromHost : CopyOp::kCopy; }

// Observes the copy (dst, src, bytes) on `stream`, then makes it with the
// real function, given `args`; `unavailable` when there is no real one,
// `out_of_memory` when its swapped pages could not be mapped (not made).
template <typename Fn, typename Result, typename... Args>
Result observed_copy(RealFunction<Fn>& real, Result unavailable, Result out_of_memory, CopyOp kind, const void* dst,
                     const void* src, size_t bytes, CUstream stream, Args... args) {
  const auto copy = real.get();
  if (copy == nullptr) return unavailable;
  ObservedCopy observed(kind, dst, src, bytes, stream);
  if (observed.refused()) return out_of_memory;
  return copy(args...);
}

// The runtime's functions. `per_thread`: stream 0 is the calling thread's
// per-thread stream (the _ptsz / _ptds twins), not the legacy one.
template <typename Fn, typename... Args>
cudaError_t runtime_copy(RealFunction<Fn>& real, CopyOp kind, const void* dst, const void* src, size_t bytes,
                         cudaStream_t stream, bool per_thread, Args... args) {
  CUstream observed = driver_stream(stream);
  if (per_thread && observed == nullptr) observed = CU_STREAM_PER_THREAD;
  return observed_copy(real, cudaErrorInitializationError, cudaErrorMemoryAllocation, kind, dst, src, bytes, observed,
                       args...);
}

template <typename Fn, typename... Args>
CUresult driver_copy(RealFunction<Fn>& real, CopyOp kind, CUdeviceptr dst, const void* src, size_t bytes,
                     CUstream stream, Args... args) {
  return observed_copy(real, CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_OUT_OF_MEMORY, kind, device_pointer(dst), src, bytes,
                       stream, args...);
}

}  // namespace
}  // namespace zico

#pragma GCC visibility push(default)
extern "C" {

using zico::CopyOp;
using zico::RealFunction;

// --- the runtime -----------------------------------------------------------

cudaError_t CUDARTAPI cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  static RealFunction<decltype(&cudaMemcpy)> real("cudaMemcpy");
  return zico::runtime_copy(real, zico::copy_op(kind), dst, src, count, nullptr, false, dst, src, count, kind);
}

cudaError_t CUDARTAPI cudaMemcpy_ptds(void* dst, const void* src, size_t count, cudaMemcpyKind kind);
cudaError_t CUDARTAPI cudaMemcpy_ptds(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  static RealFunction<decltype(&cudaMemcpy)> real("cudaMemcpy_ptds");
  return zico::runtime_copy(real, zico::copy_op(kind), dst, src, count, nullptr, true, dst, src, count, kind);
}

cudaError_t CUDARTAPI cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                                      cudaStream_t stream) {
  static RealFunction<decltype(&cudaMemcpyAsync)> real("cudaMemcpyAsync");
  return zico::runtime_copy(real, zico::copy_op(kind), dst, src, count, stream, false, dst, src, count, kind, stream);
}

cudaError_t CUDARTAPI cudaMemcpyAsync_ptsz(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                                           cudaStream_t stream);
cudaError_t CUDARTAPI cudaMemcpyAsync_ptsz(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                                           cudaStream_t stream) {
  static RealFunction<decltype(&cudaMemcpyAsync)> real("cudaMemcpyAsync_ptsz");
  return zico::runtime_copy(real, zico::copy_op(kind), dst, src, count, stream, true, dst, src, count, kind, stream);
}

cudaError_t CUDARTAPI cudaMemset(void* dst, int value, size_t count) {
  static RealFunction<decltype(&cudaMemset)> real("cudaMemset");
  return zico::runtime_copy(real, CopyOp::kSet, dst, nullptr, count, nullptr, false, dst, value, count);
}

cudaError_t CUDARTAPI cudaMemset_ptds(void* dst, int value, size_t count);
cudaError_t CUDARTAPI cudaMemset_ptds(void* dst, int value, size_t count) {
  static RealFunction<decltype(&cudaMemset)> real("cudaMemset_ptds");
  return zico::runtime_copy(real, CopyOp::kSet, dst, nullptr, count, nullptr, true, dst, value, count);
}

cudaError_t CUDARTAPI cudaMemsetAsync(void* dst, int value, size_t count, cudaStream_t stream) {
  static RealFunction<decltype(&cudaMemsetAsync)> real("cudaMemsetAsync");
  return zico::runtime_copy(real, CopyOp::kSet, dst, nullptr, count, stream, false, dst, value, count, stream);
}

cudaError_t CUDARTAPI cudaMemsetAsync_ptsz(void* dst, int value, size_t count, cudaStream_t stream);
cudaError_t CUDARTAPI cudaMemsetAsync_ptsz(void* dst, int value, size_t count, cudaStream_t stream) {
  static RealFunction<decltype(&cudaMemsetAsync)> real("cudaMemsetAsync_ptsz");
  return zico::runtime_copy(real, CopyOp::kSet, dst, nullptr, count, stream, true, dst, value, count, stream);
}

// --- the driver (the legacy default stream's ABI; cuda.h's names) ------------

CUresult CUDAAPI cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  static RealFunction<decltype(&cuMemcpy)> real("cuMemcpy");
  return zico::driver_copy(real, CopyOp::kCopy, dst, zico::device_pointer(src), bytes, nullptr, dst, src, bytes);
}

CUresult CUDAAPI cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream) {
  static RealFunction<decltype(&cuMemcpyAsync)> real("cuMemcpyAsync");
  return zico::driver_copy(real, CopyOp::kCopy, dst, zico::device_pointer(src), bytes, stream, dst, src, bytes,
                           stream);
}

// Host to device and back: the host side is a zicoum block only where it is
// managed memory of zicoum's (UM mode's blocks are host-accessible).
CUresult CUDAAPI cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t bytes) {
  static RealFunction<decltype(&cuMemcpyHtoD_v2)> real("cuMemcpyHtoD_v2");
  return zico::driver_copy(real, CopyOp::kFromHost, dst, src, bytes, nullptr, dst, src, bytes);
}

CUresult CUDAAPI cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t bytes, CUstream stream) {
  static RealFunction<decltype(&cuMemcpyHtoDAsync_v2)> real("cuMemcpyHtoDAsync_v2");
  return zico::driver_copy(real, CopyOp::kFromHost, dst, src, bytes, stream, dst, src, bytes, stream);
}

CUresult CUDAAPI cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t bytes) {
  static RealFunction<decltype(&cuMemcpyDtoH_v2)> real("cuMemcpyDtoH_v2");
  return zico::observed_copy(real, CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_OUT_OF_MEMORY, CopyOp::kCopy, dst,
                             zico::device_pointer(src), bytes, nullptr, dst, src, bytes);
}

CUresult CUDAAPI cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t bytes, CUstream stream) {
  static RealFunction<decltype(&cuMemcpyDtoHAsync_v2)> real("cuMemcpyDtoHAsync_v2");
  return zico::observed_copy(real, CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_OUT_OF_MEMORY, CopyOp::kCopy, dst,
                             zico::device_pointer(src), bytes, stream, dst, src, bytes, stream);
}

CUresult CUDAAPI cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  static RealFunction<decltype(&cuMemcpyDtoD_v2)> real("cuMemcpyDtoD_v2");
  return zico::driver_copy(real, CopyOp::kCopy, dst, zico::device_pointer(src), bytes, nullptr, dst, src, bytes);
}

CUresult CUDAAPI cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream) {
  static RealFunction<decltype(&cuMemcpyDtoDAsync_v2)> real("cuMemcpyDtoDAsync_v2");
  return zico::driver_copy(real, CopyOp::kCopy, dst, zico::device_pointer(src), bytes, stream, dst, src, bytes,
                           stream);
}

// The memsets count elements of 1, 2 or 4 bytes.
CUresult CUDAAPI cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t count) {
  static RealFunction<decltype(&cuMemsetD8_v2)> real("cuMemsetD8_v2");
  return zico::driver_copy(real, CopyOp::kSet, dst, nullptr, count, nullptr, dst, value, count);
}

CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t count, CUstream stream) {
  static RealFunction<decltype(&cuMemsetD8Async)> real("cuMemsetD8Async");
  return zico::driver_copy(real, CopyOp::kSet, dst, nullptr, count, stream, dst, value, count, stream);
}

CUresult CUDAAPI cuMemsetD16_v2(CUdeviceptr dst, unsigned short value, size_t count) {
  static RealFunction<decltype(&cuMemsetD16_v2)> real("cuMemsetD16_v2");
  return zico::driver_copy(real, CopyOp::kSet, dst, nullptr, count * 2, nullptr, dst, value, count);
}

CUresult CUDAAPI cuMemsetD16Async(CUdeviceptr dst, unsigned short value, size_t count, CUstream stream) {
  static RealFunction<decltype(&cuMemsetD16Async)> real("cuMemsetD16Async");
  return zico::driver_copy(real, CopyOp::kSet, dst, nullptr, count * 2, stream, dst, value, count, stream);
}

CUresult CUDAAPI cuMemsetD32_v2(CUdeviceptr dst, unsigned int value, size_t count) {
  static RealFunction<decltype(&cuMemsetD32_v2)> real("cuMemsetD32_v2");
  return zico::driver_copy(real, CopyOp::kSet, dst, nullptr, count * 4, nullptr, dst, value, count);
}

CUresult CUDAAPI cuMemsetD32Async(CUdeviceptr dst, unsigned int value, size_t count, CUstream stream) {
  static RealFunction<decltype(&cuMemsetD32Async)> real("cuMemsetD32Async");
  return zico::driver_copy(real, CopyOp::kSet, dst, nullptr, count * 4, stream, dst, value, count, stream);
}

}  // extern "C"
#pragma GCC visibility pop
