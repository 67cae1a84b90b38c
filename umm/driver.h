// The driver seam: every GPU operation zicoum performs, and nothing more.
//
// Two implementations sit behind it (as mimalloc's prim.h has one per OS):
//   CudaDriver  libcuda.so.1 loaded at run time through cuGetProcAddress; the
//               library never links libcuda or libcudart.
//   SimDriver   the same semantics on the CPU: memfd chunks mapped into
//               PROT_NONE reservations, so "device" memory is host-addressable
//               and fds really cross processes. Used by every CPU test.
//
// Memory model (CUDA VMM): a VA reservation holds no memory; physical chunks
// are created separately and mapped into it; access must be granted after
// mapping; a chunk released while mapped stays alive until unmapped. Unmap
// does NOT wait for the GPU: callers fence first (an event recorded after the
// last use has completed). All methods are thread-safe and noexcept; sizes
// and addresses must be multiples of Capabilities::granularity unless stated.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "status.h"
#include "types.h"

namespace zico {

// What a device can do, reported by the driver rather than #ifdef'd in policy.
struct Capabilities {
  // Virtual memory management (reserve, create, map): what zicoum allocates
  // with. False on some vGPU and MIG setups; then granularity is 0.
  bool virtual_memory = false;
  size_t granularity = 0;       // minimum chunk size and alignment (2 MiB on H100)
  size_t total_memory = 0;      // device memory in bytes
  bool posix_fd_export = false; // chunks can be exported/imported as POSIX fds
  bool managed_memory = false;  // managed (unified) allocations are available
  // The GPU faults managed pages in on demand while the CPU may touch the
  // rest (Pascal and later on Linux). Without it a launch migrates every
  // managed page the stream can reach, so no budget can hold.
  bool concurrent_managed_access = false;
  bool discard = false;         // managed ranges can be discarded (cuMemDiscardBatchAsync)
  // A discarded page on the device is the driver's to take back, as an
  // evicted one is: it need not move to the host to leave the job's budget
  // (the UVM driver reclaims discarded chunks before those in use). False
  // where a discarded page stays counted on the device until it moves.
  bool discard_releases_device_pages = false;
  // An absent managed page is unmapped: a kernel that touches it fails (an
  // illegal address) instead of faulting it in, so every page a kernel uses
  // must be brought in before it runs. True only for memory that looks
  // managed but is swapped explicitly (swap_arena_driver.h).
  bool absent_pages_unmapped = false;
  // Chunks are created registrable for GPUDirect RDMA (NICs, GPUDirect
  // Storage): the device supports the flag with virtual memory management.
  bool gpu_direct_rdma = false;
  int numa_node = -1;           // host NUMA node nearest the device; -1: unknown (use the local node)
  // Names the device across processes whatever CUDA_VISIBLE_DEVICES says
  // (cuDeviceGetUuid; SimDriver: "zicoum-sim-gpu" and the ordinal).
  std::array<uint8_t, 16> uuid{};
};

enum class CopyKind : uint8_t { kHostToDevice, kDeviceToHost, kDeviceToDevice };

enum class ManagedAdvice : uint8_t {
  kSetPreferredLocationDevice,
  kSetPreferredLocationHost,
  kUnsetPreferredLocation,
  kSetAccessedBy,
  kUnsetAccessedBy,
  kSetReadMostly,
  kUnsetReadMostly,
};

enum class CaptureState : uint8_t {
  kNone,       // work on the stream runs
  kCapturing,  // work on the stream is captured into a graph
  kBlocked,    // a blocking (legacy) stream while another stream captures: work there would break that capture
};

// A managed page the device reported arriving without a prefetch: a fault
// (or a migration the driver made on its own, as for a copy). `tag` is the
// tag of the work that caused it (Driver::tag_work), 0 where none is known.
struct ManagedFault {
  uint64_t tag = 0;
  uintptr_t address = 0;  // inside the page that arrived
};

// Moves the reports of addresses inside `range` from *pending to the end of
// *out, in their order; the others stay in *pending. May throw bad_alloc.
inline void take_reports_in(VaRange range, std::vector<ManagedFault>* pending, std::vector<ManagedFault>* out) {
  size_t kept = 0;
  for (const ManagedFault& report : *pending) {
    if (range.contains(report.address)) {
      out->push_back(report);
    } else {
      (*pending)[kept++] = report;
    }
  }
  pending->resize(kept);
}

// Where a managed prefetch moves pages to.
struct PrefetchTarget {
  bool to_host = false;
  DeviceId device{};
};

class Driver {
 public:
  virtual ~Driver() = default;

  [[nodiscard]] virtual const char* name() const noexcept = 0;
  [[nodiscard]] virtual Status device_count(int* count) noexcept = 0;
  [[nodiscard]] virtual Status capabilities(DeviceId device, Capabilities* caps) noexcept = 0;
  // The device of the calling thread's current context; kNotFound if none.
  [[nodiscard]] virtual Status current_device(DeviceId* out) noexcept = 0;
  // Free and total device memory as the driver sees it (all processes).
  [[nodiscard]] virtual Status memory_info(DeviceId device, size_t* free_bytes, size_t* total_bytes) noexcept = 0;

