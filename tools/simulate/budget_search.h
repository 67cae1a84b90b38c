// The least budget at which zico keeps a set of jobs at a given share of
// their unlimited throughput: the figure a platform engineer needs before
// `zico-umctl budget set`, and the honest answer to "how close to the
// exhaustive bound's peak does zico get?" (zico fills whatever budget it is
// given, so its peak is the budget; the question is how low that can go).
//
// The search runs the simulator: `unlimited` once for the baseline, then
// zico between the largest job's own peak (below it that job cannot run) and
// the peak `unlimited` reached (where no job waits for memory): upwards on a
// grid of 16 steps until a budget meets the target, then by bisection
// between it and the step below, to `resolution`. A budget meets the target
// when zico keeps it, no job fails and zico's aggregate iterations per
// second are at least `target` times unlimited's. Throughput is not
// monotone in the budget, so the answer is a budget that meets the target
// with one a resolution step below it that does not, not a proof that no
// lower budget does; every trial is reported. Cost: one simulation per
// trial, at most 17 + log2(1 / (16 * resolution)) of them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "job_model.h"
#include "simulator.h"
#include "status.h"

namespace zico::simulate {

struct BudgetTrial {
  uint64_t budget_bytes = 0;
  double vs_unlimited = 0;  // zico's aggregate iterations/s over unlimited's
  bool met = false;         // kept, none failed, vs_unlimited >= target
  uint64_t peak_bytes = 0;
  uint64_t yields = 0;
  uint64_t failed_jobs = 0;
  bool budget_exceeded = false;
};

struct BudgetSearch {
  double target = 0;
  bool found = false;                 // some budget tried met the target
  uint64_t budget_bytes = 0;          // the least budget tried that met it
  uint64_t resolution_bytes = 0;      // the search stopped at this spacing
  uint64_t largest_job_peak_bytes = 0;
  SimulationResult unlimited;
  SimulationResult zico;              // the run at budget_bytes (found only)
  std::vector<BudgetTrial> trials;    // in the order tried
};

// `options` gives iterations, utilization, bandwidth and chunk; its policy
// and budget are ignored. `target` in (0, 1], `resolution` (a fraction of
// unlimited's peak) in (0, 0.5]. Errors (kInvalidArgument): those out of
// range, and whatever simulate() refuses.
[[nodiscard]] Status least_budget(const std::vector<JobModel>& jobs, const SimulationOptions& options, double target,
                                  double resolution, BudgetSearch* out, std::string* error);

}  // namespace zico::simulate
