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
// Iteration boundaries and the caller's gates: iterations() moves inside the
// on_allocate or on_free call that completes the boundary, whichever kind it
// is. With marks that is on_iteration. Without marks it is the anchor token
// itself, or the token on which a detection pass finishes (the boundaries it
// finds then lie a little in the past: iteration_start_ns() says when). The
// trough a detected iteration starts at follows a free almost always, so
// boundaries are mostly seen in on_free. A caller that gates iterations at
// allocations (holds an allocation until the scheduler lets the iteration
// start) compares iterations() with the value it last saw, and passes its
// gate at the next allocation.
//
// Cost per call: O(1) amortized. A detection pass (a few steps per token of
// its window, up to 2 * max_period_tokens, every window / 8 tokens) is spread
// over the calls after it starts, about a thousand steps (a few us) in any
// one call; a window of 65536 tokens takes 64 to 160 calls. What is left costs
// O(tokens of one iteration), once per iteration: building its curve, at the
// boundary (an anchor, an adopted pattern, or a mark).
//
// Memory: the tokens kept, 40 B each, in chunks of 4096 that are reused and
// never copied: without marks the detection window (2 * max_period_tokens;
// the iteration in progress lies inside it), plus 12 B per window token for
// detection; with marks the iteration in progress, up to
// max_iteration_tokens of it. A marked iteration longer than that (marks
// that stopped coming, or come too rarely) keeps no more tokens; when its
// mark finally comes the curve becomes unknown (period 0), which moves the
// version if the curve before was known, so plans made on it go. The next
// iteration that fits is measured again. (Without the cap one mark followed
// by 40M events kept 1.5 GB.) Plus the last iteration's outlook: three 8 B
// values per step (most live ahead, level, hashed keys), at most 4096 steps.
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
  // Longest iteration, in tokens, that detection looks for. Without marks
  // twice this many tokens are kept (52 B each, see Memory above).
  size_t max_period_tokens = 32768;
  // With marks: the most tokens of one iteration kept to build its curve;
  // a longer iteration publishes an unknown curve. 0: 2 * max_period_tokens.
  size_t max_iteration_tokens = 0;
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
  // known. Moves during the call whose token completes a boundary, an
  // on_free as often as not (see the top of this file).
  [[nodiscard]] uint64_t iterations() const;
  // When the current iteration began (its mark, or the time of its anchor
  // token); meaningful once iterations() > 0. After a pattern breaks it keeps
  // the last start until a new one is found.
  [[nodiscard]] uint64_t iteration_start_ns() const;
  [[nodiscard]] bool explicit_marks() const;
  // The detected period in tokens, 0 when none is known (or marks are used).
  [[nodiscard]] size_t detected_period_tokens() const;
  [[nodiscard]] uint64_t live_bytes() const;
  // The most bytes the job is expected to hold from now until its current
  // iteration ends: the last complete iteration's live bytes from the same
  // position on, positions counted in allocations and frees since the
  // iteration began (the k-th token now is taken for the k-th then). Time
  // plays no part, so a job slowed down by its neighbours, or stalled, is
  // predicted as well as one running alone. Past the last iteration's length
  // it is that iteration's end level. Never below live_bytes(); 0 when
  // unknown: no curve yet, no iteration in progress, a pattern that broke,
  // an untrusted last iteration, or a current one that has stopped doing
  // what the last one did. Trust: the first iteration measured is never
  // trusted (a training loop's first iteration creates optimizer state,
  // tunes kernels); the second is, on its own; a later one if it made the
  // same allocations and frees (kind and size) as the one before, position
  // by position, and has as many tokens within 2 %. And the current
  // iteration must keep making the same ones as the last, checked at the end
  // of each outlook step (one token up to 4096-token iterations, a few
  // beyond): the first step that differs makes this unknown for the rest of
  // the iteration. So it is known from the third iteration on, for a loop
  // that repeats itself; never, for one whose sizes change every iteration.
  // What the ledger's deadlock avoidance counts on (ledger.h, claims).
  [[nodiscard]] uint64_t remaining_peak_bytes() const;
  // The same for an iteration that would start now (at an iteration gate,
  // once on_iteration closed the last one): the last iteration's peak,
  // raised by what is live now above what was live when it began. 0 when no
  // curve is known or the last iteration is not trusted (above).
  [[nodiscard]] uint64_t next_iteration_peak_bytes() const;
  [[nodiscard]] uint64_t ignored_frees() const;
  // Token slots held now, spare ones included (40 B each): never more than
  // the tokens kept (see Memory above) in chunks of 4096, plus two chunks,
  // whatever the stream.
  [[nodiscard]] size_t buffered_tokens() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zico::sharing
