#include "usage_tracker.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

namespace zico::sharing {
namespace {

// A token's key is what detection compares: the size, with the top bit set
// for a free. Exact, so two different tokens never match by accident.
constexpr uint64_t kFreeBit = uint64_t{1} << 63;
// A detection pass costs a few steps per token of its window (up to
// 2 * max_period_tokens); one starts at most every window / kChecksPerWindow
// tokens, and never more often than kMinCheckInterval.
constexpr uint64_t kMinCheckInterval = 1024;
constexpr uint64_t kChecksPerWindow = 8;
// A pass does at most this many steps (a prefix entry or a fallback in
// computing it, a token scanned or checked) inside any one on_allocate or
// on_free, and goes on in the next ones: a pass over a full window of 65536
// tokens takes 64 to 160 calls, a couple of us each, rather than stalling
// one call for its whole length (a tenth of a ms or more).
constexpr size_t kDetectStepsPerCall = 1024;
// Keys are copied for a pass this many at a time.
constexpr size_t kKeyRun = 256;
// Tokens are stored in chunks of this many; a chunk goes back to a spare list
// once nothing in it is needed, and is reused. Growing never copies tokens.
constexpr unsigned kChunkBits = 12;
constexpr uint64_t kChunkTokens = uint64_t{1} << kChunkBits;
// The prefix function is stored in 32 bits.
constexpr size_t kMaxPeriodLimit = size_t{1} << 30;
// A steady iteration gives back what it takes. A repeating stretch whose live
// bytes climb or fall per period by more than 1/kMaxNetChangeShare of their
// swing within it is a phase of something else: building a model of
// identical layers, a forward pass over them.
constexpr uint64_t kMaxNetChangeShare = 16;
// The outlook (remaining_peak_bytes) keeps at most this many steps of the
// last iteration; a longer one is kept in groups of tokens, each step the
// most live from its group's first token on.
constexpr size_t kOutlookSteps = 4096;
// Two iterations whose token counts differ by more than 1/kOutlookMismatchShare
// do different things: positions in one say nothing about the other.
constexpr uint64_t kOutlookMismatchShare = 50;

uint64_t sub_floor(uint64_t a, uint64_t b) { return a > b ? a - b : 0; }

// Folds one token key into a hash of a sequence of them (order matters):
// splitmix64's finalizer over the running value and the key.
uint64_t mix(uint64_t hash, uint64_t key) {
  uint64_t z = (hash ^ key) + 0x9e3779b97f4a7c15;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9;
  z = (z ^ (z >> 27)) * 0x94d049bb133111eb;
  return z ^ (z >> 31);
}

// One allocation or free, kept while detection or the current iteration may
// still need it; its key is kept apart (Chunk). Trivial on purpose: chunks
// are allocated uninitialized.
struct Token {
  uint64_t time_ns;
  uint64_t live_after;
  // The block's allocation, for a free (its own, for an allocation): a curve
  // built in hindsight, after detection, still needs to know which blocks
  // were born inside the iteration and how long they lived.
  uint64_t alloc_seq;
  uint64_t alloc_ns;
};

// Keys apart from the rest: a detection pass reads only keys, 8 B a token
// rather than a 40 B stride.
struct Chunk {
  uint64_t keys[kChunkTokens];
  Token tokens[kChunkTokens];
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

  // Token number s (of `seq` seen in all) is in chunks[s / kChunkTokens -
  // chunk_base] at s % kChunkTokens. Kept: the detection window
  // (2 * max_period_tokens), a pass in progress, and the iteration in
  // progress (at most max_iteration_tokens of it with marks), nothing older.
  std::vector<std::unique_ptr<Chunk>> chunks;
  std::vector<std::unique_ptr<Chunk>> spare;
  uint64_t chunk_base = 0;
  uint64_t seq = 0;

