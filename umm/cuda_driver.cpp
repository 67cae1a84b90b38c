#include "cuda_driver.h"

#include <cstring>

#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <link.h>

#include <atomic>
#include <cctype>
#include <cstdarg>
#include <cstdio>
#include <new>
#include <utility>

#include "cupti_faults.h"

namespace zico {

// Entry points as (base name, CUDA version). The version is the suffix of the
// PFN typedef, and asking cuGetProcAddress for exactly that version returns
// exactly that ABI: a newer driver cannot hand back a variant whose signature
// differs (cuCtxSynchronize at 13000 takes a context), and an older driver
// still resolves everything it has.
#define ZICO_CU_REQUIRED(X)                       \
  X(cuDriverGetVersion, 2020)                     \
  X(cuGetErrorName, 6000)                         \
  X(cuDeviceGet, 2000)                            \
  X(cuDeviceGetCount, 2000)                       \
  X(cuDeviceGetAttribute, 2000)                   \
  X(cuDeviceTotalMem, 3020)                       \
  X(cuDeviceGetPCIBusId, 4010)                    \
  X(cuDeviceGetUuid, 11040)                       \
  X(cuMemHostRegister, 6050)                      \
  X(cuMemHostUnregister, 4000)                    \
  X(cuDevicePrimaryCtxRetain, 7000)               \
  X(cuDevicePrimaryCtxRelease, 11000)             \
  X(cuCtxGetCurrent, 4000)                        \
  X(cuCtxGetDevice, 2000)                         \
  X(cuCtxSetCurrent, 4000)                        \
  X(cuCtxSynchronize, 2000)                       \
  X(cuMemGetInfo, 3020)                           \
  X(cuMemAddressReserve, 10020)                   \
  X(cuMemAddressFree, 10020)                      \
  X(cuMemCreate, 10020)                           \
  X(cuMemRelease, 10020)                          \
  X(cuMemMap, 10020)                              \
  X(cuMemUnmap, 10020)                            \
  X(cuMemSetAccess, 10020)                        \
  X(cuMemExportToShareableHandle, 10020)          \
  X(cuMemImportFromShareableHandle, 10020)        \
  X(cuMemGetAllocationGranularity, 10020)         \
  X(cuMemGetAllocationPropertiesFromHandle, 10020) \
  X(cuStreamCreate, 2000)                         \
  X(cuStreamDestroy, 4000)                        \
  X(cuStreamSynchronize, 2000)                    \
  X(cuStreamIsCapturing, 10000)                   \
  X(cuEventCreate, 2000)                          \
  X(cuEventDestroy, 4000)                         \
  X(cuEventRecord, 2000)                          \
  X(cuEventQuery, 2000)                           \
  X(cuEventSynchronize, 2000)                     \
  X(cuStreamWaitEvent, 3020)                      \
  X(cuMemcpyHtoDAsync, 3020)                      \
  X(cuMemcpyDtoHAsync, 3020)                      \
  X(cuMemcpyDtoDAsync, 3020)                      \
  X(cuMemsetD8Async, 3020)                        \
  X(cuMemAllocManaged, 6000)                      \
  X(cuMemFree, 3020)

// Missing from older drivers; the methods using them report kNotSupported.
// The location-taking advise/prefetch arrived in 12.2, batched prefetch and discard in 13.0.
#define ZICO_CU_OPTIONAL(X)  \
  X(cuMemAdvise, 12020)      \
  X(cuMemPrefetchAsync, 12020) \
  X(cuMemPrefetchBatchAsync, 13000) \
  X(cuMemDiscardBatchAsync, 13000) \
  X(cuMemDiscardAndPrefetchBatchAsync, 13000)

struct CudaDriver::Api {
#define ZICO_CU_FIELD(name, version) PFN_##name##_v##version name = nullptr;
  ZICO_CU_REQUIRED(ZICO_CU_FIELD)
  ZICO_CU_OPTIONAL(ZICO_CU_FIELD)
#undef ZICO_CU_FIELD
};

struct CudaDriver::Device {
  CUdevice handle = 0;
  std::atomic<CUcontext> context{nullptr};  // written once, under mu_
  bool caps_known = false;                  // under mu_
  Capabilities caps;                        // under mu_
};

// Switching a thread to another device's context and leaving it there would
// change what cudaGetDevice() returns to the application we sit under.
class CudaDriver::ContextScope {
 public:
  ContextScope() = default;
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;
  ~ContextScope() {
    if (set_current_ != nullptr) (void)set_current_(previous_);
  }
  void restore_later(PFN_cuCtxSetCurrent_v4000 set_current, CUcontext previous) {
    set_current_ = set_current;
    previous_ = previous;
  }

