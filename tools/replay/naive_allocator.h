// NaiveAllocator: the baseline with no caching and no sharing of chunks.
//
// Every allocation gets its own VA reservation and its own physical chunk,
// both the request rounded up to the driver's granularity: reserve, create,
// map, set_access. Every free undoes all of it: synchronize the stream (unmap
// does not wait for the GPU), unmap, release, unreserve. This is what a
// program calling the CUDA VMM API directly per tensor pays, and its mapped
// bytes are the request sizes plus rounding and nothing else.
//
// Thread-safety: none; one thread at a time.
#pragma once

#include <cstddef>
#include <memory>
#include <unordered_map>

#include "driver.h"

namespace zico::replay {

class NaiveAllocator {
 public:
  [[nodiscard]] static Status create(Driver& driver, DeviceId device, std::unique_ptr<NaiveAllocator>* out);
  // Frees whatever is still allocated.
  ~NaiveAllocator();
  NaiveAllocator(const NaiveAllocator&) = delete;
  NaiveAllocator& operator=(const NaiveAllocator&) = delete;

  [[nodiscard]] Status allocate(size_t bytes, StreamHandle stream, void** out) noexcept;
  [[nodiscard]] Status deallocate(void* ptr, StreamHandle stream) noexcept;

  [[nodiscard]] size_t mapped_bytes() const { return mapped_bytes_; }
  [[nodiscard]] size_t peak_mapped_bytes() const { return peak_mapped_bytes_; }

 private:
  struct Mapping {
    VaRange range;
    PhysHandle handle;
  };

  NaiveAllocator(Driver& driver, DeviceId device, size_t granularity)
      : driver_(driver), device_(device), granularity_(granularity) {}
  Status unmap_and_free(const Mapping& mapping) noexcept;

  Driver& driver_;
  const DeviceId device_;
  const size_t granularity_;
  std::unordered_map<uintptr_t, Mapping> live_;  // base address -> mapping
  size_t mapped_bytes_ = 0;
  size_t peak_mapped_bytes_ = 0;
};

}  // namespace zico::replay
