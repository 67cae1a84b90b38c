/* Copies and memsets seen by zicoum in UM mode: the zicoum blocks a copy
 * reads or writes come to the GPU before it (cudaMemcpyAsync device to
 * device: both; cudaMemsetAsync; cudaMemcpy host to device: the destination;
 * cuMemcpyDtoH: the source; cuMemsetD32Async found through cuGetProcAddress;
 * a pointer table copied from the host: the blocks it points to, for an op
 * that names the table),
 * a copy between host buffers or of no bytes is not announced, and every copy reaches the
 * driver with its bytes intact. In VMM mode nothing is paged. With
 * ZICO_SIM_CAPTURING_STREAM set (UM mode): a copy on that stream, or on the
 * legacy stream the capture blocks, is not announced; a per-thread copy's
 * stream 0 is the per-thread stream, which the capture leaves alone. Linked
 * ahead of fake_driver.c's library, on the simulated backend. Prints OK. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "probe_check.h"
#include "zicoum/zicoum.h"

extern int fake_copies;

static zico_stats_t stats(void) {
  zico_stats_t s;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  if (zico_get_stats(0, &s) != ZICO_OK) ++failures;
  return s;
}

cudaError_t cudaMemcpyAsync_ptsz(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind,
                                 cudaStream_t stream);

static void captured_copies(unsigned char* dst, unsigned char* src, size_t bytes, cudaStream_t capturing) {
  const zico_stats_t before = stats();
  CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, capturing) == cudaSuccess, "captured copy");
  CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, NULL) == cudaSuccess, "legacy-stream copy");
  CHECK(stats().copies == before.copies, "a copy on the capturing or the blocked legacy stream was announced");
  CHECK(stats().resident_bytes == before.resident_bytes, "a captured copy's blocks came to the GPU");
  CHECK(cudaMemcpyAsync_ptsz(dst, src, bytes, cudaMemcpyDeviceToDevice, NULL) == cudaSuccess, "per-thread copy");
  CHECK(stats().copies == before.copies + 1, "a per-thread copy's stream 0 was taken for the legacy stream");
  CHECK(stats().resident_bytes >= before.resident_bytes + 2 * bytes, "a per-thread copy's blocks stayed away");
  CHECK(fake_copies == 3, "not every copy reached the driver");
}

int main(void) {
  const char* mode = getenv("ZICO_MODE");
  const int um = mode != NULL && strcmp(mode, "um") == 0;
  const size_t MiB = (size_t)1 << 20;
  enum { kBlocks = 6 };
  unsigned char* blocks[kBlocks];
  for (int i = 0; i < kBlocks; ++i) {
    if (zico_malloc((void**)&blocks[i], 8 * MiB, 0, NULL) != ZICO_OK) {
      fprintf(stderr, "zico_malloc: %s\n", zico_last_error());
      return 1;
    }
    memset(blocks[i], i + 1, 8 * MiB);
  }
  const char* capturing = getenv("ZICO_SIM_CAPTURING_STREAM");
  if (capturing != NULL) {
    captured_copies(blocks[1], blocks[0], 8 * MiB, (cudaStream_t)(uintptr_t)strtoull(capturing, NULL, 16));
    if (failures == 0) printf("OK\n");
    return failures == 0 ? 0 : 1;
  }
  const uint64_t start = stats().resident_bytes;

  /* Device to device: both blocks come. */
  CHECK(cudaMemcpyAsync(blocks[1], blocks[0], 8 * MiB, cudaMemcpyDeviceToDevice, NULL) == cudaSuccess, "D2D");
  const uint64_t after_d2d = stats().resident_bytes;
  if (um) CHECK(after_d2d >= start + 16 * MiB, "a device-to-device copy's blocks did not come to the GPU");
  else CHECK(after_d2d == 0, "VMM mode paged");
  CHECK(blocks[1][0] == 1 && blocks[1][8 * MiB - 1] == 1, "the copy did not reach the driver");

  /* A memset: its destination. */
  CHECK(cudaMemsetAsync(blocks[2], 0x5a, 4 * MiB, NULL) == cudaSuccess, "memset");
  const uint64_t after_set = stats().resident_bytes;
  if (um) CHECK(after_set >= after_d2d + 8 * MiB, "a memset's block did not come to the GPU");

  /* Host to device: the destination; the host buffer is no one's. */
  unsigned char* host = malloc(MiB);
  CHECK(host != NULL, "malloc");
  if (host == NULL) return 1;
  memset(host, 0x77, MiB);
  CHECK(cudaMemcpy(blocks[3] + MiB, host, MiB, cudaMemcpyHostToDevice) == cudaSuccess, "H2D");
  const uint64_t after_h2d = stats().resident_bytes;
  if (um) CHECK(after_h2d >= after_set + 8 * MiB, "a host-to-device copy's block did not come to the GPU");

  /* Device to host through the driver: the source. */
  CHECK(cuMemcpyDtoH_v2(host, (CUdeviceptr)(uintptr_t)blocks[4], MiB) == CUDA_SUCCESS, "D2H");
  const uint64_t after_d2h = stats().resident_bytes;
  if (um) CHECK(after_d2h >= after_h2d + 8 * MiB, "a device-to-host copy's block did not come to the GPU");
  CHECK(host[0] == 5 && host[MiB - 1] == 5, "the device-to-host copy's bytes");

  /* Between host buffers: nothing of zicoum's, nothing announced. */
  unsigned char other[64];
  const uint64_t copies_before = stats().copies;
  CHECK(cudaMemcpy(other, host, sizeof other, cudaMemcpyHostToHost) == cudaSuccess, "H2H");
  CHECK(stats().copies == copies_before, "a copy between host buffers was announced");
  /* Nor is a copy of no bytes, which touches nothing. */
  CHECK(cudaMemsetAsync(blocks[0], 0, 0, NULL) == cudaSuccess, "an empty memset");
  CHECK(stats().copies == copies_before, "an empty memset was announced");
  if (um) CHECK(copies_before == 4, "not every copy into zicoum memory was counted");

  /* The driver's memset, found by lookup, is zicoum's and observes too. */
  void* found = NULL;
  CHECK(cuGetProcAddress_v2("cuMemsetD32Async", &found, 12000, 0, NULL) == CUDA_SUCCESS, "lookup");
  CHECK(found == dlsym(RTLD_DEFAULT, "cuMemsetD32Async"), "the lookup handed out the driver's cuMemsetD32Async");
  if (found != NULL) {
    typedef CUresult (*SetD32)(CUdeviceptr, unsigned int, size_t, CUstream);
    CHECK(((SetD32)found)((CUdeviceptr)(uintptr_t)blocks[5], 0x01020304u, 1024, NULL) == CUDA_SUCCESS, "D32");
    if (um) CHECK(stats().resident_bytes >= after_d2h + 8 * MiB, "a memset through the lookup was not observed");
    uint32_t word = 0;
    memcpy(&word, blocks[5] + 4092, sizeof word);
    CHECK(word == 0x01020304u && blocks[5][4096] == 6, "the driver's memset's bytes");
  }
  CHECK(fake_copies == 7, "not every copy reached the driver");

  /* A pointer table written from the host: an op that names the table brings
   * the block it points to as well (UM mode reads such copies for addresses);
   * the copy that writes the table does not. */
  if (um) {
    unsigned char* target = NULL;
    CHECK(zico_malloc((void**)&target, 8 * MiB, 0, NULL) == ZICO_OK, "zico_malloc of the table's target");
    const void* table[4] = {target, target + MiB, target + 2 * MiB, target + 3 * MiB};
    const uint64_t before_copy = stats().prefetched_pages;
    CHECK(cudaMemcpy(blocks[0], table, sizeof table, cudaMemcpyHostToDevice) == cudaSuccess, "the table's copy");
    CHECK(stats().prefetched_pages == before_copy, "the copy that writes the table brought what it points to");
    const void* named[1] = {blocks[0]};
    CHECK(zico_op_begin(77, named, 1, 0) == ZICO_OK && zico_op_end() == ZICO_OK, "an op naming the table");
    CHECK(stats().prefetched_pages >= before_copy + 4, "the block the table points to did not come with it");
    CHECK(zico_free(target, NULL) == ZICO_OK, "zico_free of the table's target");
  }
  CHECK(blocks[2][0] == 0x5a && blocks[2][4 * MiB] == 3, "the memset's bytes");
  CHECK(blocks[3][MiB] == 0x77 && blocks[3][0] == 4 && blocks[3][2 * MiB] == 4, "the host-to-device copy's bytes");
  free(host);
  for (int i = 0; i < kBlocks; ++i) CHECK(zico_free(blocks[i], NULL) == ZICO_OK, "zico_free");
  if (failures == 0) printf("OK\n");
  return failures == 0 ? 0 : 1;
}
