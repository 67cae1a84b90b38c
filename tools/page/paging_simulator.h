// PagingSimulator: one job's access stream run on a virtual GPU whose memory
// is capped at a budget, under a paging policy, on a virtual clock.
//
// The executor models the GPU and the UVM driver (prefetch/transfer_model.h
// has the costs and their sources):
// - Ops run one after another on one compute stream, each for its duration
//   once every page it uses is resident.
// - Before an op runs the policy decides (on_op_start) and its decisions are
//   carried out, overlapping compute: prefetches queue for the host-to-device
//   engine, which copies the most urgent first (the decision's priority, then
//   issue order); evictions of pages holding data run FIFO on the
//   device-to-host engine. A prefetch with no free slot waits for an eviction
//   in flight or is refused; one of a page still leaving fetches it again
//   once it has left.
// - The op then waits for its pages still arriving; those absent fault: the
//   GPU stalls for each batch of faults, during which the driver evicts the
//   least recently migrated page (not one the op uses) for each missing slot,
//   writing it back first when it holds data, then migrates the faulted
//   pages at the fault path's bandwidth.
// - After the op, on_op_end's decisions; at a free, on_free's (with the pages
//   the free left dead); at a mark, on_iteration's.
// Resident + arriving + leaving pages never exceed the budget; the simulator
// counts what a policy asked that could not be done (refused decisions,
// discards of live pages) instead of doing it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "access_stream.h"
#include "paging_policy.h"
#include "residency.h"
#include "transfer_model.h"

namespace zico::page {

struct IterationStats {
  uint64_t start_ns = 0;
  uint64_t end_ns = 0;
  uint64_t compute_ns = 0;  // sum of op durations
  uint64_t stall_ns = 0;    // time ops waited for pages
  uint64_t faults = 0;      // pages faulted in
  uint64_t h2d_bytes = 0;   // prefetched and faulted in
  uint64_t d2h_bytes = 0;   // written back
  [[nodiscard]] uint64_t elapsed_ns() const { return end_ns - start_ns; }
};

// A moment of the run, as the plot draws it.
struct Probe {
  uint64_t time_ns = 0;
  uint32_t resident_pages = 0;  // holding a slot: resident, arriving, leaving
};

struct PagingResult {
  std::string policy;
  std::vector<IterationStats> iterations;  // by iteration; the ops before the first mark count in 0
  uint64_t peak_resident_bytes = 0;
  uint64_t refused_prefetches = 0;  // no slot free or coming
  uint64_t refused_evictions = 0;   // the page was not resident, or in use by the running op
  uint64_t live_discards = 0;       // discards of pages with live data (refused): a policy bug
  // Transfers of the last iteration, for the plot: (start, end, bytes).
  struct Transfer {
    uint64_t start_ns = 0, end_ns = 0, bytes = 0;
    bool to_device = true;
  };
  std::vector<Transfer> last_iteration_transfers;
  std::vector<Probe> last_iteration_residency;  // after every event of the last iteration
};

struct PagingOptions {
  uint64_t budget_bytes = 0;
  prefetch::TransferModel model;
  bool record_last_iteration = false;
  // Called when an op starts running (every page it uses should then be
  // resident) and after every event, for tests; may be empty.
  std::function<void(const prefetch::Residency&, std::span<const prefetch::PageId> running_op)> check;
  // Wraps the policy before the run (a benchmark times its calls); may be empty.
  std::function<std::unique_ptr<prefetch::PagingPolicy>(std::unique_ptr<prefetch::PagingPolicy>)> wrap;
};

// Runs `stream` under the policy named `policy`. The stream must be valid
// (prefetch::stream_error empty) and its largest op must fit the budget;
// otherwise *error says why and false is returned.
[[nodiscard]] bool run_paging(const prefetch::AccessStream& stream, const std::string& policy,
                              const PagingOptions& options, PagingResult* out, std::string* error);

}  // namespace zico::page
