#include "usage_tracker.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace zico::sharing {
namespace {

// A token's key is what detection compares: the size, with the top bit set
// for a free. Exact, so two different tokens never match by accident.
constexpr uint64_t kFreeBit = uint64_t{1} << 63;
// A detection pass costs the window's length; running it at most every
// window / kChecksPerWindow tokens (and never more often than
// kMinCheckInterval) keeps it a few comparisons per token.
constexpr uint64_t kMinCheckInterval = 1024;
constexpr uint64_t kChecksPerWindow = 8;
// The token buffer grows by at least this much between compactions.
constexpr size_t kMinSlack = 4096;
// The prefix function is stored in 32 bits.
constexpr size_t kMaxPeriodLimit = size_t{1} << 30;
// A steady iteration gives back what it takes. A repeating stretch whose live
// bytes climb or fall per period by more than 1/kMaxNetChangeShare of their
// swing within it is a phase of something else: building a model of
// identical layers, a forward pass over them.
constexpr uint64_t kMaxNetChangeShare = 16;

uint64_t sub_floor(uint64_t a, uint64_t b) { return a > b ? a - b : 0; }

// One allocation or free, kept while detection or the current iteration may
// still need it.
struct Token {
  uint64_t key = 0;
  uint64_t time_ns = 0;
  uint64_t live_after = 0;
  // The block's allocation, for a free (its own, for an allocation): a curve
  // built in hindsight, after detection, still needs to know which blocks
  // were born inside the iteration and how long they lived.
  uint64_t alloc_seq = 0;
  uint64_t alloc_ns = 0;
};

struct Block {
  uint64_t bytes = 0;
  uint64_t alloc_ns = 0;
  uint64_t alloc_seq = 0;
};

}  // namespace

struct UsageTracker::Impl {
  UsageTrackerOptions options;
  std::unordered_map<uint64_t, Block> blocks;
  uint64_t live = 0;
  uint64_t ignored = 0;

  // tokens[i] is token number base_seq + i; `seq` tokens were seen in all.
  // Kept: the detection window (2 * max_period_tokens) and the iteration in
  // progress, nothing older.
  std::vector<Token> tokens;
  uint64_t base_seq = 0;
  uint64_t seq = 0;
  size_t compact_at = kMinSlack;

  // The iteration in progress: tokens from first_seq on, after it began at
  // start_ns holding start_live bytes.
  bool in_iteration = false;
  uint64_t first_seq = 0;
  uint64_t start_ns = 0;
  uint64_t start_live = 0;
  uint64_t iterations = 0;
  bool marks = false;

  // Detection (only while !marks). period == 0: no pattern known.
  size_t period = 0;
  uint64_t next_anchor_seq = 0;  // the token after which the next iteration starts
  uint64_t floor_seq = 0;        // a broken pattern's tokens stay out of the next search
  uint64_t next_check_seq = kMinCheckInterval;
  std::vector<uint32_t> prefix;  // reused by every detection pass

  DemandCurve curve;
  // The curve as of the last version bump: comparing with it rather than the
  // previous iteration's means a slow drift still bumps once it adds up.
  DemandCurve planned;
  uint64_t version = 0;

  explicit Impl(UsageTrackerOptions o) : options(o) {
    options.max_period_tokens = std::clamp<size_t>(options.max_period_tokens, 1, kMaxPeriodLimit);
    options.min_period_tokens = std::max<size_t>(options.min_period_tokens, 1);
    blocks.reserve(1024);
  }

  const Token& at(uint64_t s) const { return tokens[s - base_seq]; }

  void push(uint64_t key, uint64_t now_ns, uint64_t alloc_seq, uint64_t alloc_ns) {
    if (tokens.size() >= compact_at) compact();
    tokens.push_back({key, now_ns, live, alloc_seq, alloc_ns});
    const uint64_t s = seq++;
    if (marks) return;
    if (period > 0) {
      follow(s);
    } else if (seq >= next_check_seq) {
      detect();
    }
  }

  // Drops the tokens nobody can need any more. Amortized O(1) per token: the
  // buffer grows by half its kept size before the next compaction.
  void compact() {
    uint64_t keep = seq;
    if (in_iteration) keep = std::min(keep, first_seq);
    if (!marks) keep = std::min(keep, sub_floor(seq, 2 * options.max_period_tokens));
    keep = std::max(keep, base_seq);
    tokens.erase(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(keep - base_seq));
    base_seq = keep;
    compact_at = tokens.size() + std::max(kMinSlack, tokens.size() / 2);
  }

