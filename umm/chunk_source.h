// ChunkSource: where an allocator's physical chunks come from and go back to.
//
// Standalone, chunks are created by the driver and die when unmapped
// (DriverChunkSource). Under the node manager (zico-umd), they are lent by the
// daemon, which owns them: the source asks for them over the socket, imports
// the descriptors it receives, and tells the daemon when they come back
// (sharing/node_client.h). The allocator does not know which one it has.
//
// Protocol with the caller (ChunkMap): obtain() hands out handles; the caller
// maps each one and then drops it with release_handle() (the mapping keeps
// the memory alive, so holding handles would only pin descriptors). After
// unmapping, with the GPU fenced, the caller passes the chunks' ids to
// give_back(). Ids are opaque; 0 is a valid id for sources that need none.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "driver.h"
#include "status.h"

namespace zico {

struct SourcedChunk {
  PhysHandle handle;
  uint64_t id = 0;
};

// How long obtain() may wait for chunks that are not there yet.
enum class Patience : uint8_t {
  kDefault,  // the source's own limit (ZICO_WAIT_TIMEOUT under the daemon; no wait standalone)
  kForever,  // until they come: data already evicted must come back, or the job cannot go on
};

class ChunkSource {
 public:
  virtual ~ChunkSource() = default;

  // Appends `count` chunks to *out; all or nothing. Errors:
  //   kOutOfMemory  none to be had (device full, daemon said no, timed out);
  //   kYield        the daemon picked this job to break a deadlock: the caller
  //                 must give back every chunk it holds, then ask again.
  // May block (under the daemon) while other jobs give memory back.
  [[nodiscard]] virtual Status obtain(size_t count, Patience patience, std::vector<SourcedChunk>* out) noexcept = 0;
  virtual void release_handle(PhysHandle handle) noexcept = 0;
  // The chunks are unmapped and no GPU work of this process touches them.
  virtual void give_back(std::span<const uint64_t> ids) noexcept = 0;
  // Why the last obtain() failed, in words ("" if the status says it all).
  [[nodiscard]] virtual std::string last_failure() const { return {}; }
};

// Standalone: chunks from driver.create(), freed by the unmap that drops the
// last reference.
class DriverChunkSource final : public ChunkSource {
 public:
  DriverChunkSource(Driver& driver, DeviceId device, size_t chunk_bytes)
      : driver_(driver), device_(device), chunk_bytes_(chunk_bytes) {}

  Status obtain(size_t count, Patience patience, std::vector<SourcedChunk>* out) noexcept override;
  void release_handle(PhysHandle handle) noexcept override;
  void give_back(std::span<const uint64_t>) noexcept override {}

 private:
  Driver& driver_;
  DeviceId device_;
  size_t chunk_bytes_;
};

}  // namespace zico