  // The iteration in progress: tokens from first_seq on, after it began at
  // start_ns holding start_live bytes.
  bool in_iteration = false;
  uint64_t first_seq = 0;
  uint64_t start_ns = 0;
  uint64_t start_live = 0;
  uint64_t iterations = 0;
  bool marks = false;
  // With marks: the iteration in progress passed max_iteration_tokens, and
  // its tokens from then on were not kept.
  bool dropped = false;

  // Detection (only while !marks). period == 0: no pattern known.
  size_t period = 0;
  uint64_t next_anchor_seq = 0;  // the token after which the next iteration starts
  uint64_t floor_seq = 0;        // a broken pattern's tokens stay out of the next search
  uint64_t next_check_seq = kMinCheckInterval;

  // A detection pass, spread over calls (kDetectStepsPerCall). It looks at
  // the window of `window` tokens before `snap` (seq when it started):
  //  - kPrefix: the prefix function of the window read backwards, and the
  //    smallest period `found` of its longest stretch repeating twice;
  //  - kScan: live bytes over the last period before snap: the net change
  //    and the trough (`anchor`);
  //  - kContinue: the tokens that came during the pass must go on repeating
  //    `found`; once they all do, the pattern is adopted.
  enum class Stage { kIdle, kPrefix, kScan, kContinue };
  Stage stage = Stage::kIdle;
  uint64_t snap = 0;
  size_t window = 0;
  size_t pass_i = 0;    // kPrefix: the next prefix entry
  uint32_t pass_k = 0;  // kPrefix: its candidate, mid-way through the fallback loop
  size_t filled = 0;    // kPrefix: keys copied so far
  size_t found = 0;
  uint64_t cursor = 0;  // kScan, kContinue: the next token
  uint64_t low = 0;
  uint64_t high = 0;
  uint64_t anchor = 0;
  uint64_t anchor_live = 0;
  // The window's keys, newest first, and its prefix function: allocated on
  // the first pass (uninitialized, 12 B per token of the largest window),
  // reused by every pass.
  std::unique_ptr<uint64_t[]> keys;
  std::unique_ptr<uint32_t[]> prefix;

  DemandCurve curve;
  // The outlook of the last complete iteration, per group of tokens:
  // outlook[i], the most bytes live from token i * group to its end (suffix
  // maxima, never rising); outlook_level[i], live just before that token.
  // Empty while no iteration completed or after a pattern broke.
  std::vector<uint64_t> outlook;
  std::vector<uint64_t> outlook_level;
  uint64_t outlook_group = 1;
  // outlook_hash[i]: the keys of the tokens in outlook step i, hashed.
  std::vector<uint64_t> outlook_hash;
  // Positions in the last iteration are worth trusting for the next one
  // (build_outlook): what a gate claims.
  bool outlook_trusted = false;
  uint64_t previous_tokens = 0;  // tokens of the last complete iteration
  // Complete iterations measured since the start or a pattern broke.
  uint64_t measured = 0;
  // With marks: the iteration in progress has made, step by step, the same
  // allocations and frees as the last one so far (check_alignment), so its
  // positions still mean what they meant there. Detected iterations repeat
  // token for token by construction (follow), so this stays true for them.
  bool aligned = true;
  uint64_t step_hash = 0;  // the keys of the step in progress so far
  // Live bytes when the iteration in progress reached the start of its
  // current outlook step: what to compare with outlook_level there.
  uint64_t step_start_live = 0;
  // The curve as of the last version bump: comparing with it rather than the
  // previous iteration's means a slow drift still bumps once it adds up.
  DemandCurve planned;
  uint64_t version = 0;

  explicit Impl(UsageTrackerOptions o) : options(o) {
    options.max_period_tokens = std::clamp<size_t>(options.max_period_tokens, 1, kMaxPeriodLimit);
    options.min_period_tokens = std::max<size_t>(options.min_period_tokens, 1);
    if (options.max_iteration_tokens == 0) options.max_iteration_tokens = 2 * options.max_period_tokens;
    blocks.reserve(1024);
  }

