#include "sim_managed.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace zico {
namespace {

uint64_t copy_ns(size_t bytes, double bytes_per_s) {
  return bytes_per_s > 0 ? static_cast<uint64_t>(static_cast<double>(bytes) / bytes_per_s * 1e9) : 0;
}

}  // namespace

double SimManagedMemory::share_beside(uint64_t other_free_ns, uint64_t start_ns) const {
  return other_free_ns > start_ns ? costs_.duplex_factor : 1.0;
}

SimManagedMemory::SimManagedMemory(size_t page_bytes, const SimManagedCosts& costs)
    : page_bytes_(page_bytes), costs_(costs) {}

SimManagedMemory::~SimManagedMemory() {
  for (auto& [base, allocation] : allocations_) {
    munmap(reinterpret_cast<void*>(base), allocation.bytes);
  }
}

Status SimManagedMemory::allocate(size_t bytes, void** out) {
  if (bytes == 0 || bytes > SIZE_MAX - page_bytes_) return Status(Errc::kInvalidArgument);
  const size_t rounded = (bytes + page_bytes_ - 1) / page_bytes_ * page_bytes_;
  // Aligned to a page, as CUDA aligns managed allocations to its 2 MiB blocks:
  // reserve a page more and trim.
  void* raw = mmap(nullptr, rounded + page_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return Status(Errc::kOutOfMemory, errno);
  const auto start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t base = (start + page_bytes_ - 1) / page_bytes_ * page_bytes_;
  if (base > start) munmap(raw, base - start);
  if (const uintptr_t tail = start + rounded + page_bytes_ - (base + rounded); tail > 0) {
    munmap(reinterpret_cast<void*>(base + rounded), tail);
  }
  Allocation& allocation = allocations_[base];
  allocation.bytes = rounded;
  allocation.pages.resize(rounded / page_bytes_);
  *out = reinterpret_cast<void*>(base);
  return Status::ok();
}

Status SimManagedMemory::free(void* ptr, size_t* resident_freed) {
  auto it = allocations_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == allocations_.end()) return Status(Errc::kInvalidArgument);
  size_t resident = 0;
  for (Page& page : it->second.pages) {
    if (page.on_device) {
      resident += page_bytes_;
      by_migration_.erase(page.migrated);
    }
    drop_chunk(page);
  }
  stats_.resident_bytes -= resident;
  munmap(ptr, it->second.bytes);
  allocations_.erase(it);
  if (resident_freed != nullptr) *resident_freed = resident;
  return Status::ok();
}

bool SimManagedMemory::contains(VaRange range) const {
  auto it = allocations_.upper_bound(range.base);
  return it != allocations_.begin() && VaRange{std::prev(it)->first, std::prev(it)->second.bytes}.contains(range);
}

bool SimManagedMemory::locate(VaRange range, uintptr_t* base, Allocation** allocation, size_t* first,
                              size_t* last) {
  if (range.bytes == 0 || !contains(range)) return false;
  auto it = std::prev(allocations_.upper_bound(range.base));
  *base = it->first;
  *allocation = &it->second;
  *first = (range.base - it->first) / page_bytes_;
  *last = (range.end() - 1 - it->first) / page_bytes_;
  return true;
}

Status SimManagedMemory::take_chunk(Page& page, uint64_t limit, bool fault, uint64_t start_ns, uint64_t* room_at) {
  *room_at = start_ns;
  if (page.holds_chunk) {
    unused_.erase(page.unused_since);  // its own, kept since it left
    page.unused_since = 0;
    return Status::ok();
  }
  while (stats_.chunk_bytes + page_bytes_ > limit + lent_) {
    // An unused chunk first: no copy (the UVM driver's eviction picks free,
    // then unused chunks before used ones), its own or another's.
    if (release_unused(page_bytes_) != 0) continue;
    if (lend_) {
      if (const uint64_t lent = lend_(page_bytes_); lent != 0) {
        lent_ += lent;
        continue;
      }
    }
    // Then the least recently migrated page this operation does not need:
    // it leaves with a copy and its chunk comes here.
    auto victim = std::find_if(by_migration_.begin(), by_migration_.end(), [&](const auto& entry) {
      return allocations_.at(entry.second.base).pages[entry.second.index].kept != operation_;
    });
    if (victim == by_migration_.end()) return Status(Errc::kOutOfMemory);
    const PageRef ref = victim->second;
    Page& evicted = allocations_.at(ref.base).pages[ref.index];
    *room_at = std::max(*room_at, send_out(ref.base, allocations_.at(ref.base), ref.index, fault, start_ns));
    evicted.mapped_on_device = evicted.accessed_by;  // the driver maps what it evicts for accessed-by devices
    drop_chunk(evicted);
    ++stats_.driver_evictions;
  }
  page.holds_chunk = true;
  stats_.chunk_bytes += page_bytes_;
  stats_.peak_chunk_bytes = std::max(stats_.peak_chunk_bytes, stats_.chunk_bytes);
  return Status::ok();
}

