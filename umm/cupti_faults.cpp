#include "cupti_faults.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <type_traits>
#include <unordered_set>
#include <vector>

#include "fault_correlator.h"
#include "log.h"

#if __has_include(<cupti_activity.h>)
#include <cupti_activity.h>
#define ZICO_HAVE_CUPTI_HEADERS 1
#endif

namespace zico {
namespace {

// The part of CUPTI's ABI used here (cupti_activity.h, cupti_result.h). The
// record fields read are each record's stable prefix: the same offsets in
// every CUpti_ActivityKernel from version 4 and every unified-memory counter
// record from version 2 on.
namespace abi {
constexpr int kSuccess = 0;
constexpr int kMaxLimitReached = 12;  // cuptiActivityGetNextRecord: no more records
constexpr int kKindDriver = 4;
constexpr int kKindRuntime = 5;
constexpr int kKindConcurrentKernel = 10;
constexpr int kKindUnifiedMemoryCounter = 25;
constexpr int kKindExternalCorrelation = 39;
constexpr uint32_t kCounterBytesHtoD = 1;
constexpr uint32_t kCounterGpuPageFault = 4;
constexpr uint32_t kCauseCoherence = 2;        // CUpti_ActivityUnifiedMemoryMigrationCause: a fault's migration
constexpr uint32_t kCauseDriverPrefetch = 3;   // the driver's own read-ahead around a fault
constexpr uint32_t kScopeProcessSingleDevice = 1;
constexpr int kExternalCustom2 = 5;
constexpr uint32_t kMinVersion = 18;  // CUDA 11.8's CUPTI
constexpr uint32_t kFlushForced = 1;

struct UnifiedMemoryCounterConfig {
  uint32_t scope;
  uint32_t kind;
  uint32_t device_id;
  uint32_t enable;
};

constexpr size_t kKernelStart = 16, kKernelEnd = 24, kKernelCorrelation = 92;
constexpr size_t kCounterKind = 4, kCounterStart = 16, kCounterAddress = 32, kCounterFlags = 56;
constexpr size_t kExternalKind = 4, kExternalId = 8, kExternalCorrelation = 16;

#ifdef ZICO_HAVE_CUPTI_HEADERS
static_assert(CUPTI_SUCCESS == kSuccess && CUPTI_ERROR_MAX_LIMIT_REACHED == kMaxLimitReached);
static_assert(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED == kFlushForced);
static_assert(CUPTI_ACTIVITY_KIND_DRIVER == kKindDriver && CUPTI_ACTIVITY_KIND_RUNTIME == kKindRuntime &&
              CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL == kKindConcurrentKernel &&
              CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER == kKindUnifiedMemoryCounter &&
              CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION == kKindExternalCorrelation);
static_assert(CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_GPU_PAGE_FAULT == kCounterGpuPageFault &&
              CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_HTOD == kCounterBytesHtoD &&
              CUPTI_ACTIVITY_UNIFIED_MEMORY_MIGRATION_CAUSE_COHERENCE == kCauseCoherence &&
              CUPTI_ACTIVITY_UNIFIED_MEMORY_MIGRATION_CAUSE_PREFETCH == kCauseDriverPrefetch &&
              CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_SCOPE_PROCESS_SINGLE_DEVICE == kScopeProcessSingleDevice &&
              CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2 == kExternalCustom2);
static_assert(sizeof(CUpti_ActivityUnifiedMemoryCounterConfig) == sizeof(UnifiedMemoryCounterConfig));
static_assert(offsetof(CUpti_ActivityKernel10, start) == kKernelStart &&
              offsetof(CUpti_ActivityKernel10, end) == kKernelEnd &&
              offsetof(CUpti_ActivityKernel10, correlationId) == kKernelCorrelation);
static_assert(offsetof(CUpti_ActivityUnifiedMemoryCounter3, counterKind) == kCounterKind &&
              offsetof(CUpti_ActivityUnifiedMemoryCounter3, start) == kCounterStart &&
              offsetof(CUpti_ActivityUnifiedMemoryCounter3, address) == kCounterAddress &&
              offsetof(CUpti_ActivityUnifiedMemoryCounter3, flags) == kCounterFlags);
static_assert(offsetof(CUpti_ActivityExternalCorrelation, externalKind) == kExternalKind &&
              offsetof(CUpti_ActivityExternalCorrelation, externalId) == kExternalId &&
              offsetof(CUpti_ActivityExternalCorrelation, correlationId) == kExternalCorrelation);
#endif

using RequestBuffer = void (*)(uint8_t** buffer, size_t* size, size_t* max_records);
using BufferDone = void (*)(void* context, uint32_t stream, uint8_t* buffer, size_t size, size_t valid);
}  // namespace abi

struct Api {
  int (*get_version)(uint32_t*) = nullptr;
  int (*result_string)(int, const char**) = nullptr;
  int (*register_callbacks)(abi::RequestBuffer, abi::BufferDone) = nullptr;
  int (*configure_counters)(abi::UnifiedMemoryCounterConfig*, uint32_t) = nullptr;
  int (*enable)(int) = nullptr;
  int (*disable)(int) = nullptr;
  int (*flush_all)(uint32_t) = nullptr;
  int (*next_record)(uint8_t*, size_t, void**) = nullptr;
  int (*push_external)(int, uint64_t) = nullptr;
  int (*pop_external)(int, uint64_t*) = nullptr;
};

// The process's one set of reports: CUPTI's callbacks carry no user data.
struct Shared {
  std::mutex mutex;
  Api api;
  FaultCorrelator correlator;
  std::vector<ManagedFault> waiting;           // resolved, for another device's take
  std::unordered_set<const uint8_t*> buffers;  // handed to CUPTI by request_buffer, not yet back
  // What CUPTI delivered, for the summary logged at exit.
  uint64_t buffers_back = 0;
  uint64_t unreadable_buffers = 0;
  uint64_t kernel_records = 0;
  uint64_t fault_records = 0;
  uint64_t fault_transfers = 0;  // host-to-device transfers a fault caused
  uint64_t tag_records = 0;
  uint64_t faults_told = 0;  // resolved, with or without their kernel's tag
  uint64_t faults_tagged = 0;
  uint32_t takes_without_buffers = 0;  // since a flush last handed a buffer back
};
constexpr uint32_t kForceAfterTakes = 4;
Shared* g_shared = nullptr;  // set once, under g_start_mutex, never freed
std::mutex g_start_mutex;
CuptiFaults* g_instance = nullptr;

constexpr size_t kBufferBytes = size_t{1} << 20;

void request_buffer(uint8_t** buffer, size_t* size, size_t* max_records) {
  // CUPTI needs 8-byte alignment; none (a null buffer) drops records.
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = 0;
  *max_records = 0;
  if (*buffer == nullptr) return;
  std::lock_guard lock(g_shared->mutex);
  try {
    g_shared->buffers.insert(*buffer);
  } catch (const std::bad_alloc&) {
    std::free(*buffer);
    *buffer = nullptr;
    return;
  }
  *size = kBufferBytes;
}

// A host-to-device transfer that a GPU page fault caused: the fault's own
// migration, or the driver's read-ahead around it (cuMemPrefetchAsync's,
// zicoum's own, are the user's and not counted). Some platforms report no
// GPU page-fault records at all (an H100 and an H200, driver 580, CUDA 13's
// CUPTI: none, though these transfers came), so a kernel's faults are read
// from both; a page told twice is learnt once.
bool fault_caused(uint32_t migration_cause) {
  return migration_cause == abi::kCauseCoherence || migration_cause == abi::kCauseDriverPrefetch;
}

template <typename T>
T field(const uint8_t* record, size_t offset) {
  T value;
  std::memcpy(&value, record + offset, sizeof value);
  return value;
}

void buffer_done(void*, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  Shared& shared = *g_shared;
  {
    std::lock_guard lock(shared.mutex);
    ++shared.buffers_back;
    void* record = nullptr;
    int result = abi::kSuccess;
    while ((result = shared.api.next_record(buffer, valid, &record)) == abi::kSuccess) {
      const auto* bytes = static_cast<const uint8_t*>(record);
      try {
        switch (field<int32_t>(bytes, 0)) {
          case abi::kKindConcurrentKernel: {
            const auto start = field<uint64_t>(bytes, abi::kKernelStart);
            const auto end = field<uint64_t>(bytes, abi::kKernelEnd);
            if (end == 0 || end < start) break;  // handed over by a forced flush before it ran
            ++shared.kernel_records;
            shared.correlator.add_kernel(field<uint32_t>(bytes, abi::kKernelCorrelation), start, end);
            break;
          }
          case abi::kKindUnifiedMemoryCounter:
            if (const auto kind = field<uint32_t>(bytes, abi::kCounterKind); kind == abi::kCounterGpuPageFault) {
              ++shared.fault_records;
            } else if (kind == abi::kCounterBytesHtoD && fault_caused(field<uint32_t>(bytes, abi::kCounterFlags))) {
              ++shared.fault_transfers;
            } else {
              break;
            }
            shared.correlator.add_fault(field<uint64_t>(bytes, abi::kCounterStart),
                                        static_cast<uintptr_t>(field<uint64_t>(bytes, abi::kCounterAddress)));
            break;
          case abi::kKindExternalCorrelation:
            if (field<int32_t>(bytes, abi::kExternalKind) == abi::kExternalCustom2) {
              ++shared.tag_records;
              shared.correlator.add_tag(field<uint32_t>(bytes, abi::kExternalCorrelation),
                                        field<uint64_t>(bytes, abi::kExternalId));
            }
            break;
          default: break;
        }
      } catch (const std::bad_alloc&) {
        break;  // what is left of this buffer is lost; the pager learns it from a later iteration
      }
    }
    if (result != abi::kMaxLimitReached && result != abi::kSuccess) ++shared.unreadable_buffers;
    // Another tool's buffer (its callbacks were replaced by these) is its own to free.
    if (shared.buffers.erase(buffer) == 0) return;
  }
  std::free(buffer);
}

const char* result_name(const Api& api, int result) {
  const char* name = nullptr;
  if (api.result_string != nullptr && api.result_string(result, &name) == abi::kSuccess && name != nullptr) return name;
  return "an unknown CUPTI error";
}

// libcupti: the one already loaded, else one the loader finds.
void* open_cupti(std::string* why) {
  static const char* const kNames[] = {"libcupti.so.13", "libcupti.so.12", "libcupti.so"};
  for (const char* name : kNames) {
    if (void* library = dlopen(name, RTLD_NOW | RTLD_NOLOAD)) return library;
  }
  for (const char* name : kNames) {
    if (void* library = dlopen(name, RTLD_NOW | RTLD_LOCAL)) return library;
  }
  *why = "libcupti is not loaded and the loader finds none (libcupti.so.13, .12, libcupti.so); add CUPTI's folder to "
         "LD_LIBRARY_PATH";
  return nullptr;
}

bool resolve(void* library, Api* api, std::string* why) {
  const auto get = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(library, name));
    if (fn == nullptr && why->empty()) *why = std::string("libcupti has no ") + name;
  };
  get(api->get_version, "cuptiGetVersion");
  get(api->result_string, "cuptiGetResultString");
  get(api->register_callbacks, "cuptiActivityRegisterCallbacks");
  get(api->configure_counters, "cuptiActivityConfigureUnifiedMemoryCounter");
  get(api->enable, "cuptiActivityEnable");
  get(api->disable, "cuptiActivityDisable");
  get(api->flush_all, "cuptiActivityFlushAll");
  get(api->next_record, "cuptiActivityGetNextRecord");
  get(api->push_external, "cuptiActivityPushExternalCorrelationId");
  get(api->pop_external, "cuptiActivityPopExternalCorrelationId");
  return why->empty();
}

