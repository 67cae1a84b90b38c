// SpanHeap: the free virtual-address ranges of an arena.
//
// Pure bookkeeping over integers (no driver, no memory): best-fit placement
// with immediate coalescing of neighbours on free. Best fit keeps the arena's
// untouched tail (the largest span) for last, so freed holes are reused first
// and the physical chunks behind them stay in use. O(log n) per operation,
// n = number of free spans. Not thread-safe: the owner's lock covers it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "types.h"

namespace zico {

class SpanHeap {
 public:
  explicit SpanHeap(VaRange range);

  // Which end of the chosen span a placement takes.
  enum class End : uint8_t { kLow, kHigh };
  // Best-fit `bytes` at `alignment` (a power of two), placed at the `end` of
  // the chosen span; the pieces around it stay free.
  [[nodiscard]] std::optional<uintptr_t> allocate(size_t bytes, size_t alignment, End end = End::kLow);
  // Returns [addr, addr+bytes) and merges it with free neighbours.
  void free(uintptr_t addr, size_t bytes);

  // Removes [addr, addr+bytes), which must lie inside one free span.
  void take_range(uintptr_t addr, size_t bytes);
  // Length of the free span that starts exactly at `addr` / ends exactly at `end`; 0 if none.
  [[nodiscard]] size_t free_run_starting_at(uintptr_t addr) const;
  [[nodiscard]] size_t free_run_ending_at(uintptr_t end) const;
  template <typename Fn>
  void for_each_span(Fn fn) const {
    for (const auto& [addr, bytes] : by_addr_) fn(addr, bytes);
  }

  // Removes and returns every free span (address, length).
  [[nodiscard]] std::vector<std::pair<uintptr_t, size_t>> take_all();

  [[nodiscard]] size_t free_bytes() const { return free_bytes_; }
  [[nodiscard]] size_t span_count() const { return by_addr_.size(); }
  [[nodiscard]] size_t largest_span() const { return by_size_.empty() ? 0 : by_size_.rbegin()->first; }

 private:
  void insert(uintptr_t addr, size_t bytes);
  void erase(std::map<uintptr_t, size_t>::iterator it);

  std::map<uintptr_t, size_t> by_addr_;            // start -> length
  std::set<std::pair<size_t, uintptr_t>> by_size_;  // (length, start)
  size_t free_bytes_ = 0;
};

}  // namespace zico
