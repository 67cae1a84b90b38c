/* Kernel launches seen by zicoum in UM mode: the blocks a launch's
 * parameters point to come to the GPU before the launch, by each route (the
 * runtime's cudaLaunchKernel and CUDA 13's __cudaLaunchKernel with a library
 * kernel, the driver's cuLaunchKernel with kernelParams or
 * a packed buffer, and cuLaunchKernel found through cuGetProcAddress); a
 * parameter inside a struct counts; where the driver cannot tell the
 * parameters, kernelParams stay unread. In VMM mode nothing is paged and every
 * launch still reaches the driver. With ZICO_SIM_CAPTURING_STREAM set (UM
 * mode), launches on that stream, captured into a graph, are not announced.
 * Linked ahead of fake_driver.c's library, on the simulated backend. Prints OK. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "probe_check.h"
#include "zicoum/zicoum.h"

extern int fake_launches;
cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void** args, size_t sharedMem,
                               cudaStream_t stream);
extern char fake_kernel_pointer_int[1];
extern char fake_kernel_struct[1];
extern char fake_kernel_unknown[1];

static zico_stats_t stats(void) {
  zico_stats_t s;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  if (zico_get_stats(0, &s) != ZICO_OK) ++failures;
  return s;
}

static uint64_t resident(void) { return stats().resident_bytes; }

/* A launch on a capturing stream runs at each replay of the graph, not now:
 * nothing is announced, and nothing comes to the GPU for it. The same launch
 * on a stream the capture leaves alone is announced. */
static void captured_launches(void* block, CUstream capturing) {
  const uint64_t MiB = (uint64_t)1 << 20;
  const zico_stats_t before = stats();
  int n = 7;
  void* data = block;
  void* args[] = {&data, &n};
  const dim3 grid = {4, 1, 1}, threads = {128, 1, 1};
  CHECK(cudaLaunchKernel(fake_kernel_pointer_int, grid, threads, args, 0, (cudaStream_t)capturing) == cudaSuccess,
        "cudaLaunchKernel while capturing");
  CHECK(cuLaunchKernel((CUfunction)fake_kernel_pointer_int, 1, 1, 1, 32, 1, 1, 0, capturing, args, NULL) ==
            CUDA_SUCCESS, "cuLaunchKernel while capturing");
  CHECK(fake_launches == 2, "a captured launch did not reach the driver");
  const zico_stats_t after = stats();
  CHECK(after.kernels == before.kernels, "a captured launch was announced");
  CHECK(after.resident_bytes == before.resident_bytes, "a captured launch's block came to the GPU");
  CHECK(cuLaunchKernel((CUfunction)fake_kernel_pointer_int, 1, 1, 1, 32, 1, 1, 0, CU_STREAM_PER_THREAD, args, NULL) ==
            CUDA_SUCCESS, "cuLaunchKernel beside the capture");
  CHECK(stats().kernels == before.kernels + 1, "a launch beside the capture was not announced");
  CHECK(resident() >= before.resident_bytes + 8 * MiB, "a launch beside the capture paged nothing in");
}

