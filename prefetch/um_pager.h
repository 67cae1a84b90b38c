// UmPager: runs a paging policy on a live job's unified memory.
//
// The job's memory is one managed range (the arena), cut into pages of the
// UM block size. The pager is told what the job does — blocks allocated and
// freed, kernels about to run with the memory they use, iteration marks —
// turns each into the policy's event (paging_policy.h), and carries out its
// decisions with the driver: prefetches to the device and to the host
// (evictions), discards. It keeps the pages the job
// holds on the GPU within the budget: before a kernel runs, room is made for
// the pages it uses that are absent (least recently migrated first, as the
// UVM driver would), so the driver's own eviction never has to run while the
// device has room. Those pages are then fetched before the kernel runs
// where the policy says it fetches what ops name (zico, in its unplanned
// iterations too), or left to the kernel's faults (the others; "um" is plain
// demand paging). Only what no launch names is left to faults then. Where
// absent pages are unmapped (swapped memory, swap_arena_driver.h) nothing
// faults: every page a kernel names is fetched, beyond the budget if it must
// be, and an eviction also waits for the last kernel on another stream that
// named the page and, past the ring of launch marks, for a later launch on
// its stream or the device to drain.
//
// Requests are batched: those of one event (a kernel announced, a block
// freed, a mark, a budget change) are handed to the driver together, in one
// call per kind, sorted by address with adjacent pages as one range, in this
// order: discards, evictions, prefetches, then prefetches of pages that hold
// no live bytes, which go through managed_discard_and_prefetch_batch (no
// stale bytes copied) when no queued work still reads them. A page asked for
// again in a kind handed over earlier first sends what is batched, so that
// each page's requests keep their order. For a kernel, that batch goes
// before the fence it waits on; the policy's prefetches for later kernels
// form the next batch, after the fence.
//
// Dead pages are discarded (where the driver can, and the policy asks) and
// never copied: where the driver takes discarded device pages back
// (Capabilities::discard_releases_device_pages, the UVM driver's), such a page
// leaves the budget without a move; a copy to the host would undo the
// discard there and bring its stale bytes back on the page's next use. A
// page that queued work may still read is discarded when that work ends.
//
// Stream order: evictions go on a stream of their own, prefetches and
// discards on another, so copies out, copies in and kernels overlap, and
// every wait is for what a move needs, never for the latest kernel:
//   - an eviction waits for the last kernel that used its page (an event
//     recorded after each launch, kept for the last kLaunchMarks launches);
//   - a prefetch waits for the evictions before it only when it takes the
//     slot of a page still on its way out, or brings back a page whose
//     eviction is still queued: a page leaving counts on the GPU until its
//     copy is ordered before the next prefetch, so the GPU never holds more
//     than the budget of the job's pages (a dead page let go while queued
//     work still reads it stays there uncounted until its discard);
//   - an eviction of a page whose prefetch (or discard) is still queued
//     waits for the prefetch stream, or the page would leave before it came;
//   - a kernel waits for the prefetch stream only when one of its pages has
//     a prefetch or a discard there it has not yet waited for (a discard
//     ordered after the kernel would zero what it writes); a kernel that
//     faults also waits for the room made since its stream last waited
//     (evictions, and discards where they give pages back), which its
//     faults take.
// Residency here is what the pager asked for: a page prefetched counts as on
// the GPU from the call on, an evicted one as gone.
//
// Threads: the policy runs on the launching thread (CPU work only); the
// driver calls that move pages run on two pager threads, one per stream
// (pager_thread.h), because a move to the host returns only after its copy
// and the CPU's page tables. The launching thread waits for a pager thread
// only to have a kernel's stream wait for moves that kernel needs (the
// pager thread must have issued them first), or when the threads lag a
// whole ring of events behind. Stream waits between the pager's streams are
// issued by the waiting stream's thread once the other thread has recorded
// the event, so every wait is for work issued before it and none can close
// a cycle.
//
// Thread-safe: one mutex (a job may launch from several threads).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <deque>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "driver.h"
#include "exec_id.h"
#include "pager_thread.h"
#include "paging_policy.h"
#include "residency.h"
#include "status.h"
#include "transfer_model.h"
#include "unseen_uses.h"