  Chunk& chunk_of(uint64_t s) { return *chunks[(s >> kChunkBits) - chunk_base]; }
  Token& at(uint64_t s) { return chunk_of(s).tokens[s & (kChunkTokens - 1)]; }
  uint64_t key(uint64_t s) { return chunk_of(s).keys[s & (kChunkTokens - 1)]; }

  // The oldest token anything may still read.
  uint64_t oldest_needed() const {
    if (marks) return in_iteration && !dropped ? first_seq : seq;
    uint64_t lo = sub_floor(seq, 2 * options.max_period_tokens);
    if (in_iteration) lo = std::min(lo, first_seq);
    if (stage != Stage::kIdle) lo = std::min(lo, snap - window);
    return lo;
  }

  // Stores token number `seq`. O(1): at a chunk boundary, chunks holding
  // nothing needed go to the spare list and one is taken from it.
  void store(uint64_t key, const Token& t) {
    const uint64_t chunk = seq >> kChunkBits;
    if (chunk >= chunk_base + chunks.size()) {
      const uint64_t keep = oldest_needed() >> kChunkBits;
      size_t drop = 0;
      while (drop < chunks.size() && chunk_base + drop < keep) spare.push_back(std::move(chunks[drop++]));
      chunks.erase(chunks.begin(), chunks.begin() + static_cast<std::ptrdiff_t>(drop));
      chunk_base = chunks.empty() ? chunk : chunk_base + drop;
      while (chunk_base + chunks.size() <= chunk) {
        if (spare.empty()) {
          chunks.push_back(std::make_unique_for_overwrite<Chunk>());
        } else {
          chunks.push_back(std::move(spare.back()));
          spare.pop_back();
        }
      }
    }
    Chunk& c = chunk_of(seq);
    c.keys[seq & (kChunkTokens - 1)] = key;
    c.tokens[seq & (kChunkTokens - 1)] = t;
  }

  void push(uint64_t key, uint64_t now_ns, uint64_t alloc_seq, uint64_t alloc_ns) {
    const uint64_t s = seq;
    if (in_iteration && (s - first_seq + 1) % outlook_group == 0) step_start_live = live;
    if (marks) {
      if (in_iteration) check_alignment(s - first_seq, key);
      // Marks that stop coming must not make the tracker keep everything.
      if (s - first_seq >= options.max_iteration_tokens) dropped = true;
      if (!dropped) store(key, {now_ns, live, alloc_seq, alloc_ns});
      ++seq;
      return;
    }
    store(key, {now_ns, live, alloc_seq, alloc_ns});
    ++seq;
    if (period > 0) {
      follow(s);
      return;
    }
    if (stage == Stage::kIdle && seq >= next_check_seq) start_pass();
    if (stage != Stage::kIdle) step(kDetectStepsPerCall);
  }

  void begin_iteration(uint64_t first, uint64_t now_ns, uint64_t live_then) {
    in_iteration = true;
    aligned = true;
    step_hash = 0;
    first_seq = first;
    start_ns = now_ns;
    start_live = live_then;
    step_start_live = live_then;
    ++iterations;
  }

  void publish(const DemandCurve& next) {
    curve = next;
    if (materially_different(planned, curve, options.change_tolerance)) {
      planned = curve;
      ++version;
    }
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
    build_outlook(end_seq);

    // Live at the peak and born in the iteration, then freed before it ended:
    // transient, or workspace if short-lived. Everything else live at the
    // peak crossed a boundary (born before, or still live at the end).
    const double workspace_ns = options.workspace_fraction * static_cast<double>(next.period_ns);
    for (uint64_t s = peak_end; s < end_seq; ++s) {
      const uint64_t k = key(s);
      const Token& t = at(s);
      if ((k & kFreeBit) == 0 || t.alloc_seq < first_seq || t.alloc_seq >= peak_end) continue;
      const uint64_t bytes = k & ~kFreeBit;
      if (static_cast<double>(sub_floor(t.time_ns, t.alloc_ns)) < workspace_ns) {
        next.workspace_bytes += bytes;
      } else {
        next.transient_bytes += bytes;
      }
    }
    next.persistent_bytes = peak - next.transient_bytes - next.workspace_bytes;
    publish(next);
  }

