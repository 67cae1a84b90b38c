// NodeClient: libzicoum's side of the node manager (client mode).
//
// When zico-umd's socket exists, the job registers, and each device's
// allocator gets its chunks through a ChunkSource that borrows them from the
// daemon: a request per batch, descriptors received with SCM_RIGHTS, imported
// and mapped by the allocator, given back by id once fenced. A background
// thread (the link) reads the daemon's messages: grants, denials, yields,
// reclaims (answered by trimming the allocator's idle chunks, never by waiting
// on it), and sends a usage report twice a second. At each iteration boundary
// the job waits for the daemon's go (the time-shift gate), and it sends its
// learned memory pattern whenever that changes.
//
// If the daemon goes away, the job keeps what it holds and may still create
// chunks locally up to what it held then (its last budget), so the node stays
// within what the daemon had granted. The link reconnects every 100 ms; on
// success the job keeps its id, reports what it holds (those chunks are
// "unowned" for the new daemon: giving one back just lowers the count) and
// waiting requests are sent again.
//
// A Unified Memory job (ZICO_MODE=um) opens its GPU as pageable: what it
// borrows is how much of its managed memory may be on the GPU (resident
// grants, no chunks travel), and its pager (ResidentPages) keeps it there.
// It asks for more as its live blocks grow, without waiting (it pages
// meanwhile), gives back what is above its live blocks at each iteration
// boundary, and answers a reclaim by paging out down to its floor (its
// largest kernel's working set).
//
// A forked child (e.g. a data-loader worker) closes its copy of the socket, so
// the daemon sees the job's end when the parent ends.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "chunk_source.h"
#include "device_allocator.h"
#include "driver.h"
#include "chunk_residency.h"
#include "status.h"

namespace zico::sharing {

struct NodeClientOptions {
  std::string socket_path;
  uint64_t wait_timeout_ns = 60'000'000'000;
  // How long connect() waits to be registered; 0: wait_timeout_ns.
  uint64_t register_timeout_ns = 0;
  std::string job_name;  // "": the program and its first argument (ZICO_JOB_NAME sets it)
  uint64_t reconnect_interval_ns = 100'000'000;
  uint64_t report_interval_ns = 500'000'000;
  // Who may run the daemon: a listener owned by another uid than root, this
  // one or the job's own is not trusted (it could read the job's memory).
  uint32_t daemon_uid = 0;
};

// A UM job's pages on one GPU, as the client sees them (the runtime's pager).
class ResidentPages {
 public:
  virtual ~ResidentPages() = default;
  // Keep at most `bytes` of the job's pages on the GPU: what is above goes
  // to the host at once. Returns what it may keep now: more than asked only
  // while a running kernel's pages hold it up.
  virtual uint64_t limit_to(uint64_t bytes) noexcept = 0;
  // The least it can run with: its largest kernel's working set so far.
  [[nodiscard]] virtual uint64_t floor_bytes() const noexcept = 0;
  // Its link to the host, bytes per second, the slower direction (0: unknown).
  [[nodiscard]] virtual uint64_t link_bytes_per_second() const noexcept = 0;
};

// All the waits inside one allocation call share one ZICO_WAIT_TIMEOUT:
// registering with zico-umd (the runtime's first use registers, and a call
// after a failed registration tries again), opening the GPU, and each ask for
// memory (the allocator may ask again after freeing its caches). Entry points
// hold one of these around each allocation, from before their first use of
// the runtime; the clock starts at the call's first wait. Per thread.
class AllocationWaitScope {
 public:
  AllocationWaitScope() noexcept;
  ~AllocationWaitScope();
  AllocationWaitScope(const AllocationWaitScope&) = delete;
  AllocationWaitScope& operator=(const AllocationWaitScope&) = delete;

  // When the current allocation call's first wait began (now, if this is
  // it); outside a scope, now: each wait then has a timeout of its own.
  [[nodiscard]] static std::chrono::steady_clock::time_point wait_began() noexcept;
  // wait_began() + timeout_ns (time_point::max() if that is beyond it).
  [[nodiscard]] static std::chrono::steady_clock::time_point deadline(uint64_t timeout_ns) noexcept;

 private:
  bool outermost_;
};

// A suspension inside an allocation call (at its pause point or its
// iteration gate) is not the call's wait: the resumption's waits each have a
// timeout of their own, and the call's clock is as it was once it runs again.
class OutsideAllocationWait {
 public:
  OutsideAllocationWait() noexcept;
  ~OutsideAllocationWait();
  OutsideAllocationWait(const OutsideAllocationWait&) = delete;
  OutsideAllocationWait& operator=(const OutsideAllocationWait&) = delete;

 private:
  bool in_scope_;
  std::optional<std::chrono::steady_clock::time_point> first_wait_;
  bool failure_said_;
};

class NodeClient {
 public:
  // Connects and registers. kNotFound: nobody listens at the path (run
  // standalone); other errors: the daemon refused us (*why says why).
  [[nodiscard]] static Status connect(Driver& driver, const NodeClientOptions& options,
                                      std::unique_ptr<NodeClient>* out, std::string* why);
  ~NodeClient();
  NodeClient(const NodeClient&) = delete;
  NodeClient& operator=(const NodeClient&) = delete;

