/* A stand-in for libcuda and libcudart's entry-point lookups, for testing
 * libzicoum's proc-address hooks on a machine without a GPU: its lookups hand
 * out its own functions, which count their calls, so the probe can tell
 * whether a function it got came from zicoum or from "the driver". */
#include <stdint.h>
#include <string.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

int fake_driver_allocations = 0;
static CUmemGenericAllocationHandle next_handle = 1;

CUresult fake_cuMemAlloc_v1(unsigned int* dptr, unsigned int bytesize) {
  (void)dptr, (void)bytesize;
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult fake_other_function(void) { return CUDA_ERROR_NOT_SUPPORTED; }

/* What the lookups hand out: functions of this library's own, as the
 * driver's table holds (a reference to an exported name here would bind to
 * libzicoum's definition, which comes first in the global scope). */
static CUresult mem_alloc(CUdeviceptr* dptr, size_t bytesize) {
  (void)bytesize;
  ++fake_driver_allocations;
  *dptr = 0;
  return CUDA_ERROR_OUT_OF_MEMORY;
}
static CUresult mem_free(CUdeviceptr dptr) {
  (void)dptr;
  return CUDA_ERROR_INVALID_VALUE;
}
static CUresult mem_create(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                           unsigned long long flags) {
  (void)size, (void)prop, (void)flags;
  *handle = next_handle++;
  return CUDA_SUCCESS;
}
static CUresult mem_release(CUmemGenericAllocationHandle handle) {
  return handle != 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
static CUresult mem_map(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                        unsigned long long flags) {
  (void)ptr, (void)size, (void)offset, (void)flags;
  return handle != 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
static CUresult mem_unmap(CUdeviceptr ptr, size_t size) {
  (void)ptr, (void)size;
  return CUDA_SUCCESS;
}

/* The exported names, which libzicoum calls as "the real functions". */
CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) { return mem_alloc(dptr, bytesize); }
CUresult cuMemFree_v2(CUdeviceptr dptr) { return mem_free(dptr); }
CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                     unsigned long long flags) {
  return mem_create(handle, size, prop, flags);
}
CUresult cuMemRelease(CUmemGenericAllocationHandle handle) { return mem_release(handle); }
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags) {
  return mem_map(ptr, size, offset, handle, flags);
}
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) { return mem_unmap(ptr, size); }

static void* lookup(const char* symbol, int version) {
  if (strcmp(symbol, "cuMemAlloc") == 0) return version >= 3020 ? (void*)mem_alloc : (void*)fake_cuMemAlloc_v1;
  if (strcmp(symbol, "cuMemFree") == 0) return (void*)mem_free;
  if (strcmp(symbol, "cuMemCreate") == 0) return (void*)mem_create;
  if (strcmp(symbol, "cuMemRelease") == 0) return (void*)mem_release;
  if (strcmp(symbol, "cuMemMap") == 0) return (void*)mem_map;
  if (strcmp(symbol, "cuMemUnmap") == 0) return (void*)mem_unmap;
  if (strcmp(symbol, "cuMemAllocAsync") == 0) return (void*)fake_other_function;
  if (strcmp(symbol, "cuLaunchKernel") == 0) return (void*)fake_other_function;
  if (strcmp(symbol, "cuLaunchKernelEx") == 0) return (void*)fake_other_function;
  if (strcmp(symbol, "cuCtxSynchronize") == 0) return (void*)fake_other_function;
  if (strcmp(symbol, "cuMemsetD32Async") == 0) return (void*)fake_other_function;
  if (strcmp(symbol, "cuGetProcAddress") == 0) return (void*)fake_other_function;
  return NULL;
}

CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult* symbolStatus) {
  (void)flags;
  *pfn = lookup(symbol, cudaVersion);
  if (symbolStatus != NULL) *symbolStatus = *pfn != NULL ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return *pfn != NULL ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** funcPtr, unsigned int cudaVersion,
                                             unsigned long long flags, enum cudaDriverEntryPointQueryResult* status) {
  (void)flags;
  *funcPtr = lookup(symbol, (int)cudaVersion);
  if (status != NULL) *status = *funcPtr != NULL ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  return *funcPtr != NULL ? cudaSuccess : cudaErrorSymbolNotFound;
}

cudaError_t cudaGetDriverEntryPoint(const char* symbol, void** funcPtr, unsigned long long flags,
                                    enum cudaDriverEntryPointQueryResult* status) {
  return cudaGetDriverEntryPointByVersion(symbol, funcPtr, 13000, flags, status);
}

/* The CUDA 11.3 ABI of the lookup (cuda.h renames cuGetProcAddress to _v2). */
#undef cuGetProcAddress
CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags);
CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) {
  return cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, NULL);
}