  // The suffix maxima of live bytes over the iteration that ends before
  // end_seq, at most kOutlookSteps of them (one per group of tokens).
  void build_outlook(uint64_t end_seq) {
    const uint64_t n = end_seq - first_seq;
    // Positions line up only between iterations that do the same thing. The
    // first one measured (optimizer state created, kernels tuned) usually
    // does not, so its outlook is never trusted, and it is no reference for
    // the second either: the second's is trusted on its own. A later one's
    // is trusted if it did what the one before did, step for step
    // (check_alignment), with about as many tokens. Either way the claims
    // made in the next iteration hold only while it stays aligned.
    const uint64_t slack = previous_tokens / kOutlookMismatchShare;
    const bool same_length = n + slack >= previous_tokens && n <= previous_tokens + slack;
    outlook_trusted = measured == 1 || (measured > 1 && aligned && same_length);
    previous_tokens = n;
    ++measured;
    outlook_group = std::max<uint64_t>(1, (n + kOutlookSteps - 1) / kOutlookSteps);
    const size_t steps = static_cast<size_t>((n + outlook_group - 1) / outlook_group);
    outlook.assign(steps, 0);
    outlook_level.assign(steps, 0);
    outlook_hash.assign(steps, 0);
    uint64_t most = 0;
    for (uint64_t i = n; i-- > 0;) {
      most = std::max(most, at(first_seq + i).live_after);
      const size_t step = static_cast<size_t>(i / outlook_group);
      outlook[step] = std::max(outlook[step], most);
      if (i % outlook_group == 0) outlook_level[step] = i == 0 ? start_live : at(first_seq + i - 1).live_after;
    }
    for (uint64_t i = 0; i < n; ++i) {
      uint64_t& hash = outlook_hash[static_cast<size_t>(i / outlook_group)];
      hash = mix(hash, key(first_seq + i));
    }
  }

  // Token `index` of the iteration in progress has key `key`: at the end of
  // each outlook step, are the step's keys the last iteration's there? One
  // step that differs ends the alignment for the rest of the iteration. Past
  // the last iteration's length nothing is compared (outlook_from gives its
  // end level there).
  void check_alignment(uint64_t index, uint64_t key) {
    if (!aligned || outlook.empty() || index >= previous_tokens) return;
    step_hash = mix(step_hash, key);
    if ((index + 1) % outlook_group != 0 && index + 1 != previous_tokens) return;
    if (step_hash != outlook_hash[static_cast<size_t>(index / outlook_group)]) aligned = false;
    step_hash = 0;
  }

  // The most live bytes expected from outlook step `step` on, `level` being
  // what this iteration had live where that step began. Running above the
  // last iteration there (optimizer state created at the end of the first
  // iteration, a bigger batch) is taken to last: the rest is expected that
  // much higher. The comparison is at the step's start, not with what is
  // live now: a step spans several tokens in long iterations, and the ones
  // already made within it are in outlook[step] already (compared with the
  // live bytes now, each allocation inside a step raised the outlook by its
  // size again: nasnetalarge's was 166 chunks above its own peak).
  uint64_t outlook_from(uint64_t step, uint64_t level) const {
    if (step >= outlook.size()) return std::max(curve.end_bytes, live);
    const uint64_t above = sub_floor(level, outlook_level[static_cast<size_t>(step)]);
    return std::max(outlook[static_cast<size_t>(step)] + above, live);
  }

  // With a pattern known: every token must repeat the one a period earlier.
  void follow(uint64_t s) {
    if (key(s) != key(s - period)) {
      // Training loops repeat exactly, so one differing token means the
      // program changed phase (evaluation, a new batch shape): start over
      // from here rather than measure iterations of a pattern that is gone.
      period = 0;
      in_iteration = false;
      outlook.clear();
      outlook_level.clear();
      previous_tokens = 0;
      measured = 0;
      floor_seq = s;
      next_check_seq = s + kMinCheckInterval;
      return;
    }
    if (s != next_anchor_seq) return;
    const Token& t = at(s);
    finish_iteration(s + 1, t.time_ns);
    begin_iteration(s + 1, t.time_ns, t.live_after);
    next_anchor_seq += period;
  }

