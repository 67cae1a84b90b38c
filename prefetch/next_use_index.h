// NextUseIndex: the pages present on the GPU, by when they are next used,
// so that the one used farthest ahead (Belady's victim) is found fast.
//
// Keys are absolute op positions. While a plan is followed every key lies
// less than `span` positions ahead of the current op, so the index is a ring
// of `span` buckets, one per position, each an intrusive list of pages:
// moving a page to a new key is O(1), which matters because every op re-keys
// all the pages it uses. Pages never used by the prediction (kNoUse) sit in a
// list of their own, the first victims. A key that fell behind (the page's
// predicted use did not come) shares its bucket with a later key; a search
// skips it, so such a page is not chosen until it is re-keyed.
#pragma once

#include <cstdint>
#include <vector>

#include "access_stream.h"
#include "learned_iteration.h"

namespace zico::prefetch {

class NextUseIndex {
 public:
  // Empties the index for pages 0..page_count-1 and keys within `span`.
  void reset(uint32_t page_count, uint64_t span);

  void set(PageId page, uint64_t key);  // key may be kNoUse
  void remove(PageId page);
  [[nodiscard]] bool contains(PageId page) const { return bucket_of_[page] != kOut; }
  [[nodiscard]] uint64_t key(PageId page) const { return key_[page]; }

  // The page with the largest key above `floor` that `accept` takes (pages
  // without a use first), or kNoPageFound. `accept` must not change the
  // index; the caller removes what it takes.
  static constexpr PageId kNoPageFound = UINT32_MAX;
  template <typename Accept>
  [[nodiscard]] PageId farthest_above(uint64_t floor, Accept&& accept);

 private:
  static constexpr uint32_t kOut = UINT32_MAX;  // not in the index
  static constexpr uint32_t kEnd = UINT32_MAX;  // end of a list
  [[nodiscard]] uint32_t bucket_for(uint64_t key) const {
    return key == kNoUse ? static_cast<uint32_t>(span_) : static_cast<uint32_t>(key % span_);
  }
  void unlink(PageId page);

  uint64_t span_ = 1;
  uint64_t top_ = 0;  // no key above this is in a bucket
  std::vector<uint64_t> key_;
  std::vector<uint32_t> bucket_of_;
  std::vector<uint32_t> next_, prev_;
  std::vector<uint32_t> head_;  // span_ buckets, then the kNoUse list
};

template <typename Accept>
PageId NextUseIndex::farthest_above(uint64_t floor, Accept&& accept) {
  for (uint32_t p = head_[span_]; p != kEnd; p = next_[p]) {
    if (accept(p)) return p;
  }
  for (uint64_t k = top_, steps = 0; k > floor && steps < span_; --k, ++steps) {
    const uint32_t bucket = bucket_for(k);
    if (head_[bucket] == kEnd && k == top_) {
      top_ = k - 1;  // nothing up here any more
      continue;
    }
    for (uint32_t p = head_[bucket]; p != kEnd; p = next_[p]) {
      if (key_[p] == k && accept(p)) return p;
    }
  }
  return kNoPageFound;
}

}  // namespace zico::prefetch
