#include "um_pager.h"

#include <algorithm>
#include <iterator>
#include <new>

#include "exec_id.h"
#include "log.h"
#include "sizes.h"

namespace zico::prefetch {

Status UmPager::create(Driver& driver, DeviceId device, VaRange arena, uint64_t page_bytes,
                       const UmPagerOptions& options, std::unique_ptr<UmPager>* out, std::string* why) {
  const auto invalid = [why](std::string text) {
    *why = std::move(text);
    return Status(Errc::kInvalidArgument);
  };
  if (page_bytes == 0 || arena.bytes == 0 || arena.base % page_bytes != 0 || arena.bytes % page_bytes != 0) {
    return invalid("the managed arena must be a whole number of " + std::to_string(page_bytes) + "-byte pages");
  }
  if (arena.bytes / page_bytes > UINT32_MAX) return invalid("the managed arena has too many pages");
  if (std::find(std::begin(kPolicyNames), std::end(kPolicyNames), options.policy) == std::end(kPolicyNames)) {
    return invalid("unknown paging policy '" + options.policy + "' (accepted: um, deepum, autoswap, zico)");
  }
  if (options.budget_bytes < page_bytes) {
    return invalid("a budget of " + std::to_string(options.budget_bytes) + " bytes holds no " +
                   std::to_string(page_bytes) + "-byte page");
  }
  if (const std::string bad = options.model.invalid_field(); !bad.empty()) return invalid("transfer model: " + bad);
  Capabilities caps;
  if (Status status = driver.capabilities(device, &caps); !status.is_ok()) {
    *why = "cannot read the device's capabilities";
    return status;
  }
  if (!caps.managed_memory) {
    *why = "device " + std::to_string(device.value) + " has no managed memory";
    return Status(Errc::kNotSupported);
  }
  if (!caps.concurrent_managed_access) {
    *why = "device " + std::to_string(device.value) +
           " has no concurrent managed access (a GPU before Pascal, Windows or WSL, some vGPUs): its pages "
           "cannot fault in on demand, so no budget can hold";
    return Status(Errc::kNotSupported);
  }
  std::unique_ptr<UmPager> pager(new UmPager(driver, device, arena, page_bytes, options));
  pager->can_discard_ = caps.discard;
  pager->discard_releases_ = caps.discard && caps.discard_releases_device_pages;
  pager->absent_unmapped_ = caps.absent_pages_unmapped;
  if (pager->absent_unmapped_) {
    pager->stream_uses_.resize(pager->last_use_.size());
    pager->refused_fetches_.marked.resize(pager->last_use_.size(), 0);
    pager->refused_evictions_.marked.resize(pager->last_use_.size(), 0);
  }
  pager->given_pages_ = pager->residency_.budget_pages();
  for (StreamHandle* stream : {&pager->to_device_, &pager->to_host_}) {
    if (Status status = driver.stream_create(device, stream); !status.is_ok()) {
      *why = "cannot create the pager's streams";
      return status;
    }
  }
  for (StreamMark& mark : pager->stream_marks_) {
    if (Status status = driver.event_create(device, &mark.event); !status.is_ok()) {
      mark.event = EventHandle{};
      *why = "cannot create the pager's events";
      return status;
    }
  }
  // Timelines 1 and 2: the simulated backend's names for their host time.
  pager->out_thread_ = std::make_unique<PagerThread>(driver, 1, options.pager_threads);
  pager->in_thread_ = std::make_unique<PagerThread>(driver, 2, options.pager_threads);
  if (pager->out_thread_->threaded() != pager->in_thread_->threaded()) {
    // One thread could not be had: both run inline (a call on one thread
    // may wait for the other's).
    pager->out_thread_->go_inline();
    pager->in_thread_->go_inline();
  }
  if (options.learn_from_faults) {
    std::string reason;
    if (driver.start_fault_reports(device, &reason).is_ok()) {
      pager->fault_reports_ = true;
    } else {
      ZICO_LOG(kInfo, "paging: no fault reports (%s): the pager knows what kernels use from their launches only",
               reason.c_str());
    }
  }
  *out = std::move(pager);
  return Status::ok();
}

UmPager::UmPager(Driver& driver, DeviceId device, VaRange arena, uint64_t page_bytes, const UmPagerOptions& options)
    : driver_(driver),
      device_(device),
      arena_(arena),
      page_bytes_(page_bytes),
      options_(options),
      launch_marks_(kLaunchMarks),
      last_use_(arena.bytes / page_bytes, 0),
      out_call_of_(arena.bytes / page_bytes, 0),
      in_call_of_(arena.bytes / page_bytes, 0),
      stream_marks_(kStreamMarks),
      residency_(page_bytes, static_cast<uint32_t>(arena.bytes / page_bytes), options.budget_bytes),
      policy_(make_policy(options_.policy, residency_, options_.model)),
      pinned_(arena.bytes / page_bytes, 0),
      held_by_(arena.bytes / page_bytes, 0),
      discard_when_released_(arena.bytes / page_bytes, 0),
      settled_(arena.bytes / page_bytes, 0),
      batched_(arena.bytes / page_bytes, kNotBatched) {}

UmPager::~UmPager() {
  // The threads first: what they still run uses the streams and the events
  // (launch marks included). Each may wait for the other's calls: both
  // finish before either goes.
  if (in_thread_ != nullptr && out_thread_ != nullptr) {
    in_thread_->go_inline();
    out_thread_->go_inline();
  }
  in_thread_.reset();
  out_thread_.reset();
  for (const Hold& hold : holds_) {
    for (const EventHandle event : hold.events) (void)driver_.event_destroy(event);
  }
  for (const LaunchMark& mark : launch_marks_) {
    if (mark.event.valid()) (void)driver_.event_destroy(mark.event);
  }
  for (const StreamMark& mark : stream_marks_) {
    if (mark.event.valid()) (void)driver_.event_destroy(mark.event);
  }
  // A stream that was never created is 0, which stream_destroy refuses.
  for (const StreamHandle stream : {to_device_, to_host_}) {
    if (stream.value != 0) (void)driver_.stream_destroy(stream);
  }
}

VaRange UmPager::page_range(PageId page) const { return VaRange{arena_.base + uint64_t{page} * page_bytes_, page_bytes_}; }

void UmPager::on_allocate(const void* ptr, uint64_t bytes) {
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  if (bytes == 0 || !arena_.contains(VaRange{addr, bytes})) return;
  std::lock_guard lock(mutex_);
  const uint32_t id = next_block_++;
  blocks_[addr] = Block{id, bytes};
  const BlockExtent extent{addr - arena_.base, bytes};
  for (PageId page = first_page(extent, page_bytes_); page <= last_page(extent, page_bytes_); ++page) {
    residency_.add_live(page, bytes_on_page(extent, page_bytes_, page));
  }
  decisions_.clear();
  policy_->on_allocate(id, extent, &decisions_);
  apply(decisions_);
}

void UmPager::on_free(const void* ptr, std::optional<StreamHandle> work_on,
                      std::span<const StreamHandle> also_used_on) {
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard lock(mutex_);
  BatchScope batch(*this);  // the discards the poll and this free make: one call
  poll_deferred();
  auto it = blocks_.find(addr);
  if (it == blocks_.end()) return;
  const Block block = it->second;
  blocks_.erase(it);
  tables_.erase(block.id);
  const BlockExtent extent{addr - arena_.base, block.bytes};
  std::vector<PageId> dead;
  for (PageId page = first_page(extent, page_bytes_); page <= last_page(extent, page_bytes_); ++page) {
    if (residency_.remove_live(page, bytes_on_page(extent, page_bytes_, page))) dead.push_back(page);
  }
  // Work still queued that may read the block holds its pages first, so that
  // the policy's discards below (and later frees') wait for it.
  hold_pages(extent, work_on, also_used_on);
  decisions_.clear();
  policy_->on_free(block.id, extent, dead, &decisions_);
  apply(decisions_);
}

void UmPager::hold_pages(const BlockExtent& extent, std::optional<StreamHandle> work_on,
                         std::span<const StreamHandle> also_used_on) {
  Hold hold;
  bool forever = false;  // an event could not be recorded: the pages stay held
  const auto wait_for = [&](StreamHandle stream, bool skip_if_done) {
    EventHandle event;
    if (!driver_.event_create(device_, &event).is_ok()) {
      forever = true;
      return;
    }
    bool done = false;
    if (!driver_.event_record(event, stream).is_ok()) {
      forever = true;
    } else if (!skip_if_done || !driver_.event_query(event, &done).is_ok() || !done) {
      hold.events.push_back(event);
      return;
    }
    (void)driver_.event_destroy(event);
  };
  if (work_on.has_value()) wait_for(*work_on, true);
  for (const StreamHandle stream : also_used_on) wait_for(stream, false);
  if (hold.events.empty() && !forever) return;
  for (PageId page = first_page(extent, page_bytes_); page <= last_page(extent, page_bytes_); ++page) {
    ++held_by_[page];
    hold.pages.push_back(page);
  }
  if (forever) {
    for (const EventHandle event : hold.events) (void)driver_.event_destroy(event);
    return;
  }
  holds_.push_back(std::move(hold));
}

void UmPager::poll_deferred() {
  // Oldest first, stopping at the first hold still pending: a poll costs a
  // query or two, not one per hold (a later hold only ends a little late).
  BatchScope batch(*this);
  for (auto it = holds_.begin(); it != holds_.end();) {
    const bool done = std::all_of(it->events.begin(), it->events.end(), [&](EventHandle event) {
      bool complete = false;
      return driver_.event_query(event, &complete).is_ok() && complete;
    });
    if (!done) break;
    for (const PageId page : it->pages) {
      if (--held_by_[page] != 0 || !discard_when_released_[page]) continue;
      discard_when_released_[page] = 0;
      if (!residency_.live(page) && residency_.has_data(page)) discard_now(page);
    }
    for (const EventHandle event : it->events) (void)driver_.event_destroy(event);
    it = holds_.erase(it);
  }
}

void UmPager::resolve_locked(std::span<const VaRange> used, std::vector<uint32_t>* block_ids,
                             std::vector<PageId>* pages, std::vector<VaRange>* blocks, uint64_t* unknown,
                             uint64_t* block_hash, uint64_t* reached) const {
  block_ids->clear();
  pages->clear();
  if (blocks != nullptr) blocks->clear();
  // Names the live block holding `addr`, once; returns where that block
  // ends (0: no block holds it). Its offset goes into *block_hash if `hash`.
  const auto name_block_at = [&](uintptr_t addr, bool hash) -> uintptr_t {
    auto it = blocks_.upper_bound(addr);
    if (it == blocks_.begin() || addr >= std::prev(it)->first + std::prev(it)->second.bytes) return 0;
    --it;
    const uintptr_t end = it->first + it->second.bytes;
    if (std::find(block_ids->begin(), block_ids->end(), it->second.id) != block_ids->end()) return end;
    block_ids->push_back(it->second.id);
    if (blocks != nullptr) blocks->push_back(VaRange{it->first, it->second.bytes});
    const BlockExtent extent{it->first - arena_.base, it->second.bytes};
    if (hash && block_hash != nullptr) *block_hash = add_block(*block_hash, extent.offset);
    for (PageId page = first_page(extent, page_bytes_); page <= last_page(extent, page_bytes_); ++page) {
      pages->push_back(page);
    }
    if (!hash && reached != nullptr) ++*reached;
    return end;
  };
  for (const VaRange& range : used) {
    if (name_block_at(range.base, true) == 0) ++*unknown;
  }
  // The blocks the named blocks' pointer tables reach (on_pointer_table):
  // named too, but not part of the launch's identity. Targets are sorted:
  // those in a block already named are skipped (a batched GEMM's table
  // points into a few blocks, thousands of times).
  const size_t named = block_ids->size();
  for (size_t i = 0; i < named && !tables_.empty(); ++i) {
    const auto tables = tables_.find((*block_ids)[i]);
    if (tables == tables_.end()) continue;
    for (const PointerTable& table : tables->second) {
      for (auto target = table.targets.begin(); target != table.targets.end();) {
        const uintptr_t end = name_block_at(*target, false);
        target = std::lower_bound(target, table.targets.end(), end != 0 ? end : *target + 1);
      }
    }
  }
  std::sort(pages->begin(), pages->end());
  pages->erase(std::unique(pages->begin(), pages->end()), pages->end());
}

uint64_t UmPager::working_set_bytes(std::span<const VaRange> used) const {
  std::vector<uint32_t> block_ids;
  std::vector<PageId> pages;
  uint64_t unknown = 0;
  std::lock_guard lock(mutex_);
  resolve_locked(used, &block_ids, &pages, nullptr, &unknown);
  return uint64_t{pages.size()} * page_bytes_;
}

uint64_t UmPager::before_kernel(uint64_t exec_id, std::span<const VaRange> used, uint64_t duration_ns,
                               std::vector<VaRange>* blocks, StreamHandle stream, GivenId given) {
  // One kernel at a time from announcement to launch: held until
  // after_kernel, released here if this throws.
  std::unique_lock announcing(announcing_);
  std::lock_guard lock(mutex_);
  poll_deferred();
  // The reports are read at each iteration mark, and every kReadReportsEvery
  // kernels in between, so that a job which never marks one keeps the budget too.
  if (fault_reports_ && kernel_stamp_ - stamp_at_last_take_ >= kReadReportsEvery) take_fault_reports();
  launch_stream_ = stream;  // after_kernel records there, on this (the launching) thread
  // The last kernel's pages beyond the budget go (unmapped pages only: the
  // others never raise it).
  if (absent_unmapped_ && residency_.budget_pages() > given_pages_) {
    BatchScope batch(*this);
    shrink_to(given_pages_);
  }
  uint64_t block_hash = 0;
  resolve_locked(used, &kernel_blocks_, &kernel_pages_, blocks, &stats_.unknown_pointers,
                 given == GivenId::kKernel ? &block_hash : nullptr, &stats_.table_named_blocks);
  if (given == GivenId::kKernel) exec_id = exec_id_at(exec_id, block_hash);
  ++kernel_stamp_;
  if (fault_reports_) {
    // What this op used last time beyond what it names: used again (unless
    // its block was freed since), so fetched and counted like the rest.
    unseen_.announce(kernel_stamp_, op_index_, exec_id, kernel_pages_);
    const size_t named = kernel_pages_.size();
    unseen_.learnt_for(op_index_++, exec_id, &kernel_pages_);
    kernel_pages_.erase(std::remove_if(kernel_pages_.begin() + static_cast<std::ptrdiff_t>(named), kernel_pages_.end(),
                                       [this](PageId page) { return !residency_.live(page); }),
                        kernel_pages_.end());
    if (kernel_pages_.size() > named) {
      std::sort(kernel_pages_.begin(), kernel_pages_.end());
      kernel_pages_.erase(std::unique(kernel_pages_.begin(), kernel_pages_.end()), kernel_pages_.end());
    }
  }
  largest_kernel_pages_ = std::max(largest_kernel_pages_, kernel_pages_.size());
  in_kernel_ = true;
  for (const PageId page : kernel_pages_) pinned_[page] = kernel_stamp_;
  for (const PageId page : kernel_pages_) {
    // Unmapped pages keep the last use on each stream instead: those kernels
    // may still run after this one, and the page must not leave under them.
    if (absent_unmapped_) {
      note_stream_use(page, stream, kernel_stamp_);
    } else {
      last_use_[page] = kernel_stamp_;
    }
  }
  kernel_exec_id_ = exec_id;
  kernel_duration_ns_ = duration_ns;
  ++stats_.kernels;

  // No plan keeps such a kernel within the budget: the driver pages it on
  // demand while it runs, slowly but correctly (swapped pages cannot fault:
  // all come in, beyond the budget). Said once, with the numbers.
  const uint64_t budget = uint64_t{residency_.budget_pages()} * page_bytes_;
  if (kernel_pages_.size() * page_bytes_ > budget && stats_.oversized_kernels++ == 0) {
    ZICO_LOG(kWarn, "paging: a kernel uses %s of pages, more than the budget (%s); %s; a budget of at least its "
             "working set avoids that", format_size(kernel_pages_.size() * page_bytes_).c_str(),
             format_size(budget).c_str(),
             absent_unmapped_ ? "they are all brought in, beyond the budget, while it runs"
                              : "the driver pages it on demand while it runs (slow)");
  }
  const OpView view{exec_id, duration_ns, kernel_pages_, kernel_blocks_};
  decisions_.clear();
  policy_->on_op_start(view, &decisions_);
  // The kernel waits for the prefetch stream only when its pages have moves
  // there it has not waited for (fetched now or ahead, or discarded), and
  // for the eviction stream only when it faults into room made for it.
  // Prefetches for later kernels go after the fence, and a kernel whose
  // pages are all there does not wait for them.
  ahead_.clear();
  const auto for_later = [this](const Decision& d) {
    return d.kind == Decision::Kind::kPrefetch && !std::binary_search(kernel_pages_.begin(), kernel_pages_.end(), d.page);
  };
  std::copy_if(decisions_.begin(), decisions_.end(), std::back_inserter(ahead_), for_later);
  decisions_.erase(std::remove_if(decisions_.begin(), decisions_.end(), for_later), decisions_.end());
  // What is still absent is fetched now (a policy that fetches what ops
  // name), or faults in when the kernel runs (the others: the UVM driver's
  // way): room first, the least recently migrated page the kernel does not
  // use going out. All of it joins the policy's moves in one batch, handed
  // over before the fence.
  faulted_.clear();
  uint64_t beyond = 0;  // pages the driver brings with no room in the budget
  {
    BatchScope batch(*this);
    apply(decisions_);
    // Unmapped pages cannot fault in: they are always fetched.
    const bool fetch = policy_->fetches_named_pages() || absent_unmapped_;
    for (const PageId page : kernel_pages_) {
      if (residency_.state(page) != PageState::kAbsent) continue;
      // No room: the kernel alone needs more than the budget, the driver's
      // eviction decides; an unmapped page is fetched over the budget.
      if (!make_room(&stats_.room_evictions)) {
        ++beyond;
        if (!absent_unmapped_) continue;
        residency_.set_budget_pages(residency_.budget_pages() + 1);
      } else if (!fetch) {
        count_arrival(page);
        faulted_.push_back(page);
        continue;
      }
      prefetch(page);
      ++stats_.named_fetches;
    }
  }
  stats_.faulted_pages += faulted_.size();
  if (!faulted_.empty()) policy_->on_faults(view, faulted_);
  note_peak();
  stats_.peak_over_budget_bytes = std::max(stats_.peak_over_budget_bytes, beyond * page_bytes_);
  fence_kernel();
  kernel_refused_ = false;
  if (absent_unmapped_) {
    // Whether the kernel's pages were mapped is known once their fetches
    // have run: fence_kernel waited for them, unless it put no wait on the
    // stream (a graph capture beside it).
    if (std::any_of(kernel_pages_.begin(), kernel_pages_.end(),
                    [this](PageId page) { return in_call_of_[page] > in_calls_waited_; })) {
      in_thread_->drain();
      in_calls_waited_ = in_calls_;
    }
    if (refused_fetches_.count.load(std::memory_order_acquire) != 0) refetch_refused();
    if (refused_evictions_.count.load(std::memory_order_acquire) != 0) settle_stayed();
  }
  apply(ahead_);
  // The faults the kernel causes are reported under its stamp.
  if (fault_reports_) {
    if (tagged_) driver_.untag_work();
    driver_.tag_work(kernel_stamp_);
    tagged_ = true;
  }
  announcing.release();
  return faulted_.size();
}

void UmPager::after_kernel() {
  std::unique_lock announcing(announcing_, std::adopt_lock);  // before_kernel's, released on return
  std::lock_guard lock(mutex_);
  if (tagged_) {
    driver_.untag_work();
    tagged_ = false;
  }
  if (!in_kernel_) return;
  // The kernel is queued now: what an eviction of its pages waits for.
  // Recorded here, on the launching thread, so that a per-thread stream is
  // that thread's, and a stream destroyed later is never touched again.
  LaunchMark& mark = launch_marks_[kernel_stamp_ % kLaunchMarks];
  if (mark.evictions_wait != 0) out_thread_->wait_for(mark.evictions_wait);
  mark.evictions_wait = 0;
  mark.stamp = outside_graphs(launch_stream_) && recorded(mark.event, launch_stream_) ? kernel_stamp_ : 0;
  mark.stream = launch_stream_;
  for (const PageId page : kernel_pages_) residency_.set_has_data(page, true);
  in_kernel_ = false;
  const OpView view{kernel_exec_id_, kernel_duration_ns_, kernel_pages_, kernel_blocks_};
  decisions_.clear();
  policy_->on_op_end(view, &decisions_);
  apply(decisions_);
}

void UmPager::on_iteration() {
  std::lock_guard lock(mutex_);
  BatchScope batch(*this);
  poll_deferred();
  if (fault_reports_) {
    take_fault_reports();
    op_index_ = 0;
  }
  decisions_.clear();
  policy_->on_iteration(iteration_++, &decisions_);
  apply(decisions_);
}

void UmPager::take_fault_reports() {
  reports_.clear();
  stamp_at_last_take_ = kernel_stamp_;
  BatchScope batch(*this);
  if (!driver_.take_fault_reports(arena_, &reports_).is_ok()) return;
  for (const ManagedFault& report : reports_) {
    const auto page = static_cast<PageId>((report.address - arena_.base) / page_bytes_);
    if (report.tag != 0 && unseen_.on_fault(report.tag, page)) ++stats_.unnamed_faults;
    // A page the pager placed (brought, sent away or counted) while its
    // kernel was announced or after is where the pager put it. One it counts
    // absent is on the GPU otherwise, unasked: counted there, room made for
    // it. An untagged report (a copy's, an unannounced kernel's) cannot be
    // ordered against the pager's moves; counting it at worst costs a slot
    // until the page is evicted as the oldest.
    if (residency_.state(page) != PageState::kAbsent || (report.tag != 0 && settled_[page] >= report.tag)) continue;
    if (!count_arrival(page)) continue;
    residency_.set_has_data(page, true);
    ++stats_.unasked_arrivals;
  }
  unseen_.reports_read();
  stats_.learnt_pages = unseen_.learnt_pages();
  note_peak();
}

void UmPager::apply(const Decisions& decisions) {
  BatchScope batch(*this);  // handed over however this ends (a caller catches bad_alloc thrown below)
  for (const Decision& d : decisions) {
    switch (d.kind) {
      case Decision::Kind::kPrefetch: prefetch(d.page); break;
      case Decision::Kind::kEvict:
        if (residency_.state(d.page) == PageState::kAbsent && discard_releases_ && !residency_.live(d.page) &&
            !residency_.has_data(d.page)) {
          break;  // a dead page its discard took off the GPU already
        }
        if (residency_.state(d.page) != PageState::kResident || pinned(d.page)) {
          ++stats_.refused_evictions;
        } else if (evict(d.page)) {
          ++stats_.evictions;
        }
        break;
      case Decision::Kind::kDiscard: discard(d.page); break;
    }
  }
  note_peak();
}

void UmPager::prefetch(PageId page) {
  if (residency_.state(page) != PageState::kAbsent) return;  // there already
  if (residency_.free_pages() == 0) {
    ++stats_.refused_prefetches;
    return;
  }
  residency_.start_arrival(page);
  residency_.arrive(page, clock_++);
  settled_[page] = kernel_stamp_;
  ++stats_.prefetches;
  // A page with no live bytes, that no queued work reads, holds nothing
  // worth a copy: discarded on its way in. A live one moves as it is (its
  // block may hold bytes written where the pager does not look).
  if (can_discard_ && !residency_.live(page) && held_by_[page] == 0) {
    residency_.set_has_data(page, false);
    ++stats_.discarded_prefetches;
    queue(page, kDiscardAndFetch);
    return;
  }
  queue(page, kToDevice);
}

bool UmPager::make_room(uint64_t* counter) {
  bool moved = false;
  while (residency_.free_pages() == 0 && evict_oldest_unpinned(&moved)) {
    if (moved) ++*counter;
  }
  return residency_.free_pages() != 0;
}

bool UmPager::count_arrival(PageId page) {
  if (!make_room(&stats_.room_evictions)) return false;
  residency_.start_arrival(page);
  residency_.arrive(page, clock_++);
  settled_[page] = kernel_stamp_;
  return true;
}

bool UmPager::evict_oldest_unpinned(bool* moved) {
  for (const auto& [migrated, candidate] : residency_.by_migration()) {
    if (pinned(candidate)) continue;
    *moved = evict(candidate);
    return true;
  }
  return false;
}

uint64_t UmPager::set_budget(uint64_t bytes) {
  uint64_t budget = 0;
  {
    std::lock_guard lock(mutex_);
    BatchScope batch(*this);  // handed over before the lock goes: the budget holds at once
    poll_deferred();
    const auto target = static_cast<uint32_t>(std::min<uint64_t>(bytes / page_bytes_, UINT32_MAX));
    given_pages_ = target;
    shrink_to(target);
    // Nothing stays: the running kernel's pages fault back if it still uses
    // them (unmapped pages cannot: the running kernel keeps them).
    while (target == 0 && !absent_unmapped_ && !residency_.by_migration().empty()) {
      stats_.budget_evictions += evict(residency_.by_migration().begin()->second);
    }
    residency_.set_budget_pages(std::max(target, residency_.occupied_pages()));
    budget = uint64_t{residency_.budget_pages()} * page_bytes_;
  }
  // Unmapped pages hold device memory until their moves end: once this
  // returns, what the budget gave up is free on the device, for whoever the
  // node manager lends it to next. (Managed pages keep theirs either way.)
  if (absent_unmapped_) {
    out_thread_->drain();
    in_thread_->drain();
  }
  return budget;
}

void UmPager::on_pointer_table(VaRange written, std::span<const uintptr_t> targets) {
  std::lock_guard lock(mutex_);
  auto it = blocks_.upper_bound(written.base);
  if (it == blocks_.begin() || written.base >= std::prev(it)->first + std::prev(it)->second.bytes) return;
  const uint32_t id = std::prev(it)->second.id;
  auto found = tables_.find(id);
  if (found != tables_.end()) {
    std::erase_if(found->second, [written](const PointerTable& table) { return table.written.overlaps(written); });
  }
  if (!targets.empty()) {
    // May throw: the caller catches (the block keeps what it had, less what this copy overwrote).
    tables_[id].push_back(PointerTable{written, std::vector<uintptr_t>(targets.begin(), targets.end())});
  } else if (found != tables_.end() && found->second.empty()) {
    tables_.erase(found);
  }
}

void UmPager::shrink_to(uint32_t target) {
  bool moved = false;
  while (residency_.occupied_pages() > target && evict_oldest_unpinned(&moved)) stats_.budget_evictions += moved;
  residency_.set_budget_pages(std::max(target, residency_.occupied_pages()));
}

bool UmPager::evict(PageId page) {
  residency_.drop(page);
  settled_[page] = kernel_stamp_;
  // A dead page discarded (or to be, once the work that reads it is done)
  // leaves without a move where the driver takes discarded pages back: sent
  // to the host, the UVM driver would undo the discard, map it on the CPU,
  // and copy its stale bytes back on its next use.
  if (discard_releases_ && !residency_.live(page)) {
    if (discard_when_released_[page] != 0) {
      ++stats_.released_pages;  // its discard gives it back once the work that reads it ends
      return false;
    }
    if (!residency_.has_data(page) && held_by_[page] == 0) {
      ++stats_.released_pages;  // populated but never written: a discard gives it back
      queue(page, kDiscard);
      return false;
    }
  }
  queue(page, kToHost);
  return true;
}

void UmPager::discard(PageId page) {
  if (residency_.live(page)) {
    ++stats_.live_discards;
    return;
  }
  if (!can_discard_ || !residency_.has_data(page)) return;  // without discards the data stays: leaving costs a copy
  // Work queued before a free may still read it: discarded when that ends.
  if (held_by_[page] != 0) {
    discard_when_released_[page] = 1;
    return;
  }
  discard_now(page);
}

void UmPager::discard_now(PageId page) {
  // From here the page holds nothing: an eviction that follows it in this
  // batch is free (the batch hands discards over first). Where the driver
  // takes discarded device pages back, the page is on the GPU no more: its
  // slot is free, and a later use brings it in without a copy.
  residency_.set_has_data(page, false);
  if (discard_releases_ && residency_.state(page) == PageState::kResident && !pinned(page)) {
    residency_.drop(page);
    settled_[page] = kernel_stamp_;
    ++stats_.released_pages;
  }
  ++stats_.discards;
  queue(page, kDiscard);
}

bool UmPager::outside_graphs(StreamHandle stream) {
  // On a stream capturing a CUDA graph a record or a wait would become a node
  // of the application's graph, and pull the pager's stream into the capture:
  // no fence there (nor while the legacy stream is blocked by one).
  CaptureState state = CaptureState::kNone;
  return driver_.stream_capture_state(stream, &state).is_ok() && state == CaptureState::kNone;
}

bool UmPager::recorded(EventHandle& event, StreamHandle stream) {
  if (!event.valid() && !driver_.event_create(device_, &event).is_ok()) {
    event = EventHandle{};
    return false;  // no event: unordered, as without a fence (correct; the driver pages)
  }
  return driver_.event_record(event, stream).is_ok();
}

void UmPager::queue(PageId page, uint8_t kind) {
  // The batch hands its kinds over in a fixed order: the same page asked
  // for earlier in a kind handed over after this one goes first.
  if (batched_[page] != kNotBatched && batched_[page] > kind) flush_batch();
  const VaRange range = page_range(page);
  if (kind == kToHost) {
    out_call_of_[page] = out_calls_ + 1;  // the next call out carries it
    ++leaving_;
    if (in_call_of_[page] > ins_before_outs_) outs_wait_for_ins_ = true;
  } else {
    in_call_of_[page] = in_calls_ + 1;
    // It takes the slot of a page still leaving, or is itself leaving: the
    // prefetch stream waits for the evictions before it.
    if (kind != kDiscard && (out_call_of_[page] > outs_before_ins_ ||
                             uint64_t{residency_.occupied_pages()} + leaving_ > residency_.budget_pages())) {
      ins_wait_for_outs_ = true;
    }
  }
  try {
    if (kind == kToHost) note_last_use(page);
    batch_[kind].push_back(range);
  } catch (const std::bad_alloc&) {
    flush_batch();  // no memory to batch: what is queued goes, then this one alone
    if (kind == kToHost) {
      out_call_of_[page] = out_calls_ + 1;
      // Its last kernel's wait may not have been noted: an unmapped page
      // leaves after the device drains instead.
      drain_before_evictions_ = drain_before_evictions_ || absent_unmapped_;
    } else {
      in_call_of_[page] = in_calls_ + 1;
    }
    hand_over(kind, std::span<const VaRange>(&range, 1));
    return;
  }
  batched_[page] = kind;
  if (batch_depth_ == 0) flush_batch();
}

void UmPager::flush_batch() noexcept {
  // Discards first (dead pages: a move of theirs that follows is free), then
  // evictions, so that the budget holds on the device before anything comes
  // in; then what comes in. Each kind in one call, sorted by address,
  // adjacent pages as one range.
  for (uint8_t kind = 0; kind < kKinds; ++kind) {
    std::vector<VaRange>& ranges = batch_[kind];
    if (ranges.empty()) continue;
    // The call each page goes in, now that the calls before it in this
    // flush are counted (a discard call may precede the prefetches).
    std::vector<uint64_t>& call_of = kind == kToHost ? out_call_of_ : in_call_of_;
    const uint64_t call = (kind == kToHost ? out_calls_ : in_calls_) + 1;
    for (const VaRange& range : ranges) {
      const PageId page = static_cast<PageId>((range.base - arena_.base) / page_bytes_);
      batched_[page] = kNotBatched;
      call_of[page] = call;
    }
    std::sort(ranges.begin(), ranges.end(), [](const VaRange& a, const VaRange& b) { return a.base < b.base; });
    size_t kept = 0;
    for (const VaRange& range : ranges) {
      if (kept != 0 && ranges[kept - 1].end() >= range.base) {
        ranges[kept - 1].bytes = std::max(ranges[kept - 1].end(), range.end()) - ranges[kept - 1].base;
      } else {
        ranges[kept++] = range;
      }
    }
    ranges.resize(kept);
    hand_over(kind, ranges);
    ranges.clear();
  }
}

void UmPager::hand_over(uint8_t kind, std::span<const VaRange> ranges) noexcept {
  switch (kind) {
    case kDiscard:
      // On the prefetch stream: a later prefetch of the page comes after it,
      // and a kernel that uses the page waits for it (fence_kernel).
      ++in_calls_;
      last_discard_call_ = in_calls_;
      ++stats_.discard_calls;
      issue(*in_thread_, kind, ranges);
      return;
    case kToHost:
      wait_before_evictions();
      ++out_calls_;
      issue(*out_thread_, kind, ranges);
      return;
    case kToDevice:
    case kDiscardAndFetch:
      wait_before_prefetches();
      ++in_calls_;
      issue(*in_thread_, kind, ranges);
      return;
    default: return;
  }
}

void UmPager::issue(PagerThread& thread, uint8_t kind, std::span<const VaRange> ranges) noexcept {
  std::vector<VaRange> copy;
  try {
    copy.assign(ranges.begin(), ranges.end());
  } catch (const std::bad_alloc&) {
    thread.drain();  // no memory for a copy: the call runs here, after those before it
    call_driver(kind, ranges);
    return;
  }
  thread.post_or_run([this, kind, moved = std::move(copy)] { call_driver(kind, moved); });
}

void UmPager::call_driver(uint8_t kind, std::span<const VaRange> ranges) noexcept {
  const PrefetchTarget to_device{false, device_};
  switch (kind) {
    case kDiscard: {
      const Status status = driver_.managed_discard_batch(ranges, to_device_);
      if (!status.is_ok() && driver_errors_++ == 0) {
        ZICO_LOG(kError, "paging: a discard was refused by the driver (%s)", to_string(status.code()));
      }
      return;
    }
    case kToHost: {
      const Status status = driver_.managed_prefetch_batch(ranges, PrefetchTarget{true, device_}, to_host_);
      if (!status.is_ok()) mark_refused(refused_evictions_, ranges);
      note_migration(status, true, ranges.size());
      return;
    }
    case kToDevice: {
      const Status status = driver_.managed_prefetch_batch(ranges, to_device, to_device_);
      if (!status.is_ok()) mark_refused(refused_fetches_, ranges);
      note_migration(status, false, ranges.size());
      return;
    }
    case kDiscardAndFetch: {
      Status status = driver_.managed_discard_and_prefetch_batch(ranges, to_device, to_device_);
      // Refused as a whole (no discard here after all): moved as they are.
      if (status.code() == Errc::kNotSupported) status = driver_.managed_prefetch_batch(ranges, to_device, to_device_);
      if (!status.is_ok()) mark_refused(refused_fetches_, ranges);
      note_migration(status, false, ranges.size());
      return;
    }
    default: return;
  }
}

UmPager::StreamMark& UmPager::record_on(PagerThread& thread, StreamHandle stream, uint64_t* ticket) noexcept {
  StreamMark& mark = stream_marks_[next_stream_mark_++ % kStreamMarks];
  // The pager threads lag a whole ring behind only when the driver holds
  // them up; then the launching thread waits too.
  if (mark.waiter != nullptr) mark.waiter->wait_for(mark.wait_ticket);
  mark.waiter = nullptr;
  const EventHandle event = mark.event;
  *ticket = thread.post_or_run([this, event, stream] { (void)driver_.event_record(event, stream); });
  return mark;
}

void UmPager::note_stream_use(PageId page, StreamHandle stream, uint64_t stamp) {
  StreamUses& uses = stream_uses_[page];
  auto* slot = &uses.last[0];
  for (auto& use : uses.last) {
    if (use.second != 0 && use.first == stream) {  // this stream's: newer now
      use.second = stamp;
      return;
    }
    if (use.second < slot->second) slot = &use;  // an empty one, else the oldest
  }
  if (slot->second != 0) uses.forgotten = true;  // a stream's use pushed out
  *slot = {stream, stamp};
}

void UmPager::note_last_use(PageId page) {
  if (!absent_unmapped_) {
    note_use(last_use_[page], StreamHandle{});
    return;
  }
  // Waited for from here on: the page's uses start anew when it comes back.
  StreamUses& uses = stream_uses_[page];
  for (const auto& [stream, stamp] : uses.last) note_use(stamp, stream);
  if (uses.forgotten) drain_before_evictions_ = true;
  uses = StreamUses{};
}

uint64_t UmPager::oldest_mark_after(uint64_t stamp, StreamHandle stream) const {
  uint64_t oldest = 0;
  for (const LaunchMark& mark : launch_marks_) {
    if (mark.stamp > stamp && mark.stream == stream && (oldest == 0 || mark.stamp < oldest)) oldest = mark.stamp;
  }
  return oldest;
}

void UmPager::note_use(uint64_t stamp, StreamHandle stream) {
  if (stamp == 0) return;  // no kernel
  if (launch_marks_[stamp % kLaunchMarks].stamp != stamp) {
    if (!absent_unmapped_) return;  // long done, or the page faults back
    stamp = oldest_mark_after(stamp, stream);
    if (stamp == 0) {
      drain_before_evictions_ = true;
      return;
    }
  }
  stream = launch_marks_[stamp % kLaunchMarks].stream;
  const auto covers = [&](const std::pair<StreamHandle, uint64_t>& wait) {
    return wait.first == stream && wait.second >= stamp;
  };
  if (std::any_of(out_waited_.begin(), out_waited_.end(), covers)) return;
  // Launches on one stream end in order: the latest per stream covers the rest.
  for (auto& wait : out_waits_) {
    if (wait.first == stream) {
      wait.second = std::max(wait.second, stamp);
      return;
    }
  }
  out_waits_.emplace_back(stream, stamp);  // may throw: the caller hands this page over alone
}

void UmPager::stream_waits_for(PagerThread& waiter, StreamHandle waiting, PagerThread& recorder,
                               StreamHandle recorded) noexcept {
  uint64_t recorded_at = 0;
  StreamMark& mark = record_on(recorder, recorded, &recorded_at);
  mark.waiter = &waiter;
  mark.wait_ticket = waiter.post_or_run([this, &recorder, waiting, event = mark.event, recorded_at] {
    recorder.wait_for(recorded_at);
    (void)driver_.stream_wait_event(waiting, event);
  });
}

void UmPager::wait_before_evictions() noexcept {
  if (drain_before_evictions_) {
    out_thread_->post_or_run([this] { (void)driver_.device_synchronize(device_); });
    ++stats_.fences;
    drain_before_evictions_ = false;
  }
  if (outs_wait_for_ins_) {
    stream_waits_for(*out_thread_, to_host_, *in_thread_, to_device_);
    ++stats_.fences;
    ins_before_outs_ = in_calls_;
    outs_wait_for_ins_ = false;
  }
  for (const auto& wait : out_waits_) {
    const StreamHandle stream = wait.first;  // a plain name: lambdas below capture it
    LaunchMark& mark = launch_marks_[wait.second % kLaunchMarks];
    // Overwritten since by a later launch: on the same stream waiting for
    // that one covers this one; on another, this one is long done.
    if (mark.stream != stream) continue;
    const EventHandle event = mark.event;
    mark.evictions_wait = out_thread_->post_or_run([this, event] { (void)driver_.stream_wait_event(to_host_, event); });
    ++stats_.fences;
    auto waited = std::find_if(out_waited_.begin(), out_waited_.end(),
                               [&](const auto& done) { return done.first == stream; });
    if (waited != out_waited_.end()) {
      waited->second = std::max(waited->second, mark.stamp);
      continue;
    }
    try {
      out_waited_.emplace_back(stream, mark.stamp);
    } catch (const std::bad_alloc&) {
      // Not remembered: the next eviction waits again.
    }
  }
  out_waits_.clear();
}

void UmPager::wait_before_prefetches() noexcept {
  if (ins_wait_for_outs_ && out_calls_ > outs_before_ins_) {
    stream_waits_for(*in_thread_, to_device_, *out_thread_, to_host_);
    ++stats_.fences;
    outs_before_ins_ = out_calls_;
    leaving_ = 0;
  }
  ins_wait_for_outs_ = false;
}

void UmPager::forget_stream(StreamHandle stream) {
  std::lock_guard lock(mutex_);
  std::erase_if(kernel_waits_, [&](const KernelWaits& waits) { return waits.stream == stream; });
}

void UmPager::fence_kernel() {
  auto fenced = std::find_if(kernel_waits_.begin(), kernel_waits_.end(),
                             [this](const KernelWaits& waits) { return waits.stream == launch_stream_; });
  const KernelWaits waited = fenced == kernel_waits_.end() ? KernelWaits{} : *fenced;
  // A kernel waits for its own pages' prefetches and discards; one that
  // faults also for the room made since it last waited, by evictions and
  // by discards (which give the GPU's pages back where the driver does so):
  // the faults take that room, and would find it still taken otherwise.
  const bool faults = !faulted_.empty();
  const bool awaits_ins = std::any_of(kernel_pages_.begin(), kernel_pages_.end(),
                                      [&](PageId page) { return in_call_of_[page] > waited.ins; }) ||
                          (faults && last_discard_call_ > waited.ins);
  const bool awaits_room = faults && out_calls_ > waited.outs;
  if (!(awaits_ins || awaits_room) || !outside_graphs(launch_stream_)) return;
  // The launching thread waits until the pager thread has issued what the
  // kernel needs and recorded its end (the moves themselves run on: the
  // kernel's stream waits for them), then has the kernel's stream wait.
  const auto after = [this](PagerThread& thread, StreamHandle stream) {
    uint64_t ticket = 0;
    const EventHandle event = record_on(thread, stream, &ticket).event;
    thread.wait_for(ticket);
    return driver_.stream_wait_event(launch_stream_, event).is_ok();
  };
  KernelWaits now = waited;
  now.stream = launch_stream_;
  if (awaits_ins && after(*in_thread_, to_device_)) {
    ++stats_.fences;
    now.ins = in_calls_;
    in_calls_waited_ = in_calls_;
  }
  if (awaits_room && after(*out_thread_, to_host_)) {
    ++stats_.fences;
    now.outs = out_calls_;
  }
  if (now.ins == waited.ins && now.outs == waited.outs) return;
  ++stats_.kernel_waits;
  if (fenced != kernel_waits_.end()) {
    *fenced = now;
    return;
  }
  try {
    kernel_waits_.push_back(now);
  } catch (const std::bad_alloc&) {
    // Not remembered: the stream's next kernel waits again.
  }
}

void UmPager::mark_refused(RefusedMoves& moves, std::span<const VaRange> ranges) noexcept {
  // Managed pages a refused move left behind are the driver's: they fault
  // in when used, and it evicts them when it needs the room.
  if (!absent_unmapped_) return;
  std::lock_guard lock(refused_mu_);
  for (const VaRange& range : ranges) {
    const auto first = static_cast<PageId>((range.base - arena_.base) / page_bytes_);
    const auto last = static_cast<PageId>((range.end() - 1 - arena_.base) / page_bytes_);
    for (PageId page = first; page <= last && page < moves.marked.size(); ++page) moves.mark(page);
  }
}

void UmPager::refetch_refused() {
  // The kernel's fetches have run (fence_kernel waited for them, or an
  // earlier kernel's fence did): its pages marked now were not mapped.
  std::vector<VaRange> again;
  again.reserve(kernel_pages_.size());  // before any mark is cleared: a bad_alloc loses none
  {
    std::lock_guard lock(refused_mu_);
    for (const PageId page : kernel_pages_) {
      if (!refused_fetches_.take(page)) continue;
      again.push_back(VaRange{arena_.base + uintptr_t{page} * page_bytes_, page_bytes_});
    }
  }
  if (again.empty()) return;
  // A call per page, in this rare path: a refusal marks just the pages that
  // failed (a batch's marks all its pages, some of which may have been
  // mapped). Each counted as flush_batch counts a fetch: the call a later
  // kernel of the page waits for.
  for (const VaRange& range : again) {
    in_call_of_[(range.base - arena_.base) / page_bytes_] = in_calls_ + 1;
    hand_over(kToDevice, std::span<const VaRange>(&range, 1));
    ++stats_.refetched_pages;
  }
  uint64_t ticket = 0;
  const EventHandle event = record_on(*in_thread_, to_device_, &ticket).event;
  in_thread_->wait_for(ticket);
  in_calls_waited_ = in_calls_;
  {
    std::lock_guard lock(refused_mu_);
    kernel_refused_ = std::any_of(kernel_pages_.begin(), kernel_pages_.end(),
                                  [this](PageId page) { return refused_fetches_.marked[page] != 0; });
  }
  if (kernel_refused_) {
    if (stats_.refused_kernels++ == 0) {
      ZICO_LOG(kError, "paging: the GPU would not take back a swapped page a kernel uses (no device memory to map "
                       "it?); the kernel is refused instead of reading unmapped memory, and its pages are asked for "
                       "again before the next kernel that uses them");
    }
    return;
  }
  if (outside_graphs(launch_stream_) && driver_.stream_wait_event(launch_stream_, event).is_ok()) ++stats_.fences;
}

void UmPager::settle_stayed() {
  // A refused batch marks all its pages, some of which may have left: each
  // the pager still counts absent is sent out again on its own (a page
  // already on the host is no move), and one that still cannot leave is
  // counted on the GPU, room made for it, so that the budget holds on the
  // device. One fetched back since is where the pager counts it.
  std::vector<PageId> pages;
  pages.reserve(refused_evictions_.count.load(std::memory_order_acquire));  // before any mark is cleared
  {
    std::lock_guard lock(refused_mu_);
    for (PageId page = 0; page < refused_evictions_.marked.size() && pages.size() < pages.capacity(); ++page) {
      if (refused_evictions_.take(page) && residency_.state(page) == PageState::kAbsent) pages.push_back(page);
    }
  }
  if (pages.empty()) return;
  for (const PageId page : pages) {
    const VaRange range{arena_.base + uintptr_t{page} * page_bytes_, page_bytes_};
    out_call_of_[page] = out_calls_ + 1;
    hand_over(kToHost, std::span<const VaRange>(&range, 1));
    ++stats_.resent_pages;
  }
  out_thread_->drain();
  std::vector<PageId> still;
  still.reserve(pages.size());  // before any mark is cleared
  {
    std::lock_guard lock(refused_mu_);
    for (const PageId page : pages) {
      if (refused_evictions_.take(page)) still.push_back(page);
    }
  }
  BatchScope batch(*this);  // the room made for them leaves in one call
  for (const PageId page : still) {
    if (residency_.state(page) != PageState::kAbsent || !count_arrival(page)) continue;
    residency_.set_has_data(page, true);
    ++stats_.stayed_pages;
  }
}

bool UmPager::kernel_refused() const {
  std::lock_guard lock(mutex_);
  return kernel_refused_;
}

void UmPager::note_migration(const Status& status, bool to_host, size_t ranges) noexcept {
  ++migration_calls_;
  migration_ranges_ += ranges;
  if (!status.is_ok() && driver_errors_++ == 0) {
    ZICO_LOG(kError, "paging: a migration %s was refused by the driver (%s); %s", to_host ? "to the host" : "to the GPU",
             to_string(status.code()),
             !absent_unmapped_ ? "the driver pages on its own"
             : to_host         ? "the pages stay on the GPU"
                               : "the pages are asked for again before a kernel that uses them");
  }
}

void UmPager::note_peak() {
  stats_.peak_resident_bytes =
      std::max(stats_.peak_resident_bytes, uint64_t{residency_.occupied_pages()} * page_bytes_);
}

UmPagerStats UmPager::stats() const {
  std::lock_guard lock(mutex_);
  UmPagerStats stats = stats_;
  stats.found_iteration_kernels = policy_->found_iteration_ops();
  stats.migration_calls = migration_calls_.load();
  stats.migration_ranges = migration_ranges_.load();
  stats.driver_errors += driver_errors_.load();
  return stats;
}

void UmPager::go_inline() noexcept {
  std::lock_guard lock(mutex_);
  // The prefetch thread first: the eviction thread's calls it waits for
  // still run meanwhile, and then every call the eviction thread waits for
  // has run.
  in_thread_->go_inline();
  out_thread_->go_inline();
}

uint64_t UmPager::budget_bytes() const {
  std::lock_guard lock(mutex_);
  return uint64_t{residency_.budget_pages()} * page_bytes_;
}

uint64_t UmPager::floor_bytes() const {
  std::lock_guard lock(mutex_);
  return uint64_t{largest_kernel_pages_} * page_bytes_;
}

uint64_t UmPager::link_bytes_per_second() const {
  const double rate = std::min(options_.model.h2d_bytes_per_s, options_.model.d2h_bytes_per_s);
  return rate > 0 && rate < 1.8e19 ? static_cast<uint64_t>(rate) : 0;
}

uint64_t UmPager::resident_bytes() const {
  std::lock_guard lock(mutex_);
  return uint64_t{residency_.occupied_pages()} * page_bytes_;
}

}  // namespace zico::prefetch