int main(void) {
  const char* mode = getenv("ZICO_MODE");
  const int um = mode != NULL && strcmp(mode, "um") == 0;
  const uint64_t MiB = (uint64_t)1 << 20;
  void* blocks[5];
  for (int i = 0; i < 5; ++i) {
    if (zico_malloc(&blocks[i], 8 * MiB, 0, NULL) != ZICO_OK) {
      fprintf(stderr, "zico_malloc: %s\n", zico_last_error());
      return 1;
    }
    memset(blocks[i], i + 1, 8 * MiB);
  }
  const char* capturing = getenv("ZICO_SIM_CAPTURING_STREAM");
  if (capturing != NULL) {
    captured_launches(blocks[0], (CUstream)(uintptr_t)strtoull(capturing, NULL, 16));
    if (failures == 0) printf("OK\n");
    return failures == 0 ? 0 : 1;
  }
  const uint64_t before = resident();
  const dim3 grid = {4, 1, 1}, block = {128, 1, 1};

  /* The runtime's route: (float* data, int n). */
  int n = 7;
  void* data = blocks[0];
  void* args[] = {&data, &n};
  CHECK(cudaLaunchKernel(fake_kernel_pointer_int, grid, block, args, 0, NULL) == cudaSuccess, "cudaLaunchKernel");
  CHECK(fake_launches == 1, "the launch did not reach the driver");
  const uint64_t after_first = resident();
  if (um) CHECK(after_first >= before + 8 * MiB, "the launch's block did not come to the GPU");
  else CHECK(after_first == 0, "VMM mode paged");

  /* A pointer inside a struct passed by value. */
  struct {
    int n;
    void* data;
    size_t bytes;
  } by_value = {1, (char*)blocks[1] + 4096, 8 * MiB};
  void* struct_args[] = {&by_value};
  CHECK(cudaLaunchKernel(fake_kernel_struct, grid, block, struct_args, 0, NULL) == cudaSuccess, "struct launch");
  const uint64_t after_struct = resident();
  if (um) CHECK(after_struct >= after_first + 8 * MiB, "a pointer inside a struct was not seen");

  /* The driver cannot tell this kernel's parameters: kernelParams stay unread... */
  void* third = blocks[2];
  void* unknown_args[] = {&third};
  CHECK(cuLaunchKernel((CUfunction)fake_kernel_unknown, 1, 1, 1, 32, 1, 1, 0, NULL, unknown_args, NULL) ==
            CUDA_SUCCESS, "cuLaunchKernel");
  CHECK(resident() == after_struct, "kernelParams of unknown length were read");
  /* ...but a packed parameter buffer has its size. */
  void* buffer[2] = {blocks[2], NULL};
  size_t buffer_bytes = sizeof buffer;
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buffer, CU_LAUNCH_PARAM_BUFFER_SIZE, &buffer_bytes,
                   CU_LAUNCH_PARAM_END};
  CHECK(cuLaunchKernel((CUfunction)fake_kernel_unknown, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, extra) == CUDA_SUCCESS,
        "cuLaunchKernel with a buffer");
  const uint64_t after_buffer = resident();
  if (um) CHECK(after_buffer >= after_struct + 8 * MiB, "the packed buffer's pointer was not seen");

  /* cuLaunchKernel found by lookup is zicoum's, and observes too. */
  void* found = NULL;
  CHECK(cuGetProcAddress_v2("cuLaunchKernel", &found, 12000, 0, NULL) == CUDA_SUCCESS, "lookup");
  CHECK(found == dlsym(RTLD_DEFAULT, "cuLaunchKernel"), "the lookup handed out the driver's cuLaunchKernel");
  if (found != NULL) {
    void* fourth = blocks[3];
    void* fourth_args[] = {&fourth, &n};
    typedef CUresult (*Launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                               CUstream, void**, void**);
    CHECK(((Launch)found)((CUfunction)fake_kernel_pointer_int, 1, 1, 1, 32, 1, 1, 0, NULL, fourth_args, NULL) ==
              CUDA_SUCCESS, "launch through the lookup");
    if (um) CHECK(resident() >= after_buffer + 8 * MiB, "a launch through the lookup was not observed");
  }
  /* CUDA 13's <<<...>>>: __cudaLaunchKernel with a library kernel. */
  const uint64_t before_library = resident();
  void* fifth = blocks[4];
  void* fifth_args[] = {&fifth, &n};
  CHECK(__cudaLaunchKernel((cudaKernel_t)fake_kernel_pointer_int, grid, block, fifth_args, 0, NULL) == cudaSuccess,
        "__cudaLaunchKernel");
  if (um) CHECK(resident() >= before_library + 8 * MiB, "a library kernel's launch was not observed");
  CHECK(fake_launches == 6, "not every launch reached the driver");
  for (int i = 0; i < 5; ++i) {
    const unsigned char* bytes = blocks[i];
    CHECK(bytes[0] == i + 1 && bytes[8 * MiB - 1] == i + 1, "a block lost its data");
    CHECK(zico_free(blocks[i], NULL) == ZICO_OK, "zico_free");
  }
  if (failures == 0) printf("OK\n");
  return failures == 0 ? 0 : 1;
}
