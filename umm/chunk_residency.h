// Where a chunk's contents live: the residency state machine.
//
//            map (create + map + access)             evict: copy out, then unmap
//   kEmpty ─────────────────────────────► kMapped ──────────────► kInFlight ──► kHost / kNvme
//     ▲                                    │  ▲                       │ failure:      │
//     └────────── unmap (trim) ────────────┘  └── restore: create, map, copy in ──┘
//                                                  (kInFlight in between)
//
// - kEmpty: VA only. Nothing to save; trim puts idle chunks here.
// - kMapped: physical memory holds the contents (the only state a kernel may touch).
// - kHost / kNvme: the contents live in a backing store slot; no physical memory.
// - kInFlight: a copy between device and store is under way.
//
// Who moves a chunk: only the owning DeviceAllocator, under its lock, with the
// GPU quiet for that chunk (its blocks fenced, the device synchronized), since
// unmap does not wait for kernels. What a failure leaves: an eviction that
// fails before the unmap leaves the chunk kMapped with its data, and the slot
// is given back; a restore that fails leaves it in its store with the data, and
// any half-made mapping is removed. Data is never in neither place.
#pragma once

#include <cstdint>

namespace zico {

enum class Residency : uint8_t { kEmpty, kMapped, kInFlight, kHost, kNvme };

[[nodiscard]] constexpr const char* to_string(Residency residency) {
  switch (residency) {
    case Residency::kEmpty: return "empty";
    case Residency::kMapped: return "mapped";
    case Residency::kInFlight: return "in flight";
    case Residency::kHost: return "host";
    case Residency::kNvme: return "nvme";
  }
  return "?";
}

}  // namespace zico
