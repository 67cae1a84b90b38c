#include "launch_observer.h"

#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

#include <cuda_runtime_api.h>
#include <sys/uio.h>
#include <unistd.h>

#include "api_calls.h"
#include "config.h"
#include "log.h"
#include "pointer_table.h"
#include "real_function.h"
#include "runtime.h"

namespace zico {
namespace {

// A kernel's parameter sizes, in order; `known` is false where the driver
// could not tell (then kernelParams, whose length is unknown, stay unread).
struct ParamLayout {
  bool known = false;
  bool ask_again = false;  // the driver could not answer this time (not: cannot tell)
  std::vector<uint32_t> sizes;
};

// No kernel has more (CUDA's limit is 32 KiB of parameters); a guard against
// a driver that never says "out of range".
constexpr size_t kMaxParams = 4096;
// Beyond these a launch's remaining pointers are not looked at: the op is
// announced with what was found.
constexpr size_t kMaxPointers = 256;

// Asks `param_info` for each parameter's size until it says there are no more.
template <typename Handle>
ParamLayout ask_sizes(CUresult (*param_info)(Handle, size_t, size_t*, size_t*), Handle handle) {
  ParamLayout layout;
  if (param_info == nullptr || handle == nullptr) return layout;
  for (size_t i = 0; i < kMaxParams; ++i) {
    size_t offset = 0;
    size_t size = 0;
    const CUresult result = param_info(handle, i, &offset, &size);
    if (result == CUDA_ERROR_INVALID_VALUE) {  // past the last parameter
      layout.known = true;
      return layout;
    }
    if (result != CUDA_SUCCESS) {
      layout.ask_again = result != CUDA_ERROR_NOT_SUPPORTED && result != CUDA_ERROR_NOT_FOUND;
      break;
    }
    layout.sizes.push_back(static_cast<uint32_t>(size));
  }
  layout.sizes.clear();
  return layout;
}

ParamLayout ask_driver(const void* key, Callee callee) {
  if (callee == Callee::kLibraryKernel) {
    static RealFunction<CUresult (*)(CUkernel, size_t, size_t*, size_t*)> real_kernel_info("cuKernelGetParamInfo");
    return ask_sizes(real_kernel_info.get(), reinterpret_cast<CUkernel>(const_cast<void*>(key)));
  }
  auto function = reinterpret_cast<CUfunction>(const_cast<void*>(key));
  if (callee == Callee::kRuntimeStub) {
    static RealFunction<cudaError_t (*)(cudaFunction_t*, const void*)> real_by_symbol("cudaGetFuncBySymbol");
    cudaFunction_t resolved = nullptr;
    const auto by_symbol = real_by_symbol.get();
    if (by_symbol == nullptr || by_symbol(&resolved, key) != cudaSuccess) {
      ParamLayout layout;
      layout.ask_again = by_symbol != nullptr;
      return layout;
    }
    function = reinterpret_cast<CUfunction>(resolved);
  }
  static RealFunction<CUresult (*)(CUfunction, size_t, size_t*, size_t*)> real_param_info("cuFuncGetParamInfo");
  return ask_sizes(real_param_info.get(), function);
}

// Layouts by function, asked of the driver once each, until a module unload
// forgets them all. A launch keeps its layout alive while it reads.
class Layouts {
 public:
  static Layouts& instance() {
    static Layouts* layouts = new Layouts();  // never destroyed: launches may come at exit
    return *layouts;
  }
  std::shared_ptr<const ParamLayout> get(const void* key, Callee callee) {
    {
      std::shared_lock lock(mutex_);
      if (auto it = layouts_.find(key); it != layouts_.end()) return it->second;
    }
    // Outside the lock: it calls the driver.
    auto layout = std::make_shared<const ParamLayout>(ask_driver(key, callee));
    if (layout->ask_again) return layout;  // a passing failure is not remembered
    std::unique_lock lock(mutex_);
    return layouts_.try_emplace(key, std::move(layout)).first->second;
  }
  void clear() {
    std::unique_lock lock(mutex_);
    layouts_.clear();
  }