  // --- virtual address space -------------------------------------------------
  // `alignment` is a power of two, at least the granularity (0: the granularity).
  [[nodiscard]] virtual Status reserve(DeviceId device, size_t bytes, size_t alignment, VaRange* out) noexcept = 0;
  // The range must hold no mappings.
  [[nodiscard]] virtual Status unreserve(VaRange range) noexcept = 0;

  // --- physical chunks -------------------------------------------------------
  // Creates device memory exportable as a POSIX fd when the device supports it.
  [[nodiscard]] virtual Status create(DeviceId device, size_t bytes, PhysHandle* out) noexcept = 0;
  // Drops this handle; the memory lives on while it is mapped anywhere.
  [[nodiscard]] virtual Status release(PhysHandle handle) noexcept = 0;
  // Maps the whole of `handle` at `range` (range.bytes == the handle's size);
  // the range must lie inside one reservation and hold no mapping.
  [[nodiscard]] virtual Status map(VaRange range, PhysHandle handle) noexcept = 0;
  // Grants `device` read/write access to a mapped range.
  [[nodiscard]] virtual Status set_access(DeviceId device, VaRange range) noexcept = 0;
  // Removes the mappings that exactly cover `range`. Does not synchronize.
  [[nodiscard]] virtual Status unmap(VaRange range) noexcept = 0;
  // Returns a new fd the caller owns; the handle stays valid.
  [[nodiscard]] virtual Status export_fd(PhysHandle handle, int* fd) noexcept = 0;
  // Imports a chunk from an fd (the caller keeps ownership of `fd`).
  [[nodiscard]] virtual Status import_fd(int fd, PhysHandle* out) noexcept = 0;

  // --- streams, events, synchronization --------------------------------------
  [[nodiscard]] virtual Status stream_create(DeviceId device, StreamHandle* out) noexcept = 0;
  [[nodiscard]] virtual Status stream_destroy(StreamHandle stream) noexcept = 0;
  [[nodiscard]] virtual Status stream_synchronize(StreamHandle stream) noexcept = 0;
  // Whether work enqueued on `stream` now would run, be captured into a CUDA
  // graph, or break another stream's capture (CaptureState). Allocation paths
  // that map, record events or synchronize must run only in kNone, and memory
  // freed in kCapturing belongs to the graph.
  [[nodiscard]] virtual Status stream_capture_state(StreamHandle stream, CaptureState* state) noexcept = 0;
  [[nodiscard]] virtual Status event_create(DeviceId device, EventHandle* out) noexcept = 0;
  [[nodiscard]] virtual Status event_destroy(EventHandle event) noexcept = 0;
  // Captures all work enqueued on `stream` so far.
  [[nodiscard]] virtual Status event_record(EventHandle event, StreamHandle stream) noexcept = 0;
  // *done = true once the captured work has finished (or nothing was recorded).
  [[nodiscard]] virtual Status event_query(EventHandle event, bool* done) noexcept = 0;
  [[nodiscard]] virtual Status event_synchronize(EventHandle event) noexcept = 0;
  // Work enqueued on `stream` from now on starts only after what `event`
  // captured (the host does not wait). 0 is the legacy default stream.
  [[nodiscard]] virtual Status stream_wait_event(StreamHandle stream, EventHandle event) noexcept = 0;
  // Waits for all work on all streams of `device` in this process.
  [[nodiscard]] virtual Status device_synchronize(DeviceId device) noexcept = 0;

  // --- data movement (stream-ordered) ----------------------------------------
  // `bytes` need not be chunk-aligned. Host pointers should be pinned for speed.
  [[nodiscard]] virtual Status copy_async(void* dst, const void* src, size_t bytes, CopyKind kind,
                                          StreamHandle stream) noexcept = 0;
  [[nodiscard]] virtual Status memset_async(void* dst, uint8_t value, size_t bytes,
                                            StreamHandle stream) noexcept = 0;

  // --- host memory ------------------------------------------------------------
  // Pins host memory so device copies run at full speed (cuMemHostRegister).
  [[nodiscard]] virtual Status host_register(void* ptr, size_t bytes) noexcept = 0;
  [[nodiscard]] virtual Status host_unregister(void* ptr) noexcept = 0;