namespace zico::prefetch {

struct UmPagerOptions {
  std::string policy = "zico";  // one of kPolicyNames
  uint64_t budget_bytes = 0;    // the job's pages on the GPU, at most (whole pages)
  TransferModel model;          // what the policies plan with
  // Run the driver calls that move pages on two threads of the pager's own,
  // one per direction (pager_thread.h), so that the launching thread never
  // waits in them; false: on the thread that decides them, each direction's
  // host time still charged to a timeline of its own (the simulated
  // backend's way: its modelled clock stays deterministic).
  bool pager_threads = true;
  // Learn what kernels use beyond what their launches name, from the
  // driver's fault reports (unseen_uses.h), and count on the GPU the pages
  // that arrived unasked. Where the driver has no reports, the pager knows
  // only what launches name (said once in the log at kInfo).
  bool learn_from_faults = false;
};

// What the pager did.
struct UmPagerStats {
  uint64_t kernels = 0;
  uint64_t prefetches = 0;           // pages sent to the GPU ahead of use
  uint64_t evictions = 0;            // pages sent to the host by decision
  uint64_t room_evictions = 0;       // pages sent to the host to make room for a kernel's pages
  uint64_t faulted_pages = 0;        // absent when their kernel ran: the driver faulted them in
  uint64_t named_fetches = 0;        // absent when their kernel was announced: fetched for it (in prefetches)
  uint64_t discarded_prefetches = 0; // of the prefetches, pages with no live bytes: discarded on the way, no copy
  uint64_t released_pages = 0;       // dead pages discarded that left the budget without a move
  uint64_t discards = 0;
  uint64_t discard_calls = 0;        // calls into the driver that discarded pages (a batch of them is one)
  uint64_t refused_prefetches = 0;   // no slot free
  uint64_t refused_evictions = 0;    // the page was not on the GPU, or its kernel is running
  uint64_t live_discards = 0;        // refused: the page still holds live bytes
  uint64_t unknown_pointers = 0;     // ranges a kernel used that no live block holds
  uint64_t driver_errors = 0;        // migrations the driver refused (logged once)
  // Swapped pages: pages fetched again before their kernel because a fetch
  // of theirs was refused, and kernels refused because that failed too.
  uint64_t refetched_pages = 0;
  uint64_t refused_kernels = 0;
  // Swapped pages an eviction of was refused: sent out again, and of those
  // the ones still on the GPU after that, counted there again.
  uint64_t resent_pages = 0;
  uint64_t stayed_pages = 0;
  uint64_t oversized_kernels = 0;    // used more pages than the budget holds (logged once): the driver paged them
  uint64_t budget_evictions = 0;     // pages sent to the host because the budget shrank
  uint64_t migration_calls = 0;      // calls into the driver that moved pages (a batch of them is one)
  uint64_t migration_ranges = 0;     // address ranges those calls were given (adjacent pages are one)
  uint64_t fences = 0;               // stream waits issued: an eviction behind a kernel, a prefetch behind evictions, a kernel behind prefetches
  uint64_t kernel_waits = 0;         // of those, kernels made to wait for the pager's migrations
  uint64_t peak_resident_bytes = 0;
  // The most a kernel ever had the driver bring beyond the budget of the
  // moment (its absent pages with no room left: it uses more than the
  // budget): the budget binds on the device while this stays 0. The budget
  // changes under a node manager, so the peak alone says nothing of it.
  uint64_t peak_over_budget_bytes = 0;
  // Fault reports (learn_from_faults): reports of pages a kernel faulted in
  // that its launch did not name (each page is named for its op from then
  // on), and pages that arrived unasked while the pager counted them absent
  // (then counted, and room made for them).
  uint64_t unnamed_faults = 0;
  uint64_t unasked_arrivals = 0;
  uint64_t learnt_pages = 0;         // named for their ops now, over every op
  // Kernels in the last iteration the policy found in the launches, where
  // the job marks none (PagingPolicy::found_iteration_ops).
  uint64_t found_iteration_kernels = 0;
  // Blocks named for kernels through the pointer tables of the blocks they
  // name (on_pointer_table), over every kernel.
  uint64_t table_named_blocks = 0;
};

class UmPager {
 public:
  // `arena`: the managed range every block lies in, a whole number of
  // `page_bytes`. Errors: an unknown policy, a budget below one page, a
  // device without managed memory (each named in *why).
  [[nodiscard]] static Status create(Driver& driver, DeviceId device, VaRange arena, uint64_t page_bytes,
                                     const UmPagerOptions& options, std::unique_ptr<UmPager>* out,
                                     std::string* why);
  ~UmPager();
  UmPager(const UmPager&) = delete;
  UmPager& operator=(const UmPager&) = delete;

