// Replaying a memory trace against an allocator (a ReplayTarget).
//
// Allocations and frees happen in trace order; ops are skipped (no memory is
// touched). Live bytes are the *requested* sizes, so the fragmentation ratio
// (peak mapped / peak live) charges the allocator for its rounding too.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "replay_target.h"
#include "trace.h"

namespace zico::replay {

struct IterationResult {
  uint64_t peak_live_bytes = 0;
  uint64_t peak_mapped_bytes = 0;
  // At the moment of the iteration's live peak:
  uint64_t persistent_bytes = 0;  // blocks that outlive their iteration
  uint64_t transient_bytes = 0;   // blocks born and dead within it
};

struct ReplayResult {
  std::string target;
  uint64_t peak_live_bytes = 0;
  uint64_t peak_mapped_bytes = 0;
  uint64_t allocations = 0;
  uint64_t failed_allocations = 0;
  uint64_t map_calls = 0;
  uint64_t unmap_calls = 0;
  double cpu_seconds = 0;  // thread CPU time of the whole replay loop
  std::vector<IterationResult> iterations;
  [[nodiscard]] double fragmentation() const {
    return peak_live_bytes == 0 ? 0 : static_cast<double>(peak_mapped_bytes) / static_cast<double>(peak_live_bytes);
  }
  [[nodiscard]] double ns_per_operation() const;
};

// Fails only if the target fails in a way other than out-of-memory; refused
// allocations are counted and their frees skipped.
[[nodiscard]] Status replay(const trace::Trace& trace, ReplayTarget& target, ReplayResult* out, std::string* error);

}  // namespace zico::replay
