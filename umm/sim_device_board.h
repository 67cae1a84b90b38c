// SimDeviceBoard: the simulated devices' memory as every process on the node
// sees it.
//
// A GPU's memory is one for all the processes that use it: cudaMemGetInfo
// in any of them reports what all of them hold, and an allocation that finds
// none free makes the UVM driver hand over memory that managed pages keep
// unused (the root chunks of pages evicted to the host), whichever process
// they belong to. Without a board each SimDriver has its devices to itself.
// SimDrivers (in any processes) that open the same board file share them:
// each publishes what it holds on each device, reads what the others hold,
// and may take the others' managed memory, unused first; the owner learns
// what was taken at its next call and gives it up then (its unused memory
// first, then pages in use, copied out: the UVM driver evicts used chunks
// last).
//
// The file is a fixed table of slots in shared memory (MAP_SHARED), one per
// open board; a slot whose process died is free again, its memory forgotten
// (the driver frees a dead process's memory). Lock-free: every field is an
// atomic word, written by its owner except `taken`, which any taker adds to
// and nobody lowers. A slot's memory is its figures less `taken`: the owner
// publishes them gross of all it has given up so far, so that giving up what
// was taken changes nothing another process reads.
// Figures are what a slot published at its last call, as cudaMemGetInfo's
// are a snapshot.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "status.h"

namespace zico {

class SimDeviceBoard {
 public:
  static constexpr int kMaxDevices = 64;
  static constexpr size_t kSlots = 256;

  // Opens (creating if need be) the board at `path` and takes a free slot.
  // kConfigError with *why naming the path when the file is not a board or
  // cannot be opened; kOutOfMemory when every slot is taken by a live process.
  [[nodiscard]] static Status open(const std::string& path, std::unique_ptr<SimDeviceBoard>* out, std::string* why);
  ~SimDeviceBoard();  // frees the slot
  SimDeviceBoard(const SimDeviceBoard&) = delete;
  SimDeviceBoard& operator=(const SimDeviceBoard&) = delete;

  // This slot holds `held_bytes` of `device`; managed pages hold
  // `managed_bytes` of it (another allocation may take them, which the
  // driver evicts), `unused_bytes` of those unused (taken without a copy).
  void publish(int device, uint64_t held_bytes, uint64_t managed_bytes, uint64_t unused_bytes);
  // What the other live slots hold of `device`, less what was taken from them.
  [[nodiscard]] uint64_t others_held(int device) const;
  // The unused / all managed memory of other slots not yet taken.
  [[nodiscard]] uint64_t others_unused(int device) const;
  [[nodiscard]] uint64_t others_managed(int device) const;
  // Takes up to `bytes` of other slots' unused / managed memory of
  // `device`; returns what it took.
  uint64_t take_unused(int device, uint64_t bytes);
  uint64_t take_managed(int device, uint64_t bytes);
  // What other slots took of this one's memory of `device` since the last
  // call; the caller gives it up (and publishes without it).
  uint64_t taken_from_me(int device);

 private:
  struct Table;
  // Sums, or takes, what `field` says other live slots have, less what was
  // taken from them.
  enum class Field { kHeld, kUnused, kManaged };
  // What slot `slot` published of `device` for `field` (taken not deducted).
  [[nodiscard]] uint64_t published(size_t slot, int device, Field field) const;
  [[nodiscard]] uint64_t others(int device, Field field) const;
  uint64_t take(int device, Field field, uint64_t bytes);
  SimDeviceBoard(Table* table, size_t slot) : table_(table), slot_(slot) {}

  Table* table_;
  size_t slot_;
  uint64_t given_up_[kMaxDevices] = {};  // of this slot's `taken`, what taken_from_me has handed on
};

}  // namespace zico
