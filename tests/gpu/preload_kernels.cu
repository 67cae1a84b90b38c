// A program built against the shared CUDA runtime (nvcc -cudart shared) that
// exercises zicoum under LD_PRELOAD (zico-run) with real kernels:
//  1. blocks from 1 B to 300 MiB, each filled by a kernel and checked by
//     another, every byte;
//  2. cudaFree while a kernel on another stream still reads the block: the
//     block must not be rewritten under that kernel;
//  3. the budget: allocating past it gives cudaErrorMemoryAllocation, and
//     after frees the same allocations succeed again;
//  4. a pointer zicoum did not allocate (cudaMallocManaged) is freed by CUDA.
// Prints one line per check and "OK" at the end; exit 1 on any failure.
//   zico-run --backend cuda --budget 1GiB -- preload_kernels
#include <cstdint>
#include <cstdio>
#include <vector>

#include <cuda_runtime.h>

namespace {

int g_failures = 0;

void check(bool ok, const char* what) {
  std::printf("%s: %s\n", ok ? "pass" : "FAIL", what);
  if (!ok) ++g_failures;
}

__global__ void fill(uint8_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    p[i] = static_cast<uint8_t>((i * 2654435761u) ^ seed);
  }
}

__global__ void verify(const uint8_t* p, size_t n, uint32_t seed, unsigned long long* bad) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    if (p[i] != static_cast<uint8_t>((i * 2654435761u) ^ seed)) atomicAdd(bad, 1ull);
  }
}

// Reads the block for about `cycles` clocks, then checks it is unchanged.
__global__ void slow_reader(const uint8_t* p, size_t n, uint32_t seed, long long cycles, unsigned long long* bad) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    if (p[i] != static_cast<uint8_t>((i * 2654435761u) ^ seed)) atomicAdd(bad, 1ull);
  }
}

unsigned long long* g_bad = nullptr;

bool round_trip(size_t bytes, uint32_t seed, cudaStream_t stream) {
  uint8_t* p = nullptr;
  if (cudaMallocAsync(reinterpret_cast<void**>(&p), bytes, stream) != cudaSuccess) return false;
  cudaMemsetAsync(g_bad, 0, sizeof *g_bad, stream);
  fill<<<256, 256, 0, stream>>>(p, bytes, seed);
  verify<<<256, 256, 0, stream>>>(p, bytes, seed, g_bad);
  unsigned long long bad = 1;
  cudaMemcpyAsync(&bad, g_bad, sizeof bad, cudaMemcpyDeviceToHost, stream);
  cudaStreamSynchronize(stream);
  cudaFreeAsync(p, stream);
  return bad == 0 && cudaGetLastError() == cudaSuccess;
}

}  // namespace

int main() {
  if (cudaMalloc(reinterpret_cast<void**>(&g_bad), sizeof *g_bad) != cudaSuccess) {
    std::printf("FAIL: no memory for the counter\n");
    return 1;
  }
  cudaStream_t a, b;
  cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking);

  // 1. Sizes from 1 B to 300 MiB.
  bool sizes_ok = true;
  const size_t sizes[] = {1, 255, 256, 4097, size_t{1} << 20, (size_t{2} << 20) + 1, size_t{64} << 20,
                          size_t{300} << 20};
  uint32_t seed = 1;
  for (size_t bytes : sizes) sizes_ok &= round_trip(bytes, seed++, a);
  check(sizes_ok, "kernels write and read blocks from 1 B to 300 MiB, every byte");

  // 2. cudaFree while a kernel on another stream still reads the block: it
  // waits for the device, so whatever a gets next (the same block, likely)
  // is written only after that kernel read it.
  const size_t bytes = size_t{8} << 20;
  uint8_t* shared = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&shared), bytes);
  fill<<<256, 256, 0, a>>>(shared, bytes, 77);
  cudaStreamSynchronize(a);
  cudaMemsetAsync(g_bad, 0, sizeof *g_bad, b);
  slow_reader<<<64, 256, 0, b>>>(shared, bytes, 77, 200'000'000, g_bad);  // about 0.1 s
  cudaFree(shared);
  uint8_t* next = nullptr;
  cudaMallocAsync(reinterpret_cast<void**>(&next), bytes, a);
  fill<<<256, 256, 0, a>>>(next, bytes, 99);
  unsigned long long bad = 1;
  cudaStreamSynchronize(a);
  cudaMemcpyAsync(&bad, g_bad, sizeof bad, cudaMemcpyDeviceToHost, b);
  cudaStreamSynchronize(b);
  check(bad == 0, "a block freed while another stream's kernel reads it is not rewritten under that kernel");
  std::printf("  (the next block %s the freed one)\n", next == shared ? "is" : "is not");
  cudaFree(next);

  // 3. Past the budget, then back.
  std::vector<void*> blocks;
  for (;;) {
    void* p = nullptr;
    const cudaError_t result = cudaMalloc(&p, size_t{32} << 20);
    if (result != cudaSuccess) {
      check(result == cudaErrorMemoryAllocation, "allocating past the budget fails with cudaErrorMemoryAllocation");
      break;
    }
    blocks.push_back(p);
    if (blocks.size() > 100000) break;
  }
  (void)cudaGetLastError();
  const size_t filled = blocks.size();
  for (void* p : blocks) cudaFree(p);
  blocks.clear();
  size_t again = 0;
  for (; again < filled; ++again) {
    void* p = nullptr;
    if (cudaMalloc(&p, size_t{32} << 20) != cudaSuccess) break;
    blocks.push_back(p);
  }
  check(filled > 0 && again == filled, "after frees the budget serves the same allocations again");
  for (void* p : blocks) cudaFree(p);

  // 4. Memory zicoum did not allocate goes back to CUDA.
  void* managed = nullptr;
  const bool got = cudaMallocManaged(&managed, 1 << 20) == cudaSuccess;
  check(got && cudaFree(managed) == cudaSuccess, "cudaFree of memory zicoum did not allocate reaches CUDA");

  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
  std::printf(g_failures == 0 ? "OK\n" : "FAILED\n");
  return g_failures == 0 ? 0 : 1;
}