  // A block of the arena was allocated / is being freed (before its memory
  // can be reused). Pointers outside the arena are ignored. `work_on`: a
  // stream whose queued kernels may still use the block (a stream-ordered
  // free), or nullopt when none can (the caller synchronized);
  // `also_used_on`: other streams whose work may still read it
  // (record_stream). Work still queued there holds every page of the block
  // until an event recorded on each of those streams completes: a discard
  // ordered before a kernel that reads the page would hand it zeros. So a
  // held page is discarded by nobody (this free, or a later free that leaves
  // it dead) until its last hold ends, and then only if it is still dead.
  void on_allocate(const void* ptr, uint64_t bytes);
  void on_free(const void* ptr, std::optional<StreamHandle> work_on, std::span<const StreamHandle> also_used_on = {});
  // A kernel identified by `exec_id` (`given` says what it names: with
  // GivenId::kKernel the pager adds the blocks the kernel uses, exec_id.h)
  // is about to use `used` (pointers into blocks, any offset) and compute
  // for about `duration_ns` (0: unknown), launched on `stream` (0: the legacy
  // default stream). Prefetches and evictions the policy asks for are issued,
  // and room is made for its absent pages, which are fetched where the policy
  // fetches what ops name. Returns the pages it uses that are left absent:
  // the kernel will fault on them. *blocks, if given, receives
  // the whole blocks the kernel uses.
  //
  // Stream order keeps the GPU within the budget, not only the count: an
  // eviction waits for the work queued on the last kernel's stream up to it
  // (recorded by after_kernel: a queued kernel may still use the page;
  // evicted under it, the page would fault straight back), and when pages
  // come in for the kernel (prefetched or faulted now, or prefetched ahead
  // since the last kernel that waited) `stream` waits for the migrations
  // issued before it starts (the policy's evictions, room made, its pages'
  // prefetches). The policy's prefetches for later kernels are issued after
  // that wait, and a kernel whose pages are all there does not wait at all.
  // Work on other streams, and on an
  // earlier kernel's stream once a kernel on another is queued, is not waited
  // for: a page it uses may be evicted under it and fault back.
  //
  // One kernel is announced at a time: before_kernel() returns holding the
  // pager's announcement, and the same thread's after_kernel() gives it
  // back; another thread's before_kernel() waits in between. So the
  // kernel's pages stay pinned and its stream is the one recorded until it
  // is launched, whichever threads launch (a kernel announced by one thread
  // while another's was in flight could otherwise have its pages evicted
  // before it ran: under swapped pages, an illegal address).
  uint64_t before_kernel(uint64_t exec_id, std::span<const VaRange> used, uint64_t duration_ns,
                         std::vector<VaRange>* blocks = nullptr, StreamHandle stream = StreamHandle{},
                         GivenId given = GivenId::kOp);
  // The kernel of this thread's last before_kernel() was launched (or will
  // not be); required after every before_kernel() that returned.
  void after_kernel();
  // Swapped pages only (Capabilities::absent_pages_unmapped): after
  // before_kernel() on the announcing thread, whether a page the kernel uses
  // is not mapped on the GPU: the driver refused to bring it (no device
  // memory to map, say: another process took it), before and when asked
  // again. The kernel must not run then (an illegal address); the page is
  // asked for again before the next kernel that uses it.
  [[nodiscard]] bool kernel_refused() const;
  // A copy from the host wrote `written` (inside one block), which now holds
  // the addresses `targets` (sorted, as arena_addresses() gives them, in
  // pointer_table.h; none: it holds no table): from
  // now on every kernel that names the block names the blocks those
  // addresses fall in too (those live when it runs). What earlier copies
  // wrote there is replaced; the block's other tables stay; its free
  // forgets them all. An address outside the arena, or a range outside
  // every live block, is ignored.
  void on_pointer_table(VaRange written, std::span<const uintptr_t> targets);
  // What before_kernel(…, used, …) would find the kernel uses of the arena,
  // in whole pages, before what it learnt from faults: what must be on the
  // GPU at once for it to run without the driver paging inside it.
  [[nodiscard]] uint64_t working_set_bytes(std::span<const VaRange> used) const;
  // An iteration boundary (zico_mark_iteration). The driver's fault reports
  // are read here (and every few thousand kernels): what kernels used
  // unnamed is learnt for their places in the next iteration, and what
  // arrived unasked is counted on the GPU (late by up to a read; room is
  // made for it at once).
  void on_iteration();
  // The application destroyed `stream`: what it waited for is forgotten, so
  // that a stream created later with the same handle waits for its own
  // kernels' moves (its kernels do not follow the old stream's).
  void forget_stream(StreamHandle stream);
  // Whether the driver's fault reports reach the pager.
  [[nodiscard]] bool learns_from_faults() const { return fault_reports_; }