 private:
  std::shared_mutex mutex_;
  std::unordered_map<const void*, std::shared_ptr<const ParamLayout>> layouts_;
};

// Every aligned word of `data` that points into a zicoum arena.
void scan(const void* data, size_t bytes, const Runtime& runtime, std::vector<const void*>* used) {
  if (data == nullptr) return;
  for (size_t offset = 0; offset + sizeof(uintptr_t) <= bytes && used->size() < kMaxPointers;
       offset += sizeof(uintptr_t)) {
    uintptr_t word = 0;
    std::memcpy(&word, static_cast<const char*>(data) + offset, sizeof word);
    const auto* pointer = reinterpret_cast<const void*>(word);
    if (runtime.owner_of(pointer) != nullptr) used->push_back(pointer);
  }
}

// The packed parameter buffer of a driver launch's `extra` list, if any.
void scan_extra(void** extra, const Runtime& runtime, std::vector<const void*>* used) {
  const void* buffer = nullptr;
  size_t bytes = 0;
  for (size_t i = 0; i < 64 && extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
    if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) buffer = extra[i + 1];
    if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE && extra[i + 1] != nullptr) {
      bytes = *static_cast<const size_t*>(extra[i + 1]);
    }
  }
  scan(buffer, bytes, runtime, used);
}

uint64_t mix(uint64_t h, uint64_t value) {
  h ^= value + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h;
}

std::atomic<uint64_t> g_launches{0};
std::atomic<uint64_t> g_launches_without_blocks{0};
std::atomic<uint64_t> g_copies{0};
std::atomic<bool> g_route_seen[3];

const char* route_name(Callee callee) {
  switch (callee) {
    case Callee::kFunction: return "the driver (cuLaunchKernel[Ex])";
    case Callee::kRuntimeStub: return "the runtime (cudaLaunchKernel[ExC])";
    case Callee::kLibraryKernel: return "CUDA 13's <<<...>>> (__cudaLaunchKernel)";
  }
  return "?";
}

// The runtime to announce work to, or nullptr where nothing is announced:
// not UM mode, or an explicit op of the caller's is open (it covers this work).
const Runtime* announcing_runtime() {
  const Runtime* runtime = Runtime::if_created();
  if (runtime == nullptr || runtime->config().mode != Mode::kUm || api_op_pending()) return nullptr;
  return runtime;
}

// Work queued on `stream` now would be captured into a graph: it runs at each
// replay, not now, and is not announced. Asks the driver, so it comes last.
bool capturing(CUstream stream) {
  return api_capture_state(StreamHandle{reinterpret_cast<uintptr_t>(stream)}) != CaptureState::kNone;
}

// Work captured into a CUDA graph is not announced, and neither are the
// graph's replays: under swapped pages (ZICO_UM_MEMORY=swap) a replay may
// touch a page that is not mapped. Said once, when the first capture is seen.
void warn_if_swapped_capture(const Runtime& runtime) {
  static std::atomic<bool> said{false};
  if (runtime.config().um_swap && !said.exchange(true, std::memory_order_relaxed)) {
    ZICO_LOG(kWarn, "a CUDA graph is being captured under ZICO_UM_MEMORY=swap: its replays are not announced, "
                    "so a page they touch may not be on the GPU (an illegal address); use ZICO_UM_MEMORY=managed "
                    "for jobs that replay graphs");
  }
}

// Whether an op using `used` began (and so must be ended); *refused: it
// must not be launched (api_op_refused). `kernel` names the kernel only: the
// pager adds the blocks it uses (exec_id.h), found as it resolves `used`
// anyway, so that launching costs no lookup more.
bool begin_op(uint64_t kernel, const void* const* used, size_t count, CUstream stream, bool* refused) {
  const bool begun = api_op_begin(kernel, used, count, 0, StreamHandle{reinterpret_cast<uintptr_t>(stream)},
                                  prefetch::GivenId::kKernel)
                         .is_ok() &&
                     api_op_pending();
  *refused = !begun && api_op_refused();
  return begun;
}

}  // namespace

LaunchCounts launch_counts() noexcept {
  return LaunchCounts{g_launches.load(std::memory_order_relaxed),
                      g_launches_without_blocks.load(std::memory_order_relaxed),
                      g_copies.load(std::memory_order_relaxed)};
}

uint64_t launch_id(const void* key, const LaunchShape& shape) noexcept {
  uint64_t h = mix(0, reinterpret_cast<uintptr_t>(key));
  for (const unsigned d : shape.grid) h = mix(h, d);
  for (const unsigned d : shape.block) h = mix(h, d);
  return h;
}

uint64_t copy_id(CopyOp kind, bool dst_is_zicoum, bool src_is_zicoum, size_t bytes) noexcept {
  // Tagged apart from every launch's ID, whose first word is a function's address.
  uint64_t h = mix(0, 0xc0b1ULL);
  h = mix(h, static_cast<uint64_t>(kind));
  h = mix(h, (dst_is_zicoum ? 1u : 0u) | (src_is_zicoum ? 2u : 0u));
  return mix(h, bytes);
}

void forget_launch_layouts() noexcept {
  try {
    Layouts::instance().clear();
  } catch (...) {
  }
}

