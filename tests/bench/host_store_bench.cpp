// Host-store eviction throughput against plain memcpy of the same bytes.
//
// BM_MemcpyRoundTrip copies N chunks out to a host buffer and back: the
// fastest the bytes can move on this machine. BM_HostStoreRoundTrip saves the
// same N chunks of (SimDriver) device memory into HostStore slots and loads
// them back. Both report bytes per second; main() prints their ratio (target
// >= 0.9). On a GPU the store's copies are pinned DMA transfers, and the
// comparison to make there is against cudaMemcpy on pinned memory.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "chunk_map.h"
#include "host_store.h"
#include "sim_driver.h"

namespace zico::bench {
namespace {

constexpr size_t kChunk = size_t{2} << 20;
constexpr size_t kChunks = 128;  // 256 MiB moved each way

void BM_MemcpyRoundTrip(benchmark::State& state) {
  std::vector<char> device(kChunks * kChunk, 1);
  std::vector<char> host(kChunks * kChunk);
  for (auto _ : state) {
    for (size_t c = 0; c < kChunks; ++c) std::memcpy(host.data() + c * kChunk, device.data() + c * kChunk, kChunk);
    for (size_t c = 0; c < kChunks; ++c) std::memcpy(device.data() + c * kChunk, host.data() + c * kChunk, kChunk);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * 2 * kChunks * kChunk));
}

void BM_HostStoreRoundTrip(benchmark::State& state) {
  SimOptions sim;
  sim.capacity = 2 * kChunks * kChunk;
  SimDriver driver(sim);
  VaRange arena;
  std::unique_ptr<HostStore> store;
  std::string why;
  if (!driver.reserve(DeviceId{0}, kChunks * kChunk, 0, &arena).is_ok() ||
      !HostStore::create(driver, DeviceId{0}, kChunk, HostStoreOptions{kChunks}, &store, &why).is_ok()) {
    state.SkipWithError("setup failed");
    return;
  }
  DriverChunkSource source(driver, DeviceId{0}, kChunk);
  ChunkMap chunks(driver, source, DeviceId{0}, arena, kChunk);
  if (!chunks.map_range(arena.base, arena.bytes).is_ok()) {
    state.SkipWithError("map failed");
    return;
  }
  chunks.ref(arena.base, arena.bytes);
  std::memset(arena.ptr(), 1, arena.bytes);  // touch every page once, as the memcpy baseline's vector is
  std::vector<ChunkTransfer> transfers(kChunks);
  for (size_t c = 0; c < kChunks; ++c) {
    if (!store->reserve_slot(&transfers[c].slot).is_ok()) {
      state.SkipWithError("slot");
      return;
    }
    transfers[c].device = reinterpret_cast<void*>(arena.base + c * kChunk);
    std::memset(store->slot_data(transfers[c].slot), 0, kChunk);
  }
  StreamHandle stream;
  (void)driver.stream_create(DeviceId{0}, &stream);
  for (auto _ : state) {
    if (!store->save(transfers, stream).is_ok() || !store->load(transfers, stream).is_ok()) {
      state.SkipWithError("copy failed");
      break;
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * 2 * kChunks * kChunk));
  for (const ChunkTransfer& t : transfers) store->release_slot(t.slot);
  chunks.unmap_all();
}

BENCHMARK(BM_MemcpyRoundTrip)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_HostStoreRoundTrip)->Unit(benchmark::kMillisecond)->UseRealTime();

// Collects each benchmark's bytes per second to print the ratio.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      // A single run, or the median when repeated.
      const bool median = run.run_type == Run::RT_Aggregate && run.aggregate_name == "median";
      if (run.error_occurred || !(run.run_type == Run::RT_Iteration || median)) continue;
      const double rate = run.counters.count("bytes_per_second") ? double(run.counters.at("bytes_per_second")) : 0;
      if (run.benchmark_name().starts_with("BM_MemcpyRoundTrip")) memcpy_rate = rate;
      if (run.benchmark_name().starts_with("BM_HostStoreRoundTrip")) store_rate = rate;
    }
  }
  double memcpy_rate = 0, store_rate = 0;
};

}  // namespace
}  // namespace zico::bench

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  zico::bench::RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  if (reporter.memcpy_rate > 0 && reporter.store_rate > 0) {
    std::fprintf(stderr, "host store evict+restore / memcpy of the same bytes: %.3f (%.2f vs %.2f GB/s)\n",
                 reporter.store_rate / reporter.memcpy_rate, reporter.store_rate / 1e9, reporter.memcpy_rate / 1e9);
  }
  benchmark::Shutdown();
  return 0;
}
