// What unified memory does on this GPU, for the paging cost model
// (prefetch/transfer_model.h) and for UM mode's budget:
//   um_transfer_probe [MIB]          (default 1024; never more than the GPU has free)
// On one managed allocation of MIB MiB, preferred-located on the GPU, moved in
// 2 MiB pieces as zicoum's pager moves its pages:
//   d2h, h2d, duplex: cudaMemPrefetchAsync to the host, back, and half each
//     way at once on two streams (GB/s);
//   evict_call, prefetch_call: the host's time per cudaMemPrefetchAsync call
//     of one page (the launching thread pays it in UM mode);
//   freed_by_eviction: what the driver's free memory (cudaMemGetInfo) gained
//     when every page left for the host (about MIB MiB if evictions give
//     device memory back; the UVM driver's source says they do not, and
//     gives the chunks up when another allocation needs them), and
//     reclaimable_after_eviction: whether, every page on the host again, a
//     cudaMalloc of the free memory there was with them on the GPU and 3/4
//     of MIB succeeds (measured last: it may take the chunks back);
//   fault: one kernel pass over host-resident pages, which fault in (GB/s),
//     and the device memory they took;
//   accessed_by: host-resident pages then advised accessed-by the GPU, two
//     passes: if the second is as slow as the first, the pages were read over
//     the link in place, not migrated.
// Prints one JSON line. Exit 0 when every CUDA call succeeded, 2 otherwise.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace {

constexpr size_t kPage = size_t{2} << 20;

#define CHECK(call)                                                                   \
  do {                                                                                \
    if (cudaError_t e = (call); e != cudaSuccess) {                                   \
      std::printf("{\"error\": \"%s at line %d: %s\"}\n", #call, __LINE__, cudaGetErrorName(e)); \
      std::exit(2);                                                                   \
    }                                                                                 \
  } while (0)

__global__ void read_all(const float* data, size_t n, float* sink) {
  float sum = 0;
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) sum += data[i];
  if (sum == 12345.0f) *sink = sum;  // never true: keeps the reads
}

__global__ void write_all(float* data, size_t n) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) data[i] = 1.0f;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

size_t free_bytes() {
  size_t free = 0, total = 0;
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaMemGetInfo(&free, &total));
  return free;
}

cudaMemLocation on_gpu() { return cudaMemLocation{cudaMemLocationTypeDevice, 0}; }
cudaMemLocation on_host() { return cudaMemLocation{cudaMemLocationTypeHost, 0}; }

// Moves [first, last) pages of `data` to `where` in 2 MiB pieces on `stream`.
void move_pages(char* data, size_t first, size_t last, cudaMemLocation where, cudaStream_t stream) {
  for (size_t page = first; page < last; ++page) {
    CHECK(cudaMemPrefetchAsync(data + page * kPage, kPage, where, 0, stream));
  }
}

double gbps(size_t bytes, double seconds) { return static_cast<double>(bytes) / seconds / 1e9; }

// Seconds one kernel pass over `bytes` of `data` takes.
double one_pass(const char* data, size_t bytes, float* sink) {
  const auto start = std::chrono::steady_clock::now();
  read_all<<<1056, 512>>>(reinterpret_cast<const float*>(data), bytes / sizeof(float), sink);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  return seconds_since(start);
}

}  // namespace

