// A library linked with the real libcudart, as a Python extension module
// (CuPy, a JAX plugin) is: loaded with dlopen(RTLD_LOCAL), its cudart is not
// in the global scope where LD_PRELOADed libzicoum first looks for the real
// functions.
#include <cstdint>

#include <cuda_runtime_api.h>

extern "C" __attribute__((visibility("default"))) int shim_stream_destroy() {
  return static_cast<int>(cudaStreamDestroy(reinterpret_cast<cudaStream_t>(uintptr_t{0x5a5a0000})));
}
extern "C" __attribute__((visibility("default"))) int shim_free_foreign() {
  return static_cast<int>(cudaFree(reinterpret_cast<void*>(uintptr_t{0x1000})));
}
extern "C" __attribute__((visibility("default"))) int shim_free_null() { return static_cast<int>(cudaFree(nullptr)); }