 private:
  PFN_cuCtxSetCurrent_v4000 set_current_ = nullptr;
  CUcontext previous_ = nullptr;
};

namespace {

constexpr const char* kLibrary = "libcuda.so.1";

// Set once a driver has resolved cuGetErrorName; libcuda is never unloaded
// after cuInit, so the pointer stays valid for the life of the process.
std::atomic<PFN_cuGetErrorName_v6000> g_error_name{nullptr};

__attribute__((format(printf, 2, 3))) void explain(std::string* why, const char* format, ...) noexcept {
  if (why == nullptr) return;
  char text[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(text, sizeof text, format, args);
  va_end(args);
  try {
    why->assign(text);
  } catch (...) {
    // Out of memory while explaining a failure: the Status still says what happened.
  }
}

const char* loaded_path(void* library) noexcept {
  link_map* map = nullptr;
  if (dlinfo(library, RTLD_DI_LINKMAP, &map) != 0 || map == nullptr || map->l_name == nullptr) return kLibrary;
  return map->l_name[0] != '\0' ? map->l_name : kLibrary;
}

// Unifies cuGetProcAddress_v2 and the 11.3-era variant without symbolStatus.
struct ProcResolver {
  PFN_cuGetProcAddress_v12000 v2 = nullptr;
  PFN_cuGetProcAddress_v11030 v1 = nullptr;

  void* find(const char* symbol, int version) const noexcept {
    void* fn = nullptr;
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    // Legacy-stream variants: a zero StreamHandle means the legacy default stream.
    CUresult result = v2 != nullptr ? v2(symbol, &fn, version, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &found)
                                    : v1(symbol, &fn, version, CU_GET_PROC_ADDRESS_LEGACY_STREAM);
    if (v2 == nullptr && result == CUDA_SUCCESS) found = CU_GET_PROC_ADDRESS_SUCCESS;
    return result == CUDA_SUCCESS && found == CU_GET_PROC_ADDRESS_SUCCESS ? fn : nullptr;
  }
};

const char* init_hint(CUresult result) noexcept {
  switch (result) {
    case CUDA_ERROR_STUB_LIBRARY: return ": the toolkit's stub libcuda was loaded instead of the driver";
    case CUDA_ERROR_NO_DEVICE: return ": no GPU is visible (check CUDA_VISIBLE_DEVICES and the container's device access)";
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH: return ": libcuda.so.1 and the NVIDIA kernel module are different versions";
    case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE: return ": the forward-compatibility libcuda does not support this GPU";
    default: return "";
  }
}

CUdeviceptr device_ptr(const void* ptr) noexcept { return static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(ptr)); }
CUstream cu_stream(StreamHandle stream) noexcept { return reinterpret_cast<CUstream>(stream.value); }
CUevent cu_event(EventHandle event) noexcept { return reinterpret_cast<CUevent>(event.value); }

CUmemLocation device_location(DeviceId device) noexcept {
  CUmemLocation location{};
  location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  location.id = device.value;
  return location;
}

// Where a prefetch sends its pages: the host, or a device (kNoDevice when
// `device_valid` is false).
Status prefetch_location(PrefetchTarget target, bool device_valid, CUmemLocation* location) noexcept {
  if (target.to_host) {
    *location = CUmemLocation{};
    location->type = CU_MEM_LOCATION_TYPE_HOST;
    return Status::ok();
  }
  if (!device_valid) return Errc::kNoDevice;
  *location = device_location(target.device);
  return Status::ok();
}

// What every chunk is created with; the granularity is asked with the same,
// since the handle type and flags can change it.
CUmemAllocationProp chunk_properties(DeviceId device, const Capabilities& caps) noexcept {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location = device_location(device);
  prop.requestedHandleTypes = caps.posix_fd_export ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
  // Registrable by NICs (NCCL without cuMem, UCX, CUDA-aware MPI) and GPUDirect Storage.
  prop.allocFlags.gpuDirectRDMACapable = caps.gpu_direct_rdma ? 1 : 0;
  return prop;
}

}  // namespace

Status from_cu(int result) noexcept {
  switch (result) {
    case CUDA_SUCCESS: return Status::ok();
    case CUDA_ERROR_OUT_OF_MEMORY: return {Errc::kOutOfMemory, result};
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_INVALID_HANDLE:
    case CUDA_ERROR_NOT_MAPPED:
    case CUDA_ERROR_ALREADY_MAPPED:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE: return {Errc::kInvalidArgument, result};
    case CUDA_ERROR_NOT_SUPPORTED:
    case CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER: return {Errc::kNotSupported, result};
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_INVALID_DEVICE: return {Errc::kNoDevice, result};
    // CUDA 13's cuda.h drops CUDA_ERROR_INSUFFICIENT_DRIVER; these are its successors.
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_STUB_LIBRARY:
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
    case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE: return {Errc::kNoDriver, result};
    default: return {Errc::kDriverError, result};
  }
}

const char* cu_result_name(int result) noexcept {
  // CUresult's values fit in 0..1023; outside that the cast below would be undefined.
  if (result >= 0 && result < 1024) {
    const char* name = nullptr;
    PFN_cuGetErrorName_v6000 get_name = g_error_name.load(std::memory_order_acquire);
    if (get_name != nullptr && get_name(static_cast<CUresult>(result), &name) == CUDA_SUCCESS && name != nullptr) {
      return name;
    }
  }
  // The failures open() reports come before cuGetErrorName is usable.
  switch (result) {
    case CUDA_SUCCESS: return "CUDA_SUCCESS";
    case CUDA_ERROR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case CUDA_ERROR_OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
    case CUDA_ERROR_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
    case CUDA_ERROR_DEINITIALIZED: return "CUDA_ERROR_DEINITIALIZED";
    case CUDA_ERROR_STUB_LIBRARY: return "CUDA_ERROR_STUB_LIBRARY";
    case CUDA_ERROR_DEVICE_UNAVAILABLE: return "CUDA_ERROR_DEVICE_UNAVAILABLE";
    case CUDA_ERROR_NO_DEVICE: return "CUDA_ERROR_NO_DEVICE";
    case CUDA_ERROR_INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
    case CUDA_ERROR_OPERATING_SYSTEM: return "CUDA_ERROR_OPERATING_SYSTEM";
    case CUDA_ERROR_NOT_SUPPORTED: return "CUDA_ERROR_NOT_SUPPORTED";
    case CUDA_ERROR_SYSTEM_NOT_READY: return "CUDA_ERROR_SYSTEM_NOT_READY";
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH: return "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH";
    case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE: return "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE";
    case CUDA_ERROR_UNKNOWN: return "CUDA_ERROR_UNKNOWN";
    default: return "CUDA_ERROR_(unnamed)";
  }
}

// --- construction ------------------------------------------------------------

Status CudaDriver::open(std::unique_ptr<Driver>* out, std::string* why) noexcept {
  if (out == nullptr) return Errc::kInvalidArgument;
  out->reset();

  (void)dlerror();
  void* library = dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* error = dlerror();
    explain(why, "dlopen(%s) failed: %s; is the NVIDIA driver installed?", kLibrary,
            error != nullptr ? error : "unknown error");
    return Errc::kNoDriver;
  }

