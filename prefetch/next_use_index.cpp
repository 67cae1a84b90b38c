#include "next_use_index.h"

#include <algorithm>

namespace zico::prefetch {

void NextUseIndex::reset(uint32_t page_count, uint64_t span) {
  span_ = std::max<uint64_t>(span, 1);
  top_ = 0;
  key_.assign(page_count, kNoUse);
  bucket_of_.assign(page_count, kOut);
  next_.assign(page_count, kEnd);
  prev_.assign(page_count, kEnd);
  head_.assign(span_ + 1, kEnd);
}

void NextUseIndex::unlink(PageId page) {
  const uint32_t bucket = bucket_of_[page];
  if (prev_[page] != kEnd) {
    next_[prev_[page]] = next_[page];
  } else {
    head_[bucket] = next_[page];
  }
  if (next_[page] != kEnd) prev_[next_[page]] = prev_[page];
  bucket_of_[page] = kOut;
}

void NextUseIndex::set(PageId page, uint64_t key) {
  if (bucket_of_[page] != kOut) unlink(page);
  key_[page] = key;
  const uint32_t bucket = bucket_for(key);
  bucket_of_[page] = bucket;
  prev_[page] = kEnd;
  next_[page] = head_[bucket];
  if (head_[bucket] != kEnd) prev_[head_[bucket]] = page;
  head_[bucket] = page;
  if (key != kNoUse) top_ = std::max(top_, key);
}

void NextUseIndex::remove(PageId page) {
  if (bucket_of_[page] != kOut) unlink(page);
}

}  // namespace zico::prefetch
