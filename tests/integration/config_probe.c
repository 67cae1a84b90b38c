/* config_probe: one cudaMalloc and one cudaMemGetInfo through libzicoum,
 * reporting what they returned. Written in C to keep zicoum.h honest about
 * being a C header. Used by bad_configuration_test.sh. */
#include <stdio.h>

#include <cuda_runtime_api.h>

#include "zicoum/zicoum.h"

int main(void) {
  void* ptr = NULL;
  size_t free_bytes = 0, total_bytes = 0;
  const int malloc_result = (int)cudaMalloc(&ptr, 1 << 20);
  const int info_result = (int)cudaMemGetInfo(&free_bytes, &total_bytes);
  printf("cudaMalloc=%d cudaMemGetInfo=%d total=%zu last_error=%s\n", malloc_result, info_result, total_bytes,
         zico_last_error());
  if (ptr != NULL) cudaFree(ptr);
  return 0;
}
