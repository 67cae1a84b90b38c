#include "min_replacement.h"

#include <deque>
#include <set>
#include <utility>

namespace zico::prefetch {

void MinReplacement::add_op(std::span<const uint32_t> items) {
  refs_.insert(refs_.end(), items.begin(), items.end());
  op_first_.push_back(static_cast<uint32_t>(refs_.size()));
}

void MinReplacement::add_release(uint32_t item) {
  releases_.emplace_back(static_cast<uint32_t>(op_first_.size() - 1), item);
}

void MinReplacement::run(uint32_t item_count, uint32_t slots,
                         const std::function<void(const Miss&)>& on_miss) const {
  constexpr uint64_t kNever = UINT64_MAX;
  const size_t ops = op_first_.size() - 1;
  // Next use of each reference, by op index.
  std::vector<uint64_t> next(refs_.size(), kNever);
  std::vector<uint64_t> seen(item_count, kNever);
  for (size_t op = ops; op-- > 0;) {
    for (uint32_t r = op_first_[op]; r < op_first_[op + 1]; ++r) {
      next[r] = seen[refs_[r]];
      seen[refs_[r]] = op;
    }
  }

  std::set<std::pair<uint64_t, uint32_t>> cache;  // (next use, item)
  std::vector<uint64_t> key(item_count, kNever);
  std::vector<bool> cached(item_count, false);
  std::vector<bool> touched(item_count, false);
  std::vector<uint32_t> last_op(item_count, kNoOp);
  size_t release = 0;
  // Free slots, by the op after which each became free, oldest first (those
  // free from the start: kNoOp, taken before any other).
  std::deque<uint32_t> free_since(slots, kNoOp);
  for (uint32_t op = 0; op < ops; ++op) {
    for (; release < releases_.size() && releases_[release].first <= op; ++release) {
      const uint32_t item = releases_[release].second;
      if (!cached[item]) continue;
      cache.erase({key[item], item});
      cached[item] = false;
      free_since.push_back(last_op[item]);  // free once its last use is done
    }
    const uint32_t first = op_first_[op];
    const uint32_t end = op_first_[op + 1];
    // The op's items are pinned: out of the candidates while it is served,
    // then back with their next uses. A victim's last_op is then its last
    // use before this op.
    uint32_t held = 0;  // the op's items resident, kept out of `cache`
    for (uint32_t r = first; r < end; ++r) {
      const uint32_t item = refs_[r];
      last_op[item] = op;
      if (!cached[item]) continue;
      cache.erase({key[item], item});
      ++held;
    }
    for (uint32_t r = first; r < end; ++r) {
      const uint32_t item = refs_[r];
      if (!cached[item]) {
        Miss miss{op, item, !touched[item], kNoItem, kNoOp};
        if (cache.size() + held >= slots && !cache.empty()) {
          const auto victim = std::prev(cache.end());
          miss.victim = victim->second;
          miss.slot_free_after = last_op[victim->second];
          cached[victim->second] = false;
          cache.erase(victim);
        } else if (!free_since.empty()) {
          miss.slot_free_after = free_since.front();
          free_since.pop_front();
        }
        on_miss(miss);
        cached[item] = true;
        touched[item] = true;
        ++held;
      }
    }
    for (uint32_t r = first; r < end; ++r) {
      const uint32_t item = refs_[r];
      key[item] = next[r];
      cache.emplace(key[item], item);
    }
  }
}

}  // namespace zico::prefetch
