// The fixed-offset bound: the lowest peak that a few jobs sharing one GPU can
// reach by shifting their steady iterations against each other, found by
// trying every offset. It is what the time-shift scheduler aims at, so the
// simulator reports it beside the scheduler's result.
//
// The schedule searched is periodic: cycle C is the longest steady period;
// job j runs its steady iteration (its curve, alone, in trace time) from
// offset o_j in every cycle and idles at its end-of-iteration level for the
// rest [P_j, C) of it. Job 0 sits at 0; the others take offsets on a grid of
// C / kOffsetSlots, every combination tried (3 jobs: 16,384). The summed
// curve is evaluated over one cycle on a grid of C / kEvalCells with each
// cell's maximum per job, so the peak reported is never below the true peak
// of that schedule (it may exceed it by what changes inside one cell).
//
// It bounds fixed-offset schedules only: it ignores the slowdown of sharing
// compute and any schedule that changes from one cycle to the next.
//
// Below that peak no such schedule fits the budget at the longest period.
// least_fitting_cycle() lengthens the cycle, every job idling longer at its
// end level between iterations, until one does: the best that one iteration
// per job per cycle at fixed offsets can do on that budget. It looks up to the
// summed periods (one job after another: a longer cycle would be slower than
// running them in sequence), and not at all when some job's peak and the
// others' least levels already exceed the budget: then no cycle fits, and the
// jobs can only take turns, moving memory off the GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "job_model.h"
#include "status.h"

namespace zico::simulate {

inline constexpr size_t kOffsetSlots = 128;
inline constexpr size_t kEvalCells = 1024;
inline constexpr size_t kMaxBoundJobs = 3;

// One job's demand over one iteration: (offset ns, bytes from then on),
// offsets not decreasing, the first at 0; a step followed by another at the
// same offset is held for an instant (and counts). After period_ns it stays
// at the last value (its end level).
struct PeriodicCurve {
  uint64_t period_ns = 0;
  std::vector<std::pair<uint64_t, uint64_t>> steps;
};

struct ExhaustiveBound {
  uint64_t cycle_ns = 0;
  uint64_t peak_bytes = 0;            // the best offsets' peak
  std::vector<uint64_t> offsets_ns;   // per job; job 0's is 0
  uint64_t aligned_peak_bytes = 0;    // every offset 0: the iterations start together
  uint64_t sum_of_peaks_bytes = 0;    // what reserving each job's peak costs
};

// The shortest cycle, in steps of the longest period / kStretchStepsPerPeriod.
inline constexpr uint64_t kStretchStepsPerPeriod = 200;

struct StretchedCycle {
  bool found = false;                // false: no cycle up to the summed periods fits
  uint64_t cycle_ns = 0;             // the shortest that fits
  uint64_t peak_bytes = 0;           // the peak there, within the budget
  std::vector<uint64_t> offsets_ns;  // per job; job 0's is 0
  // When some job's peak and the others' least levels exceed the budget: the
  // most by which they do, the memory that must leave the GPU at that job's
  // peak, every iteration, for it to run beside the others. 0 otherwise.
  uint64_t shortfall_bytes = 0;
};

// A job's steady curve in whole chunks (what the simulator's jobs hold): its
// need over steady iteration 1, from the bytes live at that iteration's start.
[[nodiscard]] PeriodicCurve steady_need_curve(const JobModel& model, uint64_t chunk_bytes);

// Errors (kInvalidArgument): no curve or more than kMaxBoundJobs, a period of
// 0, steps not starting at 0, going back in time or past the period.
[[nodiscard]] Status exhaustive_bound(const std::vector<PeriodicCurve>& curves, ExhaustiveBound* out,
                                      std::string* error);

// The shortest cycle at which fixed offsets keep the summed curves within
// budget_bytes (above); the same errors.
[[nodiscard]] Status least_fitting_cycle(const std::vector<PeriodicCurve>& curves, uint64_t budget_bytes,
                                         StretchedCycle* out, std::string* error);

}  // namespace zico::simulate
