#include "span_heap.h"

#include <cassert>

namespace zico {

SpanHeap::SpanHeap(VaRange range) {
  if (range.bytes > 0) insert(range.base, range.bytes);
}

void SpanHeap::insert(uintptr_t addr, size_t bytes) {
  by_addr_.emplace(addr, bytes);
  by_size_.emplace(bytes, addr);
  free_bytes_ += bytes;
}

void SpanHeap::erase(std::map<uintptr_t, size_t>::iterator it) {
  by_size_.erase({it->second, it->first});
  free_bytes_ -= it->second;
  by_addr_.erase(it);
}

std::optional<uintptr_t> SpanHeap::allocate(size_t bytes, size_t alignment, End end) {
  if (bytes == 0) return std::nullopt;
  const uintptr_t mask = alignment - 1;
  for (auto it = by_size_.lower_bound({bytes, 0}); it != by_size_.end(); ++it) {
    const auto [length, start] = *it;
    const uintptr_t span_end = start + length;
    const uintptr_t placed = end == End::kLow ? (start + mask) & ~mask : (span_end - bytes) & ~mask;
    if (placed < start || placed + bytes > span_end || placed + bytes < placed) continue;
    erase(by_addr_.find(start));
    if (placed > start) insert(start, placed - start);
    if (placed + bytes < span_end) insert(placed + bytes, span_end - placed - bytes);
    return placed;
  }
  return std::nullopt;
}

void SpanHeap::take_range(uintptr_t addr, size_t bytes) {
  if (bytes == 0) return;
  auto it = by_addr_.upper_bound(addr);
  assert(it != by_addr_.begin());
  --it;
  const uintptr_t start = it->first;
  const uintptr_t end = it->first + it->second;
  assert(addr >= start && addr + bytes <= end);
  erase(it);
  if (addr > start) insert(start, addr - start);
  if (addr + bytes < end) insert(addr + bytes, end - addr - bytes);
}

size_t SpanHeap::free_run_starting_at(uintptr_t addr) const {
  auto it = by_addr_.find(addr);
  return it == by_addr_.end() ? 0 : it->second;
}

size_t SpanHeap::free_run_ending_at(uintptr_t end) const {
  auto it = by_addr_.lower_bound(end);
  if (it == by_addr_.begin()) return 0;
  --it;
  return it->first + it->second == end ? it->second : 0;
}

std::vector<std::pair<uintptr_t, size_t>> SpanHeap::take_all() {
  std::vector<std::pair<uintptr_t, size_t>> spans(by_addr_.begin(), by_addr_.end());
  by_addr_.clear();
  by_size_.clear();
  free_bytes_ = 0;
  return spans;
}

void SpanHeap::free(uintptr_t addr, size_t bytes) {
  if (bytes == 0) return;  // an empty span would collide with its neighbour's key
  uintptr_t start = addr;
  size_t length = bytes;
  auto next = by_addr_.lower_bound(addr);
  assert(next == by_addr_.end() || next->first >= addr + bytes);  // no double free
  if (next != by_addr_.end() && next->first == addr + bytes) {
    length += next->second;
    auto victim = next++;
    erase(victim);
  }
  if (next != by_addr_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == addr) {
      start = prev->first;
      length += prev->second;
      erase(prev);
    }
  }
  insert(start, length);
}

}  // namespace zico
