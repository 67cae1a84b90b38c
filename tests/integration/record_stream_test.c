/* zico_record_stream through the C API, with a free on cudaStreamPerThread
 * (what a --default-stream per-thread build frees on): that free waits for its
 * own stream, and the block must still wait for the other streams that used
 * it. Here that stream captures a graph (ZICO_SIM_CAPTURING_STREAM=0x5000), so
 * the block must never come back; if the free forgot the other stream, the
 * next allocations of its size would get it at once. Prints OK. */
#include <stdint.h>
#include <stdio.h>

#include "zicoum/zicoum.h"

int main(void) {
  void* const capturing = (void*)(uintptr_t)0x5000;
  void* const per_thread = (void*)(uintptr_t)0x2; /* cudaStreamPerThread */
  for (size_t bytes = 4096; bytes <= ((size_t)3 << 20); bytes *= 768) {
    void* block = NULL;
    if (zico_malloc(&block, bytes, 0, NULL) != ZICO_OK || zico_record_stream(block, capturing) != ZICO_OK) {
      fprintf(stderr, "FAIL: setup: %s\n", zico_last_error());
      return 1;
    }
    if (zico_free(block, per_thread) != ZICO_OK) {
      fprintf(stderr, "FAIL: zico_free: %s\n", zico_last_error());
      return 1;
    }
    zico_empty_cache(0);
    for (int i = 0; i < 8; ++i) {
      void* again = NULL;
      if (zico_malloc(&again, bytes, 0, NULL) != ZICO_OK) {
        fprintf(stderr, "FAIL: zico_malloc: %s\n", zico_last_error());
        return 1;
      }
      if (again == block) {
        fprintf(stderr, "FAIL: a block of %zu bytes a capturing stream used was handed out again\n", bytes);
        return 1;
      }
    }
  }
  printf("OK\n");
  return 0;
}
