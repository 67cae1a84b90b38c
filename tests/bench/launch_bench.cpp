// What libzicoum adds to a kernel launch (docs/benchmarks.md), against the
// driver's launch called directly in the same run. The driver is the
// stand-in of tests/integration/driver_hooks (its launch only counts), so the
// difference is zicoum's own work; run it in each mode:
//
//   ZICO_BACKEND=sim ZICO_SOCKET=off ZICO_BUDGET=64MiB [ZICO_MODE=um] build/bin/launch_bench
//
//  - Direct: the stand-in's cuLaunchKernel, called through its own address.
//  - Interposed/host_params: libzicoum's cuLaunchKernel for a kernel of two
//    parameters (a pointer and an int) whose pointer is not zicoum memory. In
//    VMM mode the cost of passing through; in UM mode also the layout lookup
//    and the parameter scan that every launch pays.
//  - Interposed/zicoum_params: the same with the pointer in a zicoum block.
//    In UM mode this adds the pager's work per op (the policy's decision and
//    the simulated backend running the kernel on its model), which
//    paging_bench measures on its own; in VMM mode it equals host_params.
//  - The same three for a copy: the driver's cuMemsetD32Async of 64 bytes
//    (the stand-in really sets them) into host memory or a zicoum block.
#include <benchmark/benchmark.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include <cuda.h>

#include "zicoum/zicoum.h"

extern "C" {
extern char fake_kernel_pointer_int[1];
CUresult fake_other_function(void);
}

namespace {

using Launch = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                            CUstream, void**, void**);

using SetD32 = CUresult (*)(CUdeviceptr, unsigned, size_t, CUstream);

// The stand-in driver's own `name` (the global name is libzicoum's).
template <typename Fn>
Fn direct(const char* name) {
  Dl_info info{};
  // A function's address is in the stand-in itself (a variable's may be a copy in this program).
  if (dladdr(reinterpret_cast<void*>(&fake_other_function), &info) == 0 || info.dli_fname == nullptr) return nullptr;
  void* driver = dlopen(info.dli_fname, RTLD_NOLOAD | RTLD_LAZY);
  return driver != nullptr ? reinterpret_cast<Fn>(dlsym(driver, name)) : nullptr;
}

void* zicoum_block() {
  static void* block = nullptr;
  if (block == nullptr && zico_malloc(&block, size_t{1} << 20, 0, nullptr) != ZICO_OK) {
    std::fprintf(stderr, "zico_malloc: %s\n", zico_last_error());
    std::exit(1);
  }
  return block;
}

void run(benchmark::State& state, Launch launch, void* pointer) {
  if (launch == nullptr) {
    state.SkipWithError("the stand-in driver's cuLaunchKernel was not found");
    return;
  }
  int n = 1024;
  void* args[] = {&pointer, &n};
  const auto f = reinterpret_cast<CUfunction>(fake_kernel_pointer_int);
  for (auto _ : state) {
    benchmark::DoNotOptimize(launch(f, 64, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr));
  }
}

void run_copy(benchmark::State& state, SetD32 set, void* destination) {
  if (set == nullptr) {
    state.SkipWithError("the stand-in driver's cuMemsetD32Async was not found");
    return;
  }
  const auto dst = static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(destination));
  for (auto _ : state) benchmark::DoNotOptimize(set(dst, 7u, 16, nullptr));
}

int host_word = 0;
unsigned host_words[16];

void BM_Direct(benchmark::State& state) { run(state, direct<Launch>("cuLaunchKernel"), &host_word); }
void BM_Interposed_host_params(benchmark::State& state) { run(state, &cuLaunchKernel, &host_word); }
void BM_Interposed_zicoum_params(benchmark::State& state) { run(state, &cuLaunchKernel, zicoum_block()); }
void BM_Copy_Direct(benchmark::State& state) { run_copy(state, direct<SetD32>("cuMemsetD32Async"), host_words); }
void BM_Copy_Interposed_host(benchmark::State& state) { run_copy(state, &cuMemsetD32Async, host_words); }
void BM_Copy_Interposed_zicoum(benchmark::State& state) { run_copy(state, &cuMemsetD32Async, zicoum_block()); }

BENCHMARK(BM_Direct);
BENCHMARK(BM_Interposed_host_params);
BENCHMARK(BM_Interposed_zicoum_params);
BENCHMARK(BM_Copy_Direct);
BENCHMARK(BM_Copy_Interposed_host);
BENCHMARK(BM_Copy_Interposed_zicoum);

}  // namespace

int main(int argc, char** argv) {
  const char* mode = std::getenv("ZICO_MODE");
  std::printf("ZICO_MODE=%s\n", mode != nullptr ? mode : "vmm (unset)");
  (void)zicoum_block();  // starts zicoum before any timing
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
