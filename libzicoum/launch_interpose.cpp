// Kernel launches, by every route CUDA offers: the runtime's __cudaLaunchKernel
// (what `kernel<<<...>>>` compiles to from CUDA 13 on: a library kernel
// handle, from __cudaGetKernel), cudaLaunchKernel (what it compiled to
// before, and what programs call by name) and cudaLaunchKernelExC, the driver's
// cuLaunchKernel and cuLaunchKernelEx (also handed out by cuGetProcAddress:
// driver_entry_points.cpp), each with its per-thread-default-stream twin. Each
// is observed (launch_observer.h: in UM mode the pager brings the launch's
// blocks first) and then made by the real function. The runtime's launches
// reach the driver inside cudart, never through these, so none is seen twice.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include "interposed.h"
#include "launch_observer.h"
#include "real_function.h"

namespace zico {
namespace {

LaunchShape shape_of(dim3 grid, dim3 block) { return LaunchShape{{grid.x, grid.y, grid.z}, {block.x, block.y, block.z}}; }

// The stream a launch is on, as the pager orders it: the _ptsz routes' 0 is
// the calling thread's per-thread stream, not the legacy one.
CUstream observed_stream(CUstream stream, bool per_thread) {
  return per_thread && stream == nullptr ? CU_STREAM_PER_THREAD : stream;
}

using RuntimeLaunch = cudaError_t (*)(const void*, dim3, dim3, void**, size_t, cudaStream_t);
using RuntimeLaunchEx = cudaError_t (*)(const cudaLaunchConfig_t*, const void*, void**);
using DriverLaunch = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                  CUstream, void**, void**);
using DriverLaunchEx = CUresult (*)(const CUlaunchConfig*, CUfunction, void**, void**);

cudaError_t runtime_launch(RealFunction<RuntimeLaunch>& real, const void* func, dim3 grid, dim3 block, void** args,
                           size_t shared_bytes, cudaStream_t stream, bool per_thread) {
  const auto launch = real.get();
  if (launch == nullptr) return cudaErrorInvalidDeviceFunction;
  ObservedLaunch observed(func, Callee::kRuntimeStub, shape_of(grid, block), args, nullptr,
                          observed_stream(stream, per_thread));
  return launch(func, grid, block, args, shared_bytes, stream);
}

using KernelLaunch = cudaError_t (*)(cudaKernel_t, dim3, dim3, void**, size_t, cudaStream_t);

cudaError_t kernel_launch(RealFunction<KernelLaunch>& real, cudaKernel_t kernel, dim3 grid, dim3 block, void** args,
                          size_t shared_bytes, cudaStream_t stream, bool per_thread) {
  const auto launch = real.get();
  if (launch == nullptr) return cudaErrorInvalidDeviceFunction;
  ObservedLaunch observed(kernel, Callee::kLibraryKernel, shape_of(grid, block), args, nullptr,
                          observed_stream(stream, per_thread));
  return launch(kernel, grid, block, args, shared_bytes, stream);
}

cudaError_t runtime_launch_ex(RealFunction<RuntimeLaunchEx>& real, const cudaLaunchConfig_t* config, const void* func,
                              void** args, bool per_thread) {
  const auto launch = real.get();
  if (launch == nullptr) return cudaErrorInvalidDeviceFunction;
  if (config == nullptr) return launch(config, func, args);  // the runtime's error to give
  ObservedLaunch observed(func, Callee::kRuntimeStub, shape_of(config->gridDim, config->blockDim), args, nullptr,
                          observed_stream(config->stream, per_thread));
  return launch(config, func, args);
}

CUresult driver_launch(RealFunction<DriverLaunch>& real, CUfunction f, const LaunchShape& shape, unsigned shared_bytes,
                       CUstream stream, void** params, void** extra, bool per_thread) {
  const auto launch = real.get();
  if (launch == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  ObservedLaunch observed(f, Callee::kFunction, shape, params, extra, observed_stream(stream, per_thread));
  if (observed.refused()) return CUDA_ERROR_OUT_OF_MEMORY;
  return launch(f, shape.grid[0], shape.grid[1], shape.grid[2], shape.block[0], shape.block[1], shape.block[2],
                shared_bytes, stream, params, extra);
}

CUresult driver_launch_ex(RealFunction<DriverLaunchEx>& real, const CUlaunchConfig* config, CUfunction f,
                          void** params, void** extra, bool per_thread) {
  const auto launch = real.get();
  if (launch == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  if (config == nullptr) return launch(config, f, params, extra);
  const LaunchShape shape{{config->gridDimX, config->gridDimY, config->gridDimZ},
                          {config->blockDimX, config->blockDimY, config->blockDimZ}};
  ObservedLaunch observed(f, Callee::kFunction, shape, params, extra, observed_stream(config->hStream, per_thread));
  if (observed.refused()) return CUDA_ERROR_OUT_OF_MEMORY;
  return launch(config, f, params, extra);
}

}  // namespace
}  // namespace zico

#pragma GCC visibility push(default)
extern "C" {

cudaError_t CUDARTAPI cudaLaunchKernel(const void* func, dim3 gridDim, dim3 blockDim, void** args, size_t sharedMem,
                                       cudaStream_t stream) {
  static zico::RealFunction<zico::RuntimeLaunch> real("cudaLaunchKernel");
  return zico::runtime_launch(real, func, gridDim, blockDim, args, sharedMem, stream, false);
}

cudaError_t CUDARTAPI cudaLaunchKernel_ptsz(const void* func, dim3 gridDim, dim3 blockDim, void** args,
                                            size_t sharedMem, cudaStream_t stream);
cudaError_t CUDARTAPI cudaLaunchKernel_ptsz(const void* func, dim3 gridDim, dim3 blockDim, void** args,
                                            size_t sharedMem, cudaStream_t stream) {
  static zico::RealFunction<zico::RuntimeLaunch> real("cudaLaunchKernel_ptsz");
  return zico::runtime_launch(real, func, gridDim, blockDim, args, sharedMem, stream, true);
}

// Declared by CUDA's headers for nvcc's generated code only.
cudaError_t CUDARTAPI __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void** args,
                                         size_t sharedMem, cudaStream_t stream);
cudaError_t CUDARTAPI __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void** args,
                                         size_t sharedMem, cudaStream_t stream) {
  static zico::RealFunction<zico::KernelLaunch> real("__cudaLaunchKernel");
  return zico::kernel_launch(real, kernel, gridDim, blockDim, args, sharedMem, stream, false);
}