int main(int argc, char** argv) {
  const long mib = argc == 2 ? std::strtol(argv[1], nullptr, 10) : 1024;
  if (mib < 64 || mib % 2 != 0) {
    std::printf("usage: um_transfer_probe [MIB]  (an even number of MiB, at least 64)\n");
    return 2;
  }
  const size_t bytes = static_cast<size_t>(mib) << 20, pages = bytes / kPage;
  if (bytes * 2 > free_bytes()) {
    std::printf("{\"error\": \"%ld MiB is more than half the GPU's free memory\"}\n", mib);
    return 2;
  }
  char* data = nullptr;
  float* sink = nullptr;
  cudaStream_t out_stream = nullptr, in_stream = nullptr;
  CHECK(cudaMalloc(&sink, sizeof(float)));
  CHECK(cudaStreamCreateWithFlags(&out_stream, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&in_stream, cudaStreamNonBlocking));
  CHECK(cudaMallocManaged(&data, bytes));
  CHECK(cudaMemAdvise(data, bytes, cudaMemAdviseSetPreferredLocation, on_gpu()));
  write_all<<<1056, 512>>>(reinterpret_cast<float*>(data), bytes / sizeof(float));  // every page on the GPU, holding data
  CHECK(cudaGetLastError());
  const size_t free_resident = free_bytes();

  auto start = std::chrono::steady_clock::now();
  move_pages(data, 0, pages, on_host(), out_stream);
  const double evict_call_us = seconds_since(start) * 1e6 / static_cast<double>(pages);
  CHECK(cudaStreamSynchronize(out_stream));
  const double d2h = gbps(bytes, seconds_since(start));
  const size_t free_evicted = free_bytes();

  start = std::chrono::steady_clock::now();
  move_pages(data, 0, pages, on_gpu(), in_stream);
  const double prefetch_call_us = seconds_since(start) * 1e6 / static_cast<double>(pages);
  CHECK(cudaStreamSynchronize(in_stream));
  const double h2d = gbps(bytes, seconds_since(start));

  // Half out while the other half, sent out first, comes back: each
  // direction from a thread of its own, since a call costs its thread.
  move_pages(data, pages / 2, pages, on_host(), out_stream);
  CHECK(cudaStreamSynchronize(out_stream));
  start = std::chrono::steady_clock::now();
  std::thread in_thread([&] {
    move_pages(data, pages / 2, pages, on_gpu(), in_stream);
    CHECK(cudaStreamSynchronize(in_stream));
  });
  move_pages(data, 0, pages / 2, on_host(), out_stream);
  CHECK(cudaStreamSynchronize(out_stream));
  in_thread.join();
  const double duplex = gbps(bytes, seconds_since(start));

  // Faulted in by one kernel pass.
  move_pages(data, 0, pages, on_host(), out_stream);
  CHECK(cudaStreamSynchronize(out_stream));
  const size_t free_before_fault = free_bytes();
  const double fault = gbps(bytes, one_pass(data, bytes, sink));
  const size_t free_after_fault = free_bytes();

  // Accessed-by the GPU, advised while the pages are on the host (which maps
  // them there; a prefetch to the host after the advice would not, the GPU
  // being their preferred location): two passes.
  move_pages(data, 0, pages, on_host(), out_stream);
  CHECK(cudaStreamSynchronize(out_stream));
  CHECK(cudaMemAdvise(data, bytes, cudaMemAdviseSetAccessedBy, on_gpu()));
  const size_t free_before_remote = free_bytes();
  const double remote_first = gbps(bytes, one_pass(data, bytes, sink));
  const double remote_second = gbps(bytes, one_pass(data, bytes, sink));
  const size_t free_after_remote = free_bytes();
  const double resident_pass = gbps(bytes, [&] {
    move_pages(data, 0, pages, on_gpu(), in_stream);
    CHECK(cudaStreamSynchronize(in_stream));
    return one_pass(data, bytes, sink);
  }());

  // Whether the device memory the pages left can be had by an ordinary
  // allocation (the driver taking back what unified memory keeps): every
  // page on the host, then the free memory the job had with them on the
  // GPU and 3/4 of them.
  move_pages(data, 0, pages, on_host(), out_stream);
  CHECK(cudaStreamSynchronize(out_stream));
  void* beside = nullptr;
  const bool reclaimable = cudaMalloc(&beside, free_resident + bytes * 3 / 4) == cudaSuccess;
  if (reclaimable) CHECK(cudaFree(beside));
  (void)cudaGetLastError();

  const auto signed_mib = [](size_t later, size_t earlier) {
    return (static_cast<double>(later) - static_cast<double>(earlier)) / (1 << 20);
  };
  std::printf("{\"mib\": %ld, \"d2h_gbps\": %.2f, \"h2d_gbps\": %.2f, \"duplex_gbps\": %.2f, "
              "\"evict_call_us\": %.1f, \"prefetch_call_us\": %.1f, "
              "\"freed_by_eviction_mib\": %.0f, \"reclaimable_after_eviction\": %s, "
              "\"fault_gbps\": %.2f, \"taken_by_faults_mib\": %.0f, "
              "\"accessed_by_first_pass_gbps\": %.2f, \"accessed_by_second_pass_gbps\": %.2f, "
              "\"taken_by_accessed_by_passes_mib\": %.0f, \"resident_pass_gbps\": %.2f}\n",
              mib, d2h, h2d, duplex, evict_call_us, prefetch_call_us, signed_mib(free_evicted, free_resident),
              reclaimable ? "true" : "false", fault,
              signed_mib(free_before_fault, free_after_fault), remote_first, remote_second,
              signed_mib(free_before_remote, free_after_remote), resident_pass);
  CHECK(cudaFree(data));
  return 0;
}
