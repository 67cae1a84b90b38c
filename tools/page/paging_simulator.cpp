#include "paging_simulator.h"

#include <algorithm>
#include <deque>
#include <queue>

namespace zico::page {
namespace {

using prefetch::AccessStream;
using prefetch::Decision;
using prefetch::Decisions;
using prefetch::PageId;
using prefetch::PageState;
using prefetch::Residency;

class Executor {
 public:
  Executor(const AccessStream& stream, const PagingOptions& options, Residency* residency, PagingResult* out)
      : stream_(stream), options_(options), model_(options.model), residency_(*residency), out_(*out),
        pinned_(stream.page_count, 0), come_back_(stream.page_count, false) {
    out_.iterations.assign(1, {});
  }

  // False when an op could not get its pages (*error says why).
  bool run(prefetch::PagingPolicy& policy, std::string* error);

 private:
  struct Completion {
    uint64_t time;
    uint64_t seq;  // FIFO among equal times
    PageId page;
    bool arrival;  // else a write-back that frees a slot
    bool operator>(const Completion& o) const { return time != o.time ? time > o.time : seq > o.seq; }
  };

  IterationStats& stats() { return out_.iterations.back(); }
  [[nodiscard]] bool recording() const {
    return options_.record_last_iteration && out_.iterations.size() == std::max<uint32_t>(stream_.iterations, 1);
  }
  [[nodiscard]] bool pinned(PageId page) const { return in_op_ && pinned_[page] == op_stamp_; }

  void complete(uint64_t time, PageId page, bool arrival) {
    completions_.push({time, seq_++, page, arrival});
  }
  void advance_to(uint64_t time);
  void grant_queued(uint64_t time);
  void fetch(PageId page, uint64_t at, uint64_t priority, uint64_t not_before = 0);
  void start_next_fetch(uint64_t at);
  [[nodiscard]] bool kick_fetches();
  void apply(const Decisions& decisions);
  // The host time of carrying out one event's decisions (transfer_model.h):
  // each direction's moves are one call on its own pager thread, which pays
  // per call, per contiguous range and per page before the copies can start.
  void issue_calls(const Decisions& decisions);
  void prefetch(PageId page, uint64_t priority);
  // True when the page leaves with a copy.
  bool evict(PageId page);
  void discard(PageId page);
  [[nodiscard]] bool run_op(const prefetch::StreamOp& op, prefetch::PagingPolicy& policy, std::string* error);
  [[nodiscard]] bool wait_for(PageId page, uint64_t* ready);
  [[nodiscard]] bool fault_in(std::span<const PageId> faulted, uint64_t* ready, std::string* error);
  [[nodiscard]] bool free_one_slot(uint64_t* ready, uint64_t* evicted_bytes);
  void note_transfer(uint64_t start, uint64_t end, uint64_t bytes, bool to_device);
  void sample();

