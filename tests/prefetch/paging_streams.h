// Access streams for the paging tests: hand-made ones with known answers,
// and random training-like ones (a prologue of persistent blocks, then
// iterations that repeat: transient blocks allocated, used by a few ops and
// freed) for property tests.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "access_stream.h"

namespace zico::prefetch::testing {

// Builds a stream op by op: blocks are laid out one after another (each
// starting on a new page when `own_pages`), ops name the blocks they use.
class StreamBuilder {
 public:
  explicit StreamBuilder(uint64_t page_bytes) { s_.page_bytes = page_bytes; }

  uint32_t allocate(uint64_t bytes, bool own_pages = true) {
    if (own_pages) next_ = (next_ + s_.page_bytes - 1) / s_.page_bytes * s_.page_bytes;
    s_.blocks.push_back({next_, bytes});
    next_ += bytes;
    const auto id = static_cast<uint32_t>(s_.blocks.size() - 1);
    s_.events.push_back({StreamEvent::Kind::kAllocate, id});
    return id;
  }
  // Reuses a freed block's place (a caching allocator would).
  uint32_t allocate_at(uint64_t offset, uint64_t bytes) {
    s_.blocks.push_back({offset, bytes});
    const auto id = static_cast<uint32_t>(s_.blocks.size() - 1);
    s_.events.push_back({StreamEvent::Kind::kAllocate, id});
    return id;
  }
  void free(uint32_t block) { s_.events.push_back({StreamEvent::Kind::kFree, block}); }
  void mark() { s_.events.push_back({StreamEvent::Kind::kIteration, s_.iterations++}); }
  void op(std::vector<uint32_t> blocks, uint64_t duration_ns, uint64_t exec_id) {
    std::sort(blocks.begin(), blocks.end());
    blocks.erase(std::unique(blocks.begin(), blocks.end()), blocks.end());
    StreamOp op;
    op.exec_id = exec_id;
    op.duration_ns = duration_ns;
    op.first_ref = static_cast<uint32_t>(s_.page_refs.size());
    op.first_block = static_cast<uint32_t>(s_.block_refs.size());
    for (const uint32_t b : blocks) {
      for (PageId p = s_.first_page(s_.blocks[b]); p <= s_.last_page(s_.blocks[b]); ++p) s_.page_refs.push_back(p);
      s_.block_refs.push_back(b);
    }
    const auto first = s_.page_refs.begin() + op.first_ref;
    std::sort(first, s_.page_refs.end());
    s_.page_refs.erase(std::unique(first, s_.page_refs.end()), s_.page_refs.end());
    op.ref_count = static_cast<uint32_t>(s_.page_refs.size() - op.first_ref);
    op.block_count = static_cast<uint32_t>(blocks.size());
    s_.events.push_back({StreamEvent::Kind::kOp, static_cast<uint32_t>(s_.ops.size())});
    s_.ops.push_back(op);
  }
  AccessStream finish() {
    uint64_t end = 0;
    for (const BlockExtent& b : s_.blocks) end = std::max(end, b.offset + b.bytes);
    s_.page_count = static_cast<uint32_t>((end + s_.page_bytes - 1) / s_.page_bytes);
    return s_;
  }

 private:
  AccessStream s_;
  uint64_t next_ = 0;
};

// A training-like stream: `persistent` weights used in a forward pass and a
// backward pass, activations made in forward, kept for backward and freed
// there, temporaries inside an op; blocks may share pages. Every iteration
// repeats the first one's sizes, addresses and op identities.
inline AccessStream random_training_stream(uint32_t seed, uint32_t iterations, uint64_t page_bytes) {
  std::mt19937 rng(seed);
  auto pick = [&](uint64_t lo, uint64_t hi) { return std::uniform_int_distribution<uint64_t>(lo, hi)(rng); };
  StreamBuilder b(page_bytes);
  const bool share = pick(0, 1) == 1;
  const auto layers = static_cast<uint32_t>(pick(2, 6));
  std::vector<uint32_t> weights;
  for (uint32_t l = 0; l < layers; ++l) weights.push_back(b.allocate(pick(page_bytes / 4, 3 * page_bytes), !share));
  std::vector<uint64_t> act_bytes;
  std::vector<uint64_t> durations;
  for (uint32_t l = 0; l < layers; ++l) {
    act_bytes.push_back(pick(page_bytes / 2, 4 * page_bytes));
    durations.push_back(pick(1000, 200000));
  }
  // Activations get fixed places after the weights, as a caching allocator
  // reusing its segments would give them.
  std::vector<uint64_t> act_offset;
  uint64_t at = b.finish().page_count * page_bytes;
  for (uint32_t l = 0; l < layers; ++l) {
    act_offset.push_back(at);
    at += (act_bytes[l] + page_bytes - 1) / page_bytes * page_bytes;
  }
  const uint64_t temp_offset = at;
  b.allocate_at(temp_offset + 2 * page_bytes, 1);  // the stream's page count covers the extra block
  for (uint32_t it = 0; it < iterations; ++it) {
    b.mark();
    std::vector<uint32_t> acts;
    uint32_t input = b.allocate_at(act_offset[0], act_bytes[0]);
    b.op({input}, 1000, 1);
    acts.push_back(input);
    // Now and then an iteration that departs from the others (an evaluation
    // step, a new sequence length): one more op, and a block of its own.
    if (seed % 3 == 0 && it == 2) {
      const uint32_t extra = b.allocate_at(temp_offset, page_bytes + 1);
      b.op({input, weights[0], extra}, 3000, 999);
      b.free(extra);
    }
    for (uint32_t l = 1; l < layers; ++l) {
      const uint32_t out = b.allocate_at(act_offset[l], act_bytes[l]);
      b.op({acts.back(), weights[l - 1], out}, durations[l], 100 + l);
      acts.push_back(out);
    }
    for (uint32_t l = layers; l-- > 1;) {
      const uint32_t temp = b.allocate_at(temp_offset, page_bytes / 2);
      b.op({acts[l], acts[l - 1], weights[l - 1], temp}, 2 * durations[l], 200 + l);
      b.free(temp);
      b.free(acts[l]);
    }
    b.free(acts[0]);
    b.op({weights.begin(), weights.end()}, 5000, 300);  // the optimizer step
  }
  return b.finish();
}

}  // namespace zico::prefetch::testing
