#include "swap_arena_driver.h"

#include <algorithm>
#include <new>

#include "log.h"

namespace zico {

SwapArenaDriver::~SwapArenaDriver() {
  for (auto& [base, arena] : arenas_) {
    chunks_of(arena.device).limit = 0;
    for (size_t i = 0; i < arena.pages.size(); ++i) {
      if (arena.pages[i].state != PageState::kEmpty && arena.pages[i].state != PageState::kOnHost) {
        (void)let_go(PageRef{&arena, i});
      }
    }
    arena.host.reset();
    (void)inner_.unreserve(arena.range);
  }
  for (auto& [device, chunks] : devices_) {
    for (const PhysHandle chunk : chunks.pool) (void)inner_.release(chunk);
  }
}

void SwapArenaDriver::set_held_limit(DeviceId device, uint64_t bytes) {
  std::lock_guard lock(mutex_);
  DeviceChunks& chunks = chunks_of(device);
  chunks.limit = bytes;
  trim_pool(chunks);
}

void SwapArenaDriver::trim_pool(DeviceChunks& chunks) {
  while (!chunks.pool.empty() && chunks.held() > chunks.limit) {
    (void)inner_.release(chunks.pool.back());
    chunks.pool.pop_back();
  }
}

SwapArenaStats SwapArenaDriver::stats() const {
  std::lock_guard lock(mutex_);
  SwapArenaStats stats = stats_;
  for (const auto& [device, chunks] : devices_) {
    stats.mapped_bytes += chunks.mapped;
    stats.pooled_bytes += chunks.pool.size() * chunks.page_bytes;
  }
  return stats;
}

Status SwapArenaDriver::capabilities(DeviceId device, Capabilities* caps) noexcept {
  ZICO_RETURN_IF_ERROR(inner_.capabilities(device, caps));
  if (!caps->virtual_memory || caps->granularity == 0) return Status(Errc::kNotSupported);
  caps->managed_memory = true;
  caps->concurrent_managed_access = true;
  caps->discard = true;
  caps->discard_releases_device_pages = true;
  caps->absent_pages_unmapped = true;
  caps->posix_fd_export = false;
  caps->gpu_direct_rdma = false;
  return Status::ok();
}

Status SwapArenaDriver::reserve(DeviceId device, size_t bytes, size_t alignment, VaRange* out) noexcept {
  Capabilities caps;
  ZICO_RETURN_IF_ERROR(inner_.capabilities(device, &caps));
  if (!caps.virtual_memory || caps.granularity == 0) return Status(Errc::kNotSupported);
  if (bytes == 0 || bytes % caps.granularity != 0) return Status(Errc::kInvalidArgument);
  VaRange range{};
  ZICO_RETURN_IF_ERROR(inner_.reserve(device, bytes, alignment, &range));
  std::lock_guard lock(mutex_);
  try {
    Arena& arena = arenas_[range.base];
    arena.range = range;
    arena.device = device;
    arena.page_bytes = caps.granularity;
    arena.pages.resize(bytes / caps.granularity);
    chunks_of(device).page_bytes = caps.granularity;
  } catch (const std::bad_alloc&) {
    arenas_.erase(range.base);
    (void)inner_.unreserve(range);
    return Status(Errc::kOutOfMemory);
  }
  *out = range;
  return Status::ok();
}

Status SwapArenaDriver::unreserve(VaRange range) noexcept {
  std::unique_lock lock(mutex_);
  auto it = arenas_.find(range.base);
  if (it == arenas_.end() || it->second.range.bytes != range.bytes) return Status(Errc::kInvalidArgument);
  Arena& arena = it->second;
  for (size_t i = 0; i < arena.pages.size(); ++i) {
    const PageRef ref{&arena, i};
    left_.wait(lock, [&] { return ref.page().state != PageState::kLeaving; });
    if (ref.page().state == PageState::kMapped) ZICO_RETURN_IF_ERROR(let_go(ref));
    drop_host_copy(ref);
  }
  const DeviceId device = arena.device;
  arenas_.erase(it);
  // The last arena on its device: nothing will take a pooled chunk again.
  if (std::none_of(arenas_.begin(), arenas_.end(), [device](const auto& a) { return a.second.device == device; })) {
    DeviceChunks& chunks = chunks_of(device);
    chunks.limit = 0;
    trim_pool(chunks);
  }
  return inner_.unreserve(range);
}

const SwapArenaDriver::Arena* SwapArenaDriver::arena_at(uintptr_t address) const {
  auto it = arenas_.upper_bound(address);
  if (it == arenas_.begin() || !std::prev(it)->second.range.contains(address)) return nullptr;
  return &std::prev(it)->second;
}

bool SwapArenaDriver::in_arena(VaRange range) const {
  std::lock_guard lock(mutex_);
  const Arena* arena = arena_at(range.base);
  return arena != nullptr && arena->range.contains(range);
}

bool SwapArenaDriver::touches_an_arena(std::span<const VaRange> ranges) const {
  if (ranges.empty()) return false;
  std::lock_guard lock(mutex_);
  return arena_at(ranges.front().base) != nullptr;
}

Status SwapArenaDriver::managed_advise(void* ptr, size_t bytes, ManagedAdvice advice, DeviceId device) noexcept {
  const VaRange range{reinterpret_cast<uintptr_t>(ptr), bytes};
  if (touches_an_arena(std::span<const VaRange>(&range, 1))) return Status::ok();
  return inner_.managed_advise(ptr, bytes, advice, device);
}

bool SwapArenaDriver::pages_of(std::span<const VaRange> ranges, std::vector<PageRef>* out) {
  out->clear();
  for (const VaRange& range : ranges) {
    Arena* found = arena_at(range.base);
    if (found == nullptr) return false;
    Arena& arena = *found;
    if (range.bytes == 0 || !arena.range.contains(range) || (range.base - arena.range.base) % arena.page_bytes != 0 ||
        range.bytes % arena.page_bytes != 0) {
      return false;
    }
    const size_t first = (range.base - arena.range.base) / arena.page_bytes;
    for (size_t i = first; i < first + range.bytes / arena.page_bytes; ++i) out->push_back(PageRef{&arena, i});
  }
  return true;
}

void SwapArenaDriver::wait_until_left(std::unique_lock<std::mutex>& lock, std::span<const PageRef> pages) {
  left_.wait(lock, [pages] {
    return std::none_of(pages.begin(), pages.end(),
                        [](const PageRef& ref) { return ref.page().state == PageState::kLeaving; });
  });
}

void SwapArenaDriver::note_held() {
  uint64_t mapped = 0, held = 0;
  for (const auto& [device, chunks] : devices_) {
    mapped += chunks.mapped;
    held += chunks.held();
  }
  stats_.peak_mapped_bytes = std::max(stats_.peak_mapped_bytes, mapped);
  stats_.peak_held_bytes = std::max(stats_.peak_held_bytes, held);
}

Status SwapArenaDriver::bring_in(const PageRef& ref, bool copy, StreamHandle stream) {
  Page& page = ref.page();
  const VaRange range = ref.range();
  if (!copy) drop_host_copy(ref);
  if (page.state == PageState::kMapped) return Status::ok();
  DeviceChunks& chunks = chunks_of(ref.arena->device);
  PhysHandle chunk{};
  if (!chunks.pool.empty()) {
    chunk = chunks.pool.back();
    chunks.pool.pop_back();
    ++stats_.chunks_reused;
  } else {
    ZICO_RETURN_IF_ERROR(inner_.create(ref.arena->device, range.bytes, &chunk));
  }
  Status status = inner_.map(range, chunk);
  if (status.is_ok()) {
    status = inner_.set_access(ref.arena->device, range);
    if (!status.is_ok()) (void)inner_.unmap(range);
  }
  if (!status.is_ok()) {
    (void)inner_.release(chunk);
    return status;
  }
  if (page.state == PageState::kOnHost) {
    status = inner_.copy_async(range.ptr(), ref.arena->host->slot_data(page.slot), range.bytes,
                               CopyKind::kHostToDevice, stream);
    if (!status.is_ok()) {
      // The page stays on the host, whole.
      (void)inner_.unmap(range);
      (void)inner_.release(chunk);
      return status;
    }
    ++stats_.copies_in;
  }
  page.state = PageState::kMapped;
  page.chunk = chunk;
  ++stats_.pages_in;
  chunks.mapped += range.bytes;
  note_held();
  return Status::ok();
}

Status SwapArenaDriver::let_go(const PageRef& ref) {
  Page& page = ref.page();
  const size_t bytes = ref.arena->page_bytes;
  ZICO_RETURN_IF_ERROR(inner_.unmap(ref.range()));
  DeviceChunks& chunks = chunks_of(ref.arena->device);
  chunks.mapped -= bytes;
  // Kept for the next page in while the device's chunks stay within the limit.
  bool kept = false;
  if (chunks.held() + bytes <= chunks.limit) {
    try {
      chunks.pool.push_back(page.chunk);
      kept = true;
    } catch (const std::bad_alloc&) {
    }
  }
  if (!kept) (void)inner_.release(page.chunk);
  page.chunk = PhysHandle{};
  note_held();
  return Status::ok();
}

void SwapArenaDriver::drop_host_copy(const PageRef& ref) {
  Page& page = ref.page();
  if (page.slot == kNoSlot) return;
  ref.arena->host->release_slot(page.slot);
  page.slot = kNoSlot;
  stats_.host_bytes -= ref.arena->page_bytes;
  if (page.state == PageState::kOnHost) page.state = PageState::kEmpty;
}

Status SwapArenaDriver::fetch(std::span<const VaRange> ranges, bool discard_first, StreamHandle stream) {
  std::unique_lock lock(mutex_);
  ++stats_.move_calls;
  std::vector<PageRef> pages;
  if (!pages_of(ranges, &pages)) return Status(Errc::kInvalidArgument);
  wait_until_left(lock, pages);
  for (const PageRef& ref : pages) {
    if (discard_first) ++stats_.discarded;
    ZICO_RETURN_IF_ERROR(bring_in(ref, !discard_first, stream));
  }
  return Status::ok();
}

Status SwapArenaDriver::send_out(std::span<const VaRange> ranges, StreamHandle stream) {
  std::vector<PageRef> leaving;
  Status status = Status::ok();
  {
    std::unique_lock lock(mutex_);
    ++stats_.move_calls;
    std::vector<PageRef> pages;
    if (!pages_of(ranges, &pages)) return Status(Errc::kInvalidArgument);
    wait_until_left(lock, pages);  // the other pager thread never sends pages out; a caller might
    for (const PageRef& ref : pages) {
      Page& page = ref.page();
      if (page.state != PageState::kMapped) continue;
      Arena& arena = *ref.arena;
      if (arena.host == nullptr) {
        std::string why;
        status = HostStore::create(inner_, arena.device, arena.page_bytes, HostStoreOptions{}, &arena.host, &why);
        if (!status.is_ok()) {
          ZICO_LOG(kError, "swap: no host store for device %d (%s): pages stay on the device", arena.device.value,
                   why.c_str());
          break;
        }
      }
      if (page.slot == kNoSlot) {
        status = arena.host->reserve_slot(&page.slot);
        if (!status.is_ok()) {
          page.slot = kNoSlot;
          break;  // the host is full: this page and the rest stay on the device
        }
        stats_.host_bytes += arena.page_bytes;
      }
      const VaRange range = ref.range();
      status = inner_.copy_async(arena.host->slot_data(page.slot), range.ptr(), range.bytes, CopyKind::kDeviceToHost,
                                 stream);
      if (!status.is_ok()) break;
      page.state = PageState::kLeaving;
      leaving.push_back(ref);
    }
  }
  // The copies wait for the kernels that used their pages (the pager queued
  // them so); a page is unmapped only after its copy has ended.
  const Status synced = leaving.empty() ? Status::ok() : inner_.stream_synchronize(stream);
  {
    std::lock_guard lock(mutex_);
    for (const PageRef& ref : leaving) {
      Page& page = ref.page();
      // A copy that cannot be confirmed leaves the page where it was.
      const Status gone = synced.is_ok() ? let_go(ref) : synced;
      page.state = gone.is_ok() ? PageState::kOnHost : PageState::kMapped;
      if (gone.is_ok()) ++stats_.pages_out;
      if (status.is_ok()) status = gone;
    }
  }
  left_.notify_all();
  return status;
}

Status SwapArenaDriver::managed_prefetch(void* ptr, size_t bytes, PrefetchTarget target, StreamHandle stream) noexcept {
  const VaRange range{reinterpret_cast<uintptr_t>(ptr), bytes};
  return managed_prefetch_batch(std::span<const VaRange>(&range, 1), target, stream);
}

Status SwapArenaDriver::managed_prefetch_batch(std::span<const VaRange> ranges, PrefetchTarget target,
                                               StreamHandle stream) noexcept {
  if (!touches_an_arena(ranges)) return inner_.managed_prefetch_batch(ranges, target, stream);
  try {
    return target.to_host ? send_out(ranges, stream) : fetch(ranges, false, stream);
  } catch (const std::bad_alloc&) {
    return Status(Errc::kOutOfMemory);
  }
}

Status SwapArenaDriver::managed_discard(void* ptr, size_t bytes, StreamHandle stream) noexcept {
  const VaRange range{reinterpret_cast<uintptr_t>(ptr), bytes};
  return managed_discard_batch(std::span<const VaRange>(&range, 1), stream);
}

Status SwapArenaDriver::managed_discard_batch(std::span<const VaRange> ranges, StreamHandle stream) noexcept {
  if (!touches_an_arena(ranges)) return inner_.managed_discard_batch(ranges, stream);
  try {
    // What the stream queued before the discard (a copy into these pages)
    // ends before they are unmapped.
    ZICO_RETURN_IF_ERROR(inner_.stream_synchronize(stream));
    std::unique_lock lock(mutex_);
    std::vector<PageRef> pages;
    if (!pages_of(ranges, &pages)) return Status(Errc::kInvalidArgument);
    wait_until_left(lock, pages);
    for (const PageRef& ref : pages) {
      if (ref.page().state == PageState::kMapped) {
        ZICO_RETURN_IF_ERROR(let_go(ref));
        ref.page().state = PageState::kEmpty;
      }
      drop_host_copy(ref);
      ++stats_.discarded;
    }
    return Status::ok();
  } catch (const std::bad_alloc&) {
    return Status(Errc::kOutOfMemory);
  }
}

Status SwapArenaDriver::managed_discard_and_prefetch_batch(std::span<const VaRange> ranges, PrefetchTarget target,
                                                           StreamHandle stream) noexcept {
  if (!touches_an_arena(ranges)) return inner_.managed_discard_and_prefetch_batch(ranges, target, stream);
  if (target.to_host) {
    // Discarded pages going to the host go nowhere: they hold nothing.
    return managed_discard_batch(ranges, stream);
  }
  try {
    return fetch(ranges, true, stream);
  } catch (const std::bad_alloc&) {
    return Status(Errc::kOutOfMemory);
  }
}

Status SwapArenaDriver::start_fault_reports(DeviceId, std::string* why) noexcept {
  if (why != nullptr) *why = "swapped pages (ZICO_UM_MEMORY=swap) never fault";
  return Status(Errc::kNotSupported);
}

}  // namespace zico
