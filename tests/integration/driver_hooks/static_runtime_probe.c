/* A library that carries its own CUDA runtime (cuBLAS, cuDNN) opens the
 * driver itself and takes its lookup with dlsym on that handle. With
 * ZICO_STATIC_RUNTIMES=on it gets zicoum's lookup, so the cuMemAlloc it finds
 * allocates within the budget; off (the default but under UM mode's swapped
 * pages), the driver's own, as without zicoum. Either way dlsym still answers RTLD_NEXT and RTLD_DEFAULT
 * for its caller, not for libzicoum. Linked ahead of fake_driver.c's library,
 * on the simulated backend. Prints OK. */
#define _GNU_SOURCE  /* dladdr, RTLD_NEXT, RTLD_DEFAULT */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>

#include "probe_check.h"
#include "zicoum/zicoum.h"

extern int fake_driver_allocations;
CUresult fake_other_function(void);

int main(void) {
  /* Unset, it is on where UM mode swaps its pages (ZICO_MODE=um, ZICO_UM_MEMORY=swap). */
  const char* setting = getenv("ZICO_STATIC_RUNTIMES");
  const char* mode = getenv("ZICO_MODE");
  const char* memory = getenv("ZICO_UM_MEMORY");
  const int um_swap = mode != NULL && strcmp(mode, "um") == 0 && memory != NULL && strcmp(memory, "swap") == 0;
  const int swapped = setting != NULL ? strcmp(setting, "on") == 0 : um_swap;

  /* Relative to this program: libzicoum's definition is the next one, the
   * stand-in driver's comes after it. */
  CHECK(dlsym(RTLD_NEXT, "cuGetProcAddress_v2") == (void*)cuGetProcAddress_v2,
        "RTLD_NEXT was answered for libzicoum, not for its caller");
  CHECK(dlsym(RTLD_DEFAULT, "fake_other_function") == (void*)fake_other_function, "RTLD_DEFAULT");

  /* The library's own route to the driver. */
  Dl_info driver;
  CHECK(dladdr((void*)fake_other_function, &driver) != 0, "dladdr");
  void* handle = dlopen(driver.dli_fname, RTLD_NOW | RTLD_NOLOAD);
  CHECK(handle != NULL, "dlopen of the driver");
  if (handle == NULL) return 1;
  void* lookup = dlsym(handle, "cuGetProcAddress_v2");
  CHECK(lookup != NULL, "dlsym of the driver's lookup");
  if (lookup == NULL) return 1;
  CHECK((lookup == (void*)cuGetProcAddress_v2) == swapped,
        swapped ? "the library got the driver's lookup" : "the lookup was swapped with the setting off");
  CHECK(dlsym(handle, "cuNoSuchFunction") == NULL, "a missing symbol was found");

  void* alloc = NULL;
  CUdriverProcAddressQueryResult found;
  typedef CUresult (*Lookup)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
  CHECK(((Lookup)lookup)("cuMemAlloc", &alloc, 12000, 0, &found) == CUDA_SUCCESS && alloc != NULL, "lookup");
  if (alloc == NULL) return 1;
  /* zicoum allocates; the stand-in driver counts the call and has no memory. */
  CUdeviceptr block = 0;
  const CUresult allocated = ((CUresult(*)(CUdeviceptr*, size_t))alloc)(&block, (size_t)1 << 20);
  zico_stats_t s = {sizeof s};
  CHECK(zico_get_stats(0, &s) == ZICO_OK, "zico_get_stats");
  if (swapped) {
    CHECK(allocated == CUDA_SUCCESS && fake_driver_allocations == 0 && s.allocated_bytes >= ((size_t)1 << 20),
          "the library's allocation went around zicoum");
  } else {
    CHECK(allocated == CUDA_ERROR_OUT_OF_MEMORY && fake_driver_allocations == 1 && s.allocated_bytes == 0,
          "the allocation did not reach the driver");
  }
  dlclose(handle);
  if (failures == 0) printf("OK\n");
  return failures == 0 ? 0 : 1;
}
