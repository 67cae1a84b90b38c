// SimDriver: CUDA VMM semantics on the CPU, for tests and GPU-less machines.
//
// How each CUDA concept is emulated:
//   physical chunk   a memfd of the chunk's size (pages cost no RAM until
//                    written, so a simulated 80 GiB device fits anywhere);
//   VA reservation   a PROT_NONE, MAP_NORESERVE anonymous mapping;
//   map              mmap(MAP_FIXED | MAP_SHARED) of the memfd into it;
//   set_access       mprotect(PROT_READ | PROT_WRITE);
//   export/import    the memfd itself, so handles really cross processes;
//   the node         alone by default; processes whose drivers name the same
//                    board file share their devices' memory (share_devices)
//   managed memory   pages on the host or device 0 under its capacity, with
//                    faults and migrations on a modelled clock (sim_managed.h)
//                    that follows stream order, events and the host time of
//                    each call (sim_timeline.h);
//   streams          FIFO queues run on the caller's thread. A stream is idle
//                    and runs work at once unless a test *holds* it, which
//                    models a GPU still busy: work queues and events recorded
//                    behind it stay incomplete until release_stream() or a
//                    synchronize. Unknown stream values (a user's cudaStream_t,
//                    the legacy default stream 0) behave as idle streams.
//
// Validation is stricter than CUDA's where CUDA would corrupt silently: copies
// into unmapped device memory fail instead of faulting, and unmapping a range
// that queued stream work still touches fails with kFenceViolation (the bug
// class "unmap does not synchronize" that real drivers let through).
//
// Thread-safety: every method may be called from any thread (one mutex).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "driver.h"
#include "sim_managed.h"

namespace zico {

struct SimOptions {
  int device_count = 1;
  size_t capacity = size_t{80} << 30;   // per device
  size_t granularity = size_t{2} << 20;  // a power of two, >= the OS page size
  // Copy cost model: bytes / bandwidth + latency. 0 bandwidth = instantaneous.
  double copy_bandwidth_bytes_per_s = 0;
  double copy_latency_s = 0;
  bool posix_fd_export = true;
  bool discard = true;
  // Off only for tests of what needs the GPU to fault managed pages on demand.
  bool concurrent_managed_access = true;
  // Whether process_memory() can tell (false: kNotSupported, as on CUDA).
  bool process_memory = true;
  // A stream handle that stream_capturing() reports as capturing a CUDA
  // graph, for tests of what must not happen during a capture (0: none).
  uintptr_t capturing_stream = 0;
  // Off only for tests of code that deliberately unmaps racing work.
  bool require_fence_before_unmap = true;
  // The simulated device's memory is the host's: a chunk is refused
  // (out-of-memory, said once on stderr with the numbers) when creating it
  // would leave the host less than this much available memory, whatever the
  // capacity says, so that filling a simulated 80 GiB device cannot take a
  // smaller host down. 0: 5 % of the host's memory, at least 512 MiB.
  // Only touched memory counts: what a reading of the host finds used, and
  // what was created since that reading (readings come every 10 ms).
  uint64_t host_reserve_bytes = 0;
  // Where the host's memory is read (host_memory.h's root): "" for this
  // machine; tests point it at a fake /proc and /sys.
  std::string host_memory_root;
  // Unified memory on device 0 (sim_managed.h): its page (0: the
  // granularity) and what migration costs on the modelled clock.
  size_t managed_page_bytes = 0;
  SimManagedCosts managed_costs{};
};

// Operations whose Nth call can be made to fail.
enum class SimOp : uint8_t { kCreate, kMap, kImport, kReserve, kCopy, kCount };

// What the driver has done so far; tests assert on these.
struct SimCounters {
  uint64_t creates = 0;
  uint64_t releases = 0;
  uint64_t maps = 0;
  uint64_t set_accesses = 0;
  uint64_t captured_records = 0;  // events recorded on a stream that was not kNone: a fence a graph swallowed
  uint64_t unmaps = 0;
  uint64_t imports = 0;
  uint64_t device_syncs = 0;
  uint64_t stream_waits = 0;      // stream_wait_event calls
  uint64_t copies = 0;
  uint64_t prefetch_calls = 0;  // managed_prefetch and managed_prefetch_batch calls (a batch is one)
  uint64_t live_chunks = 0;   // created or imported, memory not yet freed
  size_t created_bytes = 0;   // counted against capacity (imports are not)
};

class SimDriver final : public Driver {
 public:
  // Raises RLIMIT_NOFILE's soft limit to its hard limit: every unreleased
  // chunk is an open memfd.
  explicit SimDriver(const SimOptions& options = {});
  ~SimDriver() override;
  SimDriver(const SimDriver&) = delete;
  SimDriver& operator=(const SimDriver&) = delete;

  // --- fault injection and test control ---------------------------------------
  // The nth call of `op` from now (1 = the next) fails with `error`; once.
  void inject_failure(SimOp op, uint64_t nth, Errc error = Errc::kInjectedFault);
  // Models a busy GPU stream: its work queues until release_stream().
  void hold_stream(StreamHandle stream);
  [[nodiscard]] Status release_stream(StreamHandle stream);
  [[nodiscard]] SimCounters counters() const;
  // A kernel on device 0 that uses `ranges` (each inside managed memory or
  // mapped, accessible chunks; kInvalidArgument otherwise: an illegal
  // address) and computes for `duration_ns` on the modelled clock, launched
  // on `stream` by the calling thread (it starts after the stream's earlier
  // work and the thread's earlier calls). Managed pages it uses that are not
  // on the device fault in (sim_managed.h); kOutOfMemory when they cannot
  // all be on the device at once.
  [[nodiscard]] Status run_kernel(std::span<const VaRange> ranges, uint64_t duration_ns, StreamHandle stream = {});
  // Shares the devices' memory with every SimDriver, in any process, that
  // names the same board file (sim_device_board.h): memory_info reports what
  // all of them hold, and a chunk created on a full device 0 takes the
  // others' unused managed memory. Call before any memory is made.
  // kConfigError (with *why) when the file is no board.
  [[nodiscard]] Status share_devices(const std::string& board_path, std::string* why);
  // What unified memory did so far: the modelled clock, faults, migrations.
  [[nodiscard]] SimManagedStats managed_stats() const;
  // Fault reports dropped because too many waited to be taken.
  [[nodiscard]] uint64_t dropped_fault_reports() const;

