#include "chunk_map.h"

#include <algorithm>
#include <bit>
#include <cassert>

#include "log.h"

namespace zico {

ChunkMap::ChunkMap(Driver& driver, ChunkSource& source, DeviceId device, VaRange arena, size_t chunk_bytes)
    : driver_(driver), source_(source), device_(device), arena_(arena), chunk_bytes_(chunk_bytes),
      chunk_shift_(std::has_single_bit(chunk_bytes) ? std::countr_zero(chunk_bytes) : -1),
      entries_(arena.bytes / chunk_bytes) {}

ChunkMap::~ChunkMap() {
  drop_spares();
  flush_returns();
}

Status ChunkMap::obtain_spares(size_t count, Patience patience) {
  if (spares_.size() >= count) return Status::ok();
  return source_.obtain(count - spares_.size(), patience, &spares_);
}

void ChunkMap::drop_spares() {
  if (spares_.empty()) return;
  std::vector<uint64_t> ids;
  ids.reserve(spares_.size());
  for (const SourcedChunk& chunk : spares_) {
    source_.release_handle(chunk.handle);
    ids.push_back(chunk.id);
  }
  spares_.clear();
  source_.give_back(ids);
}

void ChunkMap::flush_returns() {
  if (returns_.empty()) return;
  source_.give_back(returns_);
  returns_.clear();
}

size_t ChunkMap::unmapped_bytes_in(uintptr_t addr, size_t bytes) const {
  if (bytes == 0) return 0;
  size_t count = 0;
  for (size_t i = index_of(addr), last = last_index(addr, bytes); i <= last; ++i) count += entries_[i].mapped() ? 0 : 1;
  return count * chunk_bytes_;
}

Status ChunkMap::map_one(size_t index, bool with_access) {
  const VaRange range{address_of(index), chunk_bytes_};
  const SourcedChunk chunk = spares_.back();
  Status status = driver_.map(range, chunk.handle);
  if (status.is_ok() && with_access) {
    status = driver_.set_access(device_, range);
    if (!status.is_ok()) (void)driver_.unmap(range);
  }
  if (!status.is_ok()) return status;  // the chunk stays a spare
  spares_.pop_back();
  // The mapping keeps the memory alive; holding the handle would only pin an fd.
  source_.release_handle(chunk.handle);
  entries_[index].residency = Residency::kMapped;
  entries_[index].id = chunk.id;
  ++mapped_chunks_;
  if (entries_[index].used == 0) ++idle_chunks_;
  ++maps_;
  return Status::ok();
}

Status ChunkMap::unmap_one(size_t index) {
  ZICO_RETURN_IF_ERROR(driver_.unmap(VaRange{address_of(index), chunk_bytes_}));
  entries_[index].residency = Residency::kEmpty;
  returns_.push_back(entries_[index].id);
  --mapped_chunks_;
  if (entries_[index].used == 0) --idle_chunks_;
  ++unmaps_;
  return Status::ok();
}

Status ChunkMap::map_range(uintptr_t addr, size_t bytes, Patience patience) {
  if (bytes == 0) return Status::ok();
  ZICO_RETURN_IF_ERROR(obtain_spares(unmapped_bytes_in(addr, bytes) / chunk_bytes_, patience));
  std::vector<size_t> mapped_here;
  // Access is granted once per run of chunks mapped here side by side:
  // cuMemSetAccess takes any fully mapped range and synchronizes, so one
  // call for a 1 GiB block instead of 512.
  size_t run_start = SIZE_MAX;
  const auto grant_run = [&](size_t run_end) {
    const Status granted = driver_.set_access(device_, VaRange{address_of(run_start), (run_end - run_start) * chunk_bytes_});
    run_start = SIZE_MAX;
    return granted;
  };
  Status status = Status::ok();
  for (size_t i = index_of(addr), last = last_index(addr, bytes); i <= last && status.is_ok(); ++i) {
    if (entries_[i].mapped()) {
      if (run_start != SIZE_MAX) status = grant_run(i);
      continue;
    }
    status = map_one(i, false);
    if (status.is_ok()) {
      mapped_here.push_back(i);
      if (run_start == SIZE_MAX) run_start = i;
    }
  }
  if (status.is_ok() && run_start != SIZE_MAX) status = grant_run(last_index(addr, bytes) + 1);
  if (!status.is_ok()) {
    // All or nothing: nothing can use the chunks this call mapped yet.
    for (size_t j : mapped_here) (void)unmap_one(j);
    flush_returns();
    return status;
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
    if (e.used == 0 && e.mapped()) --idle_chunks_;
    e.used += overlap;
  });
}

void ChunkMap::unref(uintptr_t addr, size_t bytes) {
  for_each_overlap(addr, bytes, [this](Entry& e, uint64_t overlap) {
    assert(e.used >= overlap);
    e.used -= overlap;
    if (e.used == 0 && e.mapped()) ++idle_chunks_;
  });
}

Status ChunkMap::trim(size_t want, VaRange keep, size_t* freed) {
  *freed = 0;
  for (size_t i = 0; i < entries_.size() && *freed < want && idle_chunks_ > 0; ++i) {
    const Entry& e = entries_[i];
    if (!e.mapped() || e.used != 0) continue;
    if (keep.bytes != 0 && keep.overlaps(VaRange{address_of(i), chunk_bytes_})) continue;
    if (Status status = unmap_one(i); !status.is_ok()) {
      flush_returns();
      return status;
    }
    *freed += chunk_bytes_;
  }
  flush_returns();
  return Status::ok();
}

