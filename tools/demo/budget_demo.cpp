// budget_demo: a CUDA program, written only against the CUDA runtime API,
// that shows a zicoum budget at work. Run it on the simulated backend:
//
//   ZICO_BACKEND=sim ZICO_BUDGET=64MiB build/bin/budget_demo
//
// It fills the budget with 1 MiB blocks until cudaMalloc says no, frees half,
// allocates again, then churns thousands of random allocations while checking
// that every block keeps its data. Every claim it prints is checked; any
// mismatch exits with status 1. `--torch-abi` runs the same steps through
// PyTorch's pluggable-allocator entry points instead of cudaMalloc/cudaFree.
//
// The sim backend returns host-addressable memory, so the demo reads and
// writes blocks directly from the CPU.
#include <dlfcn.h>

#include <new>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "zicoum/zicoum.h"

namespace {

constexpr size_t kMiB = size_t{1} << 20;
bool g_torch_abi = false;

// zicoum's own symbols are looked up at run time so the demo also works when
// it is linked against the real libcudart and zicoum arrives via LD_PRELOAD.
template <typename Fn>
Fn zicoum_symbol(const char* name) {
  const auto fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
  if (fn == nullptr) {
    std::printf("FAIL: %s not found: libzicoum is not loaded (link it or run through zico-run)\n", name);
    std::exit(1);
  }
  return fn;
}

// Both allocation paths, chosen by --torch-abi.
cudaError_t demo_malloc(void** ptr, size_t bytes) {
  if (!g_torch_abi) return cudaMalloc(ptr, bytes);
  static const auto torch_malloc = zicoum_symbol<void* (*)(ssize_t, int, void*)>("zico_torch_malloc");
  try {
    *ptr = torch_malloc(static_cast<ssize_t>(bytes), 0, nullptr);
  } catch (const std::bad_alloc&) {  // the ABI's out-of-memory signal, as PyTorch sees it
    *ptr = nullptr;
    return cudaErrorMemoryAllocation;
  }
  return cudaSuccess;
}

void demo_free(void* ptr, size_t bytes) {
  if (g_torch_abi) {
    static const auto torch_free = zicoum_symbol<void (*)(void*, ssize_t, int, void*)>("zico_torch_free");
    torch_free(ptr, static_cast<ssize_t>(bytes), 0, nullptr);
  } else if (cudaFree(ptr) != cudaSuccess) {
    std::printf("FAIL: cudaFree(%p) failed\n", ptr);
    std::exit(1);
  }
}

void check(bool ok, const char* what) {
  if (ok) return;
  std::printf("FAIL: %s\n", what);
  std::exit(1);
}

struct Block {
  uint8_t* ptr = nullptr;
  size_t bytes = 0;
  uint8_t seed = 0;
};

void fill(const Block& b) {
  for (size_t i = 0; i < b.bytes; i += 512) b.ptr[i] = static_cast<uint8_t>(b.seed + i / 512);
  b.ptr[b.bytes - 1] = b.seed;
}

bool intact(const Block& b) {
  for (size_t i = 0; i < b.bytes; i += 512) {
    if (b.ptr[i] != static_cast<uint8_t>(b.seed + i / 512)) return false;
  }
  return b.ptr[b.bytes - 1] == b.seed;
}

uint64_t next_random(uint64_t& state) {
  state ^= state << 13;
  state ^= state >> 7;
  state ^= state << 17;
  return state;
}

void print_stats() {
  const auto get_stats = zicoum_symbol<zico_status_t (*)(int, zico_stats_t*)>("zico_get_stats");
  zico_stats_t s{};
  s.struct_size = sizeof s;
  check(get_stats(0, &s) == ZICO_OK, "zico_get_stats failed");
  std::printf("zicoum stats: budget %zu MiB, peak mapped %.1f MiB, peak allocated %.1f MiB, "
              "%llu allocations, %llu refused, %llu chunk maps, %llu unmaps\n",
              static_cast<size_t>(s.budget_bytes / kMiB), static_cast<double>(s.peak_mapped_bytes) / kMiB,
              static_cast<double>(s.peak_allocated_bytes) / kMiB, static_cast<unsigned long long>(s.allocations),
              static_cast<unsigned long long>(s.failed_allocations), static_cast<unsigned long long>(s.chunk_maps),
              static_cast<unsigned long long>(s.chunk_unmaps));
  check(s.peak_mapped_bytes <= s.budget_bytes, "mapped memory exceeded the budget");
}

}  // namespace