// Configures `ordinal`'s fault counter and enables the kinds; on a refusal
// disables again what it enabled.
bool enable(const Api& api, int ordinal, std::string* why) {
  const auto device = static_cast<uint32_t>(ordinal);
  abi::UnifiedMemoryCounterConfig config[] = {{abi::kScopeProcessSingleDevice, abi::kCounterGpuPageFault, device, 1},
                                              {abi::kScopeProcessSingleDevice, abi::kCounterBytesHtoD, device, 1}};
  if (int r = api.configure_counters(config, static_cast<uint32_t>(std::size(config))); r != abi::kSuccess) {
    *why = std::string("CUPTI refused to count unified-memory faults (") + result_name(api, r) + ")";
    return false;
  }
  // External correlations are written against API records: without the
  // driver's and runtime's a kernel's tag never reaches its correlation ID.
  static constexpr int kKinds[] = {abi::kKindUnifiedMemoryCounter, abi::kKindConcurrentKernel,
                                   abi::kKindExternalCorrelation, abi::kKindDriver, abi::kKindRuntime};
  for (size_t i = 0; i < std::size(kKinds); ++i) {
    if (int r = api.enable(kKinds[i]); r != abi::kSuccess) {
      *why = "CUPTI refused activity records of kind " + std::to_string(kKinds[i]) + " (" + result_name(api, r) + ")";
      while (i-- > 0) (void)api.disable(kKinds[i]);
      return false;
    }
  }
  return true;
}

