#include "chunk_map.h"

#include <algorithm>
#include <bit>
#include <cassert>

#include "log.h"

namespace zico {

ChunkMap::ChunkMap(Driver& driver, DeviceId device, VaRange arena, size_t chunk_bytes)
    : driver_(driver), device_(device), arena_(arena), chunk_bytes_(chunk_bytes),
      chunk_shift_(std::has_single_bit(chunk_bytes) ? std::countr_zero(chunk_bytes) : -1),
      entries_(arena.bytes / chunk_bytes) {}

size_t ChunkMap::unmapped_bytes_in(uintptr_t addr, size_t bytes) const {
  if (bytes == 0) return 0;
  size_t count = 0;
  for (size_t i = index_of(addr), last = last_index(addr, bytes); i <= last; ++i) count += entries_[i].mapped ? 0 : 1;
  return count * chunk_bytes_;
}

Status ChunkMap::map_one(size_t index) {
  const VaRange range{address_of(index), chunk_bytes_};
  PhysHandle handle;
  ZICO_RETURN_IF_ERROR(driver_.create(device_, chunk_bytes_, &handle));
  Status status = driver_.map(range, handle);
  if (status.is_ok()) {
    status = driver_.set_access(device_, range);
    if (!status.is_ok()) (void)driver_.unmap(range);
  }
  // The mapping keeps the memory alive; holding the handle would only pin an fd.
  const Status released = driver_.release(handle);
  if (!released.is_ok()) ZICO_LOG(kWarn, "releasing a chunk handle failed: %s", released.message().c_str());
  if (!status.is_ok()) return status;
  entries_[index].mapped = true;
  ++mapped_chunks_;
  if (entries_[index].used == 0) ++idle_chunks_;
  ++maps_;
  return Status::ok();
}

Status ChunkMap::unmap_one(size_t index) {
  ZICO_RETURN_IF_ERROR(driver_.unmap(VaRange{address_of(index), chunk_bytes_}));
  entries_[index].mapped = false;
  --mapped_chunks_;
  if (entries_[index].used == 0) --idle_chunks_;
  ++unmaps_;
  return Status::ok();
}

Status ChunkMap::map_range(uintptr_t addr, size_t bytes) {
  if (bytes == 0) return Status::ok();
  std::vector<size_t> mapped_here;
  for (size_t i = index_of(addr), last = last_index(addr, bytes); i <= last; ++i) {
    if (entries_[i].mapped) continue;
    const Status status = map_one(i);
    if (!status.is_ok()) {
      // All or nothing: nothing can use the chunks this call mapped yet.
      for (size_t j : mapped_here) (void)unmap_one(j);
      return status;
    }
    mapped_here.push_back(i);
  }
  return Status::ok();
}

template <typename Fn>
void ChunkMap::for_each_overlap(uintptr_t addr, size_t bytes, Fn fn) {
  if (bytes == 0) return;  // last_index() needs at least one byte
  const uintptr_t end = addr + bytes;
  for (size_t i = index_of(addr), last = last_index(addr, bytes); i <= last; ++i) {
    const uintptr_t chunk_start = address_of(i);
    const uintptr_t from = std::max(addr, chunk_start);
    const uintptr_t to = std::min(end, chunk_start + chunk_bytes_);
    fn(entries_[i], static_cast<uint64_t>(to - from));
  }
}

void ChunkMap::ref(uintptr_t addr, size_t bytes) {
  for_each_overlap(addr, bytes, [this](Entry& e, uint64_t overlap) {
    if (e.used == 0 && e.mapped) --idle_chunks_;
    e.used += overlap;
  });
}

void ChunkMap::unref(uintptr_t addr, size_t bytes) {
  for_each_overlap(addr, bytes, [this](Entry& e, uint64_t overlap) {
    assert(e.used >= overlap);
    e.used -= overlap;
    if (e.used == 0 && e.mapped) ++idle_chunks_;
  });
}

Status ChunkMap::trim(size_t want, VaRange keep, size_t* freed) {
  *freed = 0;
  for (size_t i = 0; i < entries_.size() && *freed < want && idle_chunks_ > 0; ++i) {
    const Entry& e = entries_[i];
    if (!e.mapped || e.used != 0) continue;
    if (keep.bytes != 0 && keep.overlaps(VaRange{address_of(i), chunk_bytes_})) continue;
    ZICO_RETURN_IF_ERROR(unmap_one(i));
    *freed += chunk_bytes_;
  }
  return Status::ok();
}

void ChunkMap::unmap_all() {
  for (size_t i = 0; i < entries_.size() && mapped_chunks_ > 0; ++i) {
    if (!entries_[i].mapped) continue;
    const Status status = unmap_one(i);
    if (!status.is_ok()) ZICO_LOG(kWarn, "unmapping chunk %zu at teardown failed: %s", i, status.message().c_str());
  }
}

}  // namespace zico
