/* cudaMallocAsync / cudaFreeAsync under LD_PRELOAD=libzicoum.so while a
 * stream captures a CUDA graph (ZICO_SIM_CAPTURING_STREAM=0x5000, sim
 * backend). Prints what each call returned, then OK if:
 *  - an allocation on the capturing stream went to the real cudart (a graph
 *    memory node; here, with no driver, whatever cudart says, never zicoum's
 *    memory),
 *  - an allocation on another stream came from zicoum,
 *  - a free of zicoum's block on the capturing stream was refused
 *    (cudaErrorStreamCaptureUnsupported) and the block stayed live. */
#include <stdint.h>
#include <stdio.h>

#include <cuda_runtime_api.h>

int main(void) {
  cudaStream_t capturing = (cudaStream_t)(uintptr_t)0x5000;
  cudaStream_t eager = (cudaStream_t)(uintptr_t)0x6000;
  void* graph = NULL;
  void* block = NULL;
  const cudaError_t in_graph = cudaMallocAsync(&graph, 1 << 20, capturing);
  const cudaError_t outside = cudaMallocAsync(&block, 1 << 20, eager);
  const cudaError_t free_in_graph = cudaFreeAsync(block, capturing);
  const cudaError_t free_outside = cudaFreeAsync(block, eager);
  printf("malloc on capturing stream: %d (%p); elsewhere: %d (%p); free on capturing stream: %d; elsewhere: %d\n",
         (int)in_graph, graph, (int)outside, block, (int)free_in_graph, (int)free_outside);
  const int ok = in_graph != cudaSuccess && graph == NULL && outside == cudaSuccess && block != NULL &&
                 free_in_graph == cudaErrorStreamCaptureUnsupported && free_outside == cudaSuccess;
  printf(ok ? "OK\n" : "FAIL\n");
  return ok ? 0 : 1;
}