  // --- managed (unified) memory ----------------------------------------------
  // `bytes` may be any size; the result is host- and device-accessible.
  [[nodiscard]] virtual Status managed_allocate(size_t bytes, void** out) noexcept = 0;
  [[nodiscard]] virtual Status managed_free(void* ptr) noexcept = 0;
  [[nodiscard]] virtual Status managed_advise(void* ptr, size_t bytes, ManagedAdvice advice,
                                              DeviceId device) noexcept = 0;
  [[nodiscard]] virtual Status managed_prefetch(void* ptr, size_t bytes, PrefetchTarget target,
                                                StreamHandle stream) noexcept = 0;
  // The ranges, each as managed_prefetch would move it, queued on `stream` in
  // one call where the driver can (their order among themselves unspecified).
  // On an error some may have been queued. This default calls
  // managed_prefetch for each.
  [[nodiscard]] virtual Status managed_prefetch_batch(std::span<const VaRange> ranges, PrefetchTarget target,
                                                      StreamHandle stream) noexcept {
    for (const VaRange& range : ranges) {
      if (Status status = managed_prefetch(range.ptr(), range.bytes, target, stream); !status.is_ok()) return status;
    }
    return Status::ok();
  }
  // Contents of the range become undefined; no data migrates for it afterwards.
  // kNotSupported where Capabilities::discard is false.
  [[nodiscard]] virtual Status managed_discard(void* ptr, size_t bytes, StreamHandle stream) noexcept = 0;
  // managed_discard of each range, in one call where the driver can. On an
  // error some may have been discarded. This default calls managed_discard
  // for each.
  [[nodiscard]] virtual Status managed_discard_batch(std::span<const VaRange> ranges, StreamHandle stream) noexcept {
    for (const VaRange& range : ranges) {
      if (Status status = managed_discard(range.ptr(), range.bytes, stream); !status.is_ok()) return status;
    }
    return Status::ok();
  }
  // Discards the ranges, then prefetches them to `target`, in one call where
  // the driver can: pages that hold nothing worth keeping arrive without a
  // copy. kNotSupported where Capabilities::discard is false. This default
  // calls managed_discard_batch, then managed_prefetch_batch.
  [[nodiscard]] virtual Status managed_discard_and_prefetch_batch(std::span<const VaRange> ranges,
                                                                  PrefetchTarget target,
                                                                  StreamHandle stream) noexcept {
    if (Status status = managed_discard_batch(ranges, stream); !status.is_ok()) return status;
    return managed_prefetch_batch(ranges, target, stream);
  }

  // --- what the device reports of managed memory ------------------------------
  // Reports of managed pages that arrived on `device` unasked (faults), for
  // what a kernel reaches that its parameters do not show. Off until started;
  // kNotSupported where the driver cannot tell (CudaDriver: no CUPTI, or
  // CUPTI refused; *why says which). Not virtual-pure: a driver without
  // reports needs nothing of these.
  [[nodiscard]] virtual Status start_fault_reports(DeviceId device, std::string* why) noexcept {
    (void)device;
    if (why != nullptr) *why = "the driver reports no faults";
    return Status(Errc::kNotSupported);
  }
  // Work the calling thread queues from now until untag_work() carries `tag`
  // (nonzero) into the reports of the faults it causes.
  virtual void tag_work(uint64_t tag) noexcept { (void)tag; }
  virtual void untag_work() noexcept {}
  // The host time of the calling thread's calls from now on is that of
  // `timeline` (nonzero: a helper thread's work run on this thread, which
  // starts no earlier than now; 0: the thread's own again). Only a driver
  // that models time (SimDriver) cares.
  virtual void charge_host_time_to(uint32_t timeline) noexcept { (void)timeline; }
  // Appends to *out the reports of pages inside `range` (one device's
  // arena) from work that has completed since the last call, older first;
  // reports of other ranges stay for their callers (a bounded number).
  // kOutOfMemory if the host has no memory for them.
  [[nodiscard]] virtual Status take_fault_reports(VaRange range, std::vector<ManagedFault>* out) noexcept {
    (void)range;
    (void)out;
    return Status(Errc::kNotSupported);
  }

  // --- the host behind the device ---------------------------------------------
  // Whether the host can take `bytes` more of `device`'s memory: UM mode asks
  // before it hands out each chunk of its managed arena, whose pages the
  // host holds whenever they are off the device. kOutOfMemory where it would
  // run low. Not virtual-pure: where device memory is the device's own
  // (CUDA), the driver's allocation limits are the answer.
  [[nodiscard]] virtual Status host_room(DeviceId device, size_t bytes) noexcept {
    (void)device;
    (void)bytes;
    return Status::ok();
  }

  // --- other processes ---------------------------------------------------------
  // How much of `device`'s memory process `pid` holds (mapped, or kept alive
  // by a handle or descriptor), as the platform sees it: what zico-umd checks
  // a job's grant against, since a process can keep memory it said it gave
  // back. kNotSupported where the platform cannot tell; kOsError (detail
  // errno: EACCES, ESRCH) where this process may not look or `pid` is gone.
  [[nodiscard]] virtual Status process_memory(int pid, DeviceId device, uint64_t* bytes) noexcept = 0;
  // Which of `chunks` (this process's own, all of `device`) process `pid`
  // still holds: (*held)[i] for chunks[i]. What zico-umd asks before it
  // lends a returned chunk again. Not virtual-pure: kNotSupported where the
  // platform cannot tell chunk by chunk (CUDA).
  [[nodiscard]] virtual Status process_holds(int pid, DeviceId device, std::span<const PhysHandle> chunks,
                                             std::vector<bool>* held) noexcept {
    (void)pid;
    (void)device;
    (void)chunks;
    (void)held;
    return Status(Errc::kNotSupported);
  }
};

}  // namespace zico