  // Starts a pass over the newest tokens: the smallest period of the longest
  // recent stretch that repeats it at least twice.
  void start_pass() {
    const uint64_t from = std::max(floor_seq, sub_floor(seq, 2 * options.max_period_tokens));
    const size_t w = seq - from;
    next_check_seq = seq + std::max(kMinCheckInterval, w / kChecksPerWindow);
    if (w < 2 * options.min_period_tokens) return;
    if (!keys) {
      keys = std::make_unique_for_overwrite<uint64_t[]>(2 * options.max_period_tokens);
      prefix = std::make_unique_for_overwrite<uint32_t[]>(2 * options.max_period_tokens);
    }
    stage = Stage::kPrefix;
    snap = seq;
    window = w;
    // Keys are copied a run at a time as the pass gets to them.
    filled = 0;
    while (filled < 2) fill_keys();
    prefix[0] = 0;
    pass_i = 1;
    pass_k = 0;
    found = 0;
  }

  // Copies the keys of the next few tokens of the window (older and older),
  // up to the start of their chunk.
  void fill_keys() {
    const uint64_t s = snap - 1 - filled;
    const uint64_t* k = &chunk_of(s).keys[s & (kChunkTokens - 1)];
    const size_t run = std::min<size_t>({window - filled, kKeyRun, (s & (kChunkTokens - 1)) + 1});
    for (size_t j = 0; j < run; ++j) keys[filled + j] = *(k - j);
    filled += run;
  }

  // The prefix function of the window read backwards from its newest token:
  // n - prefix[n - 1] is the smallest period of the newest n tokens, for
  // every n at once. The longest stretch repeating twice wins over shorter
  // ones: a loop inside an iteration (layers, micro-batches) repeats too, but
  // only over part of it. Requiring the stretch to cover half the window
  // keeps such a loop from being taken for the iteration before two whole
  // iterations exist. Goes on for at most `budget` steps; returns what is
  // left of it.
  size_t prefix_steps(size_t budget) {
    uint64_t* const key_of = keys.get();
    uint32_t* const pf = prefix.get();
    const size_t w = window;
    size_t i = pass_i;
    uint32_t k = pass_k;  // prefix[i]'s candidate, maybe mid-way through falling back
    size_t best = found;
    while (i < w && budget > 0) {
      if (i == filled) fill_keys();
      for (const size_t end = filled; i < end && budget > 0;) {
        const uint64_t key = key_of[i];
        while (k > 0 && key != key_of[k] && --budget > 0) k = pf[k - 1];
        if (budget == 0) break;  // k is where the fallback got to
        if (key == key_of[k]) ++k;
        pf[i] = k;
        const size_t n = i + 1;
        if (2 * n >= w && n >= 2 * (n - k)) best = n - k;
        ++i;  // prefix[i]'s first candidate is prefix[i - 1]: k already
        --budget;
      }
    }
    pass_i = i;
    pass_k = k;
    found = best;
    return budget;
  }

