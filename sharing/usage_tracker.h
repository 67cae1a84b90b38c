// UsageTracker: learns one job's memory pattern from its allocation stream.
//
// Input is what an allocator sees: blocks allocated and freed, in time order,
// and, when the program gives them, explicit iteration marks
// (zico_mark_iteration, zicoum.torch's step hook, a trace's `i` records).
// Output is the job's DemandCurve over its last complete iteration and the
// start time of the iteration it is in now.
//
// Iterations come from the marks when there are any (the first mark switches
// detection off for good). Without marks the tracker finds the period itself:
// each allocation or free is a token (kind and size); a training loop repeats
// the same token sequence every iteration, so the smallest period of the most
// recent tokens (prefix function, at least two full repeats seen) is the
// iteration length in tokens. The repeating stretch must cover at least half
// of the tokens looked at, and live bytes must come back to (nearly) where
// they were after each period: loops inside an iteration (identical layers
// being built or run forward) repeat too, but only grow or only shrink. The
// phase anchor is the token at which live bytes are lowest within the period
// (the trough between a backward pass and the next forward pass). A token
// that breaks the learned pattern drops it; detection starts again on the
// new stream, from that token on.
//
// Time is whatever clock the caller uses, in ns, never decreasing: the
// virtual clock in the simulator, the GPU-progress clock in a job.
//
// Not thread-safe: one tracker per (job, device), driven by one thread or
// under the caller's lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "demand_curve.h"

namespace zico::sharing {

struct UsageTrackerOptions {
  // Longest iteration, in tokens, that detection looks for. Memory use is a
  // few times this many tokens.
  size_t max_period_tokens = 32768;
  // Shortest pattern accepted as an iteration (shorter repeats are loops
  // inside one iteration).
  size_t min_period_tokens = 8;
  // Transient blocks living less than this fraction of the period are
  // workspace.
  double workspace_fraction = 0.01;
  // curve_version() moves only when the curve changes by more than this
  // (materially_different()).
  double change_tolerance = 0.05;
};

class UsageTracker {
 public:
  explicit UsageTracker(UsageTrackerOptions options = {});
  ~UsageTracker();
  UsageTracker(UsageTracker&&) noexcept;
  UsageTracker& operator=(UsageTracker&&) noexcept;

  // `block` is any id unique among live blocks (an address, a trace id).
  // An id already live is treated as freed and allocated again.
  void on_allocate(uint64_t block, uint64_t bytes, uint64_t now_ns);
  // Unknown ids are ignored (counted in ignored_frees()).
  void on_free(uint64_t block, uint64_t now_ns);
  // The program says an iteration starts now.
  void on_iteration(uint64_t now_ns);

  // The last complete iteration's curve, always the latest one (small
  // changes included); !known() until one completed. When detection finds a
  // period it measures the iteration just before in hindsight, so a curve is
  // known from that moment on.
  [[nodiscard]] const DemandCurve& curve() const;
  // Starts at 0, moves by one each time curve() changes materially (a
  // re-plan trigger); a first known curve counts as a change. Each new curve
  // is compared with the one that last moved the version, not with the one
  // just before it, so a slow drift still moves it once it adds up.
  [[nodiscard]] uint64_t curve_version() const;
  // Iteration starts seen (marks, or detected anchors once a period is
  // known; a detection counts two: the start of the iteration it measured in
  // hindsight and of the one in progress). Stands still while no pattern is
  // known.
  [[nodiscard]] uint64_t iterations() const;
  // When the current iteration began (its mark, or the time of its anchor
  // token); meaningful once iterations() > 0. After a pattern breaks it keeps
  // the last start until a new one is found.
  [[nodiscard]] uint64_t iteration_start_ns() const;
  [[nodiscard]] bool explicit_marks() const;
  // The detected period in tokens, 0 when none is known (or marks are used).
  [[nodiscard]] size_t detected_period_tokens() const;
  [[nodiscard]] uint64_t live_bytes() const;
  [[nodiscard]] uint64_t ignored_frees() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zico::sharing