  // --- Driver ----------------------------------------------------------------
  const char* name() const noexcept override { return "sim"; }
  Status device_count(int* count) noexcept override;
  // Always device 0: the simulation has no per-thread current context.
  Status current_device(DeviceId* out) noexcept override;
  Status capabilities(DeviceId device, Capabilities* caps) noexcept override;
  Status memory_info(DeviceId device, size_t* free_bytes, size_t* total_bytes) noexcept override;
  Status reserve(DeviceId device, size_t bytes, size_t alignment, VaRange* out) noexcept override;
  Status unreserve(VaRange range) noexcept override;
  Status create(DeviceId device, size_t bytes, PhysHandle* out) noexcept override;
  Status release(PhysHandle handle) noexcept override;
  Status map(VaRange range, PhysHandle handle) noexcept override;
  Status set_access(DeviceId device, VaRange range) noexcept override;
  Status unmap(VaRange range) noexcept override;
  Status export_fd(PhysHandle handle, int* fd) noexcept override;
  Status import_fd(int fd, PhysHandle* out) noexcept override;
  Status stream_create(DeviceId device, StreamHandle* out) noexcept override;
  Status stream_destroy(StreamHandle stream) noexcept override;
  Status stream_synchronize(StreamHandle stream) noexcept override;
  Status event_create(DeviceId device, EventHandle* out) noexcept override;
  Status event_destroy(EventHandle event) noexcept override;
  Status event_record(EventHandle event, StreamHandle stream) noexcept override;
  Status event_query(EventHandle event, bool* done) noexcept override;
  Status event_synchronize(EventHandle event) noexcept override;
  Status stream_wait_event(StreamHandle stream, EventHandle event) noexcept override;
  Status device_synchronize(DeviceId device) noexcept override;
  Status copy_async(void* dst, const void* src, size_t bytes, CopyKind kind,
                    StreamHandle stream) noexcept override;
  Status memset_async(void* dst, uint8_t value, size_t bytes, StreamHandle stream) noexcept override;
  // Host memory is already as fast as it gets here: registration only checks.
  Status host_register(void* ptr, size_t bytes) noexcept override;
  Status host_unregister(void* ptr) noexcept override;
  Status managed_allocate(size_t bytes, void** out) noexcept override;
  Status managed_free(void* ptr) noexcept override;
  Status managed_advise(void* ptr, size_t bytes, ManagedAdvice advice, DeviceId device) noexcept override;
  Status managed_prefetch_batch(std::span<const VaRange> ranges, PrefetchTarget target,
                                StreamHandle stream) noexcept override;
  Status managed_prefetch(void* ptr, size_t bytes, PrefetchTarget target,
                          StreamHandle stream) noexcept override;
  Status managed_discard(void* ptr, size_t bytes, StreamHandle stream) noexcept override;
  // Each range discarded, then prefetched, at once as managed_prefetch_batch
  // moves pages: a page that held data arrives without a copy. One prefetch call.
  Status managed_discard_and_prefetch_batch(std::span<const VaRange> ranges, PrefetchTarget target,
                                            StreamHandle stream) noexcept override;
  // Every page a kernel (run_kernel) or a copy faults in, on device 0, the
  // kernel's under the launching thread's tag.
  Status start_fault_reports(DeviceId device, std::string* why) noexcept override;
  void tag_work(uint64_t tag) noexcept override;
  void untag_work() noexcept override;
  Status take_fault_reports(VaRange range, std::vector<ManagedFault>* out) noexcept override;
  void charge_host_time_to(uint32_t timeline) noexcept override;
  // Only SimOptions::capturing_stream is ever capturing; while it is, the
  // legacy stream (0, 0x1) is blocked.
  Status stream_capture_state(StreamHandle stream, CaptureState* state) noexcept override;
  // Chunks are memfds named after their device: the process's mappings and
  // descriptors of such memfds, each counted once (/proc/PID/maps, and the
  // first 65536 entries of /proc/PID/fd).
  Status process_memory(int pid, DeviceId device, uint64_t* bytes) noexcept override;
  // The same look, chunk by chunk (by the memfd's inode).
  Status process_holds(int pid, DeviceId device, std::span<const PhysHandle> chunks,
                       std::vector<bool>* held) noexcept override;
  // Simulated memory is host memory: the same refusal as create()'s.
  Status host_room(DeviceId device, size_t bytes) noexcept override;

 private:
  // kOutOfMemory (said once on stderr, with the numbers) where `bytes` more
  // would leave the host short (SimOptions::host_reserve_bytes). Holds
  // state_->mutex.
  Status refuse_if_host_runs_low(DeviceId device, size_t bytes);
  // Prefetches `ranges` (each discarded first if `discard_first`) on the
  // modelled timeline.
  Status migrate_managed(std::span<const VaRange> ranges, PrefetchTarget target, StreamHandle stream,
                         bool discard_first) noexcept;

  struct State;
  std::unique_ptr<State> state_;  // everything behind one mutex; see sim_driver.cpp
  SimOptions options_;
};

}  // namespace zico
