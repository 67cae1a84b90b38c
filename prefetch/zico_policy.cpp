#include "zico_policy.h"

#include <algorithm>

#include "exec_id.h"

namespace zico::prefetch {

ZicoPolicy::ZicoPolicy(const Residency& residency, const TransferModel& /*model*/)
    : residency_(residency),
      pinned_(residency.page_count(), 0),
      prefetched_(residency.page_count(), 0),
      evicted_(residency.page_count(), 0) {
  index_.reset(residency.page_count(), 1);
}

uint32_t ZicoPolicy::spare_pages() const {
  // About 64 MiB (a millisecond of copying), at most a 64th of the budget.
  return static_cast<uint32_t>(std::min<uint64_t>(
      residency_.budget_pages() / 64, std::max<uint64_t>(4, (uint64_t{64} << 20) / residency_.page_bytes())));
}

void ZicoPolicy::build_plan() {
  planned_budget_ = residency_.budget_pages();
  plan_.build(learned_, planned_budget_ - spare_pages(), residency_.page_count());
}

int64_t ZicoPolicy::available_slots() const {
  // Free slots, plus those evictions in flight will free that no queued
  // prefetch has claimed.
  return int64_t{residency_.free_pages()} + residency_.leaving_pages() - residency_.queued_pages();
}

void ZicoPolicy::rekey_present_pages(uint64_t after) {
  // Keys reach two iterations ahead: planned fetches of the next iteration
  // are issued during this one.
  index_.reset(residency_.page_count(), 2 * uint64_t{learned_.ops()} + 2);
  for (PageId page = 0; page < residency_.page_count(); ++page) {
    if (residency_.present_or_coming(page)) index_.set(page, learned_.next_use(page, after));
  }
}

void ZicoPolicy::evict(PageId page, Decisions* out) {
  out->push_back({Decision::Kind::kEvict, page});
  evicted_[page] = stamp_;
  index_.remove(page);
  ++slots_;
}

void ZicoPolicy::on_free(uint32_t /*block*/, const BlockExtent& /*extent*/, std::span<const PageId> dead,
                         Decisions* out) {
  ++stamp_;
  for (const PageId page : dead) {
    recording_.add_death(page);
    // Nothing to keep: drop the contents, and the page with them (free).
    out->push_back({Decision::Kind::kDiscard, page});
    if (residency_.state(page) == PageState::kResident) evict(page, out);
  }
}

void ZicoPolicy::on_iteration(uint32_t /*n*/, Decisions* /*out*/) {
  marked_ = true;
  if (period_ == 2 && !mid_period_) {
    mid_period_ = true;  // the period goes on across this mark
    return;
  }
  mid_period_ = false;
  begin_iteration();
}

void ZicoPolicy::begin_iteration() {
  bool changed = false;
  if (!recording_.empty()) {
    if (learned_.empty()) {
      std::swap(learned_, recording_);
      learned_.finish(residency_.page_count());
      build_plan();
      changed = true;
    } else if (recording_.same_as(learned_)) {
      returns_ = 0;  // as predicted
      // The budget changed since the plan was made: the same iteration, planned again.
      if (planned_budget_ != residency_.budget_pages()) {
        build_plan();
        changed = true;
      }
    } else if (period_ == 2 && following_) {
      // Followed to its end through a little drift: the same two
      // iterations, placed a little differently. Learned as they ran.
      std::swap(learned_, recording_);
      learned_.finish(residency_.page_count());
      build_plan();
      changed = true;
    } else if (period_ == 2) {
      // The alternation broke: start over from the next iteration.
      period_ = 1;
      returns_ = 0;
      learned_.clear();
      previous_.clear();
      plan_.clear();
      previous_plan_.clear();
      changed = true;
    } else if (!previous_.empty() && recording_.close_to(previous_, kDriftDivisor)) {
      // It repeated the one two back. The second time in a row, the two
      // alternate: learn them as one period, the prediction (what comes
      // next) first. The first time, predict what was just seen (one odd
      // iteration, then steady again).
      if (++returns_ >= 2) {
        learned_.append(previous_);
        learned_.finish(residency_.page_count());
        build_plan();
        previous_.clear();
        previous_plan_.clear();
        period_ = 2;
        mid_period_ = false;
      } else {
        std::swap(learned_, previous_);
        std::swap(plan_, previous_plan_);
      }
      changed = true;
    } else {
      std::swap(previous_, learned_);
      std::swap(previous_plan_, plan_);
      std::swap(learned_, recording_);
      learned_.finish(residency_.page_count());
      build_plan();
      returns_ = 0;
      changed = true;
    }
  }
  if (changed && !learned_.empty()) {
    adopt_prediction();
  } else if (!learned_.empty()) {
    iteration_base_ += learned_.ops();
    due_ = next_due_;
  }
  next_due_ = 0;
  ahead_ = 0;
  recording_.clear();
  position_ = 0;
  pages_drifted_ = 0;
  following_ = !learned_.empty();
}

void ZicoPolicy::adopt_prediction() {
  // Positions restart at iteration 1 of the new prediction, so that "just
  // before this iteration" is a position too.
  iteration_base_ = learned_.ops();
  rekey_present_pages(iteration_base_ - 1);
  due_ = 0;  // including those the plan would have issued in the iteration before
}

void ZicoPolicy::on_op_start(const OpView& op, Decisions* out) {
  if (!marked_ && detector_.add(op.exec_id)) {
    // The last period's launches were an iteration: learn it now.
    if (learned_.empty()) recording_.keep_last(detector_.period());
    begin_iteration();
  }
  recording_.add_op(op.exec_id, op.duration_ns, op.pages);
  max_op_pages_ = std::max(max_op_pages_, static_cast<uint32_t>(op.pages.size()));
  ++stamp_;
  slots_ = available_slots();
  for (const PageId page : op.pages) pinned_[page] = stamp_;
  const bool exact = following_ && learned_.matches(position_, op.exec_id, op.pages);
  if (following_ && !exact) following_ = drifts_a_little(op);

  if (following_) {
    const uint64_t now = iteration_base_ + position_;
    if (exact) {
      for (size_t i = 0; i < op.pages.size(); ++i) {
        index_.set(op.pages[i], iteration_base_ + learned_.next_use_of(position_, i));
      }
    } else {
      rekey_drifted(op);
    }
    fetch_missing(op, now, out);  // first: the op that runs now must have its pages
    issue_due(now, out);
    fill_spare_slots(now, out);
  } else {
    pre_evict(out);
  }
  ++position_;
}

bool ZicoPolicy::drifts_a_little(const OpView& op) {
  if (position_ >= learned_.ops() || !same_kernel(learned_.exec_id(position_), op.exec_id)) return false;
  pages_drifted_ += differing_pages(op.pages, learned_.pages(position_));
  return pages_drifted_ * kDriftDivisor <= learned_.page_refs();
}

void ZicoPolicy::rekey_drifted(const OpView& op) {
  // A page the prediction has elsewhere is next used where the prediction
  // uses it next.
  for (const PageId page : op.pages) {
    const uint64_t next = learned_.next_use(page, position_);
    index_.set(page, next == kNoUse ? kNoUse : iteration_base_ + next);
  }
  // The prediction's pages this op did not use move past it all the same,
  // as if it had: left at this position, they could be neither chosen as
  // victims nor evicted as planned until the iteration ends.
  const std::span<const PageId> learned = learned_.pages(position_);
  for (size_t i = 0; i < learned.size(); ++i) {
    if (index_.contains(learned[i]) && !std::binary_search(op.pages.begin(), op.pages.end(), learned[i])) {
      index_.set(learned[i], iteration_base_ + learned_.next_use_of(position_, i));
    }
  }
}

void ZicoPolicy::issue_due(uint64_t now, Decisions* out) {
  const std::vector<PlannedFetch>& plan = plan_.fetches();
  const auto base = static_cast<int64_t>(iteration_base_);
  const auto length = static_cast<int64_t>(learned_.ops());
  const auto at = static_cast<int64_t>(now);
  for (; due_ < plan.size() && base + plan[due_].issue <= at; ++due_) {
    issue(plan[due_], iteration_base_ + plan[due_].need, out);
  }
  // The next iteration's fetches whose victims are done with already.
  for (; next_due_ < plan.size() && plan[next_due_].issue < 0 && base + length + plan[next_due_].issue <= at;
       ++next_due_) {
    issue(plan[next_due_], iteration_base_ + learned_.ops() + plan[next_due_].need, out);
  }
}

void ZicoPolicy::issue(const PlannedFetch& fetch, uint64_t need, Decisions* out) {
  if (fetch.victim != kNoPage && residency_.state(fetch.victim) == PageState::kResident &&
      pinned_[fetch.victim] != stamp_ && evicted_[fetch.victim] != stamp_ && prefetched_[fetch.victim] != stamp_ &&
      index_.key(fetch.victim) > need) {
    evict(fetch.victim, out);
  }
  const PageId page = fetch.page;
  if (residency_.present_or_coming(page) || prefetched_[page] == stamp_) return;
  if (slots_ <= 0 && !make_room(need, out)) return;  // its op will fetch it
  out->push_back({Decision::Kind::kPrefetch, page, need});
  prefetched_[page] = stamp_;
  --slots_;
  index_.set(page, need);
}

void ZicoPolicy::fill_spare_slots(uint64_t now, Decisions* out) {
  // Free slots (the plan leaves some spare) take the planned pages needed
  // next, without waiting for their victims (those still leave when due,
  // handing the slot back), so a fetch need not wait for its victim's copy
  // to the host. Empty pages are left to their turn: they cost no copy.
  // Pages present now may be gone later, so each op looks again, at up to
  // kFillWindow planned fetches from the current op on.
  constexpr size_t kFillWindow = 64;
  const std::vector<uint32_t>& order = plan_.by_need();
  const std::vector<PlannedFetch>& plan = plan_.fetches();
  if (order.empty()) return;
  const uint64_t length = learned_.ops();
  while (ahead_ < order.size() && plan[order[ahead_]].need < position_) ++ahead_;
  for (size_t k = 0; k < kFillWindow && k < order.size() && slots_ > 0; ++k) {
    const size_t i = ahead_ + k;
    const PlannedFetch& fetch = plan[order[i % order.size()]];
    const uint64_t need = iteration_base_ + (i >= order.size() ? length : 0) + fetch.need;
    if (need > now + length) return;
    const PageId page = fetch.page;
    if (!residency_.has_data(page) || residency_.state(page) != PageState::kAbsent || prefetched_[page] == stamp_) {
      continue;
    }
    out->push_back({Decision::Kind::kPrefetch, page, need});
    prefetched_[page] = stamp_;
    --slots_;
    index_.set(page, need);
  }
}

void ZicoPolicy::fetch_missing(const OpView& op, uint64_t now, Decisions* out) {
  for (const PageId page : op.pages) {
    if (residency_.present_or_coming(page) || prefetched_[page] == stamp_) continue;
    if (slots_ <= 0 && !make_room(now, out)) return;  // the fault path takes over
    out->push_back({Decision::Kind::kPrefetch, page, now});
    prefetched_[page] = stamp_;
    --slots_;
  }
}

bool ZicoPolicy::make_room(uint64_t need, Decisions* out) {
  gone_.clear();
  const PageId victim = index_.farthest_above(need, [&](PageId page) {
    const PageState state = residency_.state(page);
    if (state == PageState::kAbsent || state == PageState::kLeaving) {
      gone_.push_back(page);  // the fault path took it, or it is leaving already
      return false;
    }
    return state == PageState::kResident && pinned_[page] != stamp_ && prefetched_[page] != stamp_ &&
           evicted_[page] != stamp_;
  });
  for (const PageId page : gone_) index_.remove(page);
  if (victim == NextUseIndex::kNoPageFound) return false;  // everything present is needed sooner
  evict(victim, out);
  return true;
}

void ZicoPolicy::pre_evict(Decisions* out) {
  for (const auto& [migrated, page] : residency_.by_migration()) {
    if (slots_ >= int64_t{max_op_pages_}) return;
    if (pinned_[page] == stamp_) continue;
    evict(page, out);
  }
}

}  // namespace zico::prefetch
