// ReplayTarget: an allocator under test, as the trace replayer drives it.
//
// The replayer calls allocate/free in trace order, the iteration hook at each
// iteration start, and samples mapped_bytes() after every call, so a target
// only reports its current state; peaks are the replayer's business. Targets
// never touch the memory they hand out.
#pragma once

#include <cstddef>
#include <cstdint>

#include "status.h"

namespace zico::replay {

class ReplayTarget {
 public:
  virtual ~ReplayTarget() = default;
  [[nodiscard]] virtual const char* name() const = 0;
  // `block` is the trace's dense block index, for targets that plan ahead.
  [[nodiscard]] virtual Status allocate(uint32_t block, size_t bytes, void** out) = 0;
  virtual void free(uint32_t block, void* ptr) = 0;
  virtual void iteration_started(uint32_t /*iteration*/) {}
  // Physical memory the target holds now (mapped chunks, reserved segments).
  [[nodiscard]] virtual uint64_t mapped_bytes() const = 0;
  // Driver calls that create or destroy mappings (segments for models).
  [[nodiscard]] virtual uint64_t map_calls() const = 0;
  [[nodiscard]] virtual uint64_t unmap_calls() const = 0;
};

}  // namespace zico::replay
