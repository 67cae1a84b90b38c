// A paging study: one access stream under one budget, run under several
// policies, each summarised by its steady iteration against the two
// references measured in the same run: the in-memory time (every page
// resident, no budget) and the lower bound (the largest of
// prefetch/belady_bound.h's, prefetch/peak_bound.h's and
// prefetch/segment_bound.h's).
//
// The steady iteration is the stream's last: by then every policy that
// learns has seen at least one whole iteration (streams need two or more).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "access_stream.h"
#include "paging_simulator.h"
#include "peak_bound.h"
#include "segment_bound.h"

namespace zico::page {

struct PolicySummary {
  std::string policy;
  uint64_t iteration_ns = 0;  // the steady iteration, elapsed
  uint64_t stall_ns = 0;
  uint64_t faults = 0;
  uint64_t h2d_bytes = 0;
  uint64_t d2h_bytes = 0;
  uint64_t peak_resident_bytes = 0;  // over the whole run
  uint64_t refused_decisions = 0;
  uint64_t live_discards = 0;
  PagingResult run;
};

struct PagingStudy {
  std::string name;
  uint64_t page_bytes = 0;
  uint64_t budget_bytes = 0;
  uint64_t peak_live_bytes = 0;
  uint64_t peak_live_page_bytes = 0;  // the pages holding them: what paging moves
  uint64_t range_bytes = 0;           // every page the job's blocks ever use
  uint64_t largest_op_bytes = 0;
  double host_bytes_per_s = 0;  // the transfer model's host to device rate
  uint64_t in_memory_iteration_ns = 0;
  // The largest of compute, Belady's bytes over the H2D bandwidth, the peak
  // bound (prefetch/peak_bound.h) and the segment bound
  // (prefetch/segment_bound.h).
  uint64_t lower_bound_iteration_ns = 0;
  uint64_t lower_bound_fetch_bytes = 0;  // Belady's, in the steady iteration
  prefetch::PeakBound peak;
  prefetch::SegmentBound segments;
  std::vector<PolicySummary> policies;
};

// The budget must hold the largest op; the stream needs two iterations.
// False with *error naming the value otherwise.
[[nodiscard]] bool study_paging(const prefetch::AccessStream& stream, uint64_t budget_bytes,
                                const prefetch::TransferModel& model, const std::vector<std::string>& policies,
                                bool record_last_iteration, PagingStudy* out, std::string* error);

}  // namespace zico::page