ObservedLaunch::ObservedLaunch(const void* key, Callee callee, const LaunchShape& shape, void** args, void** extra,
                               CUstream stream) noexcept {
  try {
    const Runtime* runtime = announcing_runtime();
    if (runtime == nullptr) return;
    if (capturing(stream)) {
      warn_if_swapped_capture(*runtime);
      return;
    }
    thread_local std::vector<const void*> used;
    used.clear();
    const std::shared_ptr<const ParamLayout> layout = Layouts::instance().get(key, callee);
    if (args != nullptr && layout->known) {
      for (size_t i = 0; i < layout->sizes.size(); ++i) scan(args[i], layout->sizes[i], *runtime, &used);
    }
    if (extra != nullptr) scan_extra(extra, *runtime, &used);
    g_launches.fetch_add(1, std::memory_order_relaxed);
    // Which routes reach zicoum, said once each: a route that never shows is
    // one LD_PRELOAD does not reach, whose kernels fault their pages in unplanned.
    if (!g_route_seen[static_cast<size_t>(callee)].exchange(true, std::memory_order_relaxed)) {
      ZICO_LOG(kInfo, "UM mode: kernel launches seen through %s", route_name(callee));
    }
    if (used.empty()) {
      g_launches_without_blocks.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    begun_ = begin_op(launch_id(key, shape), used.data(), used.size(), stream, &refused_);
    if (refused_ && callee != Callee::kFunction) {
      ZICO_LOG(kError, "UM mode: a kernel launched through %s uses a swapped page the GPU would not take back; the "
                       "runtime API cannot be told, so it is launched (an illegal address follows)",
               route_name(callee));
    }
  } catch (...) {
    // Host memory for bookkeeping ran out (or a lock failed): the launch goes
    // unannounced, and its pages fault in.
  }
}

ObservedLaunch::~ObservedLaunch() {
  if (begun_) (void)api_op_end();
}

namespace {

// Reads a copy from the host into zicoum memory (of `allocator`) for the
// addresses a pointer table holds, and tells the pager what the destination's
// block reaches (or that it reaches nothing now).
void note_pointer_table(const Runtime& runtime, const DeviceAllocator& allocator, const void* dst, const void* src,
                        size_t bytes) {
  if (bytes > prefetch::kTableBytesRead) return;  // data, not a table
  prefetch::UmPager* pager = runtime.pager(allocator.device());
  if (pager == nullptr) return;
  thread_local std::vector<std::byte> host;
  thread_local std::vector<uintptr_t> targets;
  host.resize(bytes);
  // The call says the source is host memory; if it is not (device memory has
  // no CPU mapping), the read fails here instead of faulting.
  const iovec local{host.data(), bytes};
  const iovec remote{const_cast<void*>(src), bytes};
  if (process_vm_readv(::getpid(), &local, 1, &remote, 1, 0) != static_cast<ssize_t>(bytes)) return;
  prefetch::arena_addresses(host, reinterpret_cast<uintptr_t>(dst), allocator.arena(), &targets);
  pager->on_pointer_table(VaRange{reinterpret_cast<uintptr_t>(dst), bytes}, targets);
}

}  // namespace

ObservedCopy::ObservedCopy(CopyOp kind, const void* dst, const void* src, size_t bytes, CUstream stream) noexcept {
  try {
    if (bytes == 0) return;  // touches nothing
    const Runtime* runtime = announcing_runtime();
    if (runtime == nullptr) return;
    const DeviceAllocator* dst_owner = runtime->owner_of(dst);
    const bool dst_is_zicoum = dst_owner != nullptr;
    const bool src_is_zicoum = src != nullptr && runtime->owner_of(src) != nullptr;
    const void* used[2];
    size_t count = 0;
    if (dst_is_zicoum) used[count++] = dst;
    if (src_is_zicoum) used[count++] = src;
    if (count == 0) return;
    if (capturing(stream)) {
      warn_if_swapped_capture(*runtime);
      return;
    }
    g_copies.fetch_add(1, std::memory_order_relaxed);
    begun_ = begin_op(copy_id(kind, dst_is_zicoum, src_is_zicoum, bytes), used, count, stream, &refused_);
    // After the copy's own op: it writes the table, it does not read through
    // it. A refused copy writes nothing.
    if (kind == CopyOp::kFromHost && dst_is_zicoum && !src_is_zicoum && !refused_) {
      note_pointer_table(*runtime, *dst_owner, dst, src, bytes);
    }
  } catch (...) {
    // As for a launch: the copy goes unannounced, and the driver brings its pages in.
  }
}

ObservedCopy::~ObservedCopy() {
  if (begun_) (void)api_op_end();
}

}  // namespace zico
