#include "caching_model.h"

#include <iterator>

namespace zico::replay {
namespace {

// Where the fake address space starts: far from zero so a stray null-ish
// pointer is never mistaken for a block, and 2 MiB aligned like cudaMalloc's.
constexpr uintptr_t kFirstAddress = uintptr_t{1} << 40;

// Requests beyond this cannot be rounded without overflow; no device has it.
constexpr uint64_t kLargestRequest = uint64_t{1} << 62;

}  // namespace

CachingAllocatorModel::CachingAllocatorModel(uint64_t limit_bytes)
    : limit_bytes_(limit_bytes), next_address_(kFirstAddress) {}

uint64_t CachingAllocatorModel::round_size(uint64_t bytes) {
  if (bytes < kMinBlockSize) return kMinBlockSize;
  return (bytes + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
}

uint64_t CachingAllocatorModel::allocation_size(uint64_t rounded) {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return kLargeBuffer;
  return (rounded + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

Status CachingAllocatorModel::allocate(uint32_t /*block*/, size_t bytes, void** out) {
  if (bytes == 0) {
    *out = nullptr;
    return Status::ok();
  }
  if (bytes > kLargestRequest) {
    ++ooms_;
    return Status(Errc::kOutOfMemory);
  }
  const uint64_t size = round_size(bytes);
  const bool small_pool = size <= kSmallSize;
  FreeSet& free_blocks = pool(small_pool);

  uintptr_t address = 0;
  if (auto best = free_blocks.lower_bound({size, 0}); best != free_blocks.end()) {
    address = best->second;
    free_blocks.erase(best);
  } else {
    const uint64_t segment = allocation_size(size);
    if (!create_segment(segment, small_pool, &address)) {
      // malloc's last resort: give back every fully free segment and retry once.
      release_cached_segments();
      ++alloc_retries_;
      if (!create_segment(segment, small_pool, &address)) {
        ++ooms_;
        return Status(Errc::kOutOfMemory);
      }
    }
  }

  const auto it = blocks_.find(address);
  Block& block = it->second;
  const uint64_t remaining = block.bytes - size;
  const bool split = small_pool ? remaining >= kMinBlockSize : remaining > kSmallSize;
  if (split) {
    blocks_.emplace_hint(std::next(it), address + size, Block{remaining, block.segment, small_pool, false});
    free_blocks.emplace(remaining, address + size);
    block.bytes = size;
  }
  block.allocated = true;
  allocated_bytes_ += block.bytes;
  *out = reinterpret_cast<void*>(address);
  return Status::ok();
}

void CachingAllocatorModel::free(uint32_t /*block*/, void* ptr) {
  auto it = blocks_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == blocks_.end() || !it->second.allocated) return;
  Block& freed = it->second;
  freed.allocated = false;
  allocated_bytes_ -= freed.bytes;
  FreeSet& free_blocks = pool(freed.small_pool);

  // Segments sit back to back in the fake address space, so an address
  // neighbour is only a merge candidate when it shares the segment.
  if (it != blocks_.begin()) {
    const auto prev = std::prev(it);
    if (!prev->second.allocated && prev->second.segment == freed.segment) {
      free_blocks.erase({prev->second.bytes, prev->first});
      prev->second.bytes += freed.bytes;
      blocks_.erase(it);
      it = prev;
    }
  }
  if (const auto next = std::next(it);
      next != blocks_.end() && !next->second.allocated && next->second.segment == it->second.segment) {
    free_blocks.erase({next->second.bytes, next->first});
    it->second.bytes += next->second.bytes;
    blocks_.erase(next);
  }
  free_blocks.emplace(it->second.bytes, it->first);
}

bool CachingAllocatorModel::create_segment(uint64_t bytes, bool small_pool, uintptr_t* address) {
  if (limit_bytes_ != kUnlimited && (bytes > limit_bytes_ || reserved_bytes_ > limit_bytes_ - bytes)) return false;
  *address = next_address_;
  next_address_ += bytes;
  segment_bytes_.emplace(*address, bytes);
  // The new block goes straight to the caller, not through the free set.
  blocks_.emplace(*address, Block{bytes, *address, small_pool, false});
  reserved_bytes_ += bytes;
  ++segment_allocs_;
  return true;
}

void CachingAllocatorModel::release_cached_segments() {
  for (FreeSet* free_blocks : {&large_free_, &small_free_}) {
    for (auto it = free_blocks->begin(); it != free_blocks->end();) {
      const auto [bytes, address] = *it;
      const auto segment = segment_bytes_.find(address);
      if (segment == segment_bytes_.end() || segment->second != bytes) {
        ++it;
        continue;
      }
      it = free_blocks->erase(it);
      blocks_.erase(address);
      segment_bytes_.erase(segment);
      reserved_bytes_ -= bytes;
      ++segment_frees_;
    }
  }
}

std::vector<CachingAllocatorModel::Segment> CachingAllocatorModel::segments() const {
  std::vector<Segment> result;
  result.reserve(segment_bytes_.size());
  auto block = blocks_.begin();
  for (const auto& [base, bytes] : segment_bytes_) {
    Segment segment{base, bytes, false, 0};
    for (; block != blocks_.end() && block->second.segment == base; ++block) {
      segment.small_pool = block->second.small_pool;
      if (block->second.allocated) segment.allocated_bytes += block->second.bytes;
    }
    result.push_back(segment);
  }
  return result;
}

}  // namespace zico::replay
