#include "period_detector.h"

#include <algorithm>

namespace zico::prefetch {

PeriodDetector::PeriodDetector(uint32_t min_period, uint32_t max_period)
    : min_period_(std::max<uint32_t>(min_period, 1)),
      max_period_(std::max(max_period, min_period_)),
      history_(2 * size_t{max_period_}, 0) {}

bool PeriodDetector::add(uint64_t exec_id) {
  const uint64_t index = count_++;
  history_[index % history_.size()] = exec_id;

  if (period_ != 0) {
    if (at(index - period_) == exec_id) return index % period_ == phase_;
    period_ = 0;  // the loop changed: search again
    for (Candidate& c : candidates_) c = Candidate{};
  }

  // A new candidate: the distance back to this ID's last launch. IDs of a
  // job whose launches never repeat are forgotten now and then.
  if (last_seen_.size() > 4 * size_t{max_period_}) last_seen_.clear();
  const auto [it, fresh] = last_seen_.try_emplace(exec_id, index);
  if (!fresh) {
    const uint64_t distance = index - it->second;
    it->second = index;
    if (distance >= min_period_ && distance <= max_period_) {
      const auto known = std::find_if(candidates_.begin(), candidates_.end(),
                                      [&](const Candidate& c) { return c.period == distance; });
      if (known == candidates_.end()) {
        candidates_[next_slot_] = {static_cast<uint32_t>(distance), 0};
        next_slot_ = (next_slot_ + 1) % kCandidates;
      }
    }
  }

  uint32_t found = 0;
  for (Candidate& c : candidates_) {
    if (c.period == 0) continue;
    c.run = index >= c.period && at(index - c.period) == exec_id ? c.run + 1 : 0;
    if (c.run >= c.period && (found == 0 || c.period < found)) found = c.period;
  }
  if (found == 0) return false;
  period_ = found;
  phase_ = index % period_;  // an iteration begins here, and every period after
  return true;
}

}  // namespace zico::prefetch