  ProcResolver resolver;
  resolver.v2 = reinterpret_cast<PFN_cuGetProcAddress_v12000>(dlsym(library, "cuGetProcAddress_v2"));
  if (resolver.v2 == nullptr) {
    resolver.v1 = reinterpret_cast<PFN_cuGetProcAddress_v11030>(dlsym(library, "cuGetProcAddress"));
  }
  // cuInit is documented as the first driver call, so it comes from dlsym (its
  // ABI has never changed) and nothing is resolved through the driver before it.
  auto init = reinterpret_cast<PFN_cuInit_v2000>(dlsym(library, "cuInit"));
  if (init == nullptr || (resolver.v2 == nullptr && resolver.v1 == nullptr)) {
    explain(why, "%s (%s) exports no cuGetProcAddress/cuInit; the driver predates CUDA 11.3", kLibrary,
            loaded_path(library));
    dlclose(library);
    return Errc::kNoDriver;
  }

  CUresult result = init(0);
  // From here on libcuda is never dlclosed: after cuInit it owns threads and
  // state that unloading would pull out from under them (and the runtime).
  if (result != CUDA_SUCCESS) {
    // The loaded file's path is the diagnosis when the wrong libcuda won the search.
    bool show_path = result == CUDA_ERROR_STUB_LIBRARY || result == CUDA_ERROR_SYSTEM_DRIVER_MISMATCH ||
                     result == CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE;
    explain(why, "cuInit failed: %s (%d)%s%s%s%s", cu_result_name(result), static_cast<int>(result),
            init_hint(result), show_path ? " (" : "", show_path ? loaded_path(library) : "", show_path ? ")" : "");
    return from_cu(result);
  }

  std::unique_ptr<Api> api(new (std::nothrow) Api);
  if (api == nullptr) return Errc::kOutOfMemory;
  const char* missing = nullptr;
  int missing_version = 0;
#define ZICO_CU_RESOLVE(name, version)                                                      \
  api->name = reinterpret_cast<PFN_##name##_v##version>(resolver.find(#name, version));     \
  if (api->name == nullptr && missing == nullptr) {                                         \
    missing = #name;                                                                        \
    missing_version = version;                                                              \
  }
  ZICO_CU_REQUIRED(ZICO_CU_RESOLVE)
#undef ZICO_CU_RESOLVE
  int driver_version = 0;
  if (api->cuDriverGetVersion == nullptr || api->cuDriverGetVersion(&driver_version) != CUDA_SUCCESS) {
    driver_version = 0;
  }
  // Only from a driver at least that new: an older one may answer with its
  // newest variant below the version asked for, whose arguments differ
  // (cuMemAdvise before 12.2 takes a device, not a location).
#define ZICO_CU_RESOLVE_OPTIONAL(name, version)                                                      \
  api->name = driver_version >= (version)                                                            \
                  ? reinterpret_cast<PFN_##name##_v##version>(resolver.find(#name, version))         \
                  : nullptr;
  ZICO_CU_OPTIONAL(ZICO_CU_RESOLVE_OPTIONAL)
#undef ZICO_CU_RESOLVE_OPTIONAL

  if (missing != nullptr) {
    explain(why, "%s lacks %s (CUDA %d.%d ABI) while the driver reports CUDA %d.%d; update the NVIDIA driver",
            loaded_path(library), missing, missing_version / 1000, missing_version % 1000 / 10,
            driver_version / 1000, driver_version % 1000 / 10);
    return Errc::kNoDriver;
  }
  g_error_name.store(api->cuGetErrorName, std::memory_order_release);

  int count = 0;
  result = api->cuDeviceGetCount(&count);
  if (result != CUDA_SUCCESS || count <= 0) {
    explain(why, "cuDeviceGetCount found no usable device: %s (%d)", cu_result_name(result),
            static_cast<int>(result));
    return result != CUDA_SUCCESS ? from_cu(result) : Status(Errc::kNoDevice);
  }
  std::unique_ptr<Device[]> devices(new (std::nothrow) Device[count]);
  if (devices == nullptr) return Errc::kOutOfMemory;
  for (int i = 0; i < count; ++i) {
    result = api->cuDeviceGet(&devices[i].handle, i);
    if (result != CUDA_SUCCESS) {
      explain(why, "cuDeviceGet(%d) failed: %s (%d)", i, cu_result_name(result), static_cast<int>(result));
      return from_cu(result);
    }
  }

  out->reset(new (std::nothrow) CudaDriver(std::move(api), std::move(devices), count));
  if (*out == nullptr) return Errc::kOutOfMemory;
  return Status::ok();
}

CudaDriver::CudaDriver(std::unique_ptr<const Api> api, std::unique_ptr<Device[]> devices, int count) noexcept
    : api_(std::move(api)), devices_(std::move(devices)), device_count_(count) {}

CudaDriver::~CudaDriver() {
  // Fails harmlessly with CUDA_ERROR_DEINITIALIZED if the driver shut down first at exit.
  for (int i = 0; i < device_count_; ++i) {
    if (devices_[i].context.load(std::memory_order_acquire) != nullptr) {
      (void)api_->cuDevicePrimaryCtxRelease(devices_[i].handle);
    }
  }
}

// --- contexts and capabilities -----------------------------------------------

bool CudaDriver::valid(DeviceId device) const noexcept { return device.value >= 0 && device.value < device_count_; }