  // Goes on with the pass for at most `budget` steps.
  void step(size_t budget) {
    if (stage == Stage::kPrefix) {
      budget = prefix_steps(budget);
      if (pass_i < window) return;
      if (found < options.min_period_tokens || found > options.max_period_tokens) {
        stage = Stage::kIdle;
        return;
      }
      stage = Stage::kScan;
      cursor = snap - found;
      low = high = at(snap - 1 - found).live_after;
      anchor = cursor;
      anchor_live = at(anchor).live_after;
      if (budget == 0) return;
    }
    if (stage == Stage::kScan) {
      // Phase 0 is the trough of the last period: the least live bytes after
      // a token, earliest on a tie.
      while (cursor < snap && budget > 0) {
        const Token* t = &at(cursor);
        const size_t run = std::min<size_t>({snap - cursor, budget, kChunkTokens - (cursor & (kChunkTokens - 1))});
        for (size_t j = 0; j < run; ++j) {
          const uint64_t l = t[j].live_after;
          low = std::min(low, l);
          high = std::max(high, l);
          if (l < anchor_live) {
            anchor = cursor + j;
            anchor_live = l;
          }
        }
        cursor += run;
        budget -= run;
      }
      if (cursor < snap) return;
      // Live bytes must come back after a period (kMaxNetChangeShare).
      const uint64_t before = at(snap - 1 - found).live_after;
      const uint64_t after = at(snap - 1).live_after;
      const uint64_t net = before > after ? before - after : after - before;
      if (net > (high - low) / kMaxNetChangeShare) {
        stage = Stage::kIdle;
        return;
      }
      stage = Stage::kContinue;
      cursor = snap;
    }
    // stage == kContinue: tokens that came during the pass.
    for (; cursor < seq && budget > 0; ++cursor, --budget) {
      if (key(cursor) != key(cursor - found)) {
        stage = Stage::kIdle;
        return;
      }
    }
    if (cursor == seq) adopt();
  }

  // The pattern holds up to the newest token: its latest anchor is the
  // trough's phase, `found` apart. The stretch holds two periods, so the
  // anchor before it and the whole iteration after that are still kept:
  // measure it now rather than wait a full period for the first curve.
  void adopt() {
    stage = Stage::kIdle;
    period = found;
    const uint64_t a = anchor + (seq - 1 - anchor) / period * period;
    const Token& previous = at(a - period);
    begin_iteration(a - period + 1, previous.time_ns, previous.live_after);
    finish_iteration(a + 1, at(a).time_ns);
    begin_iteration(a + 1, at(a).time_ns, at(a).live_after);
    next_anchor_seq = a + period;
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
    m.outlook.clear();  // positions counted from detected anchors, not marks
    m.outlook_level.clear();
    m.previous_tokens = 0;
    m.measured = 0;
    m.stage = Impl::Stage::kIdle;
    m.keys.reset();
    m.prefix.reset();
    m.chunks.clear();
    m.spare.clear();
  } else if (m.dropped) {
    // Too long to measure: plans made on an earlier curve no longer hold.
    m.publish(DemandCurve{});
    m.outlook.clear();
    m.outlook_level.clear();
    m.previous_tokens = 0;
    m.measured = 0;
  } else if (m.in_iteration) {
    m.finish_iteration(m.seq, now_ns);
  }
  m.dropped = false;
  m.begin_iteration(m.seq, now_ns, m.live);
}

const DemandCurve& UsageTracker::curve() const { return impl_->curve; }
uint64_t UsageTracker::curve_version() const { return impl_->version; }
uint64_t UsageTracker::iterations() const { return impl_->iterations; }
uint64_t UsageTracker::iteration_start_ns() const { return impl_->start_ns; }
bool UsageTracker::explicit_marks() const { return impl_->marks; }
size_t UsageTracker::detected_period_tokens() const { return impl_->period; }
uint64_t UsageTracker::live_bytes() const { return impl_->live; }

uint64_t UsageTracker::remaining_peak_bytes() const {
  const Impl& m = *impl_;
  if (!m.curve.known() || !m.in_iteration || m.outlook.empty() || !m.outlook_trusted || !m.aligned) return 0;
  // Tokens of this iteration so far, i.e. the position of the next one.
  return m.outlook_from((m.seq - m.first_seq) / m.outlook_group, m.step_start_live);
}

uint64_t UsageTracker::next_iteration_peak_bytes() const {
  const Impl& m = *impl_;
  if (!m.curve.known() || m.outlook.empty() || !m.outlook_trusted) return 0;
  return m.outlook_from(0, m.live);
}
uint64_t UsageTracker::ignored_frees() const { return impl_->ignored; }
size_t UsageTracker::buffered_tokens() const {
  return (impl_->chunks.size() + impl_->spare.size()) * kChunkTokens;
}

}  // namespace zico::sharing