void SimManagedMemory::keep_unused(Page& page, uintptr_t base, size_t index) {
  if (!page.holds_chunk || page.unused_since != 0) return;
  page.unused_since = next_stamp_++;
  unused_[page.unused_since] = PageRef{base, index};
}

void SimManagedMemory::drop_chunk(Page& page) {
  if (!page.holds_chunk) return;
  if (page.unused_since != 0) unused_.erase(page.unused_since);
  page.unused_since = 0;
  page.holds_chunk = false;
  stats_.chunk_bytes -= page_bytes_;
}

uint64_t SimManagedMemory::release_unused(uint64_t bytes) {
  uint64_t released = 0;
  while (released < bytes && !unused_.empty()) {
    const PageRef ref = unused_.begin()->second;
    drop_chunk(allocations_.at(ref.base).pages[ref.index]);
    released += page_bytes_;
    ++stats_.chunks_taken;
  }
  return released;
}

void SimManagedMemory::give_up(uint64_t bytes) {
  uint64_t given = release_unused(bytes);
  while (given < bytes && !by_migration_.empty()) {
    const PageRef ref = by_migration_.begin()->second;
    Allocation& allocation = allocations_.at(ref.base);
    Page& page = allocation.pages[ref.index];
    (void)send_out(ref.base, allocation, ref.index, false, stats_.now_ns);
    page.mapped_on_device = page.accessed_by;
    drop_chunk(page);
    ++stats_.driver_evictions;
    ++stats_.chunks_taken;
    given += page_bytes_;
  }
}

Status SimManagedMemory::bring_in(uintptr_t base, Allocation& allocation, size_t index, uint64_t limit, bool fault,
                                  uint64_t start_ns) {
  Page& page = allocation.pages[index];
  page.kept = operation_;
  if (page.on_device) return Status::ok();
  uint64_t room_at = start_ns;
  ZICO_RETURN_IF_ERROR(take_chunk(page, limit, fault, start_ns, &room_at));
  page.arrives_ns = start_ns;
  if (page.has_data && !page.discarded) {
    stats_.h2d_bytes += page_bytes_;
    if (fault) {
      fault_ns_pending_ += copy_ns(page_bytes_, costs_.fault_bytes_per_s);
    } else {
      const uint64_t start = std::max({room_at, h2d_free_ns_, page.left_ns});
      h2d_free_ns_ = start + copy_ns(page_bytes_, costs_.h2d_bytes_per_s * share_beside(d2h_free_ns_, start));
      page.arrives_ns = h2d_free_ns_;
    }
  } else if (!fault) {
    page.arrives_ns = room_at;  // populated in place once its slot is free
  }
  // An asked-for migration revokes a discard (the page is populated where it lands).
  if (!fault) page.discarded = false;
  page.on_device = true;
  page.migrated = next_stamp_++;
  by_migration_[page.migrated] = PageRef{base, index};
  stats_.resident_bytes += page_bytes_;
  stats_.peak_resident_bytes = std::max(stats_.peak_resident_bytes, stats_.resident_bytes);
  return Status::ok();
}

