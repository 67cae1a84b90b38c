// CudaDriver: the Driver seam on a real GPU, through libcuda.so.1 loaded at
// run time. Nothing links libcuda or libcudart: open() dlopens the driver,
// finds cuGetProcAddress, and resolves every entry point by base name at the
// CUDA version its cudaTypedefs.h PFN type names, so each pointer has exactly
// the ABI it is called with, whatever the installed driver's version.
//
// Contexts: each device's primary context is retained on first use, so work
// lands in the same context as the CUDA runtime's. A call that needs a device
// makes that device's primary context current for its duration and restores
// the caller's context afterwards (the thread's current device belongs to the
// application); a call with no device uses whatever context is current, or
// device 0's primary context when none is.
//
// Thread-safety: every method may be called from any thread at any time. Lazy
// per-device state (retained contexts, capabilities) is guarded by a mutex;
// the hot path to an already-retained context is a single atomic load.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "driver.h"

struct CUctx_st;  // CUcontext, without including cuda.h

namespace zico {

class CuptiFaults;

// Maps a CUresult (passed as int so this header needs no CUDA include path)
// to a Status whose detail is the CUresult.
Status from_cu(int result) noexcept;

// "CUDA_ERROR_OUT_OF_MEMORY" style name for a CUresult, for log and `why`
// text. Uses the driver's cuGetErrorName once a CudaDriver has been opened;
// never returns null.
const char* cu_result_name(int result) noexcept;

class CudaDriver final : public Driver {
 public:
  // Loads and initializes the driver. On failure *out stays empty and *why
  // (when non-null) gets one sentence naming the cause.
  [[nodiscard]] static Status open(std::unique_ptr<Driver>* out, std::string* why) noexcept;

  ~CudaDriver() override;
  CudaDriver(const CudaDriver&) = delete;
  CudaDriver& operator=(const CudaDriver&) = delete;

  [[nodiscard]] const char* name() const noexcept override;
  [[nodiscard]] Status device_count(int* count) noexcept override;
  [[nodiscard]] Status current_device(DeviceId* out) noexcept override;
  [[nodiscard]] Status host_register(void* ptr, size_t bytes) noexcept override;
  [[nodiscard]] Status host_unregister(void* ptr) noexcept override;
  [[nodiscard]] Status capabilities(DeviceId device, Capabilities* caps) noexcept override;
  [[nodiscard]] Status memory_info(DeviceId device, size_t* free_bytes, size_t* total_bytes) noexcept override;

  [[nodiscard]] Status reserve(DeviceId device, size_t bytes, size_t alignment, VaRange* out) noexcept override;
  [[nodiscard]] Status unreserve(VaRange range) noexcept override;

  [[nodiscard]] Status create(DeviceId device, size_t bytes, PhysHandle* out) noexcept override;
  [[nodiscard]] Status release(PhysHandle handle) noexcept override;
  [[nodiscard]] Status map(VaRange range, PhysHandle handle) noexcept override;
  [[nodiscard]] Status set_access(DeviceId device, VaRange range) noexcept override;
  [[nodiscard]] Status unmap(VaRange range) noexcept override;
  [[nodiscard]] Status export_fd(PhysHandle handle, int* fd) noexcept override;
  [[nodiscard]] Status import_fd(int fd, PhysHandle* out) noexcept override;

  [[nodiscard]] Status stream_create(DeviceId device, StreamHandle* out) noexcept override;
  [[nodiscard]] Status stream_destroy(StreamHandle stream) noexcept override;
  [[nodiscard]] Status stream_synchronize(StreamHandle stream) noexcept override;
  [[nodiscard]] Status event_create(DeviceId device, EventHandle* out) noexcept override;
  [[nodiscard]] Status event_destroy(EventHandle event) noexcept override;
  [[nodiscard]] Status event_record(EventHandle event, StreamHandle stream) noexcept override;
  [[nodiscard]] Status event_query(EventHandle event, bool* done) noexcept override;
  [[nodiscard]] Status event_synchronize(EventHandle event) noexcept override;
  [[nodiscard]] Status stream_wait_event(StreamHandle stream, EventHandle event) noexcept override;
  [[nodiscard]] Status device_synchronize(DeviceId device) noexcept override;