  // Tells the daemon the job uses `device`. *chunk_bytes: the chunk size the
  // allocator must use; *source lends the chunks (owned by the client).
  [[nodiscard]] Status open_gpu(DeviceId device, size_t* chunk_bytes, ChunkSource** source, std::string* why);
  // The allocator of `device`, for reclaims and reports.
  void attach(DeviceId device, DeviceAllocator* allocator);

  // A UM job's GPU (see above). *chunk_bytes: the unit of its grants (its
  // pages should divide it). It is lent one chunk first, within the wait
  // timeout, before its pager exists: *lent, the pager's first budget.
  [[nodiscard]] Status open_pageable_gpu(DeviceId device, size_t* chunk_bytes, uint64_t* lent, std::string* why);
  // The pager of a pageable GPU; `most_bytes` caps what it asks for (its
  // ZICO_BUDGET; the share the daemon allows binds too).
  void attach_pages(DeviceId device, ResidentPages* pages, uint64_t most_bytes);
  // zico-umctl suspend of a UM job: every page leaves the GPU and the
  // grants go back; after the resumption it asks again (waiting up to the
  // wait timeout for a first chunk).
  void page_out(DeviceId device) noexcept;
  [[nodiscard]] Status page_in(DeviceId device, std::string* why);
  // A UM job's next kernel needs `bytes` on the GPU at once: if it is lent
  // less, asks for the rest and waits for it (at most a second, or the wait
  // timeout if shorter; a suspension asked meanwhile ends the wait), so that
  // the kernel runs within what the daemon lent. kOutOfMemory (and *why) if
  // it did not come: the job's kernels then run on what is lent for ten
  // seconds before it asks again. ok at once where nothing is to be asked
  // (no daemon, a suspension, within its share, or more than the share allows).
  [[nodiscard]] Status need_resident(DeviceId device, uint64_t bytes, std::string* why);

  [[nodiscard]] bool connected() const;
  // The most the job could hold on `device` as the daemon last said: the
  // GPU's budget, or the job's maximum if lower. 0 if the daemon has not
  // opened the device.
  [[nodiscard]] uint64_t share_bytes(DeviceId device) const;
  [[nodiscard]] uint64_t job_id() const;
  // Why the last borrowing failed ("" if it did not), and forget it.
  [[nodiscard]] std::string take_last_failure();

  // The time-shift schedule. The job's allocations and frees on a device
  // feed that device's usage tracker (usage_tracker.h); on_freed comes
  // before the memory is freed. on_allocated says true when an iteration the
  // tracker detected by itself (no explicit marks) began at this allocation
  // or at a free since the last one: the caller then passes the gate.
  [[nodiscard]] bool on_allocated(DeviceId device, const void* ptr, size_t bytes) noexcept;
  void on_freed(DeviceId device, const void* ptr) noexcept;
  // After a free on `device` (the block is back in the allocator): once the
  // daemon said a request waits for memory (MemoryWanted) in this
  // iteration, the idle chunks the rest of the iteration will not allocate
  // again go back now instead of at the gate, so that another job's
  // iteration climbs into what this one's backward pass lets go of. Cheap
  // when not told (the lock on_freed takes and one flag), and no call into
  // the allocator between two steps of a sixteenth of what is held.
  void after_free(DeviceId device) noexcept;
  // An iteration boundary (explicit: zico_mark_iteration). Gives the
  // allocators' idle chunks back, starts the new iteration in the trackers
  // and sends the curves that changed (so the daemon plans the gate with the
  // iteration just ended), then tells the daemon, with the claims of the
  // iteration it would begin, and waits for its go (kProceed) at most the
  // wait timeout, or not at all while no daemon answers. The trackers'
  // clock leaves the wait out. A suspension asked while it waits (a turn,
  // zico-umd --turns, or zico-umctl suspend) runs `pause` there, which
  // suspends the job and returns once it is resumed; then it waits on.
  // Without `pause` the suspension waits for the next pause point.
  void iteration_gate(bool explicit_mark, const std::function<void()>& pause = {}) noexcept;

  // zico-umctl suspend: true once the daemon asked this job to pause; *to
  // says where its memory should go. Cheap (one atomic load) when not.
  [[nodiscard]] bool suspend_requested(Residency* to) const;
  // The job has paused (all memory evicted) or runs again.
  void report_suspended(bool suspended);
  // The job could not suspend, or could not restore its memory (the log
  // says why): it runs on, and the request is forgotten.
  void report_failed();
  // Blocks until zico-umctl resume (or a daemon restart, which forgets the
  // suspension), then clears the request.
  void wait_for_resume();

  struct Impl;

 private:
  explicit NodeClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zico::sharing