// One line at exit: whether CUPTI's records arrived and what they told.
// Never waits: an exit from a signal handler, or a forked child, may find
// the mutex held.
void log_summary() {
  if (!log_enabled(LogLevel::kInfo)) return;
  Shared& shared = *g_shared;
  std::unique_lock lock(shared.mutex, std::try_to_lock);
  if (!lock.owns_lock()) return;
  ZICO_LOG(kInfo,
           "paging: CUPTI handed back %llu buffers (%llu unreadable): %llu kernel runs, %llu GPU page faults, %llu "
           "transfers faults caused, %llu launch tags; %llu faults told, %llu of them with their kernel's tag, %zu "
           "waiting, %llu records dropped",
           static_cast<unsigned long long>(shared.buffers_back),
           static_cast<unsigned long long>(shared.unreadable_buffers),
           static_cast<unsigned long long>(shared.kernel_records),
           static_cast<unsigned long long>(shared.fault_records),
           static_cast<unsigned long long>(shared.fault_transfers), static_cast<unsigned long long>(shared.tag_records),
           static_cast<unsigned long long>(shared.faults_told), static_cast<unsigned long long>(shared.faults_tagged),
           shared.correlator.waiting(), static_cast<unsigned long long>(shared.correlator.dropped()));
}

}  // namespace

