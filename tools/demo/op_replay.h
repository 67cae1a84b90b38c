// OpReplay: a trace's memory and kernels replayed through libzicoum, as fast
// as they go (trace_job --ops). Blocks are allocated and freed with
// zico_malloc / zico_free in the trace's order; each op of a v2 trace is
// announced with zico_op_begin (its blocks and its duration) and
// zico_op_end; iterations are marked with zico_mark_iteration. In UM mode the
// pager pages around the ops; on the simulated backend each op runs for its
// duration on the device's modelled clock, which then gives the iteration
// times (wall time on a GPU). Every block carries a pattern in its first and
// last bytes, checked at its free, where its memory is host-accessible (the
// simulated backend, or UM mode): paging must never lose a live byte.
#pragma once

#include <cstdint>
#include <string>

#include "trace.h"

namespace zico::demo {

struct OpReplayResult {
  uint32_t iterations = 0;
  double first_iteration_s = 0;  // learning: the pager has seen nothing yet
  double steady_iteration_s = 0; // mean of the iterations after the first
  double last_iteration_s = 0;
  bool modelled = false;         // times from the simulated device's clock
  uint64_t peak_allocated_bytes = 0;
  uint64_t peak_resident_bytes = 0;
  uint64_t peak_over_budget_bytes = 0;  // zico_stats_t's: 0 while the budget held on the device
  // zico_stats_t's, read once every block is freed: the whole run's, as the
  // library's exit log counts them.
  uint64_t faulted_pages = 0;
  uint64_t prefetched_pages = 0;
  uint64_t evicted_pages = 0;
  // On failure: the trace cannot be replayed so (refused before any block
  // was allocated), rather than the run failing.
  bool unusable_trace = false;
};

// Each op runs for `time_scale` times its traced duration, each block is
// `memory_scale` times its traced size. False with *error naming the block,
// op or iteration that failed (an allocation out of memory, a wrong pattern,
// a refused op).
[[nodiscard]] bool replay_ops(const trace::Trace& trace, uint32_t iterations, double time_scale, double memory_scale,
                              OpReplayResult* out, std::string* error);

}  // namespace zico::demo