cudaError_t CUDARTAPI __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void** args,
                                              size_t sharedMem, cudaStream_t stream);
cudaError_t CUDARTAPI __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void** args,
                                              size_t sharedMem, cudaStream_t stream) {
  static zico::RealFunction<zico::KernelLaunch> real("__cudaLaunchKernel_ptsz");
  return zico::kernel_launch(real, kernel, gridDim, blockDim, args, sharedMem, stream, true);
}

cudaError_t CUDARTAPI cudaLaunchKernelExC(const cudaLaunchConfig_t* config, const void* func, void** args) {
  static zico::RealFunction<zico::RuntimeLaunchEx> real("cudaLaunchKernelExC");
  return zico::runtime_launch_ex(real, config, func, args, false);
}

cudaError_t CUDARTAPI cudaLaunchKernelExC_ptsz(const cudaLaunchConfig_t* config, const void* func, void** args);
cudaError_t CUDARTAPI cudaLaunchKernelExC_ptsz(const cudaLaunchConfig_t* config, const void* func, void** args) {
  static zico::RealFunction<zico::RuntimeLaunchEx> real("cudaLaunchKernelExC_ptsz");
  return zico::runtime_launch_ex(real, config, func, args, true);
}

CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                                unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                                unsigned int sharedMemBytes, CUstream hStream, void** kernelParams, void** extra) {
  static zico::RealFunction<zico::DriverLaunch> real("cuLaunchKernel");
  return zico::driver_launch(real, f, zico::LaunchShape{{gridDimX, gridDimY, gridDimZ}, {blockDimX, blockDimY, blockDimZ}},
                             sharedMemBytes, hStream, kernelParams, extra, false);
}

CUresult CUDAAPI cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                                     unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                                     unsigned int sharedMemBytes, CUstream hStream, void** kernelParams, void** extra) {
  static zico::RealFunction<zico::DriverLaunch> real("cuLaunchKernel_ptsz");
  return zico::driver_launch(real, f, zico::LaunchShape{{gridDimX, gridDimY, gridDimZ}, {blockDimX, blockDimY, blockDimZ}},
                             sharedMemBytes, hStream, kernelParams, extra, true);
}

CUresult CUDAAPI cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void** kernelParams, void** extra) {
  static zico::RealFunction<zico::DriverLaunchEx> real("cuLaunchKernelEx");
  return zico::driver_launch_ex(real, config, f, kernelParams, extra, false);
}

CUresult CUDAAPI cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f, void** kernelParams, void** extra) {
  static zico::RealFunction<zico::DriverLaunchEx> real("cuLaunchKernelEx_ptsz");
  return zico::driver_launch_ex(real, config, f, kernelParams, extra, true);
}

// Unloading may give a function's handle to a new one with other parameters.
CUresult CUDAAPI cuModuleUnload(CUmodule hmod) {
  static zico::RealFunction<decltype(&cuModuleUnload)> real("cuModuleUnload");
  const auto unload = real.get();
  if (unload == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult result = unload(hmod);
  zico::forget_launch_layouts();
  return result;
}

CUresult CUDAAPI cuLibraryUnload(CUlibrary library) {
  static zico::RealFunction<decltype(&cuLibraryUnload)> real("cuLibraryUnload");
  const auto unload = real.get();
  if (unload == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult result = unload(library);
  zico::forget_launch_layouts();
  return result;
}

}  // extern "C"
#pragma GCC visibility pop