constexpr const char* kUsage =
    "Usage: %s [--torch-abi]\n"
    "Fills a zicoum budget with 1 MiB blocks until cudaMalloc says no, frees half, allocates\n"
    "again and churns random allocations, checking every block's data; exits 1 on a mismatch.\n"
    "It reads device memory from the CPU, so it runs on the simulated backend:\n"
    "  zico-run --backend sim --budget 64MiB -- %s\n"
    "  (budget_demo, linked to libzicoum, also runs as ZICO_BACKEND=sim ZICO_BUDGET=64MiB budget_demo)\n"
    "\n"
    "  --torch-abi   allocate through PyTorch's pluggable-allocator entry points instead\n"
    "  -h, --help    print this help\n";

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--torch-abi") == 0) {
      g_torch_abi = true;
    } else if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::printf(kUsage, argv[0], argv[0]);
      return 0;
    } else {
      std::fprintf(stderr, "%s: unknown option '%s'\nTry '%s --help'.\n", argv[0], argv[i], argv[0]);
      return 2;
    }
  }
  // Linked to libcudart (budget_demo_cudart), zicoum comes only by preload.
  const bool zicoum_loaded = dlsym(RTLD_DEFAULT, "zico_malloc") != nullptr;
  const char* backend = std::getenv("ZICO_BACKEND");
  if (!zicoum_loaded || backend == nullptr || std::strcmp(backend, "sim") != 0) {
    std::fprintf(stderr,
                 "%s: %s; it reads device memory from the CPU, so it runs on the simulated backend:\n"
                 "  zico-run --backend sim --budget 64MiB -- %s\n",
                 argv[0], zicoum_loaded ? "ZICO_BACKEND is not sim" : "libzicoum is not loaded (run it through zico-run)",
                 argv[0]);
    return 2;
  }
  std::printf("zicoum budget demo (%s)\n", g_torch_abi ? "PyTorch pluggable-allocator ABI" : "CUDA runtime API");

  size_t free_bytes = 0, total_bytes = 0;
  check(cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess, "cudaMemGetInfo failed");
  std::printf("cudaMemGetInfo: total %zu MiB (the job's budget), free %zu MiB\n", total_bytes / kMiB, free_bytes / kMiB);

  // 1. Fill the budget with 1 MiB blocks.
  std::vector<Block> blocks;
  for (;;) {
    void* p = nullptr;
    const cudaError_t err = demo_malloc(&p, kMiB);
    if (err == cudaErrorMemoryAllocation) break;
    check(err == cudaSuccess && p != nullptr, "1 MiB allocation failed with an unexpected error");
    blocks.push_back({static_cast<uint8_t*>(p), kMiB, static_cast<uint8_t>(blocks.size() * 7 + 1)});
    fill(blocks.back());
    check(blocks.size() <= total_bytes / kMiB, "more 1 MiB blocks fit than the budget allows");
  }
  std::printf("1 MiB blocks: %zu allocated, then cudaErrorMemoryAllocation (budget %zu MiB)\n", blocks.size(),
              total_bytes / kMiB);
  check(blocks.size() + 1 >= total_bytes / kMiB, "far fewer blocks fit than the budget allows");
  check(cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess && free_bytes < kMiB, "budget not reported as full");

  // 2. Free every other block; the process keeps working.
  std::vector<Block> kept;
  size_t freed = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (i % 2 == 1) {
      demo_free(blocks[i].ptr, blocks[i].bytes);
      freed += blocks[i].bytes;
    } else {
      kept.push_back(blocks[i]);
    }
  }
  check(cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess, "cudaMemGetInfo failed");
  std::printf("freed %zu MiB: cudaMemGetInfo now reports %zu MiB free\n", freed / kMiB, free_bytes / kMiB);
  check(free_bytes >= freed, "freed memory not reported free");
  blocks = kept;

  // 3. Allocate again into the freed room.
  size_t again = 0;
  for (void* p = nullptr; demo_malloc(&p, kMiB) == cudaSuccess; ++again) {
    blocks.push_back({static_cast<uint8_t*>(p), kMiB, static_cast<uint8_t>(again * 13 + 5)});
    fill(blocks.back());
  }
  std::printf("allocated %zu MiB again after freeing\n", again);
  check(again + 1 >= freed / kMiB, "freed memory could not be allocated again");
  for (const Block& b : blocks) check(intact(b), "a block lost its data");
  for (const Block& b : blocks) demo_free(b.ptr, b.bytes);
  blocks.clear();

  // 4. Churn: random sizes from 512 B to 4 MiB, random frees, data checked.
  uint64_t rng = 0x9e3779b97f4a7c15ULL;
  size_t refused = 0;
  const int kOps = 20000;
  for (int op = 0; op < kOps; ++op) {
    if (!blocks.empty() && next_random(rng) % 100 < 45) {
      const size_t victim = next_random(rng) % blocks.size();
      check(intact(blocks[victim]), "a block lost its data during churn");
      demo_free(blocks[victim].ptr, blocks[victim].bytes);
      blocks[victim] = blocks.back();
      blocks.pop_back();
      continue;
    }
    const size_t bytes = size_t{512} << (next_random(rng) % 14);
    void* p = nullptr;
    const cudaError_t err = demo_malloc(&p, bytes + next_random(rng) % bytes);
    if (err == cudaErrorMemoryAllocation) {
      ++refused;
      continue;
    }
    check(err == cudaSuccess, "allocation failed with an unexpected error during churn");
    blocks.push_back({static_cast<uint8_t*>(p), bytes, static_cast<uint8_t>(next_random(rng))});
    fill(blocks.back());
  }
  for (const Block& b : blocks) check(intact(b), "a block lost its data after churn");
  std::printf("churn: %d random alloc/free operations, %zu refused at the budget, all data verified\n", kOps, refused);
  for (const Block& b : blocks) demo_free(b.ptr, b.bytes);

  print_stats();
  std::printf("OK\n");
  return 0;
}
