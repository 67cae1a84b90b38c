// BackingStore: where evicted chunks live while their GPU memory is released.
//
// Implementations: HostStore (NUMA-local pinned host memory) and NvmeStore
// (one file per job, O_DIRECT through io_uring). A store hands out slots of
// exactly one chunk each. save() copies chunks from device memory into slots
// and load() copies them back; both are batched so a store can keep its links
// busy (device<->host copies overlapped with disk I/O) and both return only
// when the data is where it was asked to be.
//
// Failure contract: save() either stores every chunk of the batch or reports
// an error, after which the caller must treat every slot of the batch as
// empty (the device copies are untouched). load() either restores every chunk
// or reports an error; the slots keep their contents and may be loaded again.
// A corrupt slot (checksum mismatch) is an error, never wrong data.
//
// Thread-safety: one caller at a time (the owning allocator's lock).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "driver.h"
#include "chunk_residency.h"
#include "status.h"

namespace zico {

struct ChunkTransfer {
  uint32_t slot = 0;
  void* device = nullptr;  // the chunk's device address (mapped, accessible)
};

class BackingStore {
 public:
  virtual ~BackingStore() = default;
  // kHost or kNvme: what a chunk saved here is.
  [[nodiscard]] virtual Residency residency() const = 0;
  [[nodiscard]] virtual size_t chunk_bytes() const = 0;
  [[nodiscard]] virtual Status reserve_slot(uint32_t* slot) = 0;
  virtual void release_slot(uint32_t slot) = 0;
  [[nodiscard]] virtual Status save(std::span<const ChunkTransfer> chunks, StreamHandle stream) = 0;
  [[nodiscard]] virtual Status load(std::span<const ChunkTransfer> chunks, StreamHandle stream) = 0;
};

}  // namespace zico
