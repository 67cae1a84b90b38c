#include "correlation_table.h"

#include <algorithm>
#include <iterator>

namespace zico::prefetch {

void CorrelationTable::record_successor(uint64_t previous, uint64_t next) {
  Successors& s = successors_[previous];
  const auto end = s.ids.begin() + s.count;
  auto found = std::find(s.ids.begin(), end, next);
  if (found == end) {
    if (s.count < kSuccessors) ++s.count;
    found = s.ids.begin() + s.count - 1;
  }
  // Most recent first: shift the ones before it down by one.
  std::move_backward(s.ids.begin(), found, found + 1);
  s.ids[0] = next;
}

bool CorrelationTable::predict_next(uint64_t exec_id, uint64_t* next) const {
  const auto it = successors_.find(exec_id);
  if (it == successors_.end() || it->second.count == 0) return false;
  *next = it->second.ids[0];
  return true;
}

void CorrelationTable::record_faults(uint64_t exec_id, std::span<const PageId> pages) {
  if (pages.empty()) return;
  std::vector<PageId>& table = pages_[exec_id];
  std::vector<PageId> merged;
  merged.reserve(table.size() + pages.size());
  std::set_union(table.begin(), table.end(), pages.begin(), pages.end(), std::back_inserter(merged));
  table.swap(merged);
}

std::span<const PageId> CorrelationTable::pages(uint64_t exec_id) const {
  const auto it = pages_.find(exec_id);
  if (it == pages_.end()) return {};
  return it->second;
}

}  // namespace zico::prefetch
