#include "host_store.h"

#include <numa.h>
#include <sched.h>
#include <sys/mman.h>

#include <algorithm>

#include "log.h"
#include "sizes.h"

namespace zico {

Status HostStore::create(Driver& driver, DeviceId device, size_t chunk_bytes, const HostStoreOptions& options,
                         std::unique_ptr<HostStore>* out, std::string* why) {
  if (chunk_bytes == 0 || options.block_chunks == 0) {
    *why = "host store: chunk size and block size must be positive";
    return Status(Errc::kInvalidArgument);
  }
  Capabilities caps;
  if (Status status = driver.capabilities(device, &caps); !status.is_ok()) {
    *why = "host store: cannot query device " + std::to_string(device.value) + ": " + status.message();
    return status;
  }
  int node = -1;
  if (numa_available() >= 0) {
    node = caps.numa_node >= 0 && caps.numa_node <= numa_max_node() ? caps.numa_node : numa_node_of_cpu(sched_getcpu());
  }
  out->reset(new HostStore(driver, chunk_bytes, options, node));
  ZICO_LOG(kInfo, "host store for device %d on NUMA node %d, %s slots", device.value, node,
           format_size(chunk_bytes).c_str());
  return Status::ok();
}

HostStore::~HostStore() {
  for (Block& block : blocks_) free_block(block);
}

void HostStore::free_block(Block& block) {
  if (block.memory == nullptr) return;
  const size_t bytes = chunk_bytes_ * options_.block_chunks;
  if (block.pinned) (void)driver_.host_unregister(block.memory);
  if (numa_node_ >= 0) {
    numa_free(block.memory, bytes);
  } else {
    munmap(block.memory, bytes);
  }
  block = Block{};
}

Status HostStore::grow() {
  const size_t bytes = chunk_bytes_ * options_.block_chunks;
  void* memory = nullptr;
  if (numa_node_ >= 0) {
    memory = numa_alloc_onnode(bytes, numa_node_);
  } else {
    memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) memory = nullptr;
  }
  if (memory == nullptr) return Status(Errc::kOutOfMemory);
  Block block{memory, driver_.host_register(memory, bytes).is_ok()};
  if (!block.pinned && !warned_unpinned_) {
    ZICO_LOG(kWarn, "host store: pinning %s of host memory failed; evictions will be slower (host memory short?)",
             format_size(bytes).c_str());
    warned_unpinned_ = true;
  }
  // Reuse a shrunk block's slot numbers first, so slot ids stay dense.
  auto hole = std::find_if(blocks_.begin(), blocks_.end(), [](const Block& b) { return b.memory == nullptr; });
  const size_t index = hole == blocks_.end() ? blocks_.size() : static_cast<size_t>(hole - blocks_.begin());
  if (hole == blocks_.end()) {
    blocks_.push_back(block);
    slot_used_.resize(blocks_.size() * options_.block_chunks, false);
  } else {
    *hole = block;
  }
  for (size_t i = options_.block_chunks; i-- > 0;) {
    free_slots_.push_back(static_cast<uint32_t>(index * options_.block_chunks + i));
  }
  return Status::ok();
}

Status HostStore::reserve_slot(uint32_t* slot) {
  try {
    if (free_slots_.empty()) ZICO_RETURN_IF_ERROR(grow());
    *slot = free_slots_.back();
    free_slots_.pop_back();
    slot_used_[*slot] = true;
    ++in_use_;
    return Status::ok();
  } catch (const std::bad_alloc&) {
    return Status(Errc::kOutOfMemory);
  }
}

void HostStore::release_slot(uint32_t slot) {
  if (slot >= slot_used_.size() || !slot_used_[slot]) return;
  slot_used_[slot] = false;
  --in_use_;
  free_slots_.push_back(slot);
}

void* HostStore::slot_data(uint32_t slot) const {
  const Block& block = blocks_[slot / options_.block_chunks];
  return static_cast<char*>(block.memory) + (slot % options_.block_chunks) * chunk_bytes_;
}

Status HostStore::transfer(std::span<const ChunkTransfer> chunks, StreamHandle stream, bool to_host) {
  Status status = Status::ok();
  for (const ChunkTransfer& c : chunks) {
    status = to_host ? driver_.copy_async(slot_data(c.slot), c.device, chunk_bytes_, CopyKind::kDeviceToHost, stream)
                     : driver_.copy_async(c.device, slot_data(c.slot), chunk_bytes_, CopyKind::kHostToDevice, stream);
    if (!status.is_ok()) break;
  }
  // Even after a failure: copies already queued must finish before anyone
  // unmaps their source or reuses their slot.
  const Status synced = driver_.stream_synchronize(stream);
  return status.is_ok() ? synced : status;
}

Status HostStore::save(std::span<const ChunkTransfer> chunks, StreamHandle stream) {
  return transfer(chunks, stream, true);
}

Status HostStore::load(std::span<const ChunkTransfer> chunks, StreamHandle stream) {
  return transfer(chunks, stream, false);
}

void HostStore::shrink() {
  for (size_t b = 0; b < blocks_.size(); ++b) {
    if (blocks_[b].memory == nullptr) continue;
    const size_t first = b * options_.block_chunks;
    bool any_used = false;
    for (size_t s = first; s < first + options_.block_chunks; ++s) any_used = any_used || slot_used_[s];
    if (any_used) continue;
    std::erase_if(free_slots_, [&](uint32_t s) { return s >= first && s < first + options_.block_chunks; });
    free_block(blocks_[b]);
  }
}

size_t HostStore::reserved_bytes() const {
  const auto live = std::count_if(blocks_.begin(), blocks_.end(), [](const Block& b) { return b.memory != nullptr; });
  return static_cast<size_t>(live) * options_.block_chunks * chunk_bytes_;
}

}  // namespace zico
