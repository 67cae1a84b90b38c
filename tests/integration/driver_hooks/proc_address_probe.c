/* Driver functions obtained by lookup (cuGetProcAddress, the runtime's
 * cudaGetDriverEntryPoint[ByVersion]) are zicoum's where zicoum defines them
 * with that ABI, and the driver's otherwise; the process's own cuMemCreate
 * memory counts against ZICO_BUDGET until it is released and unmapped; a
 * cudaMalloc that zicoum refuses leaves its error for cudaGetLastError.
 * Linked ahead of fake_driver.c's library, on the simulated backend. Prints OK. */
#include <dlfcn.h>
#include <stdio.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "probe_check.h"
#include "zicoum/zicoum.h"

#undef cuGetProcAddress
CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags);
extern int fake_driver_allocations;
CUresult fake_cuMemAlloc_v1(unsigned int* dptr, unsigned int bytesize);
CUresult fake_other_function(void);

static zico_stats_t stats(void) {
  zico_stats_t s = {sizeof s};
  if (zico_get_stats(0, &s) != ZICO_OK) ++failures;
  return s;
}

int main(void) {
  const size_t MiB = (size_t)1 << 20;
  void* f = NULL;
  CUdriverProcAddressQueryResult found;

  /* cuMemAlloc at a current version: zicoum's, so within the budget. */
  CHECK(cuGetProcAddress_v2("cuMemAlloc", &f, 12000, 0, &found) == CUDA_SUCCESS, "lookup");
  if (f == NULL) return 1;
  CUdeviceptr block = 0;
  CHECK(((CUresult(*)(CUdeviceptr*, size_t))f)(&block, MiB) == CUDA_SUCCESS, "cuMemAlloc from the lookup");
  CHECK(fake_driver_allocations == 0, "the lookup handed out the driver's cuMemAlloc");
  CHECK(stats().allocated_bytes >= MiB, "zicoum did not allocate it");
  /* At a version older than its ABI: the driver's, untouched. */
  CHECK(cuGetProcAddress_v2("cuMemAlloc", &f, 3010, 0, &found) == CUDA_SUCCESS, "old lookup");
  CHECK(f == (void*)fake_cuMemAlloc_v1, "an older ABI was swapped");
  /* What zicoum does not define: the driver's. */
  CHECK(cuGetProcAddress_v2("cuCtxSynchronize", &f, 12000, 0, &found) == CUDA_SUCCESS && f == (void*)fake_other_function,
        "a function zicoum does not define was swapped");
  CHECK(cuGetProcAddress_v2("cuNoSuchFunction", &f, 12000, 0, &found) == CUDA_ERROR_NOT_FOUND && f == NULL,
        "the driver's failure is passed on");
  /* The lookup found through the lookup is zicoum's too, at each ABI. */
  CHECK(cuGetProcAddress_v2("cuGetProcAddress", &f, 12000, 0, &found) == CUDA_SUCCESS &&
            f == dlsym(RTLD_DEFAULT, "cuGetProcAddress_v2"), "the lookup of the lookup is the driver's");
  CHECK(cuGetProcAddress_v2("cuGetProcAddress", &f, 11030, 0, &found) == CUDA_SUCCESS &&
            f == dlsym(RTLD_DEFAULT, "cuGetProcAddress"), "the 11.3 lookup of the lookup is the driver's");
  /* The per-thread twin of cuLaunchKernel (CUDA 7.0 on): asked for by an
   * older version, the driver's function, which has no twin to swap for. */
  CHECK(cuGetProcAddress_v2("cuLaunchKernel", &f, 6050, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &found) ==
            CUDA_SUCCESS && f == (void*)fake_other_function,
        "a per-thread cuLaunchKernel older than its twin was swapped");
  CHECK(cuGetProcAddress_v2("cuLaunchKernel", &f, 7000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &found) ==
            CUDA_SUCCESS && f == dlsym(RTLD_DEFAULT, "cuLaunchKernel_ptsz"),
        "not zicoum's per-thread cuLaunchKernel");
  /* The 11.3 ABI of the lookup, for cuMemFree. */
  CHECK(cuGetProcAddress("cuMemFree", &f, 12000, 0) == CUDA_SUCCESS, "v1 lookup");
  if (f == NULL) return 1;
  CHECK(((CUresult(*)(CUdeviceptr))f)(block) == CUDA_SUCCESS, "cuMemFree from the lookup");
  CHECK(stats().allocated_bytes == 0, "zicoum's block was not freed");
  /* The runtime's route, per-thread default stream asked for (deprecated,
   * but what PyTorch's driver wrapper calls before CUDA 12.5). */
  enum cudaDriverEntryPointQueryResult status;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  CHECK(cudaGetDriverEntryPoint("cuMemAllocAsync", &f, cudaEnablePerThreadDefaultStream, &status) == cudaSuccess,
        "runtime lookup");
#pragma GCC diagnostic pop
  CHECK(f == dlsym(RTLD_DEFAULT, "cuMemAllocAsync_ptsz"), "not zicoum's per-thread cuMemAllocAsync");

  /* cuMemCreate from the runtime's lookup: counted against the 64 MiB budget. */
  void *create = NULL, *release = NULL, *map = NULL, *unmap = NULL;
  CHECK(cudaGetDriverEntryPointByVersion("cuMemCreate", &create, 12000, 0, &status) == cudaSuccess, "create");
  CHECK(cudaGetDriverEntryPointByVersion("cuMemRelease", &release, 12000, 0, &status) == cudaSuccess, "release");
  CHECK(cuGetProcAddress_v2("cuMemMap", &map, 12000, 0, &found) == CUDA_SUCCESS, "map");
  CHECK(cuGetProcAddress_v2("cuMemUnmap", &unmap, 12000, 0, &found) == CUDA_SUCCESS, "unmap");
  if (create == NULL || release == NULL || map == NULL || unmap == NULL) return 1;
  CUmemAllocationProp prop = {0};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  typedef CUresult (*Create)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long);
  CUmemGenericAllocationHandle handle = 0, refused = 0;
  CHECK(((Create)create)(&handle, 8 * MiB, &prop, 0) == CUDA_SUCCESS, "cuMemCreate within the budget");
  CHECK(stats().outside_bytes == 8 * MiB, "the process's own memory is not counted");
  CHECK(stats().budget_bytes == 56 * MiB, "zicoum's share did not shrink");
  void* big = NULL;
  CHECK(zico_malloc(&big, 60 * MiB, 0, NULL) == ZICO_ERROR_OUT_OF_MEMORY, "zicoum allocated past the budget");
  CHECK(((Create)create)(&refused, 60 * MiB, &prop, 0) == CUDA_ERROR_OUT_OF_MEMORY, "cuMemCreate past the budget");
  /* Released while mapped, as NCCL does: counted until unmapped. */
  const CUdeviceptr at = 0x7f0000000000ull;
  CHECK(((CUresult(*)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long))map)(
            at, 8 * MiB, 0, handle, 0) == CUDA_SUCCESS, "cuMemMap");
  CHECK(((CUresult(*)(CUmemGenericAllocationHandle))release)(handle) == CUDA_SUCCESS, "cuMemRelease");
  CHECK(stats().outside_bytes == 8 * MiB, "memory still mapped was taken for freed");
  CHECK(((CUresult(*)(CUdeviceptr, size_t))unmap)(at, 8 * MiB) == CUDA_SUCCESS, "cuMemUnmap");
  CHECK(stats().outside_bytes == 0, "released and unmapped memory is still counted");
  CHECK(stats().budget_bytes == 64 * MiB, "zicoum's share did not come back");
  CHECK(zico_malloc(&big, 60 * MiB, 0, NULL) == ZICO_OK, "the budget is whole again");
  CHECK(zico_free(big, NULL) == ZICO_OK, "free");

  /* Past the budget, cudaMalloc fails and cudaGetLastError says so, as CUDA's does. */
  void* blocks[80];
  int count = 0;
  cudaError_t error = cudaSuccess;
  while (count < 80 && (error = cudaMalloc(&blocks[count], MiB)) == cudaSuccess) ++count;
  CHECK(error == cudaErrorMemoryAllocation, "cudaMalloc past the budget");
  CHECK(cudaGetLastError() == cudaErrorMemoryAllocation, "the runtime's last error was not set");
  for (int i = 0; i < count; ++i) CHECK(cudaFree(blocks[i]) == cudaSuccess, "cudaFree");

  if (failures == 0) printf("OK\n");
  return failures == 0 ? 0 : 1;
}
