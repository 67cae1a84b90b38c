// What capping a Unified Memory job's resident bytes costs it
// (sharing/paging_cost.h), measured on its trace: the trace's access stream
// run by the paging simulator under zicoum's planner (the `zico` policy, the
// one libzicoum's UM mode runs) at caps from the largest op's working set
// (the floor) up to the peak of live memory, and with every page it touches
// resident. The stretch at a cap is the steady iteration's time there over
// its time in memory.
//
// The caps crowd towards the peak, where the time-shift scheduler caps jobs
// (a little below their peak beside the others' troughs) and where the
// stretch changes least smoothly; between points the scheduler interpolates.
#pragma once

#include <cstdint>
#include <string>

#include "paging_cost.h"
#include "trace.h"
#include "transfer_model.h"

namespace zico::page {

struct PagingCostOptions {
  prefetch::TransferModel model;
  uint64_t page_bytes = uint64_t{2} << 20;
  uint32_t points = 12;  // >= 2
};

// False, with *error naming the trace and the problem, for a trace the paging
// simulator cannot run (no ops, fewer than two iterations).
[[nodiscard]] bool measure_paging_cost(const trace::Trace& trace, const PagingCostOptions& options,
                                       sharing::PagingCost* out, std::string* error);

}  // namespace zico::page
