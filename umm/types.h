// Strong types for the handles and ranges that cross the driver seam.
//
// Every one of these is a plain integer underneath; the wrappers exist so a
// device ordinal cannot be passed where a stream is expected, nor a physical
// handle where a VA. Streams and events are opaque driver values (CUstream,
// CUevent, or SimDriver ids); a zero StreamHandle is the legacy default stream.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zico {

struct DeviceId {
  int value = 0;
  friend constexpr bool operator==(DeviceId, DeviceId) = default;
};

// A physical memory allocation (CUmemGenericAllocationHandle, or a SimDriver id).
struct PhysHandle {
  uint64_t value = 0;
  [[nodiscard]] constexpr bool valid() const { return value != 0; }
  friend constexpr bool operator==(PhysHandle, PhysHandle) = default;
};

struct StreamHandle {
  uintptr_t value = 0;
  friend constexpr bool operator==(StreamHandle, StreamHandle) = default;
};

struct EventHandle {
  uintptr_t value = 0;
  [[nodiscard]] constexpr bool valid() const { return value != 0; }
  friend constexpr bool operator==(EventHandle, EventHandle) = default;
};

// A range of device virtual addresses: [base, base + bytes).
struct VaRange {
  uintptr_t base = 0;
  size_t bytes = 0;
  [[nodiscard]] constexpr uintptr_t end() const { return base + bytes; }
  [[nodiscard]] constexpr bool contains(uintptr_t addr) const { return addr >= base && addr < end(); }
  [[nodiscard]] constexpr bool contains(VaRange inner) const {
    return inner.base >= base && inner.end() <= end() && inner.end() >= inner.base;
  }
  [[nodiscard]] constexpr bool overlaps(VaRange other) const {
    return base < other.end() && other.base < end();
  }
  [[nodiscard]] void* ptr() const { return reinterpret_cast<void*>(base); }
  friend constexpr bool operator==(VaRange, VaRange) = default;
};

}  // namespace zico