uint64_t SimManagedMemory::send_out(uintptr_t base, Allocation& allocation, size_t index, bool fault,
                                    uint64_t start_ns) {
  Page& page = allocation.pages[index];
  uint64_t done = start_ns;
  if (!page.discarded) {
    stats_.d2h_bytes += page_bytes_;
    if (fault) {
      fault_ns_pending_ += copy_ns(page_bytes_, costs_.d2h_bytes_per_s);
    } else {
      const uint64_t start = std::max({d2h_free_ns_, start_ns, page.arrives_ns});
      d2h_free_ns_ = start + copy_ns(page_bytes_, costs_.d2h_bytes_per_s * share_beside(h2d_free_ns_, start));
      done = d2h_free_ns_;
    }
    page.has_data = true;
  }
  by_migration_.erase(page.migrated);
  page.on_device = false;
  page.left_ns = done;
  stats_.resident_bytes -= page_bytes_;
  keep_unused(page, base, index);
  return done;
}

uint64_t SimManagedMemory::copy(bool to_device, uint64_t bytes, uint64_t start_ns) {
  uint64_t& engine = to_device ? h2d_free_ns_ : d2h_free_ns_;
  const uint64_t other = to_device ? d2h_free_ns_ : h2d_free_ns_;
  const uint64_t start = std::max(engine, start_ns);
  const double rate = to_device ? costs_.h2d_bytes_per_s : costs_.d2h_bytes_per_s;
  engine = start + copy_ns(bytes, rate * share_beside(other, start));
  (to_device ? stats_.h2d_bytes : stats_.d2h_bytes) += bytes;
  return engine;
}

Status SimManagedMemory::prefetch_to_device(VaRange range, uint64_t limit, uint64_t start_ns, uint64_t* done_ns) {
  Allocation* allocation = nullptr;
  size_t first = 0, last = 0;
  uintptr_t base = 0;
  *done_ns = start_ns;
  if (!locate(range, &base, &allocation, &first, &last)) return Status(Errc::kInvalidArgument);
  ++operation_;
  lent_ = 0;
  for (size_t i = first; i <= last; ++i) allocation->pages[i].kept = operation_;
  for (size_t i = first; i <= last; ++i) {
    Page& page = allocation->pages[i];
    const bool moves = !page.on_device;
    if (Status status = bring_in(base, *allocation, i, limit, false, start_ns); !status.is_ok()) return status;
    page.discarded = false;  // revoked, resident or not
    *done_ns = std::max(*done_ns, page.arrives_ns);
    stats_.prefetched_pages += moves ? 1 : 0;
  }
  return Status::ok();
}

Status SimManagedMemory::prefetch_to_host(VaRange range, uint64_t start_ns, uint64_t* done_ns) {
  Allocation* allocation = nullptr;
  size_t first = 0, last = 0;
  uintptr_t base = 0;
  *done_ns = start_ns;
  if (!locate(range, &base, &allocation, &first, &last)) return Status(Errc::kInvalidArgument);
  for (size_t i = first; i <= last; ++i) {
    Page& page = allocation->pages[i];
    if (!page.on_device) {
      // A discarded page is populated on the host by the move: no longer discarded.
      if (page.discarded) {
        page.discarded = false;
        page.has_data = true;
      }
      continue;
    }
    *done_ns = std::max(*done_ns, send_out(base, *allocation, i, false, start_ns));
    // The UVM driver revokes the discard of a page an API call migrates: it
    // is populated on the host now, and coming back is a copy of its bytes.
    page.discarded = false;
    page.has_data = true;
    page.mapped_on_device = page.accessed_by && !page.preferred_on_device;
    ++stats_.evicted_pages;
  }
  return Status::ok();
}