Status CudaDriver::retained_context(DeviceId device, CUcontext* context) noexcept {
  if (!valid(device)) return Errc::kNoDevice;
  Device& slot = devices_[device.value];
  *context = slot.context.load(std::memory_order_acquire);
  if (*context != nullptr) return Status::ok();
  std::lock_guard<std::mutex> lock(mu_);
  *context = slot.context.load(std::memory_order_relaxed);
  if (*context != nullptr) return Status::ok();
  ZICO_RETURN_IF_ERROR(from_cu(api_->cuDevicePrimaryCtxRetain(context, slot.handle)));
  slot.context.store(*context, std::memory_order_release);
  return Status::ok();
}

Status CudaDriver::enter(DeviceId device, ContextScope* scope) noexcept {
  CUcontext wanted = nullptr;
  ZICO_RETURN_IF_ERROR(retained_context(device, &wanted));
  CUcontext current = nullptr;
  ZICO_RETURN_IF_ERROR(from_cu(api_->cuCtxGetCurrent(&current)));
  if (current == wanted) return Status::ok();
  ZICO_RETURN_IF_ERROR(from_cu(api_->cuCtxSetCurrent(wanted)));
  scope->restore_later(api_->cuCtxSetCurrent, current);
  return Status::ok();
}

Status CudaDriver::enter_any(ContextScope* scope) noexcept {
  CUcontext current = nullptr;
  ZICO_RETURN_IF_ERROR(from_cu(api_->cuCtxGetCurrent(&current)));
  if (current != nullptr) return Status::ok();
  return enter(DeviceId{0}, scope);
}

// The NUMA node of the device's PCI slot, from sysfs; -1 when unknown.
int CudaDriver::numa_node_of(int device_handle) const noexcept {
  char bus_id[32] = {};
  if (api_->cuDeviceGetPCIBusId(bus_id, sizeof bus_id, device_handle) != CUDA_SUCCESS) return -1;
  for (char* c = bus_id; *c != '\0'; ++c) *c = static_cast<char>(std::tolower(static_cast<unsigned char>(*c)));
  char path[96];
  std::snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/numa_node", bus_id);
  std::FILE* file = std::fopen(path, "r");
  if (file == nullptr) return -1;
  int node = -1;
  if (std::fscanf(file, "%d", &node) != 1) node = -1;
  std::fclose(file);
  return node;
}

Status CudaDriver::device_caps(DeviceId device, Capabilities* caps) noexcept {
  if (!valid(device)) return Errc::kNoDevice;
  Device& slot = devices_[device.value];
  std::lock_guard<std::mutex> lock(mu_);
  if (!slot.caps_known) {
    Capabilities found;
    int fd_export = 0;
    int managed = 0;
    int rdma = 0;
    int vmm = 0;
    ZICO_RETURN_IF_ERROR(from_cu(
        api_->cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, slot.handle)));
    found.virtual_memory = vmm != 0;
    ZICO_RETURN_IF_ERROR(from_cu(api_->cuDeviceGetAttribute(
        &fd_export, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, slot.handle)));
    ZICO_RETURN_IF_ERROR(from_cu(api_->cuDeviceGetAttribute(&managed, CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, slot.handle)));
    // Unknown to old drivers: then not supported.
    if (api_->cuDeviceGetAttribute(&rdma, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, slot.handle) !=
        CUDA_SUCCESS) {
      rdma = 0;
    }
    ZICO_RETURN_IF_ERROR(from_cu(api_->cuDeviceTotalMem(&found.total_memory, slot.handle)));
    found.posix_fd_export = fd_export != 0;
    found.managed_memory = managed != 0;
    found.gpu_direct_rdma = rdma != 0;
    // cuMemDiscardBatchAsync needs concurrent managed access on every device.
    bool concurrent_everywhere = true;
    for (int i = 0; i < device_count_; ++i) {
      int concurrent = 0;
      if (api_->cuDeviceGetAttribute(&concurrent, CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, devices_[i].handle) !=
              CUDA_SUCCESS ||
          concurrent == 0) {
        concurrent_everywhere = false;
      } else if (devices_[i].handle == slot.handle) {
        found.concurrent_managed_access = found.managed_memory;
      }
    }
    found.discard = found.managed_memory && concurrent_everywhere && api_->cuMemDiscardBatchAsync != nullptr;
    found.discard_releases_device_pages = found.discard;
    found.numa_node = numa_node_of(slot.handle);
    CUuuid uuid{};
    ZICO_RETURN_IF_ERROR(from_cu(api_->cuDeviceGetUuid(&uuid, slot.handle)));
    std::memcpy(found.uuid.data(), uuid.bytes, found.uuid.size());
    // Same properties create() uses: the handle type can change the granularity.
    CUmemAllocationProp prop = chunk_properties(device, found);
    if (found.virtual_memory) {
      ZICO_RETURN_IF_ERROR(from_cu(
          api_->cuMemGetAllocationGranularity(&found.granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)));
    }
    slot.caps = found;
    slot.caps_known = true;
  }
  *caps = slot.caps;
  return Status::ok();
}

// --- Driver ------------------------------------------------------------------

const char* CudaDriver::name() const noexcept { return "cuda"; }

Status CudaDriver::device_count(int* count) noexcept {
  if (count == nullptr) return Errc::kInvalidArgument;
  *count = device_count_;
  return Status::ok();
}

Status CudaDriver::capabilities(DeviceId device, Capabilities* caps) noexcept {
  if (caps == nullptr) return Errc::kInvalidArgument;
  return device_caps(device, caps);
}

Status CudaDriver::memory_info(DeviceId device, size_t* free_bytes, size_t* total_bytes) noexcept {
  if (free_bytes == nullptr || total_bytes == nullptr) return Errc::kInvalidArgument;
  ContextScope scope;
  ZICO_RETURN_IF_ERROR(enter(device, &scope));
  return from_cu(api_->cuMemGetInfo(free_bytes, total_bytes));
}