  [[nodiscard]] Status copy_async(void* dst, const void* src, size_t bytes, CopyKind kind,
                                  StreamHandle stream) noexcept override;
  [[nodiscard]] Status memset_async(void* dst, uint8_t value, size_t bytes,
                                    StreamHandle stream) noexcept override;

  [[nodiscard]] Status managed_allocate(size_t bytes, void** out) noexcept override;
  [[nodiscard]] Status managed_free(void* ptr) noexcept override;
  [[nodiscard]] Status managed_advise(void* ptr, size_t bytes, ManagedAdvice advice,
                                      DeviceId device) noexcept override;
  [[nodiscard]] Status managed_prefetch(void* ptr, size_t bytes, PrefetchTarget target,
                                        StreamHandle stream) noexcept override;
  [[nodiscard]] Status managed_prefetch_batch(std::span<const VaRange> ranges, PrefetchTarget target,
                                              StreamHandle stream) noexcept override;
  [[nodiscard]] Status managed_discard(void* ptr, size_t bytes, StreamHandle stream) noexcept override;
  [[nodiscard]] Status managed_discard_batch(std::span<const VaRange> ranges, StreamHandle stream) noexcept override;
  [[nodiscard]] Status managed_discard_and_prefetch_batch(std::span<const VaRange> ranges, PrefetchTarget target,
                                                          StreamHandle stream) noexcept override;
  [[nodiscard]] Status stream_capture_state(StreamHandle stream, CaptureState* state) noexcept override;
  // kNotSupported: per-process usage needs NVML, which is not loaded yet.
  [[nodiscard]] Status process_memory(int pid, DeviceId device, uint64_t* bytes) noexcept override;
  // CUPTI's unified-memory fault records (cupti_faults.h); kNotSupported,
  // with the reason, where libcupti is absent or refuses.
  [[nodiscard]] Status start_fault_reports(DeviceId device, std::string* why) noexcept override;
  void tag_work(uint64_t tag) noexcept override;
  void untag_work() noexcept override;
  [[nodiscard]] Status take_fault_reports(VaRange range, std::vector<ManagedFault>* out) noexcept override;

 private:
  // Defined in cuda_driver.cpp so that this header stays free of cuda.h.
  struct Api;          // the resolved function table
  struct Device;       // per-device lazy state
  class ContextScope;  // restores the caller's context on scope exit

  CudaDriver(std::unique_ptr<const Api> api, std::unique_ptr<Device[]> devices, int count) noexcept;

  [[nodiscard]] bool valid(DeviceId device) const noexcept;
  // Makes `device`'s primary context current until `scope` ends.
  [[nodiscard]] Status enter(DeviceId device, ContextScope* scope) noexcept;
  // Makes sure some context is current until `scope` ends.
  [[nodiscard]] Status enter_any(ContextScope* scope) noexcept;
  // For a call that names `event` and `stream`: 0, CU_STREAM_LEGACY and
  // CU_STREAM_PER_THREAD mean that stream of the current context, which must
  // be the event's device's.
  [[nodiscard]] Status enter_for_event(EventHandle event, StreamHandle stream, ContextScope* scope) noexcept;
  [[nodiscard]] Status retained_context(DeviceId device, CUctx_st** context) noexcept;
  [[nodiscard]] Status device_caps(DeviceId device, Capabilities* caps) noexcept;
  [[nodiscard]] int numa_node_of(int device_handle) const noexcept;

  std::unique_ptr<const Api> api_;
  std::unique_ptr<Device[]> devices_;
  int device_count_ = 0;
  std::mutex mu_;  // guards lazy retains and the capability cache in devices_
  // The device each event was created for: stream 0 (and the legacy and
  // per-thread handles) means that stream of the *current* context, so a
  // fence on it must be recorded in the event's own device's context.
  std::mutex events_mu_;
  std::unordered_map<uintptr_t, int> event_devices_;  // guarded by events_mu_
  std::atomic<CuptiFaults*> cupti_{nullptr};  // set by start_fault_reports, the process's one
  // cuMemPrefetchBatchAsync refused once (it needs concurrent managed access on
  // every device): one call a range from then on.
  std::atomic<bool> batch_prefetch_refused_{false};
};

}  // namespace zico