  // A new budget (whole pages; a node manager lent more or asks some back).
  // Shrinking evicts the least recently migrated pages first, never those of
  // the kernel running now; returns the budget it has after: more than asked
  // only while that kernel's pages hold it up. 0 sends every page to the
  // host, that kernel's too (a suspension: what it still uses faults back),
  // unless absent pages are unmapped. Unmapped, it returns once the moves
  // have ended: the device has the memory back.
  uint64_t set_budget(uint64_t bytes);
  // Runs the moves queued on the pager's threads and ends the threads: from
  // here on the driver calls run on the thread that decides them. For
  // process exit, before the driver's own teardown.
  void go_inline() noexcept;

  [[nodiscard]] UmPagerStats stats() const;
  [[nodiscard]] uint64_t budget_bytes() const;
  // The least budget the job runs with, no driver paging inside a kernel:
  // the largest kernel's working set so far (0 before the first kernel).
  [[nodiscard]] uint64_t floor_bytes() const;
  // What its transfer model takes the host link to move per second, the
  // slower direction.
  [[nodiscard]] uint64_t link_bytes_per_second() const;
  [[nodiscard]] uint64_t resident_bytes() const;

 private:
  // Events the pager threads record for a wait to follow them: after
  // evictions (a prefetch or a kernel waits), after prefetches (a kernel
  // waits); taken in turn. A mark is recorded again only once the wait on
  // its last record has been issued (`waiter`'s call `wait_ticket`, where a
  // pager thread waits; the launching thread waits at once): a wait issued
  // after a newer record would wait for other work, or for work that waits
  // for the waiter.
  struct StreamMark {
    EventHandle event{};
    PagerThread* waiter = nullptr;
    uint64_t wait_ticket = 0;
  };
  UmPager(Driver& driver, DeviceId device, VaRange arena, uint64_t page_bytes, const UmPagerOptions& options);