Status CudaDriver::current_device(DeviceId* out) noexcept {
  if (out == nullptr) return Errc::kInvalidArgument;
  CUcontext current = nullptr;
  ZICO_RETURN_IF_ERROR(from_cu(api_->cuCtxGetCurrent(&current)));
  if (current == nullptr) return Errc::kNotFound;
  CUdevice device = 0;
  ZICO_RETURN_IF_ERROR(from_cu(api_->cuCtxGetDevice(&device)));
  *out = DeviceId{device};
  return Status::ok();
}

Status CudaDriver::reserve(DeviceId device, size_t bytes, size_t alignment, VaRange* out) noexcept {
  if (out == nullptr || bytes == 0) return Errc::kInvalidArgument;
  Capabilities caps;
  ZICO_RETURN_IF_ERROR(device_caps(device, &caps));
  if (alignment == 0) alignment = caps.granularity;
  if ((alignment & (alignment - 1)) != 0 || alignment < caps.granularity) return Errc::kInvalidArgument;
  ContextScope scope;
  ZICO_RETURN_IF_ERROR(enter(device, &scope));
  CUdeviceptr base = 0;
  ZICO_RETURN_IF_ERROR(from_cu(api_->cuMemAddressReserve(&base, bytes, alignment, 0, 0)));
  *out = VaRange{static_cast<uintptr_t>(base), bytes};
  return Status::ok();
}

Status CudaDriver::unreserve(VaRange range) noexcept {
  ContextScope scope;
  ZICO_RETURN_IF_ERROR(enter_any(&scope));
  return from_cu(api_->cuMemAddressFree(range.base, range.bytes));
}

Status CudaDriver::create(DeviceId device, size_t bytes, PhysHandle* out) noexcept {
  if (out == nullptr || bytes == 0) return Errc::kInvalidArgument;
  Capabilities caps;
  ZICO_RETURN_IF_ERROR(device_caps(device, &caps));
  ContextScope scope;
  ZICO_RETURN_IF_ERROR(enter(device, &scope));
  const CUmemAllocationProp prop = chunk_properties(device, caps);
  CUmemGenericAllocationHandle handle = 0;
  ZICO_RETURN_IF_ERROR(from_cu(api_->cuMemCreate(&handle, bytes, &prop, 0)));
  *out = PhysHandle{handle};
  return Status::ok();
}

Status CudaDriver::release(PhysHandle handle) noexcept {
  ContextScope scope;
  ZICO_RETURN_IF_ERROR(enter_any(&scope));
  return from_cu(api_->cuMemRelease(handle.value));
}

Status CudaDriver::map(VaRange range, PhysHandle handle) noexcept {
  ContextScope scope;
  ZICO_RETURN_IF_ERROR(enter_any(&scope));
  return from_cu(api_->cuMemMap(range.base, range.bytes, 0, handle.value, 0));
}

Status CudaDriver::set_access(DeviceId device, VaRange range) noexcept {
  if (!valid(device)) return Errc::kNoDevice;
  ContextScope scope;
  ZICO_RETURN_IF_ERROR(enter_any(&scope));
  CUmemAccessDesc access{};
  access.location = device_location(device);
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return from_cu(api_->cuMemSetAccess(range.base, range.bytes, &access, 1));
}

Status CudaDriver::unmap(VaRange range) noexcept {
  ContextScope scope;
  ZICO_RETURN_IF_ERROR(enter_any(&scope));
  return from_cu(api_->cuMemUnmap(range.base, range.bytes));
}

Status CudaDriver::export_fd(PhysHandle handle, int* fd) noexcept {
  if (fd == nullptr) return Errc::kInvalidArgument;
  ContextScope scope;
  ZICO_RETURN_IF_ERROR(enter_any(&scope));
  // Export only works if the handle type was requested at creation; checking
  // the handle itself also covers chunks imported from another process.
  CUmemAllocationProp prop{};
  ZICO_RETURN_IF_ERROR(from_cu(api_->cuMemGetAllocationPropertiesFromHandle(&prop, handle.value)));
  if ((prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0) return Errc::kNotSupported;
  int exported = -1;
  ZICO_RETURN_IF_ERROR(from_cu(
      api_->cuMemExportToShareableHandle(&exported, handle.value, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)));
  *fd = exported;
  return Status::ok();
}

Status CudaDriver::import_fd(int fd, PhysHandle* out) noexcept {
  if (fd < 0 || out == nullptr) return Errc::kInvalidArgument;
  ContextScope scope;
  ZICO_RETURN_IF_ERROR(enter_any(&scope));
  CUmemGenericAllocationHandle handle = 0;
  void* os_handle = reinterpret_cast<void*>(static_cast<uintptr_t>(fd));
  ZICO_RETURN_IF_ERROR(
      from_cu(api_->cuMemImportFromShareableHandle(&handle, os_handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)));
  *out = PhysHandle{handle};
  return Status::ok();
}

Status CudaDriver::stream_create(DeviceId device, StreamHandle* out) noexcept {
  if (out == nullptr) return Errc::kInvalidArgument;
  ContextScope scope;
  ZICO_RETURN_IF_ERROR(enter(device, &scope));
  CUstream stream = nullptr;
  // Non-blocking: our copies must not serialize against the application's legacy stream.
  ZICO_RETURN_IF_ERROR(from_cu(api_->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING)));
  *out = StreamHandle{reinterpret_cast<uintptr_t>(stream)};
  return Status::ok();
}

