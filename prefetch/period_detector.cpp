#include "period_detector.h"

#include <algorithm>

namespace zico::prefetch {

PeriodDetector::PeriodDetector(uint32_t min_period, uint32_t max_period)
    : min_period_(std::max<uint32_t>(min_period, 1)),
      max_period_(std::max(max_period, min_period_)),
      history_(2 * size_t{max_period_} + kMaxSkip + 1, 0) {}

uint64_t PeriodDetector::line_up(Alignment* a, uint64_t index, uint64_t exec_id, uint64_t previous) const {
  for (uint64_t skip = 0; skip <= kMaxSkip && a->next + skip < index; ++skip) {
    // Stepping over launches there only to this ID's last launch: a kernel
    // that runs often (a stray) would be met a few launches on by chance.
    if (at(a->next + skip) == exec_id && (skip == 0 || a->next + skip == previous)) {
      a->next += skip + 1;
      ++a->matched;
      return a->next - 1;
    }
  }
  ++a->missed;
  return kNoMatch;
}

bool PeriodDetector::holds(const Alignment& a, uint64_t index) const {
  const uint64_t lag = index + 1 - a.next;  // launches from the one a period before the next
  return a.missed <= kSlack + a.matched / kMatchesPerMiss && lag >= min_period_ && lag <= 2 * uint64_t{max_period_};
}

bool PeriodDetector::add(uint64_t exec_id) {
  const uint64_t index = count_++;
  history_[index % history_.size()] = exec_id;
  // IDs of a job whose launches never repeat are forgotten now and then.
  if (last_seen_.size() > 4 * size_t{max_period_}) last_seen_.clear();
  const auto [it, fresh] = last_seen_.try_emplace(exec_id, index);
  const uint64_t previous = fresh ? kNoMatch : it->second;
  it->second = index;

  if (period_ != 0) {
    const uint64_t from = found_.next;
    const uint64_t counterpart = line_up(&found_, index, exec_id, previous);
    if (!holds(found_, index)) {
      period_ = 0;  // the loop changed: search again
      found_ = Alignment{};
      return false;
    }
    if (!closes(found_, from, counterpart)) return false;
    period_ = static_cast<uint32_t>(index - found_.begin);
    found_.begin = index;
    // What the iterations before did counts for less and less: a loop that
    // changes is dropped within about a period.
    found_.matched /= 2;
    found_.missed /= 2;
    return true;
  }

  uint32_t found = 0;
  size_t which = 0;
  for (size_t k = 0; k < kCandidates; ++k) {
    Alignment& c = candidates_[k];
    if (!c.live) continue;
    const uint64_t from = c.next;
    const uint64_t counterpart = line_up(&c, index, exec_id, previous);
    if (!holds(c, index)) {
      c = Alignment{};
      continue;
    }
    const uint64_t length = index - c.begin;
    if (closes(c, from, counterpart) && length >= min_period_ && (found == 0 || length < found)) {
      found = static_cast<uint32_t>(length);
      which = k;
    }
  }
  if (found == 0) {
    if (previous != kNoMatch) search(index, previous);
    return false;
  }
  period_ = found;
  found_ = candidates_[which];
  found_.begin = index;  // an iteration begins here, and one each period after
  found_.matched /= 2;
  found_.missed /= 2;
  for (Alignment& c : candidates_) c = Alignment{};
  return true;
}

void PeriodDetector::search(uint64_t index, uint64_t last) {
  const uint64_t distance = index - last;
  if (distance < min_period_ || distance > max_period_) return;
  // A candidate that lined this launch up with the same one already is this one.
  if (std::any_of(candidates_.begin(), candidates_.end(),
                  [&](const Alignment& c) { return c.live && c.next == last + 1; })) {
    return;
  }
  // A free slot, or the candidate with the fewest matches gives way.
  Alignment* slot = &*std::min_element(candidates_.begin(), candidates_.end(), [](const Alignment& a, const Alignment& b) {
    return (a.live ? a.matched + 1 : 0) < (b.live ? b.matched + 1 : 0);
  });
  *slot = Alignment{true, index, last + 1, 1, 0};
}

}  // namespace zico::prefetch