  struct Block {
    uint32_t id = 0;
    uint64_t bytes = 0;
  };

  [[nodiscard]] VaRange page_range(PageId page) const;
  // The blocks `used` points into, each once (unknown pointers counted in
  // *unknown), then those their pointer tables reach (counted in *reached,
  // if given), and all their pages, sorted, each once; *block_hash, if
  // given, the start offsets of the blocks `used` names, folded in that
  // order (exec_id.h). Holds mutex_.
  void resolve_locked(std::span<const VaRange> used, std::vector<uint32_t>* block_ids, std::vector<PageId>* pages,
                      std::vector<VaRange>* blocks, uint64_t* unknown, uint64_t* block_hash = nullptr,
                      uint64_t* reached = nullptr) const;
  void apply(const Decisions& decisions);
  void prefetch(PageId page);
  // Takes a resident page off the GPU: sent to the host (a copy only when it
  // holds data), or, a dead page discarded where the driver takes those back,
  // let go without a move. True if it was sent.
  bool evict(PageId page);
  void discard(PageId page);
  void discard_now(PageId page);
  // Holds every page of a freed block while work queued on `work_on` (if it
  // is not done yet) or on `also_used_on` may still read it.
  void hold_pages(const BlockExtent& extent, std::optional<StreamHandle> work_on,
                  std::span<const StreamHandle> also_used_on);
  // Ends the holds whose work is done, and discards the dead pages whose
  // discard waited for them.
  void poll_deferred();
  // What the pager asks of the driver for a page, in the order a batch
  // hands them over (flush_batch).
  enum BatchKind : uint8_t { kDiscard, kToHost, kToDevice, kDiscardAndFetch, kKinds, kNotBatched = kKinds };
  // While one is alive (they nest), queue() collects the pager's requests;
  // the outermost hands them over as it ends, however it ends.
  struct BatchScope {
    UmPager& pager;
    explicit BatchScope(UmPager& p) : pager(p) { ++pager.batch_depth_; }
    ~BatchScope() {
      if (--pager.batch_depth_ == 0) pager.flush_batch();
    }
    BatchScope(const BatchScope&) = delete;
    BatchScope& operator=(const BatchScope&) = delete;
  };
  // Queues the request for the page: within a BatchScope it joins the
  // batch, else it is handed over at once. Notes the stream waits it needs.
  void queue(PageId page, uint8_t kind);
  // Hands the batch to the driver: one call per kind, sorted by address,
  // adjacent pages as one range, each after the stream waits it needs.
  void flush_batch() noexcept;
  void hand_over(uint8_t kind, std::span<const VaRange> ranges) noexcept;
  // Runs the driver call for `kind` on `ranges` on its pager thread (a copy
  // of them travels with it; inline where none can be made).
  void issue(PagerThread& thread, uint8_t kind, std::span<const VaRange> ranges) noexcept;
  // The driver call itself, on a pager thread.
  void call_driver(uint8_t kind, std::span<const VaRange> ranges) noexcept;
  // The next stream mark, recorded on `stream` by `thread`; returns it and,
  // in *ticket, the record's ticket. Whoever waits on a pager thread for
  // the record sets the mark's waiter.
  StreamMark& record_on(PagerThread& thread, StreamHandle stream, uint64_t* ticket) noexcept;
  // Makes the eviction stream wait, before the next evictions, for the
  // kernel that last used `page` (unmapped pages: for the last one on each
  // stream that used it since it last left, or for the device to drain if
  // one was forgotten).
  void note_last_use(PageId page);
  // An unmapped page's use by the kernel of `stamp` on `stream`.
  void note_stream_use(PageId page, StreamHandle stream, uint64_t stamp);
  // The same for the kernel of `stamp` (0: none) on `stream`. Where its
  // mark is gone (kLaunchMarks launches since): managed pages take it to be
  // done (at worst the page faults back); unmapped ones wait for the oldest
  // later launch on its stream still marked, which ends after it, or, with
  // none, for the device to drain.
  void note_use(uint64_t stamp, StreamHandle stream);
  // The stamp of the oldest marked launch on `stream` later than `stamp`; 0 if none.
  [[nodiscard]] uint64_t oldest_mark_after(uint64_t stamp, StreamHandle stream) const;
  // `waiting` (the stream of `waiter`'s calls) waits for what `recorder`
  // has issued on `recorded` so far: `waiter` runs the wait once
  // `recorder` has recorded it (a wait issued before the record would wait
  // for an older one).
  void stream_waits_for(PagerThread& waiter, StreamHandle waiting, PagerThread& recorder,
                        StreamHandle recorded) noexcept;
  // Issues the eviction stream's noted waits (after the prefetches of the
  // pages they send out, when still queued); the prefetch stream's wait for
  // the evictions, when the prefetches need it.
  void wait_before_evictions() noexcept;
  void wait_before_prefetches() noexcept;
  // Makes the announced kernel's stream wait for the moves it needs.
  void fence_kernel();
  // Swapped pages a move of was refused, where the pager does not count
  // them (marked where the move ran: a pager thread, or the calling thread
  // inline; under refused_mu_, the count readable without it). A refused
  // fetch: counted on the GPU, not mapped; fetched again before its next
  // kernel (refetch_refused). A refused eviction: counted gone, still
  // mapped; sent out again before the next kernel, or counted on the GPU
  // again where that fails too (settle_stayed), so that the pager's count
  // stays what the device holds.
  struct RefusedMoves {
    std::vector<uint8_t> marked;
    std::atomic<uint64_t> count{0};
    void mark(PageId page) {
      if (marked[page] == 0) count.fetch_add(1, std::memory_order_release);
      marked[page] = 1;
    }
    // Whether the page was marked; unmarks it.
    bool take(PageId page) {
      if (marked[page] == 0) return false;
      marked[page] = 0;
      count.fetch_sub(1, std::memory_order_release);
      return true;
    }
  };
  // Marks the pages of `ranges` in `moves` (refused_fetches_ or
  // refused_evictions_); before a kernel, refetch_refused fetches its marked
  // pages again and its stream waits for that, or, refused again, refuses
  // the kernel; settle_stayed sends the others out again.
  void mark_refused(RefusedMoves& moves, std::span<const VaRange> ranges) noexcept;
  void refetch_refused();
  void settle_stayed();
  // Counts a call into the driver that moved pages; logs its first refusal.
  void note_migration(const Status& status, bool to_host, size_t ranges) noexcept;
  // Whether `stream` is capturing no CUDA graph (a fence there would join it).
  [[nodiscard]] bool outside_graphs(StreamHandle stream);
  // Records `event` (made the first time) on `stream`; false if it could not.
  [[nodiscard]] bool recorded(EventHandle& event, StreamHandle stream);
  void note_peak();
  // Reads the driver's fault reports (on_iteration).
  void take_fault_reports();
  // Evicts the least recently migrated page no running kernel uses (*moved:
  // whether it was sent); false if none.
  bool evict_oldest_unpinned(bool* moved);
  // Evicts until a slot is free, counting pages sent in *counter; false when
  // no page can make room.
  bool make_room(uint64_t* counter);
  // Counts an absent page on the GPU without migrating it (the device brings
  // it: a fault), room made first; false when no page can make room.
  bool count_arrival(PageId page);
  // Evicts the least recently migrated pages no running kernel uses until
  // `target` pages are occupied or none is left to evict, counting pages
  // sent in budget_evictions; the budget is then the larger of the two.
  void shrink_to(uint32_t target);
  [[nodiscard]] bool pinned(PageId page) const { return in_kernel_ && pinned_[page] == kernel_stamp_; }