Status CudaDriver::stream_destroy(StreamHandle stream) noexcept {
  if (stream.value == 0) return Errc::kInvalidArgument;
  ContextScope scope;
  ZICO_RETURN_IF_ERROR(enter_any(&scope));
  return from_cu(api_->cuStreamDestroy(cu_stream(stream)));
}

Status CudaDriver::stream_synchronize(StreamHandle stream) noexcept {
  ContextScope scope;
  ZICO_RETURN_IF_ERROR(enter_any(&scope));
  return from_cu(api_->cuStreamSynchronize(cu_stream(stream)));
}

Status CudaDriver::event_create(DeviceId device, EventHandle* out) noexcept {
  if (out == nullptr) return Errc::kInvalidArgument;
  ContextScope scope;
  ZICO_RETURN_IF_ERROR(enter(device, &scope));
  CUevent event = nullptr;
  ZICO_RETURN_IF_ERROR(from_cu(api_->cuEventCreate(&event, CU_EVENT_DISABLE_TIMING)));
  *out = EventHandle{reinterpret_cast<uintptr_t>(event)};
  try {
    std::lock_guard lock(events_mu_);
    event_devices_[out->value] = device.value;
  } catch (const std::bad_alloc&) {
    (void)api_->cuEventDestroy(event);
    return Errc::kOutOfMemory;
  }
  return Status::ok();
}

Status CudaDriver::event_destroy(EventHandle event) noexcept {
  if (!event.valid()) return Errc::kInvalidArgument;
  {
    std::lock_guard lock(events_mu_);
    event_devices_.erase(event.value);
  }
  ContextScope scope;
  ZICO_RETURN_IF_ERROR(enter_any(&scope));
  return from_cu(api_->cuEventDestroy(cu_event(event)));
}

Status CudaDriver::enter_for_event(EventHandle event, StreamHandle stream, ContextScope* scope) noexcept {
  // cuEventRecord: "hEvent and hStream must be from the same context".
  if (stream.value > reinterpret_cast<uintptr_t>(CU_STREAM_PER_THREAD)) return enter_any(scope);
  int device = -1;
  {
    std::lock_guard lock(events_mu_);
    if (auto it = event_devices_.find(event.value); it != event_devices_.end()) device = it->second;
  }
  return device >= 0 ? enter(DeviceId{device}, scope) : enter_any(scope);
}

Status CudaDriver::event_record(EventHandle event, StreamHandle stream) noexcept {
  if (!event.valid()) return Errc::kInvalidArgument;
  ContextScope scope;
  ZICO_RETURN_IF_ERROR(enter_for_event(event, stream, &scope));
  return from_cu(api_->cuEventRecord(cu_event(event), cu_stream(stream)));
}

Status CudaDriver::stream_wait_event(StreamHandle stream, EventHandle event) noexcept {
  if (!event.valid()) return Errc::kInvalidArgument;
  ContextScope scope;
  ZICO_RETURN_IF_ERROR(enter_for_event(event, stream, &scope));
  return from_cu(api_->cuStreamWaitEvent(cu_stream(stream), cu_event(event), 0));
}

Status CudaDriver::event_query(EventHandle event, bool* done) noexcept {
  if (!event.valid() || done == nullptr) return Errc::kInvalidArgument;
  ContextScope scope;
  ZICO_RETURN_IF_ERROR(enter_any(&scope));
  CUresult result = api_->cuEventQuery(cu_event(event));
  *done = result == CUDA_SUCCESS;
  return result == CUDA_ERROR_NOT_READY ? Status::ok() : from_cu(result);
}

Status CudaDriver::event_synchronize(EventHandle event) noexcept {
  if (!event.valid()) return Errc::kInvalidArgument;
  ContextScope scope;
  ZICO_RETURN_IF_ERROR(enter_any(&scope));
  return from_cu(api_->cuEventSynchronize(cu_event(event)));
}

Status CudaDriver::device_synchronize(DeviceId device) noexcept {
  CUcontext caller = nullptr;
  ZICO_RETURN_IF_ERROR(from_cu(api_->cuCtxGetCurrent(&caller)));
  {
    ContextScope scope;
    ZICO_RETURN_IF_ERROR(enter(device, &scope));
    ZICO_RETURN_IF_ERROR(from_cu(api_->cuCtxSynchronize()));
  }
  // A context the caller made itself on this device (cuCtxCreate, then an
  // interposed cuMemAlloc/cuMemFree) runs work on our memory too.
  if (caller == nullptr || caller == devices_[device.value].context.load(std::memory_order_acquire)) {
    return Status::ok();
  }
  CUdevice on = 0;
  if (api_->cuCtxGetDevice(&on) != CUDA_SUCCESS || on != devices_[device.value].handle) return Status::ok();
  return from_cu(api_->cuCtxSynchronize());
}

Status CudaDriver::copy_async(void* dst, const void* src, size_t bytes, CopyKind kind, StreamHandle stream) noexcept {
  ContextScope scope;
  ZICO_RETURN_IF_ERROR(enter_any(&scope));
  switch (kind) {
    case CopyKind::kHostToDevice:
      return from_cu(api_->cuMemcpyHtoDAsync(device_ptr(dst), src, bytes, cu_stream(stream)));
    case CopyKind::kDeviceToHost:
      return from_cu(api_->cuMemcpyDtoHAsync(dst, device_ptr(src), bytes, cu_stream(stream)));
    case CopyKind::kDeviceToDevice:
      return from_cu(api_->cuMemcpyDtoDAsync(device_ptr(dst), device_ptr(src), bytes, cu_stream(stream)));
  }
  return Errc::kInvalidArgument;
}

Status CudaDriver::memset_async(void* dst, uint8_t value, size_t bytes, StreamHandle stream) noexcept {
  ContextScope scope;
  ZICO_RETURN_IF_ERROR(enter_any(&scope));
  return from_cu(api_->cuMemsetD8Async(device_ptr(dst), value, bytes, cu_stream(stream)));
}