  void begin_iteration(uint64_t first, uint64_t now_ns, uint64_t live_then) {
    in_iteration = true;
    first_seq = first;
    start_ns = now_ns;
    start_live = live_then;
    ++iterations;
  }

  // Builds the curve of the iteration in progress from its tokens before
  // end_seq, ended at end_ns, and publishes it.
  void finish_iteration(uint64_t end_seq, uint64_t end_ns) {
    DemandCurve next;
    // A zero-length iteration (every event at one instant) still has a shape;
    // one ns keeps it known() rather than dropping it.
    next.period_ns = std::max<uint64_t>(1, sub_floor(end_ns, start_ns));
    uint64_t current = start_live;
    uint64_t peak = start_live;
    uint64_t peak_end = first_seq;  // tokens before this one are applied at the peak
    size_t bin = 0;
    next.bins[0] = current;
    for (uint64_t s = first_seq; s < end_seq; ++s) {
      const Token& t = at(s);
      const size_t to = next.bin_of(sub_floor(t.time_ns, start_ns));
      // Each bin entered starts at the level carried into it.
      while (bin < to) next.bins[++bin] = current;
      current = t.live_after;
      next.bins[bin] = std::max(next.bins[bin], current);
      if (current > peak) {
        peak = current;
        peak_end = s + 1;
      }
    }
    while (bin < kDemandBins - 1) next.bins[++bin] = current;
    next.end_bytes = current;

    // Live at the peak and born in the iteration, then freed before it ended:
    // transient, or workspace if short-lived. Everything else live at the
    // peak crossed a boundary (born before, or still live at the end).
    const double workspace_ns = options.workspace_fraction * static_cast<double>(next.period_ns);
    for (uint64_t s = peak_end; s < end_seq; ++s) {
      const Token& t = at(s);
      if ((t.key & kFreeBit) == 0 || t.alloc_seq < first_seq || t.alloc_seq >= peak_end) continue;
      const uint64_t bytes = t.key & ~kFreeBit;
      if (static_cast<double>(sub_floor(t.time_ns, t.alloc_ns)) < workspace_ns) {
        next.workspace_bytes += bytes;
      } else {
        next.transient_bytes += bytes;
      }
    }
    next.persistent_bytes = peak - next.transient_bytes - next.workspace_bytes;

    curve = next;
    if (materially_different(planned, curve, options.change_tolerance)) {
      planned = curve;
      ++version;
    }
  }

  // With a pattern known: every token must repeat the one a period earlier.
  void follow(uint64_t s) {
    const Token& t = at(s);
    if (t.key != at(s - period).key) {
      // Training loops repeat exactly, so one differing token means the
      // program changed phase (evaluation, a new batch shape): start over
      // from here rather than measure iterations of a pattern that is gone.
      period = 0;
      in_iteration = false;
      floor_seq = s;
      next_check_seq = s + kMinCheckInterval;
      return;
    }
    if (s != next_anchor_seq) return;
    finish_iteration(s + 1, t.time_ns);
    begin_iteration(s + 1, t.time_ns, t.live_after);
    next_anchor_seq += period;
  }