/* The runtime's last error, which only the runtime itself can set. */
static cudaError_t last_error = cudaSuccess;
cudaError_t cudaMalloc(void** devPtr, size_t size) {
  (void)size;
  *devPtr = NULL;
  last_error = cudaErrorMemoryAllocation;
  return last_error;
}
cudaError_t cudaGetLastError(void) {
  const cudaError_t error = last_error;
  last_error = cudaSuccess;
  return error;
}

/* Kernels: their "functions" are these objects' addresses, for the runtime
 * (host stubs) and the driver (CUfunction) alike. */
char fake_kernel_pointer_int[1];   /* (float* data, int n) */
char fake_kernel_struct[1];        /* (struct { int n; float* data; size_t bytes; }) */
char fake_kernel_unknown[1];       /* a driver that cannot tell its parameters */
int fake_launches = 0;

cudaError_t cudaGetFuncBySymbol(cudaFunction_t* functionPtr, const void* symbolPtr) {
  *functionPtr = (cudaFunction_t)symbolPtr;
  return cudaSuccess;
}

CUresult cuFuncGetParamInfo(CUfunction func, size_t paramIndex, size_t* paramOffset, size_t* paramSize) {
  static const size_t pointer_int[] = {8, 4};
  static const size_t by_struct[] = {24};
  const size_t* sizes = NULL;
  size_t count = 0;
  if ((void*)func == fake_kernel_pointer_int) sizes = pointer_int, count = 2;
  else if ((void*)func == fake_kernel_struct) sizes = by_struct, count = 1;
  else return CUDA_ERROR_NOT_SUPPORTED;
  if (paramIndex >= count) return CUDA_ERROR_INVALID_VALUE;
  *paramOffset = 0;
  for (size_t i = 0; i < paramIndex; ++i) *paramOffset += sizes[i];
  *paramSize = sizes[paramIndex];
  return CUDA_SUCCESS;
}

/* Library kernels (CUDA 13's <<<...>>>): the same objects, as CUkernel. */
CUresult cuKernelGetParamInfo(CUkernel kernel, size_t paramIndex, size_t* paramOffset, size_t* paramSize) {
  return cuFuncGetParamInfo((CUfunction)kernel, paramIndex, paramOffset, paramSize);
}

cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void** args, size_t sharedMem,
                               cudaStream_t stream);
cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void** args, size_t sharedMem,
                               cudaStream_t stream) {
  (void)kernel, (void)gridDim, (void)blockDim, (void)args, (void)sharedMem, (void)stream;
  ++fake_launches;
  return cudaSuccess;
}

cudaError_t cudaLaunchKernel(const void* func, dim3 gridDim, dim3 blockDim, void** args, size_t sharedMem,
                             cudaStream_t stream) {
  (void)func, (void)gridDim, (void)blockDim, (void)args, (void)sharedMem, (void)stream;
  ++fake_launches;
  return cudaSuccess;
}

CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                        unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                        unsigned int sharedMemBytes, CUstream hStream, void** kernelParams, void** extra) {
  (void)f, (void)gridDimX, (void)gridDimY, (void)gridDimZ, (void)blockDimX, (void)blockDimY, (void)blockDimZ;
  (void)sharedMemBytes, (void)hStream, (void)kernelParams, (void)extra;
  ++fake_launches;
  return CUDA_SUCCESS;
}

/* Copies and memsets: on the simulated backend zicoum's blocks are host
 * memory, so "the driver" really copies, and a probe can check the bytes. */
int fake_copies = 0;

static cudaError_t copy(void* dst, const void* src, size_t count) {
  ++fake_copies;
  memmove(dst, src, count);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind) {
  (void)kind;
  return copy(dst, src, count);
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream) {
  (void)kind, (void)stream;
  return copy(dst, src, count);
}
cudaError_t cudaMemcpyAsync_ptsz(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind,
                                 cudaStream_t stream);
cudaError_t cudaMemcpyAsync_ptsz(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind,
                                 cudaStream_t stream) {
  (void)kind, (void)stream;
  return copy(dst, src, count);
}
cudaError_t cudaMemsetAsync(void* dst, int value, size_t count, cudaStream_t stream) {
  (void)stream;
  ++fake_copies;
  memset(dst, value, count);
  return cudaSuccess;
}
CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t bytes) {
  ++fake_copies;
  memmove(dst, (const void*)(uintptr_t)src, bytes);
  return CUDA_SUCCESS;
}
static CUresult memset_d32_async(CUdeviceptr dst, unsigned int value, size_t count, CUstream stream) {
  (void)stream;
  ++fake_copies;
  unsigned int* words = (unsigned int*)(uintptr_t)dst;
  for (size_t i = 0; i < count; ++i) words[i] = value;
  return CUDA_SUCCESS;
}
CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int value, size_t count, CUstream stream) {
  return memset_d32_async(dst, value, count, stream);
}