Status CudaDriver::host_register(void* ptr, size_t bytes) noexcept {
  if (ptr == nullptr || bytes == 0) return Errc::kInvalidArgument;
  ContextScope scope;
  ZICO_RETURN_IF_ERROR(enter_any(&scope));
  // Portable: the pinned pages are usable from every context, as with cudaHostRegister.
  return from_cu(api_->cuMemHostRegister(ptr, bytes, CU_MEMHOSTREGISTER_PORTABLE));
}

Status CudaDriver::host_unregister(void* ptr) noexcept {
  if (ptr == nullptr) return Errc::kInvalidArgument;
  ContextScope scope;
  ZICO_RETURN_IF_ERROR(enter_any(&scope));
  return from_cu(api_->cuMemHostUnregister(ptr));
}

Status CudaDriver::managed_allocate(size_t bytes, void** out) noexcept {
  if (out == nullptr || bytes == 0) return Errc::kInvalidArgument;
  ContextScope scope;
  ZICO_RETURN_IF_ERROR(enter_any(&scope));
  CUdeviceptr ptr = 0;
  ZICO_RETURN_IF_ERROR(from_cu(api_->cuMemAllocManaged(&ptr, bytes, CU_MEM_ATTACH_GLOBAL)));
  *out = reinterpret_cast<void*>(static_cast<uintptr_t>(ptr));
  return Status::ok();
}

Status CudaDriver::managed_free(void* ptr) noexcept {
  ContextScope scope;
  ZICO_RETURN_IF_ERROR(enter_any(&scope));
  return from_cu(api_->cuMemFree(device_ptr(ptr)));
}

Status CudaDriver::managed_advise(void* ptr, size_t bytes, ManagedAdvice advice, DeviceId device) noexcept {
  if (api_->cuMemAdvise == nullptr) return Errc::kNotSupported;
  CUmemLocation location = device_location(device);
  CUmem_advise what = CU_MEM_ADVISE_SET_READ_MOSTLY;
  switch (advice) {
    case ManagedAdvice::kSetPreferredLocationDevice: what = CU_MEM_ADVISE_SET_PREFERRED_LOCATION; break;
    case ManagedAdvice::kSetPreferredLocationHost:
      what = CU_MEM_ADVISE_SET_PREFERRED_LOCATION;
      location = CUmemLocation{};
      location.type = CU_MEM_LOCATION_TYPE_HOST;
      break;
    case ManagedAdvice::kUnsetPreferredLocation: what = CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION; break;
    case ManagedAdvice::kSetAccessedBy: what = CU_MEM_ADVISE_SET_ACCESSED_BY; break;
    case ManagedAdvice::kUnsetAccessedBy: what = CU_MEM_ADVISE_UNSET_ACCESSED_BY; break;
    case ManagedAdvice::kSetReadMostly: what = CU_MEM_ADVISE_SET_READ_MOSTLY; break;
    case ManagedAdvice::kUnsetReadMostly: what = CU_MEM_ADVISE_UNSET_READ_MOSTLY; break;
  }
  if (location.type == CU_MEM_LOCATION_TYPE_DEVICE && !valid(device)) return Errc::kNoDevice;
  ContextScope scope;
  ZICO_RETURN_IF_ERROR(enter_any(&scope));
  return from_cu(api_->cuMemAdvise(device_ptr(ptr), bytes, what, location));
}

Status CudaDriver::managed_prefetch(void* ptr, size_t bytes, PrefetchTarget target, StreamHandle stream) noexcept {
  if (api_->cuMemPrefetchAsync == nullptr) return Errc::kNotSupported;
  CUmemLocation location{};
  ZICO_RETURN_IF_ERROR(prefetch_location(target, valid(target.device), &location));
  ContextScope scope;
  ZICO_RETURN_IF_ERROR(enter_any(&scope));
  return from_cu(api_->cuMemPrefetchAsync(device_ptr(ptr), bytes, location, 0, cu_stream(stream)));
}

Status CudaDriver::managed_prefetch_batch(std::span<const VaRange> ranges, PrefetchTarget target,
                                          StreamHandle stream) noexcept {
  // One call for the lot where the driver has it: each call into the UVM
  // driver costs the launching thread its own round trip. Not on the legacy
  // stream ("must not be", cuda.h).
  if (api_->cuMemPrefetchBatchAsync == nullptr || ranges.size() < 2 || stream.value == 0 ||
      stream.value == reinterpret_cast<uintptr_t>(CU_STREAM_LEGACY) ||
      batch_prefetch_refused_.load(std::memory_order_relaxed)) {
    return Driver::managed_prefetch_batch(ranges, target, stream);
  }
  CUmemLocation location{};
  ZICO_RETURN_IF_ERROR(prefetch_location(target, valid(target.device), &location));
  std::vector<CUdeviceptr> bases;
  std::vector<size_t> sizes;
  try {
    bases.reserve(ranges.size());
    sizes.reserve(ranges.size());
  } catch (const std::bad_alloc&) {
    return Driver::managed_prefetch_batch(ranges, target, stream);  // one call each needs no memory
  }
  for (const VaRange& range : ranges) {
    bases.push_back(range.base);
    sizes.push_back(range.bytes);
  }
  size_t first_with_location = 0;
  {
    ContextScope scope;
    ZICO_RETURN_IF_ERROR(enter_any(&scope));
    if (api_->cuMemPrefetchBatchAsync(bases.data(), sizes.data(), bases.size(), &location, &first_with_location, 1, 0,
                                      cu_stream(stream)) == CUDA_SUCCESS) {
      return Status::ok();
    }
  }
  // Refused (another device without concurrent managed access, say): one
  // call a range, now and from now on (a range queued twice moves once).
  batch_prefetch_refused_.store(true, std::memory_order_relaxed);
  return Driver::managed_prefetch_batch(ranges, target, stream);
}