void SimManagedMemory::discard(VaRange range) {
  Allocation* allocation = nullptr;
  size_t first = 0, last = 0;
  uintptr_t base = 0;
  if (!locate(range, &base, &allocation, &first, &last)) return;
  // Only whole pages: a partly covered page still holds someone's bytes.
  if (range.base > base + first * page_bytes_) ++first;
  if (range.end() < base + (last + 1) * page_bytes_) {
    if (last == 0) return;
    --last;
  }
  for (size_t i = first; i <= last && i < allocation->pages.size(); ++i) {
    Page& page = allocation->pages[i];
    if (page.discarded) continue;
    const bool had_data = page.has_data || page.on_device;
    page.has_data = false;
    page.discarded = true;
    // Resident nowhere now: the UVM driver puts a wholly discarded block's
    // chunk on its unused list, free for any allocation without a copy.
    if (page.on_device) {
      by_migration_.erase(page.migrated);
      page.on_device = false;
      stats_.resident_bytes -= page_bytes_;
      keep_unused(page, base, i);
    }
    (void)madvise(reinterpret_cast<void*>(base + i * page_bytes_), page_bytes_, MADV_DONTNEED);
    if (had_data) ++stats_.discarded_pages;
  }
}

void SimManagedMemory::set_accessed_by(VaRange range, bool accessed_by) {
  Allocation* allocation = nullptr;
  size_t first = 0, last = 0;
  uintptr_t base = 0;
  if (!locate(range, &base, &allocation, &first, &last)) return;
  for (size_t i = first; i <= last; ++i) {
    Page& page = allocation->pages[i];
    page.accessed_by = accessed_by;
    // A page never touched has nowhere to be mapped from: its first touch populates it on the device.
    page.mapped_on_device = accessed_by && !page.on_device && page.has_data;
  }
}

void SimManagedMemory::set_preferred_on_device(VaRange range, bool preferred) {
  Allocation* allocation = nullptr;
  size_t first = 0, last = 0;
  uintptr_t base = 0;
  if (!locate(range, &base, &allocation, &first, &last)) return;
  for (size_t i = first; i <= last; ++i) allocation->pages[i].preferred_on_device = preferred;
}

Status SimManagedMemory::run_kernel(std::span<const VaRange> ranges, uint64_t duration_ns, uint64_t limit,
                                    uint64_t start_ns, std::vector<uintptr_t>* faulted_pages) {
  ++operation_;
  lent_ = 0;
  fault_ns_pending_ = 0;
  uint64_t faulted = 0;
  const uint64_t start = std::max(stats_.now_ns, start_ns);
  uint64_t arrival = start;
  // Mark every page the kernel uses first, so that no fault pushes out a page
  // another of its ranges needs.
  for (const VaRange& range : ranges) {
    Allocation* allocation = nullptr;
    size_t first = 0, last = 0;
    uintptr_t base = 0;
    if (!locate(range, &base, &allocation, &first, &last)) continue;
    for (size_t i = first; i <= last; ++i) allocation->pages[i].kept = operation_;
  }
  uint64_t remote = 0;
  for (const VaRange& range : ranges) {
    Allocation* allocation = nullptr;
    size_t first = 0, last = 0;
    uintptr_t base = 0;
    if (!locate(range, &base, &allocation, &first, &last)) continue;
    for (size_t i = first; i <= last; ++i) {
      Page& page = allocation->pages[i];
      if (page.on_device) {
        arrival = std::max(arrival, page.arrives_ns);
      } else if (page.mapped_on_device) {
        ++remote;  // read where it is
      } else {
        if (Status status = bring_in(base, *allocation, i, limit, true, start); !status.is_ok()) return status;
        ++faulted;
        if (faulted_pages != nullptr) faulted_pages->push_back(base + i * page_bytes_);
      }
      page.has_data = true;
      page.discarded = false;
    }
  }
  const uint64_t batch = std::max<uint32_t>(costs_.fault_batch_pages, 1);
  const uint64_t batches = (faulted + batch - 1) / batch;
  const uint64_t remote_ns = copy_ns(remote * page_bytes_, costs_.fault_bytes_per_s);
  const uint64_t fault_time = batches * costs_.fault_batch_ns + faulted * costs_.fault_block_ns + fault_ns_pending_ + remote_ns;
  stats_.remote_pages += remote;
  stats_.idle_ns += start - stats_.now_ns;
  stats_.stall_ns += arrival - start;
  stats_.fault_ns += fault_time;
  stats_.faulted_pages += faulted;
  stats_.fault_batches += batches;
  stats_.kernel_ns += duration_ns;
  stats_.kernels += 1;
  stats_.now_ns = arrival + fault_time + duration_ns;
  return Status::ok();
}

}  // namespace zico
