#include "learned_iteration.h"

#include <algorithm>

#include "exec_id.h"

namespace zico::prefetch {

void LearnedIteration::add_op(uint64_t exec_id, uint64_t duration_ns, std::span<const PageId> pages) {
  exec_ids_.push_back(exec_id);
  durations_.push_back(duration_ns);
  refs_.insert(refs_.end(), pages.begin(), pages.end());
  first_ref_.push_back(static_cast<uint32_t>(refs_.size()));
}

void LearnedIteration::clear() {
  exec_ids_.clear();
  durations_.clear();
  first_ref_.assign(1, 0);
  refs_.clear();
  deaths_.clear();
  use_start_.clear();
  uses_.clear();
  next_of_ref_.clear();
  start_ns_.clear();
}

void LearnedIteration::keep_last(uint32_t ops) {
  if (ops >= this->ops()) return;
  const uint32_t drop = this->ops() - ops;
  const uint32_t first = first_ref_[drop];
  exec_ids_.erase(exec_ids_.begin(), exec_ids_.begin() + drop);
  durations_.erase(durations_.begin(), durations_.begin() + drop);
  refs_.erase(refs_.begin(), refs_.begin() + first);
  first_ref_.erase(first_ref_.begin(), first_ref_.begin() + drop);
  for (uint32_t& f : first_ref_) f -= first;
  std::erase_if(deaths_, [&](const std::pair<uint32_t, PageId>& d) { return d.first < drop; });
  for (auto& d : deaths_) d.first -= drop;
}

void LearnedIteration::append(const LearnedIteration& next) {
  const uint32_t shift = ops();
  const auto ref_shift = static_cast<uint32_t>(refs_.size());
  exec_ids_.insert(exec_ids_.end(), next.exec_ids_.begin(), next.exec_ids_.end());
  durations_.insert(durations_.end(), next.durations_.begin(), next.durations_.end());
  refs_.insert(refs_.end(), next.refs_.begin(), next.refs_.end());
  for (size_t i = 1; i < next.first_ref_.size(); ++i) first_ref_.push_back(next.first_ref_[i] + ref_shift);
  for (const auto& [position, page] : next.deaths_) deaths_.emplace_back(position + shift, page);
}

void LearnedIteration::finish(uint32_t page_count) {
  start_ns_.assign(1, 0);
  for (const uint64_t d : durations_) start_ns_.push_back(start_ns_.back() + d);
  use_start_.assign(size_t{page_count} + 1, 0);
  for (const PageId page : refs_) ++use_start_[page + 1];
  for (size_t p = 0; p < page_count; ++p) use_start_[p + 1] += use_start_[p];
  uses_.assign(refs_.size(), 0);
  std::vector<uint32_t> fill(use_start_.begin(), use_start_.end() - 1);
  for (uint32_t position = 0; position < ops(); ++position) {
    for (const PageId page : pages(position)) uses_[fill[page]++] = position;
  }
  next_of_ref_.resize(refs_.size());
  for (uint32_t position = 0; position < ops(); ++position) {
    for (size_t i = 0; i < first_ref_[position + 1] - first_ref_[position]; ++i) {
      const size_t ref = first_ref_[position] + i;
      next_of_ref_[ref] = static_cast<uint32_t>(next_use(refs_[ref], position));
    }
  }
}

bool LearnedIteration::same_as(const LearnedIteration& other) const {
  return exec_ids_ == other.exec_ids_ && first_ref_ == other.first_ref_ && refs_ == other.refs_ &&
         deaths_ == other.deaths_;
}

uint64_t differing_pages(std::span<const PageId> a, std::span<const PageId> b) {
  uint64_t differing = 0;
  size_t i = 0;
  size_t j = 0;
  while (i < a.size() && j < b.size()) {
    if (a[i] == b[j]) {
      ++i;
      ++j;
    } else {
      ++differing;
      ++(a[i] < b[j] ? i : j);
    }
  }
  return differing + (a.size() - i) + (b.size() - j);
}

bool LearnedIteration::close_to(const LearnedIteration& other, uint64_t divisor) const {
  if (!std::equal(exec_ids_.begin(), exec_ids_.end(), other.exec_ids_.begin(), other.exec_ids_.end(), same_kernel)) {
    return false;
  }
  uint64_t differing = 0;
  for (uint32_t op = 0; op < ops(); ++op) differing += differing_pages(pages(op), other.pages(op));
  return differing * divisor <= refs_.size();
}

bool LearnedIteration::matches(uint32_t position, uint64_t exec_id, std::span<const PageId> pages) const {
  if (position >= ops() || exec_ids_[position] != exec_id) return false;
  const std::span<const PageId> learned = this->pages(position);
  return std::equal(learned.begin(), learned.end(), pages.begin(), pages.end());
}

uint64_t LearnedIteration::time_between(uint64_t from, uint64_t to) const {
  const uint64_t length = ops();
  auto at = [&](uint64_t position) { return position / length * start_ns_.back() + start_ns_[position % length]; };
  return at(to) - at(from);
}

uint64_t LearnedIteration::next_use(PageId page, uint64_t after) const {
  if (page + size_t{1} >= use_start_.size()) return kNoUse;
  const uint32_t* begin = uses_.data() + use_start_[page];
  const uint32_t* end = uses_.data() + use_start_[page + 1];
  if (begin == end) return kNoUse;
  const uint64_t length = ops();
  const uint64_t base = after / length * length;
  const auto position = static_cast<uint32_t>(after - base);
  const uint32_t* next = std::upper_bound(begin, end, position);
  return next != end ? base + *next : base + length + *begin;
}

}  // namespace zico::prefetch