Status CudaDriver::stream_capture_state(StreamHandle stream, CaptureState* state) noexcept {
  ContextScope scope;
  ZICO_RETURN_IF_ERROR(enter_any(&scope));
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  const CUresult result = api_->cuStreamIsCapturing(cu_stream(stream), &status);
  // The legacy stream while a blocking stream captures: work there would
  // invalidate that capture.
  if (result == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) {
    *state = CaptureState::kBlocked;
    return Status::ok();
  }
  ZICO_RETURN_IF_ERROR(from_cu(result));
  *state = status == CU_STREAM_CAPTURE_STATUS_NONE ? CaptureState::kNone : CaptureState::kCapturing;
  return Status::ok();
}

Status CudaDriver::managed_discard(void* ptr, size_t bytes, StreamHandle stream) noexcept {
  if (api_->cuMemDiscardBatchAsync == nullptr) return Errc::kNotSupported;
  // "Must not be legacy NULL stream" (cuda.h).
  if (stream.value == 0 || stream.value == reinterpret_cast<uintptr_t>(CU_STREAM_LEGACY)) return Errc::kInvalidArgument;
  ContextScope scope;
  ZICO_RETURN_IF_ERROR(enter_any(&scope));
  CUdeviceptr base = device_ptr(ptr);
  size_t size = bytes;
  return from_cu(api_->cuMemDiscardBatchAsync(&base, &size, 1, 0, cu_stream(stream)));
}

Status CudaDriver::managed_discard_batch(std::span<const VaRange> ranges, StreamHandle stream) noexcept {
  if (api_->cuMemDiscardBatchAsync == nullptr) return Errc::kNotSupported;
  if (stream.value == 0 || stream.value == reinterpret_cast<uintptr_t>(CU_STREAM_LEGACY)) return Errc::kInvalidArgument;
  if (ranges.empty()) return Status::ok();
  std::vector<CUdeviceptr> bases;
  std::vector<size_t> sizes;
  try {
    bases.reserve(ranges.size());
    sizes.reserve(ranges.size());
  } catch (const std::bad_alloc&) {
    return Driver::managed_discard_batch(ranges, stream);  // one call each needs no memory
  }
  for (const VaRange& range : ranges) {
    bases.push_back(range.base);
    sizes.push_back(range.bytes);
  }
  ContextScope scope;
  ZICO_RETURN_IF_ERROR(enter_any(&scope));
  return from_cu(api_->cuMemDiscardBatchAsync(bases.data(), sizes.data(), bases.size(), 0, cu_stream(stream)));
}

Status CudaDriver::managed_discard_and_prefetch_batch(std::span<const VaRange> ranges, PrefetchTarget target,
                                                      StreamHandle stream) noexcept {
  // One call where the driver has it (13.0 and later); else a discard and a
  // prefetch, two calls, the same result.
  if (api_->cuMemDiscardAndPrefetchBatchAsync == nullptr || api_->cuMemDiscardBatchAsync == nullptr) {
    return Driver::managed_discard_and_prefetch_batch(ranges, target, stream);
  }
  if (stream.value == 0 || stream.value == reinterpret_cast<uintptr_t>(CU_STREAM_LEGACY)) return Errc::kInvalidArgument;
  if (ranges.empty()) return Status::ok();
  CUmemLocation location{};
  ZICO_RETURN_IF_ERROR(prefetch_location(target, valid(target.device), &location));
  std::vector<CUdeviceptr> bases;
  std::vector<size_t> sizes;
  try {
    bases.reserve(ranges.size());
    sizes.reserve(ranges.size());
  } catch (const std::bad_alloc&) {
    return Driver::managed_discard_and_prefetch_batch(ranges, target, stream);
  }
  for (const VaRange& range : ranges) {
    bases.push_back(range.base);
    sizes.push_back(range.bytes);
  }
  size_t first_with_location = 0;
  ContextScope scope;
  ZICO_RETURN_IF_ERROR(enter_any(&scope));
  return from_cu(api_->cuMemDiscardAndPrefetchBatchAsync(bases.data(), sizes.data(), bases.size(), &location,
                                                         &first_with_location, 1, 0, cu_stream(stream)));
}

Status CudaDriver::start_fault_reports(DeviceId device, std::string* why) noexcept {
  if (!valid(device)) return Errc::kInvalidArgument;
  CuptiFaults* cupti = CuptiFaults::start(device.value, why);
  if (cupti == nullptr) return Errc::kNotSupported;
  cupti_.store(cupti, std::memory_order_release);
  return Status::ok();
}

void CudaDriver::tag_work(uint64_t tag) noexcept {
  if (CuptiFaults* cupti = cupti_.load(std::memory_order_acquire)) cupti->push_tag(tag);
}

void CudaDriver::untag_work() noexcept {
  if (CuptiFaults* cupti = cupti_.load(std::memory_order_acquire)) cupti->pop_tag();
}

Status CudaDriver::take_fault_reports(VaRange range, std::vector<ManagedFault>* out) noexcept {
  CuptiFaults* cupti = cupti_.load(std::memory_order_acquire);
  if (cupti == nullptr) return Errc::kNotSupported;
  return cupti->take(range, out);
}

Status CudaDriver::process_memory(int /*pid*/, DeviceId /*device*/, uint64_t* /*bytes*/) noexcept {
  // NVML's per-process usage (nvmlDeviceGetComputeRunningProcesses) would
  // answer this; it also counts each process's context and the libraries'
  // own allocations, so it needs a tolerance before it can judge a grant.
  return Errc::kNotSupported;
}

}  // namespace zico
