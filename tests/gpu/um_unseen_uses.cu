// A kernel that reaches blocks through a pointer table kept in device memory,
// under zico-run --mode um: its parameters name only the table, so zicoum
// learns the blocks from the GPU's fault reports (CUPTI) and from then on
// fetches them before the kernel and counts them within the budget.
//   zico-run --backend cuda --mode um --budget 384MiB -- um_unseen_uses 402653184
// (the argument: the budget in bytes, which the pages on the GPU are checked against).
// 16 blocks of 32 MiB (more than the budget) are filled by kernels that name
// them, then summed each iteration by two kernels, each naming only the
// table and summing half the blocks through it; every sum is checked. What
// the device holds is read from the driver itself (cuMemGetInfo through
// libcuda's own handle: zicoum answers cudaMemGetInfo): its growth from
// before the first kernel is the job's pages on the GPU, plus CUPTI's own
// buffers. Prints one JSON line of figures, then OK; exit 1 when a sum is
// wrong, no fault was reported as unnamed (the reports did not reach zicoum:
// ZICO_LOG=info says why), nothing was learnt, zicoum counted more than the
// budget, or the device grew by more than the budget and 64 MiB.
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>

#include "zicoum/zicoum.h"

namespace {

constexpr int kBlocks = 16;
constexpr size_t kBlockBytes = size_t{32} << 20;
constexpr size_t kWords = kBlockBytes / sizeof(uint32_t);
constexpr int kIterations = 6;

__global__ void fill(uint32_t* block, size_t words, uint32_t seed) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < words; i += size_t{gridDim.x} * blockDim.x) {
    block[i] = static_cast<uint32_t>(i) * 2654435761u ^ seed;
  }
}

// One thread block per table entry: sums its block's words.
__global__ void sum_through_table(uint32_t* const* table, size_t words, unsigned long long* sums) {
  const uint32_t* block = table[blockIdx.x];
  unsigned long long sum = 0;
  for (size_t i = threadIdx.x; i < words; i += blockDim.x) sum += block[i];
  atomicAdd(&sums[blockIdx.x], sum);
}

template <typename Fn>
Fn zicoum_function(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}

// The device's free memory as the driver says it, once the device is idle
// (0 if it cannot be read).
size_t device_free_bytes() {
  using MemGetInfo = int (*)(size_t*, size_t*);
  static const MemGetInfo get = [] {
    void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    return cuda != nullptr ? reinterpret_cast<MemGetInfo>(dlsym(cuda, "cuMemGetInfo_v2")) : nullptr;
  }();
  size_t free_bytes = 0, total = 0;
  if (get == nullptr || cudaDeviceSynchronize() != cudaSuccess || get(&free_bytes, &total) != 0) return 0;
  return free_bytes;
}

}  // namespace

int main(int argc, char** argv) {
  const unsigned long long budget = argc == 2 ? std::strtoull(argv[1], nullptr, 10) : 0;
  if (budget == 0) {
    std::printf("FAIL: usage: um_unseen_uses BUDGET_BYTES\n");
    return 1;
  }
  const auto mark = zicoum_function<zico_status_t (*)(void)>("zico_mark_iteration");
  const auto get_stats = zicoum_function<zico_status_t (*)(int, zico_stats_t*)>("zico_get_stats");
  if (mark == nullptr || get_stats == nullptr) {
    std::printf("FAIL: zicoum is not preloaded (run under zico-run)\n");
    return 1;
  }
  std::vector<uint32_t*> blocks(kBlocks);
  uint32_t** table = nullptr;
  unsigned long long* sums = nullptr;
  for (auto& block : blocks) {
    if (cudaMalloc(&block, kBlockBytes) != cudaSuccess) return std::printf("FAIL: cudaMalloc\n"), 1;
  }
  if (cudaMalloc(&table, sizeof(uint32_t*) * kBlocks) != cudaSuccess ||
      cudaMalloc(&sums, sizeof(unsigned long long) * kBlocks) != cudaSuccess) {
    return std::printf("FAIL: cudaMalloc\n"), 1;
  }
  const size_t free_at_start = device_free_bytes();
  size_t least_free = free_at_start;
  std::vector<unsigned long long> expected(kBlocks, 0);
  for (int b = 0; b < kBlocks; ++b) {
    fill<<<256, 256>>>(blocks[b], kWords, static_cast<uint32_t>(b) * 977u);
    for (size_t i = 0; i < kWords; ++i) expected[b] += static_cast<uint32_t>(i) * 2654435761u ^ (b * 977u);
  }
  if (cudaMemcpy(table, blocks.data(), sizeof(uint32_t*) * kBlocks, cudaMemcpyHostToDevice) != cudaSuccess) {
    return std::printf("FAIL: cudaMemcpy of the table\n"), 1;
  }
  int wrong = 0;
  std::vector<unsigned long long> got(kBlocks);
  for (int iteration = 0; iteration < kIterations; ++iteration) {
    if (cudaMemset(sums, 0, sizeof(unsigned long long) * kBlocks) != cudaSuccess) return std::printf("FAIL: memset\n"), 1;
    for (int half = 0; half < 2; ++half) {
      sum_through_table<<<kBlocks / 2, 512>>>(table + half * (kBlocks / 2), kWords, sums + half * (kBlocks / 2));
    }
    if (cudaMemcpy(got.data(), sums, sizeof(unsigned long long) * kBlocks, cudaMemcpyDeviceToHost) != cudaSuccess) {
      return std::printf("FAIL: cudaMemcpy of the sums\n"), 1;
    }
    for (int b = 0; b < kBlocks; ++b) wrong += got[b] != expected[b];
    (void)mark();
    if (const size_t free_now = device_free_bytes(); free_now != 0 && free_now < least_free) least_free = free_now;
  }
  zico_stats_t stats{};
  stats.struct_size = sizeof stats;
  (void)get_stats(0, &stats);
  std::printf("{\"wrong_sums\": %d, \"unnamed_faults\": %llu, \"learnt_pages\": %llu, \"unasked_arrivals\": %llu, "
              "\"faulted_pages\": %llu, \"prefetched_pages\": %llu, \"peak_resident_bytes\": %llu, "
              "\"budget_bytes\": %llu, \"device_growth_bytes\": %llu}\n",
              wrong, static_cast<unsigned long long>(stats.unnamed_faults),
              static_cast<unsigned long long>(stats.learnt_pages),
              static_cast<unsigned long long>(stats.unasked_arrivals),
              static_cast<unsigned long long>(stats.faulted_pages),
              static_cast<unsigned long long>(stats.prefetched_pages),
              static_cast<unsigned long long>(stats.peak_resident_bytes),
              budget, static_cast<unsigned long long>(free_at_start - least_free));
  int failures = 0;
  const auto check = [&failures](bool ok, const char* what) {
    std::printf("%s: %s\n", ok ? "pass" : "FAIL", what);
    failures += !ok;
  };
  check(wrong == 0, "every sum through the table is right");
  check(stats.unnamed_faults > 0, "the GPU's fault reports named blocks the kernel's parameters did not");
  check(stats.learnt_pages > 0, "the table's blocks were learnt for the kernel");
  check(stats.peak_resident_bytes <= budget, "zicoum counted no more than the budget on the GPU");
  check(free_at_start != 0, "the driver's cuMemGetInfo answered");
  check(free_at_start - least_free <= budget + (size_t{64} << 20), "the device held no more than the budget and 64 MiB");
  if (failures == 0) std::printf("OK\n");
  return failures == 0 ? 0 : 1;
}