  // Looks for the smallest period of the longest recent stretch that repeats
  // it at least twice; on success measures the last whole iteration in
  // hindsight and follows the pattern from then on.
  void detect() {
    const uint64_t from = std::max({base_seq, floor_seq, sub_floor(seq, 2 * options.max_period_tokens)});
    const size_t w = seq - from;
    next_check_seq = seq + std::max(kMinCheckInterval, w / kChecksPerWindow);
    if (w < 2 * options.min_period_tokens) return;

    // The prefix function of the window read backwards from the newest token:
    // prefix[n - 1] gives the smallest period, n - prefix[n - 1], of the
    // newest n tokens, for every n at once.
    const Token* newest = &tokens[seq - 1 - base_seq];
    auto key = [newest](size_t i) { return (newest - i)->key; };
    prefix.resize(w);
    prefix[0] = 0;
    for (size_t i = 1; i < w; ++i) {
      uint32_t k = prefix[i - 1];
      while (k > 0 && key(i) != key(k)) k = prefix[k - 1];
      if (key(i) == key(k)) ++k;
      prefix[i] = k;
    }

    // The longest repeating stretch wins over shorter ones: a loop inside an
    // iteration (layers, micro-batches) repeats too, but only over part of
    // it. Requiring the stretch to cover half the window keeps such a loop
    // from being taken for the iteration before two whole iterations exist.
    size_t p = 0;
    for (size_t n = w; 2 * n >= w && n > 0; --n) {
      const size_t smallest = n - prefix[n - 1];
      if (n >= 2 * smallest) {
        p = smallest;
        break;
      }
    }
    if (p < options.min_period_tokens || p > options.max_period_tokens) return;
    // Live bytes must come back after a period (kMaxNetChangeShare).
    const uint64_t before = at(seq - 1 - p).live_after;
    const uint64_t after = at(seq - 1).live_after;
    uint64_t low = before;
    uint64_t high = before;
    for (uint64_t s = seq - p; s < seq; ++s) {
      low = std::min(low, at(s).live_after);
      high = std::max(high, at(s).live_after);
    }
    const uint64_t net = before > after ? before - after : after - before;
    if (net > (high - low) / kMaxNetChangeShare) return;

    // Phase 0 is the trough of the last period: the least live bytes after a
    // token, earliest on a tie.
    uint64_t anchor = seq - p;
    for (uint64_t s = anchor + 1; s < seq; ++s) {
      if (at(s).live_after < at(anchor).live_after) anchor = s;
    }
    // The stretch holds two periods, so the previous anchor and the whole
    // iteration after it are still buffered: measure it now rather than wait
    // a full period for the first curve.
    period = p;
    const Token& previous = at(anchor - p);
    begin_iteration(anchor - p + 1, previous.time_ns, previous.live_after);
    finish_iteration(anchor + 1, at(anchor).time_ns);
    begin_iteration(anchor + 1, at(anchor).time_ns, at(anchor).live_after);
    next_anchor_seq = anchor + p;
  }

  void free_block(const Block& b, uint64_t now_ns) {
    live -= b.bytes;
    push(kFreeBit | b.bytes, now_ns, b.alloc_seq, b.alloc_ns);
  }
};

UsageTracker::UsageTracker(UsageTrackerOptions options) : impl_(std::make_unique<Impl>(options)) {}
UsageTracker::~UsageTracker() = default;
UsageTracker::UsageTracker(UsageTracker&&) noexcept = default;
UsageTracker& UsageTracker::operator=(UsageTracker&&) noexcept = default;

void UsageTracker::on_allocate(uint64_t block, uint64_t bytes, uint64_t now_ns) {
  Impl& m = *impl_;
  bytes &= ~kFreeBit;
  auto [it, inserted] = m.blocks.try_emplace(block);
  if (!inserted) m.free_block(it->second, now_ns);
  it->second = {bytes, now_ns, m.seq};
  m.live += bytes;
  m.push(bytes, now_ns, m.seq, now_ns);
}

void UsageTracker::on_free(uint64_t block, uint64_t now_ns) {
  Impl& m = *impl_;
  auto it = m.blocks.find(block);
  if (it == m.blocks.end()) {
    ++m.ignored;
    return;
  }
  const Block b = it->second;
  m.blocks.erase(it);
  m.free_block(b, now_ns);
}

void UsageTracker::on_iteration(uint64_t now_ns) {
  Impl& m = *impl_;
  if (!m.marks) {
    // The program knows its iterations better than any guess: whatever was
    // detected goes, and detection never runs again.
    m.marks = true;
    m.period = 0;
    m.in_iteration = false;
    m.prefix = {};
  } else if (m.in_iteration) {
    m.finish_iteration(m.seq, now_ns);
  }
  m.tokens.clear();
  m.base_seq = m.seq;
  m.begin_iteration(m.seq, now_ns, m.live);
}

const DemandCurve& UsageTracker::curve() const { return impl_->curve; }
uint64_t UsageTracker::curve_version() const { return impl_->version; }
uint64_t UsageTracker::iterations() const { return impl_->iterations; }
uint64_t UsageTracker::iteration_start_ns() const { return impl_->start_ns; }
bool UsageTracker::explicit_marks() const { return impl_->marks; }
size_t UsageTracker::detected_period_tokens() const { return impl_->period; }
uint64_t UsageTracker::live_bytes() const { return impl_->live; }
uint64_t UsageTracker::ignored_frees() const { return impl_->ignored; }

}  // namespace zico::sharing