CuptiFaults* CuptiFaults::start(int ordinal, std::string* why) noexcept {
  std::string reason;
  std::lock_guard lock(g_start_mutex);
  try {
    if (g_shared == nullptr) {
      void* library = open_cupti(&reason);
      if (library == nullptr) {
        if (why != nullptr) *why = reason;
        return nullptr;
      }
      Api api;
      uint32_t version = 0;
      if (!resolve(library, &api, &reason) || api.get_version(&version) != abi::kSuccess ||
          version < abi::kMinVersion) {
        if (reason.empty()) reason = "libcupti's API version " + std::to_string(version) + " is older than 18 (CUDA 11.8)";
        if (why != nullptr) *why = reason;
        return nullptr;
      }
      auto* shared = new Shared;
      shared->api = api;
      g_shared = shared;  // before CUPTI can call back
      if (int r = api.register_callbacks(&request_buffer, &buffer_done); r != abi::kSuccess) {
        g_shared = nullptr;
        delete shared;
        if (why != nullptr) *why = std::string("CUPTI refused its buffer callbacks (") + result_name(api, r) + ")";
        return nullptr;
      }
    }
    if (!enable(g_shared->api, ordinal, &reason)) {
      if (why != nullptr) *why = reason;
      return nullptr;
    }
    if (g_instance == nullptr) {
      g_instance = new CuptiFaults;
      std::atexit(log_summary);
    }
    ZICO_LOG(kInfo, "paging: CUPTI reports device %d's unified-memory faults", ordinal);
    return g_instance;
  } catch (const std::bad_alloc&) {
    if (why != nullptr) *why = "out of host memory";
    return nullptr;
  }
}

void CuptiFaults::push_tag(uint64_t tag) noexcept { (void)g_shared->api.push_external(abi::kExternalCustom2, tag); }

void CuptiFaults::pop_tag() noexcept {
  uint64_t last = 0;
  (void)g_shared->api.pop_external(abi::kExternalCustom2, &last);
}

Status CuptiFaults::take(VaRange range, std::vector<ManagedFault>* out) noexcept {
  // A default flush hands back the buffers whose every record is complete;
  // one that also collects the runtime's and driver's calls may stay
  // incomplete while the job runs, so after kForceAfterTakes takes that got
  // nothing a forced flush hands it over anyway. Forcing costs the records
  // still open in it: a kernel queued but not run yet comes without its
  // times (skipped), and the faults it causes go untagged.
  uint64_t buffers_before = 0;
  {
    std::lock_guard lock(g_shared->mutex);
    buffers_before = g_shared->buffers_back;
  }
  (void)g_shared->api.flush_all(0);
  std::unique_lock lock(g_shared->mutex);
  if (g_shared->buffers_back != buffers_before) {
    g_shared->takes_without_buffers = 0;
  } else if (++g_shared->takes_without_buffers >= kForceAfterTakes) {
    g_shared->takes_without_buffers = 0;
    lock.unlock();  // CUPTI calls buffer_done, which takes the mutex, from inside the flush
    (void)g_shared->api.flush_all(abi::kFlushForced);
    lock.lock();
  }
  std::vector<ManagedFault>& waiting = g_shared->waiting;
  try {
    const size_t before = waiting.size();
    g_shared->correlator.resolve(&waiting);
    g_shared->faults_told += waiting.size() - before;
    g_shared->faults_tagged += static_cast<uint64_t>(std::count_if(
        waiting.begin() + static_cast<std::ptrdiff_t>(before), waiting.end(),
        [](const ManagedFault& fault) { return fault.tag != 0; }));
    if (waiting.size() > kMaxWaiting) waiting.erase(waiting.begin(), waiting.end() - kMaxWaiting);
    take_reports_in(range, &waiting, out);
  } catch (const std::bad_alloc&) {
    return Status(Errc::kOutOfMemory);
  }
  return Status::ok();
}

}  // namespace zico