  Driver& driver_;
  const DeviceId device_;
  const VaRange arena_;
  const uint64_t page_bytes_;
  const UmPagerOptions options_;
  StreamHandle to_device_{};  // prefetches and discards
  StreamHandle to_host_{};    // evictions
  // The driver discards (Capabilities::discard), and takes discarded device
  // pages back without a move (discard_releases_device_pages).
  bool can_discard_ = false;
  bool discard_releases_ = false;
  // Absent pages are unmapped (Capabilities::absent_pages_unmapped): nothing
  // faults in, so a kernel's absent pages are all fetched, those beyond the
  // budget too (it grows for that kernel, and back to `given_pages_`, what
  // set_budget last asked, at the next kernel).
  bool absent_unmapped_ = false;
  uint32_t given_pages_ = 0;
  std::mutex refused_mu_;  // guards the two below (RefusedMoves)
  RefusedMoves refused_fetches_;
  RefusedMoves refused_evictions_;
  bool kernel_refused_ = false;  // the announced kernel's, under mutex_
  // Requests not yet handed to the driver, a page each, by kind; per page,
  // the kind it is batched as (kNotBatched: none).
  uint32_t batch_depth_ = 0;
  std::vector<VaRange> batch_[kKinds];
  // A launch's mark: an event recorded after the kernel of `stamp` on its
  // stream. The last kLaunchMarks launches are kept; a page last used
  // earlier is taken to be done with (evicting it early costs a fault back,
  // never data). A mark is recorded again only once the eviction thread
  // has issued the last wait on it (its call `evictions_wait`): a wait
  // issued after the newer record would wait for a later kernel, which may
  // itself wait for those evictions.
  struct LaunchMark {
    EventHandle event{};
    uint64_t stamp = 0;
    StreamHandle stream{};
    uint64_t evictions_wait = 0;
  };
  static constexpr size_t kLaunchMarks = 256;
  std::vector<LaunchMark> launch_marks_;
  // Per page: the stamp of the last kernel announced with it (managed pages;
  // unmapped ones keep stream_uses_ instead).
  std::vector<uint64_t> last_use_;
  // Unmapped pages, per page: the last use on each of the last few streams
  // that used it since it last left (a kernel on one stream may still run
  // after a later one on another), and whether a stream's was pushed out.
  static constexpr size_t kUseStreams = 4;
  struct StreamUses {
    std::array<std::pair<StreamHandle, uint64_t>, kUseStreams> last{};  // (stream, stamp); stamp 0: empty
    bool forgotten = false;
  };
  std::vector<StreamUses> stream_uses_;
  // An eviction waits for a launch whose mark is gone: the device drains first.
  bool drain_before_evictions_ = false;
  // Launches the eviction stream must wait for before its next call (the
  // latest per launch stream), and those it waits for already.
  std::vector<std::pair<StreamHandle, uint64_t>> out_waits_;
  std::vector<std::pair<StreamHandle, uint64_t>> out_waited_;
  // Calls on each pager stream, numbered (a batch of one kind is one call);
  // per page, the call that last moved (or discarded) it each way; what of
  // the eviction stream the prefetch stream waits for already; the last
  // discard's call; per launch stream, what of each pager stream it waits
  // for already.
  uint64_t out_calls_ = 0;
  uint64_t in_calls_ = 0;
  uint64_t in_calls_waited_ = 0;  // of those, the ones the launching thread saw run (swapped pages)
  std::vector<uint64_t> out_call_of_;
  std::vector<uint64_t> in_call_of_;
  uint64_t outs_before_ins_ = 0;
  uint64_t ins_before_outs_ = 0;
  uint64_t last_discard_call_ = 0;
  struct KernelWaits {
    StreamHandle stream{};
    uint64_t ins = 0;
    uint64_t outs = 0;
  };
  std::vector<KernelWaits> kernel_waits_;
  // Pages sent out since the prefetch stream last waited for the evictions:
  // still on the GPU for all the prefetches know. Whether the batched
  // prefetches take such a page's slot, or bring one of them back.
  uint64_t leaving_ = 0;
  bool ins_wait_for_outs_ = false;
  // Whether the batched evictions send out a page whose prefetch (or
  // discard) the eviction stream has not waited for: they wait for it, or
  // the page would leave before it arrives and then arrive.
  bool outs_wait_for_ins_ = false;
  static constexpr size_t kStreamMarks = 64;
  std::vector<StreamMark> stream_marks_;
  size_t next_stream_mark_ = 0;
  // The driver calls' own threads (inline unless options.pager_threads):
  // evictions on out_thread_, prefetches and discards on in_thread_.
  std::unique_ptr<PagerThread> out_thread_;
  std::unique_ptr<PagerThread> in_thread_;
  // What the pager threads count (stats() adds them).
  std::atomic<uint64_t> migration_calls_{0};
  std::atomic<uint64_t> migration_ranges_{0};
  std::atomic<uint64_t> driver_errors_{0};
  // Stream order (before_kernel): the announced kernel's stream.
  StreamHandle launch_stream_{};
  // Held from before_kernel() to after_kernel() (taken before mutex_).
  std::mutex announcing_;
  mutable std::mutex mutex_;
  Residency residency_;
  std::unique_ptr<PagingPolicy> policy_;
  std::map<uintptr_t, Block> blocks_;  // live blocks by address
  // Per block id: its pointer tables, each where a copy wrote it and the
  // addresses it holds (on_pointer_table).
  struct PointerTable {
    VaRange written{};
    std::vector<uintptr_t> targets;  // sorted
  };
  std::unordered_map<uint32_t, std::vector<PointerTable>> tables_;
  uint32_t next_block_ = 0;
  uint32_t iteration_ = 0;
  uint64_t clock_ = 0;  // counts migrations: the residency's "migrated at" order
  std::vector<uint64_t> pinned_;  // the kernel stamp that uses each page
  uint64_t kernel_stamp_ = 0;
  bool in_kernel_ = false;
  // The pages of a freed block that work queued before the free (on the
  // freeing stream, or on another that used the block) may still read.
  struct Hold {
    std::vector<EventHandle> events;  // one per stream with work pending
    std::vector<PageId> pages;
  };
  std::deque<Hold> holds_;
  // Per page: how many holds include it (a hold whose event could not be
  // recorded never ends), and whether a discard waits for them to end.
  std::vector<uint32_t> held_by_;
  std::vector<uint8_t> discard_when_released_;
  std::vector<PageId> kernel_pages_;
  std::vector<uint32_t> kernel_blocks_;
  std::vector<PageId> faulted_;
  uint64_t kernel_exec_id_ = 0;
  uint64_t kernel_duration_ns_ = 0;
  size_t largest_kernel_pages_ = 0;
  Decisions decisions_;
  Decisions ahead_;  // the policy's prefetches for later kernels, issued after the fence
  UmPagerStats stats_;
  // Fault reports: whether the driver gives them, whether this thread's work
  // carries a kernel's tag now, what kernels used unnamed, the next op's
  // place in the iteration, the stamp of the last kernel when the reports
  // were last read, a buffer; per page, the kernel stamp when the pager last
  // placed it (a report of an earlier kernel is older than the pager's view).
  static constexpr uint64_t kReadReportsEvery = 4096;
  bool fault_reports_ = false;
  bool tagged_ = false;
  UnseenUses unseen_;
  uint32_t op_index_ = 0;
  uint64_t stamp_at_last_take_ = 0;
  std::vector<ManagedFault> reports_;
  std::vector<uint64_t> settled_;
  std::vector<uint8_t> batched_;
};

}  // namespace zico::prefetch