  const AccessStream& stream_;
  const PagingOptions& options_;
  const prefetch::TransferModel& model_;
  Residency& residency_;
  PagingResult& out_;
  uint64_t now_ = 0;        // the compute stream's clock
  // Host to device: transfers wait in `h2d_queue_`, most urgent first (the
  // policy's priority, then issue order), and the engine takes the next one
  // when it is done with the one it runs (until h2d_busy_until_), as a
  // runtime that keeps its own prefetch queue and feeds the copy engine one
  // page at a time would. Device to host: FIFO, done at d2h_free_.
  struct QueuedFetch {
    uint64_t priority, seq;
    PageId page;
    uint64_t not_before;  // its call's host time ends
    bool operator>(const QueuedFetch& o) const { return priority != o.priority ? priority > o.priority : seq > o.seq; }
  };
  std::priority_queue<QueuedFetch, std::vector<QueuedFetch>, std::greater<>> h2d_queue_;
  uint64_t h2d_busy_until_ = 0;
  uint64_t d2h_free_ = 0;
  // The pager threads' host clocks (one per direction), and when this
  // event's calls end on each: its copies start no earlier.
  uint64_t h2d_host_ = 0;
  uint64_t d2h_host_ = 0;
  uint64_t h2d_issued_ = 0;
  uint64_t d2h_issued_ = 0;
  std::vector<PageId> call_pages_;
  uint64_t seq_ = 0;
  std::priority_queue<Completion, std::vector<Completion>, std::greater<>> completions_;
  struct WaitingPrefetch {
    PageId page;
    uint64_t priority;
    uint64_t not_before;  // its call's host time ends
  };
  std::deque<WaitingPrefetch> queued_;  // prefetches waiting for a slot, oldest first
  bool faulting_ = false;      // the fault path takes freed slots before queued prefetches
  std::vector<uint64_t> pinned_;
  std::vector<bool> come_back_;  // prefetched while leaving: fetch it again when it has left
  uint64_t op_stamp_ = 0;
  bool in_op_ = false;
  Decisions decisions_;
};

void Executor::note_transfer(uint64_t start, uint64_t end, uint64_t bytes, bool to_device) {
  if (to_device) {
    stats().h2d_bytes += bytes;
  } else {
    stats().d2h_bytes += bytes;
  }
  if (recording()) out_.last_iteration_transfers.push_back({start, end, bytes, to_device});
}

void Executor::sample() {
  out_.peak_resident_bytes =
      std::max(out_.peak_resident_bytes, uint64_t{residency_.occupied_pages()} * stream_.page_bytes);
  if (recording()) {
    out_.last_iteration_residency.push_back({now_, residency_.occupied_pages()});
  }
}

void Executor::advance_to(uint64_t time) {
  while (!completions_.empty() && completions_.top().time <= time) {
    const Completion c = completions_.top();
    completions_.pop();
    if (c.arrival) {
      residency_.arrive(c.page, c.time);
      start_next_fetch(c.time);
    } else {
      residency_.leave(c.page);
      if (come_back_[c.page]) {
        come_back_[c.page] = false;
        residency_.start_arrival(c.page);
        fetch(c.page, c.time, 0);
      } else if (!faulting_) {
        grant_queued(c.time);
      }
    }
  }
}

void Executor::grant_queued(uint64_t time) {
  while (!queued_.empty() && residency_.free_pages() > 0) {
    const auto [page, priority, not_before] = queued_.front();
    queued_.pop_front();
    if (residency_.state(page) != PageState::kQueued) continue;
    residency_.start_arrival(page);
    fetch(page, time, priority, not_before);
  }
}

void Executor::fetch(PageId page, uint64_t at, uint64_t priority, uint64_t not_before) {
  if (!residency_.has_data(page)) {
    complete(std::max(at, not_before), page, true);  // populated on the GPU, nothing to copy
    return;
  }
  h2d_queue_.push({priority, seq_++, page, not_before});
  start_next_fetch(at);
}

// Queued copies wait for a completion to start them; after a fault-path
// copy there is none. Starts the next one when the engine is free; false if
// nothing is queued.
bool Executor::kick_fetches() {
  if (h2d_queue_.empty()) return false;
  start_next_fetch(h2d_busy_until_);
  return true;
}

void Executor::start_next_fetch(uint64_t at) {
  if (h2d_queue_.empty() || h2d_busy_until_ > at) return;  // a completion will call again
  const PageId page = h2d_queue_.top().page;
  at = std::max(at, h2d_queue_.top().not_before);  // the engine waits for the call that issues it
  h2d_queue_.pop();
  const uint64_t end = at + model_.h2d_ns(stream_.page_bytes, d2h_free_ > at);
  h2d_busy_until_ = end;
  note_transfer(at, end, stream_.page_bytes, true);
  complete(end, page, true);
}

void Executor::prefetch(PageId page, uint64_t priority) {
  switch (residency_.state(page)) {
    case PageState::kAbsent:
      if (residency_.free_pages() > 0) {
        residency_.start_arrival(page);
        fetch(page, now_, priority, h2d_issued_);
      } else if (residency_.leaving_pages() > residency_.queued_pages()) {
        residency_.queue(page);
        queued_.push_back({page, priority, h2d_issued_});
      } else {
        ++out_.refused_prefetches;
      }
      return;
    case PageState::kLeaving: come_back_[page] = true; return;  // fetched again once it has left
    default: return;  // there already, or on its way
  }
}

bool Executor::evict(PageId page) {
  if (residency_.state(page) != PageState::kResident || pinned(page)) {
    ++out_.refused_evictions;
    return false;
  }
  if (!residency_.has_data(page)) {
    residency_.drop(page);
    grant_queued(now_);
    return false;
  }
  residency_.start_leaving(page);
  const uint64_t start = std::max({now_, d2h_free_, d2h_issued_});
  const uint64_t end = start + model_.d2h_ns(stream_.page_bytes, h2d_busy_until_ > start);
  d2h_free_ = end;
  note_transfer(start, end, stream_.page_bytes, false);
  complete(end, page, false);
  return true;
}

void Executor::discard(PageId page) {
  if (residency_.live(page)) {
    ++out_.live_discards;
    return;
  }
  // Its slot stays taken (cuMemDiscardAndPrefetchBatchAsync keeps a page
  // resident): whether a dead page should leave is the policy's call, and
  // evicting it now costs nothing.
  residency_.set_has_data(page, false);
}

void Executor::issue_calls(const Decisions& decisions) {
  h2d_issued_ = d2h_issued_ = 0;
  if (model_.call_ns == 0 && model_.range_ns == 0 && model_.block_ns == 0 && model_.discard_call_ns == 0 &&
      !model_.ordered_call_waits && !model_.to_host_sync) {
    return;  // no host time modelled: moves start when decided
  }
  // What moves (a decision about a page already where it goes, or not able
  // to move, calls nothing), in one call a direction: its pages sorted,
  // adjacent ones one range.
  const auto moves = [&](const Decision& d) {
    const PageState state = residency_.state(d.page);
    if (d.kind == Decision::Kind::kPrefetch) return state == PageState::kAbsent;
    return state == PageState::kResident && !pinned(d.page) && residency_.has_data(d.page);
  };
  const auto call = [&](Decision::Kind kind, uint64_t* host, uint64_t engine_end) -> uint64_t {
    call_pages_.clear();
    for (const Decision& d : decisions) {
      if (d.kind == kind && moves(d)) call_pages_.push_back(d.page);
    }
    if (call_pages_.empty()) return 0;
    std::sort(call_pages_.begin(), call_pages_.end());
    uint64_t ranges = 0;
    for (size_t i = 0; i < call_pages_.size(); ++i) ranges += i == 0 || call_pages_[i] != call_pages_[i - 1] + 1;
    *host = std::max(*host, now_);
    if (model_.ordered_call_waits) *host = std::max(*host, engine_end);  // the stream's earlier copies
    *host += model_.call_ns + ranges * model_.range_ns + call_pages_.size() * model_.block_ns;
    return *host;
  };
  h2d_issued_ = call(Decision::Kind::kPrefetch, &h2d_host_, h2d_busy_until_);
  d2h_issued_ = call(Decision::Kind::kEvict, &d2h_host_, d2h_free_);
  if (std::any_of(decisions.begin(), decisions.end(), [](const Decision& d) { return d.kind == Decision::Kind::kDiscard; })) {
    d2h_host_ = std::max(d2h_host_, now_) + model_.discard_call_ns;  // on the same thread as evictions
  }
}

void Executor::apply(const Decisions& decisions) {
  issue_calls(decisions);
  uint64_t evictions = 0;
  for (const Decision& d : decisions) {
    switch (d.kind) {
      case Decision::Kind::kPrefetch: prefetch(d.page, d.priority); break;
      case Decision::Kind::kEvict: evictions += evict(d.page) ? 1 : 0; break;
      case Decision::Kind::kDiscard: discard(d.page); break;
    }
  }
  // A move to the host returns once its copies end, then maps the pages for
  // the CPU: its thread's next call waits for both.
  if (model_.to_host_sync && evictions != 0) {
    d2h_host_ = std::max(d2h_host_, d2h_free_) + evictions * model_.cpu_map_block_ns;
  }
}

// Waits until `page` is resident or absent (then it faults); false if it can
// never arrive (queued with no slot coming), after which it is absent.
bool Executor::wait_for(PageId page, uint64_t* ready) {
  for (;;) {
    const PageState state = residency_.state(page);
    if (state == PageState::kResident || state == PageState::kAbsent) return true;
    if (completions_.empty()) {
      if (kick_fetches()) continue;
      residency_.unqueue(page);  // only a queued page has no completion coming
      return false;
    }
    const uint64_t next = completions_.top().time;
    *ready = std::max(*ready, next);
    advance_to(next);
  }
}

// The driver's eviction for one faulting page: the least recently migrated
// resident page the op does not use; if every slot is taken by pages in use
// or in flight, the next completion is waited for.
bool Executor::free_one_slot(uint64_t* ready, uint64_t* evicted_bytes) {
  while (residency_.free_pages() == 0) {
    for (const auto& [migrated, victim] : residency_.by_migration()) {
      if (pinned(victim)) continue;
      if (residency_.has_data(victim)) *evicted_bytes += stream_.page_bytes;
      residency_.drop(victim);
      return true;
    }
    if (completions_.empty() && !kick_fetches()) return false;
    const uint64_t next = completions_.top().time;
    *ready = std::max(*ready, next);
    advance_to(next);
  }
  return true;
}

bool Executor::fault_in(std::span<const PageId> faulted, uint64_t* ready, std::string* error) {
  faulting_ = true;
  const size_t batch = model_.fault_batch_pages;
  for (size_t first = 0; first < faulted.size(); first += batch) {
    const std::span<const PageId> pages = faulted.subspan(first, std::min(batch, faulted.size() - first));
    advance_to(*ready);
    uint64_t evicted = 0;
    uint64_t fetched = 0;
    for (const PageId page : pages) {
      if (!free_one_slot(ready, &evicted)) {
        *error = "an op needs more pages than the budget holds";
        faulting_ = false;
        return false;
      }
      residency_.start_arrival(page);
      if (residency_.has_data(page)) fetched += stream_.page_bytes;
    }
    // The UVM driver evicts, then migrates, with the GPU stalled throughout,
    // and fills each block over several fault-and-replay rounds.
    uint64_t time = *ready + model_.fault_batch_ns + pages.size() * model_.fault_block_ns;
    if (evicted > 0) {
      const uint64_t start = std::max(time, d2h_free_);
      time = start + model_.fault_evict_ns(evicted);
      d2h_free_ = time;
      note_transfer(start, time, evicted, false);
    }
    if (fetched > 0) {
      // The fault path waits for the copy in progress, not for the queue.
      const uint64_t start = std::max(time, h2d_busy_until_);
      time = start + model_.fault_transfer_ns(fetched);
      h2d_busy_until_ = time;
      note_transfer(start, time, fetched, true);
    }
    for (const PageId page : pages) residency_.arrive(page, time);
    *ready = time;
    stats().faults += pages.size();
    sample();
  }
  faulting_ = false;
  grant_queued(*ready);
  start_next_fetch(*ready);
  return true;
}

bool Executor::run_op(const prefetch::StreamOp& op, prefetch::PagingPolicy& policy, std::string* error) {
  advance_to(now_);
  const std::span<const PageId> pages = stream_.pages(op);
  const prefetch::OpView view{op.exec_id, op.duration_ns, pages, stream_.op_blocks(op)};
  ++op_stamp_;
  in_op_ = true;
  for (const PageId page : pages) pinned_[page] = op_stamp_;
  decisions_.clear();
  policy.on_op_start(view, &decisions_);
  apply(decisions_);

  uint64_t ready = now_;
  std::vector<PageId> faulted;
  for (const PageId page : pages) {
    (void)wait_for(page, &ready);
  }
  for (const PageId page : pages) {
    if (residency_.state(page) == PageState::kAbsent) faulted.push_back(page);
  }
  if (!faulted.empty()) {
    if (!fault_in(faulted, &ready, error)) return false;
    policy.on_faults(view, faulted);
  }
  advance_to(ready);
  if (options_.check) options_.check(residency_, pages);

  stats().stall_ns += ready - now_;
  stats().compute_ns += op.duration_ns;
  now_ = ready + op.duration_ns;
  for (const PageId page : pages) residency_.set_has_data(page, true);
  in_op_ = false;
  advance_to(now_);
  decisions_.clear();
  policy.on_op_end(view, &decisions_);  // applied by run(), as every event's decisions
  return true;
}

bool Executor::run(prefetch::PagingPolicy& policy, std::string* error) {
  std::vector<PageId> dead;
  for (const prefetch::StreamEvent& e : stream_.events) {
    decisions_.clear();
    switch (e.kind) {
      case prefetch::StreamEvent::Kind::kAllocate: {
        const prefetch::BlockExtent& block = stream_.blocks[e.index];
        for (PageId page = stream_.first_page(block); page <= stream_.last_page(block); ++page) {
          residency_.add_live(page, stream_.bytes_on_page(block, page));
        }
        policy.on_allocate(e.index, block, &decisions_);
        break;
      }
      case prefetch::StreamEvent::Kind::kFree: {
        const prefetch::BlockExtent& block = stream_.blocks[e.index];
        dead.clear();
        for (PageId page = stream_.first_page(block); page <= stream_.last_page(block); ++page) {
          if (residency_.remove_live(page, stream_.bytes_on_page(block, page))) {
            dead.push_back(page);
          }
        }
        policy.on_free(e.index, block, dead, &decisions_);
        break;
      }
      case prefetch::StreamEvent::Kind::kOp:
        if (!run_op(stream_.ops[e.index], policy, error)) return false;
        break;
      case prefetch::StreamEvent::Kind::kIteration:
        advance_to(now_);
        if (e.index == 0) {
          stats().start_ns = now_;
        } else {
          stats().end_ns = now_;
          out_.iterations.push_back({});
          stats().start_ns = now_;
        }
        policy.on_iteration(e.index, &decisions_);
        break;
    }
    apply(decisions_);
    if (options_.check) options_.check(residency_, {});
    sample();
  }
  stats().end_ns = now_;
  return true;
}

}  // namespace

bool run_paging(const prefetch::AccessStream& stream, const std::string& policy_name, const PagingOptions& options,
                PagingResult* out, std::string* error) {
  *out = PagingResult{};
  out->policy = policy_name;
  if (const std::string bad = prefetch::stream_error(stream); !bad.empty()) {
    *error = stream.name + ": " + bad;
    return false;
  }
  if (const std::string bad = options.model.invalid_field(); !bad.empty()) {
    *error = "transfer model: " + bad;
    return false;
  }
  Residency residency(stream.page_bytes, stream.page_count, options.budget_bytes);
  const prefetch::StreamFacts facts = prefetch::stream_facts(stream);
  if (facts.max_op_pages > residency.budget_pages()) {
    *error = "the largest op uses " + std::to_string(facts.max_op_pages) + " pages, more than the budget's " +
             std::to_string(residency.budget_pages());
    return false;
  }
  auto policy = prefetch::make_policy(policy_name, residency, options.model);
  if (!policy) {
    *error = "unknown policy '" + policy_name + "'";
    return false;
  }
  if (options.wrap) policy = options.wrap(std::move(policy));
  Executor executor(stream, options, &residency, out);
  return executor.run(*policy, error);
}

}  // namespace zico::page