void ChunkMap::unmap_all() {
  for (size_t i = 0; i < entries_.size() && mapped_chunks_ > 0; ++i) {
    if (!entries_[i].mapped()) continue;
    const Status status = unmap_one(i);
    if (!status.is_ok()) ZICO_LOG(kWarn, "unmapping chunk %zu at teardown failed: %s", i, status.message().c_str());
  }
  flush_returns();
}

std::vector<size_t> ChunkMap::chunks_in_use() const {
  std::vector<size_t> indices;
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (entries_[i].mapped() && entries_[i].used != 0) indices.push_back(i);
  }
  return indices;
}

void ChunkMap::discard_evicted(BackingStore& store) {
  for (Entry& e : entries_) {
    if (e.residency != store.residency()) continue;
    store.release_slot(e.slot);
    e.residency = Residency::kEmpty;
  }
}

std::vector<size_t> ChunkMap::evicted_chunks() const {
  std::vector<size_t> indices;
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Residency r = entries_[i].residency;
    if (r == Residency::kHost || r == Residency::kNvme) indices.push_back(i);
  }
  return indices;
}

Status ChunkMap::evict(std::span<const size_t> indices, BackingStore& store, StreamHandle stream) {
  std::vector<ChunkTransfer> transfers;
  transfers.reserve(indices.size());
  Status status = Status::ok();
  for (size_t index : indices) {
    if (!entries_[index].mapped()) {
      status = Status(Errc::kInvalidArgument);
      break;
    }
    uint32_t slot = 0;
    status = store.reserve_slot(&slot);
    if (!status.is_ok()) break;
    transfers.push_back({slot, reinterpret_cast<void*>(address_of(index))});
  }
  if (status.is_ok()) {
    for (size_t index : indices) entries_[index].residency = Residency::kInFlight;
    status = store.save(transfers, stream);
    for (size_t index : indices) entries_[index].residency = Residency::kMapped;
  }
  if (!status.is_ok()) {
    for (const ChunkTransfer& t : transfers) store.release_slot(t.slot);
    return status;
  }
  // Saved: the physical memory can go. Contents now live only in the store.
  Status result = Status::ok();
  for (size_t k = 0; k < indices.size(); ++k) {
    const size_t index = indices[k];
    if (Status unmapped = unmap_one(index); !unmapped.is_ok()) {
      // Still mapped and intact: keep it so, drop its copy, and report it,
      // since the caller expected the memory to be gone.
      store.release_slot(transfers[k].slot);
      ZICO_LOG(kWarn, "evict: unmapping chunk %zu failed (%s); it stays mapped", index, unmapped.message().c_str());
      result = unmapped;
      continue;
    }
    entries_[index].residency = store.residency();
    entries_[index].slot = transfers[k].slot;
  }
  flush_returns();
  return result;
}

Status ChunkMap::restore(std::span<const size_t> indices, BackingStore& store, StreamHandle stream,
                         Patience patience) {
  ZICO_RETURN_IF_ERROR(obtain_spares(indices.size(), patience));
  std::vector<ChunkTransfer> transfers;
  std::vector<size_t> mapped_here;
  transfers.reserve(indices.size());
  Status status = Status::ok();
  for (size_t index : indices) {
    Entry& e = entries_[index];
    if (e.residency != store.residency()) {
      status = Status(Errc::kInvalidArgument);
      break;
    }
    const Residency saved = e.residency;
    status = map_one(index);  // sets kMapped
    if (!status.is_ok()) {
      e.residency = saved;
      break;
    }
    e.residency = Residency::kInFlight;
    mapped_here.push_back(index);
    transfers.push_back({e.slot, reinterpret_cast<void*>(address_of(index))});
  }
  if (status.is_ok()) status = store.load(transfers, stream);
  if (!status.is_ok()) {
    // Back out: the store still holds every chunk of the batch.
    for (size_t index : mapped_here) {
      entries_[index].residency = Residency::kMapped;
      if (!unmap_one(index).is_ok()) {
        // The mapping stays (and stays counted); the data is still in the
        // store, but a later restore of this chunk would map over it.
        ZICO_LOG(kError, "restore: could not undo the mapping of chunk %zu; it holds no data", index);
        continue;
      }
      entries_[index].residency = store.residency();
    }
    flush_returns();
    return status;
  }
  for (size_t index : mapped_here) {
    entries_[index].residency = Residency::kMapped;
    store.release_slot(entries_[index].slot);
  }
  return Status::ok();
}

}  // namespace zico

namespace zico {

Status DriverChunkSource::obtain(size_t count, Patience, std::vector<SourcedChunk>* out) noexcept {
  const size_t first = out->size();
  for (size_t i = 0; i < count; ++i) {
    PhysHandle handle;
    if (Status status = driver_.create(device_, chunk_bytes_, &handle); !status.is_ok()) {
      for (size_t j = first; j < out->size(); ++j) release_handle((*out)[j].handle);
      out->resize(first);
      return status;
    }
    try {
      out->push_back(SourcedChunk{handle, 0});
    } catch (const std::bad_alloc&) {
      release_handle(handle);
      for (size_t j = first; j < out->size(); ++j) release_handle((*out)[j].handle);
      out->resize(first);
      return Status(Errc::kOutOfMemory);
    }
  }
  return Status::ok();
}

void DriverChunkSource::release_handle(PhysHandle handle) noexcept {
  const Status released = driver_.release(handle);
  if (!released.is_ok()) ZICO_LOG(kWarn, "releasing a chunk handle failed: %s", released.message().c_str());
}

}  // namespace zico
