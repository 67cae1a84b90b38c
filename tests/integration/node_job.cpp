// node_job: a training-like workload for the node-manager tests. Through the
// C API (so it borrows from zico-umd when ZICO_SOCKET names one), it keeps a
// persistent set of blocks ("weights") and, each iteration, allocates
// activations up to its peak, then frees them in reverse, writing a pattern
// into every block and checking every byte before it is freed.
//
//   node_job --seed N --iterations N --peak SIZE [--persistent SIZE] [--pause-ms N] [--block SIZE]
//
// --block: every block has this size (else 1-4 MiB weights, 64 KiB-8 MiB
// activations); with the chunk size, a job can ask for exactly its budget.
//
// Exit: 0 and "done, budget N" (zico_get_stats' budget) when every byte verified; 1 "MISMATCH ..." on wrong data;
// 2 "OOM allocating N bytes after S s: why" when an allocation failed (S: how long that call took); 64 on bad usage.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <zicoum/zicoum.h>

namespace {

struct Block {
  uint64_t* words;
  size_t count;
  uint64_t tag;
};

uint64_t word(uint64_t tag, size_t i) { return (tag * 0x9E3779B97F4A7C15ULL) ^ (i * 0xBF58476D1CE4E5B9ULL); }

void fill(const Block& b) {
  for (size_t i = 0; i < b.count; ++i) b.words[i] = word(b.tag, i);
}

bool verify(const Block& b) {
  for (size_t i = 0; i < b.count; ++i) {
    if (b.words[i] != word(b.tag, i)) {
      std::printf("MISMATCH block tag %llu word %zu: %llx, expected %llx\n", static_cast<unsigned long long>(b.tag), i,
                  static_cast<unsigned long long>(b.words[i]), static_cast<unsigned long long>(word(b.tag, i)));
      return false;
    }
  }
  return true;
}

bool allocate(size_t bytes, uint64_t tag, Block* out) {
  void* p = nullptr;
  const auto start = std::chrono::steady_clock::now();
  if (zico_malloc(&p, bytes, 0, nullptr) != ZICO_OK) {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("OOM allocating %zu bytes after %.3f s: %s\n", bytes, seconds, zico_last_error());
    return false;
  }
  *out = Block{static_cast<uint64_t*>(p), bytes / 8, tag};
  fill(*out);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t seed = 1;
  long iterations = 10;
  size_t peak = 0;
  size_t persistent = 0;
  long pause_ms = 0;
  size_t block = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string name = argv[i];
    const char* value = argv[i + 1];
    if (name == "--seed") {
      seed = std::strtoull(value, nullptr, 10);
    } else if (name == "--iterations") {
      iterations = std::strtol(value, nullptr, 10);
    } else if (name == "--peak" || name == "--persistent" || name == "--block") {
      uint64_t bytes = 0;
      if (zico_parse_size(value, &bytes) != ZICO_OK) {
        std::fprintf(stderr, "node_job: %s '%s' is not a size\n", name.c_str(), value);
        return 64;
      }
      (name == "--peak" ? peak : name == "--block" ? block : persistent) = bytes;
    } else if (name == "--pause-ms") {
      pause_ms = std::strtol(value, nullptr, 10);
    } else {
      std::fprintf(stderr, "node_job: unknown option %s\n", name.c_str());
      return 64;
    }
  }
  if (peak == 0 || persistent > peak) {
    std::fprintf(stderr, "usage: node_job --seed N --iterations N --peak SIZE [--persistent SIZE] [--pause-ms N]\n");
    return 64;
  }
  std::mt19937_64 random(seed);
  uint64_t tag = seed << 32;
  std::vector<Block> weights;
  for (size_t held = 0; held < persistent;) {
    const size_t bytes =
        block != 0 ? block : std::min<size_t>(persistent - held, (size_t{1} << 20) * (1 + random() % 4));
    Block b;
    if (!allocate(bytes & ~size_t{7}, ++tag, &b)) return 2;
    weights.push_back(b);
    held += bytes;
  }
  for (long it = 0; it < iterations; ++it) {
    std::vector<Block> activations;
    size_t live = persistent;
    while (live < peak) {
      // 64 KiB .. 8 MiB, like a layer's output.
      const size_t bytes =
          block != 0 ? block : std::min<size_t>(peak - live, (size_t{64} << 10) << (random() % 8)) & ~size_t{7};
      if (bytes < 8) break;
      Block b;
      if (!allocate(bytes, ++tag, &b)) return 2;
      activations.push_back(b);
      live += bytes;
    }
    if (pause_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
    for (auto b = activations.rbegin(); b != activations.rend(); ++b) {
      if (!verify(*b)) return 1;
      if (zico_free(b->words, nullptr) != ZICO_OK) {
        std::printf("free failed: %s\n", zico_last_error());
        return 1;
      }
    }
    for (const Block& b : weights) {
      if (!verify(b)) return 1;
    }
    (void)zico_mark_iteration();
  }
  for (const Block& b : weights) (void)zico_free(b.words, nullptr);
  zico_stats_t stats;
  std::memset(&stats, 0, sizeof stats);
  stats.struct_size = sizeof stats;
  if (zico_get_stats(0, &stats) != ZICO_OK) {
    std::printf("zico_get_stats failed: %s\n", zico_last_error());
    return 1;
  }
  std::printf("done, budget %llu\n", static_cast<unsigned long long>(stats.budget_bytes));
  return 0;
}
