// JobModel: one training job's memory events from a trace, ready to be
// replayed for any number of iterations (by the simulator and by the demo's
// job processes).
//
// A trace holds a few iterations; a simulated job runs many. The model keeps
// three pieces: the prologue (events before the first iteration mark: the
// model's parameters, the first batch), the first iteration (it differs: the
// optimizer creates its state), and one steady iteration (the trace's last
// complete one) that repeats for every later iteration. Steady iterations of
// a training loop allocate the same sizes in the same order, so a block the
// template frees that was allocated in the iteration before is, on replay,
// the block allocated at the same position of the previous repetition.
// build_job_model() checks that this holds (the steady iteration's net bytes
// are zero and its cross-iteration frees line up); a trace for which it does
// not is refused with the reason.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "status.h"
#include "trace.h"

namespace zico::simulate {

struct ReplayEvent {
  enum class Kind : uint8_t { kAllocate, kFree };
  Kind kind = Kind::kAllocate;
  uint64_t offset_ns = 0;  // since the iteration began (prologue: since its first event)
  uint64_t block = 0;      // unique among live blocks over the whole replay
  uint64_t bytes = 0;      // the block's size (frees too)
};

struct JobModel {
  std::string name;               // the trace's meta `model`, else its file name
  uint64_t prologue_ns = 0;       // from the first event to the first iteration mark
  uint64_t first_period_ns = 0;   // iteration 0
  uint64_t steady_period_ns = 0;  // every later iteration
  double utilization = 1.0;       // busy fraction of a steady iteration (op time / period), in (0, 1]
  uint64_t persistent_bytes = 0;  // live at every steady iteration boundary
  uint64_t peak_bytes = 0;        // the most bytes live at once over a long replay

  // The event templates; use append_*_events() to replay them (the block
  // numbering inside is the implementation's).
  std::vector<ReplayEvent> prologue;
  std::vector<ReplayEvent> first;
  std::vector<ReplayEvent> steady;
};

// Builds the model. Errors (kInvalidArgument, *error names the trace and what
// is wrong): fewer than two iterations, a steady iteration that does not
// repeat (net bytes, sizes or frees do not line up).
[[nodiscard]] Status build_job_model(const trace::Trace& trace, JobModel* out, std::string* error);

// Appends iteration `n`'s events (0: the first iteration; the prologue is
// separate) with offsets from that iteration's start and block ids unique
// across the whole replay (prologue, then iterations 0, 1, 2, ... in order).
void append_iteration_events(const JobModel& model, uint32_t n, std::vector<ReplayEvent>* out);
void append_prologue_events(const JobModel& model, std::vector<ReplayEvent>* out);

}  // namespace zico::simulate
