// HostStore: evicted chunks in host memory near the GPU.
//
// Slots are chunk-sized pieces of larger blocks (block_chunks chunks each),
// allocated on the GPU's NUMA node (libnuma; the node comes from the device's
// PCI slot, else the calling thread's node) and pinned through the driver so
// device copies run at full link speed. Blocks are kept and slots reused:
// pinning costs far more than a copy, so the pool only grows, until shrink()
// returns blocks with no slot in use. If pinning fails (RLIMIT_MEMLOCK, a
// driver without support) the store still works, unpinned and slower, and
// says so once in the log.
//
// Copies are one chunk each: at 2 MiB a pinned copy already runs at the
// link's peak (the 10-50 us fixed cost per copy is under 5 % of its time at
// 25-55 GB/s), and a chunk-sized copy never straddles two slots.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backing_store.h"

namespace zico {

struct HostStoreOptions {
  size_t block_chunks = 32;  // slots per host allocation (64 MiB at 2 MiB chunks)
};

class HostStore final : public BackingStore {
 public:
  [[nodiscard]] static Status create(Driver& driver, DeviceId device, size_t chunk_bytes,
                                     const HostStoreOptions& options, std::unique_ptr<HostStore>* out,
                                     std::string* why);
  ~HostStore() override;
  HostStore(const HostStore&) = delete;
  HostStore& operator=(const HostStore&) = delete;

  Residency residency() const override { return Residency::kHost; }
  size_t chunk_bytes() const override { return chunk_bytes_; }
  Status reserve_slot(uint32_t* slot) override;
  void release_slot(uint32_t slot) override;
  Status save(std::span<const ChunkTransfer> chunks, StreamHandle stream) override;
  Status load(std::span<const ChunkTransfer> chunks, StreamHandle stream) override;

  // Returns blocks in which no slot is in use.
  void shrink();
  [[nodiscard]] void* slot_data(uint32_t slot) const;
  [[nodiscard]] int numa_node() const { return numa_node_; }  // -1: libnuma unavailable
  [[nodiscard]] size_t slots_in_use() const { return in_use_; }
  [[nodiscard]] size_t reserved_bytes() const;

 private:
  struct Block {
    void* memory = nullptr;  // nullptr once shrunk
    bool pinned = false;
  };

  HostStore(Driver& driver, size_t chunk_bytes, const HostStoreOptions& options, int numa_node)
      : driver_(driver), chunk_bytes_(chunk_bytes), options_(options), numa_node_(numa_node) {}
  Status grow();
  Status transfer(std::span<const ChunkTransfer> chunks, StreamHandle stream, bool to_host);
  void free_block(Block& block);

  Driver& driver_;
  const size_t chunk_bytes_;
  const HostStoreOptions options_;
  const int numa_node_;
  std::vector<Block> blocks_;
  std::vector<uint32_t> free_slots_;
  std::vector<bool> slot_used_;
  size_t in_use_ = 0;
  bool warned_unpinned_ = false;
};

}  // namespace zico
