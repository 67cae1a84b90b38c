// Does this machine's CUPTI report unified-memory GPU page faults at all?
// zicoum learns the blocks a kernel reaches through pointers from those
// reports (ZICO_FAULT_REPORTS); where the platform gives none, the GPU
// suite's um_unseen step is told apart from a zicoum defect by this probe.
//   cupti_um_probe early|late
// early: CUPTI's unified-memory counters are configured and enabled before
// the first CUDA call; late: after the context exists (as libzicoum does).
// Then 256 MiB of managed memory is written on the host and again by a
// kernel (every page a GPU fault), and CUPTI's records are flushed and
// counted: GPU page-fault records, and host-to-device transfers by their
// migration cause (coherence: a fault's). Prints one JSON line. Exit 0 when
// either names what the kernel touched (a fault record, or a transfer a
// fault caused), 1 when neither came, 2 when CUDA itself failed.
#include <cuda_runtime.h>
#include <cupti.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

// Written by CUPTI's thread in buffer_done; read after the flush, which
// returns once the buffers are handed over.
std::atomic<unsigned long long> g_records{0}, g_faults{0}, g_htod_bytes{0}, g_buffers{0};
std::atomic<unsigned long long> g_htod_by_cause[6] = {};  // CUpti_ActivityUnifiedMemoryMigrationCause, 0..5

void CUPTIAPI request_buffer(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = size_t{8} << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, *size));
  *max_records = 0;
}

void CUPTIAPI buffer_done(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  ++g_buffers;
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    ++g_records;
    if (record->kind != CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER) continue;
    const auto* counter = reinterpret_cast<const CUpti_ActivityUnifiedMemoryCounter3*>(record);
    if (counter->counterKind == CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_GPU_PAGE_FAULT) ++g_faults;
    if (counter->counterKind == CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_HTOD) {
      g_htod_bytes += counter->value;
      ++g_htod_by_cause[counter->flags < 6 ? counter->flags : 0];
    }
  }
  std::free(buffer);
}

// The result of configuring and enabling the counters, as CUPTI names it.
const char* enable_counters() {
  CUpti_ActivityUnifiedMemoryCounterConfig config[2] = {};
  config[0].scope = CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_SCOPE_PROCESS_SINGLE_DEVICE;
  config[0].kind = CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_GPU_PAGE_FAULT;
  config[0].deviceId = 0;
  config[0].enable = 1;
  config[1] = config[0];
  config[1].kind = CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_HTOD;
  const char* name = "CUPTI_SUCCESS";
  CUptiResult result = cuptiActivityRegisterCallbacks(request_buffer, buffer_done);
  if (result == CUPTI_SUCCESS) result = cuptiActivityConfigureUnifiedMemoryCounter(config, 2);
  if (result == CUPTI_SUCCESS) result = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER);
  if (result != CUPTI_SUCCESS) cuptiGetResultString(result, &name);
  return name;
}

__global__ void write_all(unsigned* data, size_t words) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < words; i += size_t{gridDim.x} * blockDim.x) {
    data[i] = static_cast<unsigned>(i);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool early = argc == 2 && std::strcmp(argv[1], "early") == 0;
  if (argc != 2 || (!early && std::strcmp(argv[1], "late") != 0)) {
    std::printf("usage: cupti_um_probe early|late\n");
    return 2;
  }
  const char* enabled = early ? enable_counters() : nullptr;
  if (cudaFree(nullptr) != cudaSuccess) return std::printf("{\"error\": \"no CUDA context\"}\n"), 2;
  if (!early) enabled = enable_counters();
  constexpr size_t kBytes = size_t{256} << 20;
  unsigned* data = nullptr;
  if (cudaMallocManaged(&data, kBytes) != cudaSuccess) return std::printf("{\"error\": \"cudaMallocManaged\"}\n"), 2;
  std::memset(data, 0, kBytes);
  write_all<<<1024, 256>>>(data, kBytes / sizeof(unsigned));
  const cudaError_t ran = cudaDeviceSynchronize();
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  int concurrent = 0;
  cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, 0);
  unsigned long long cause[6];
  for (int i = 0; i < 6; ++i) cause[i] = g_htod_by_cause[i].load();
  std::printf("{\"when\": \"%s\", \"enable\": \"%s\", \"kernel\": \"%s\", \"concurrent_managed_access\": %d, "
              "\"buffers\": %llu, \"records\": %llu, \"gpu_page_faults\": %llu, \"htod_bytes\": %llu, "
              "\"htod_records_by_cause\": {\"unknown\": %llu, \"user\": %llu, \"coherence\": %llu, "
              "\"prefetch\": %llu, \"eviction\": %llu, \"access_counters\": %llu}}\n",
              argv[1], enabled, cudaGetErrorName(ran), concurrent, g_buffers.load(), g_records.load(), g_faults.load(),
              g_htod_bytes.load(),
              cause[0], cause[1], cause[2], cause[3], cause[4], cause[5]);
  if (ran != cudaSuccess) return 2;
  // What zicoum can learn from: fault records, or transfers that faults caused
  // (coherence, or the driver's read-ahead around a fault).
  return g_faults > 0 || cause[2] + cause[3] > 0 ? 0 : 1;
}
