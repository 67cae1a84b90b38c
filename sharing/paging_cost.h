// PagingCost: what it costs a job in Unified Memory mode (ZICO_MODE=um) to
// run an iteration with its GPU-resident bytes capped below its demand.
//
// A UM job's memory can leave the GPU while it runs: its pager evicts what
// the next ops do not use and prefetches it back before they do
// (prefetch/zico_policy.h). So the time-shift scheduler has a second way to
// make a job fit beside the others: instead of delaying its start, cap its
// resident bytes and let it run slower. This is how much slower: the
// iteration's time at a cap over its time in memory (the "stretch"), at a
// few caps, measured by running the job's own access stream through the
// paging simulator (tools/page) under the planner it would run live.
//
// Below `floor_bytes` the job cannot run at all (its largest op's pages must
// be resident at once). Between the points the stretch is interpolated
// linearly; at or above the last point it is that point's (measured at every
// page the job touches, where it pages nothing: 1).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zico::sharing {

struct PagingCost {
  struct Point {
    uint64_t cap_bytes = 0;
    double stretch = 1.0;  // iteration time at this cap / in memory, >= 1
  };
  uint64_t floor_bytes = 0;   // the least cap the job can run at
  std::vector<Point> points;  // caps increasing, each >= floor_bytes; stretch not increasing

  [[nodiscard]] bool known() const { return !points.empty(); }
  // The stretch at `cap_bytes` (>= floor_bytes); 1 without points.
  [[nodiscard]] double stretch_at(uint64_t cap_bytes) const;
  // The least cap at which the job runs at most `stretch` times its time in
  // memory (the last point's cap if none does).
  [[nodiscard]] uint64_t least_cap_within(double stretch) const;
  // Empty when the points are usable; otherwise says which is not and why.
  [[nodiscard]] std::string invalid() const;
};

// What a UM job pages out at its gate (Ledger::set_gate_paging): what its
// link to the host moves in one of its iterations, so that each way (out
// while it waits, back in before it starts) takes at most an iteration. 0
// for an unknown link or period.
[[nodiscard]] uint64_t gate_paging_bytes(double link_bytes_per_second, uint64_t period_ns);

}  // namespace zico::sharing
