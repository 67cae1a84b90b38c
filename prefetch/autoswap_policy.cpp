#include "autoswap_policy.h"

#include <algorithm>

namespace zico::prefetch {
namespace {

struct Candidate {
  uint32_t block = 0;
  uint32_t last_use = 0;  // position of the use before the absence
  uint32_t next_use = 0;  // position of the use after it, + L when it is in the next iteration
  uint64_t gap_start = 0;
  uint64_t gap_end = 0;
  uint64_t bytes = 0;
  double score = 0;
};

}  // namespace

AutoSwapPolicy::AutoSwapPolicy(const Residency& residency, const TransferModel& model)
    : residency_(residency), model_(model) {}

AutoSwapPolicy::PageRange AutoSwapPolicy::pages_of(const BlockExtent& extent) const {
  const uint64_t page = residency_.page_bytes();
  return {static_cast<PageId>(extent.offset / page), static_cast<PageId>((extent.offset + extent.bytes - 1) / page)};
}

// Two blocks' page ranges share at most one page, at an end of each (their
// bytes do not overlap); what an earlier range of the same moment moves is
// not asked for again.
void AutoSwapPolicy::add_pages(std::vector<PageRange>* ranges, PageRange range) {
  const auto taken = [&](PageId page) {
    return std::any_of(ranges->begin(), ranges->end(), [&](const PageRange& r) { return r.first <= page && page <= r.last; });
  };
  while (range.first <= range.last && taken(range.first)) ++range.first;
  while (range.first <= range.last && taken(range.last)) --range.last;
  if (range.first <= range.last) ranges->push_back(range);
}

void AutoSwapPolicy::on_allocate(uint32_t block, const BlockExtent& extent, Decisions* /*out*/) {
  live_[block] = extent;
  if (!recording_started_) return;
  recording_.changes.emplace_back(block, true);
  recording_.change_op.push_back(position_);
  recording_.extents[block] = extent;
}

void AutoSwapPolicy::on_free(uint32_t block, const BlockExtent& /*extent*/, std::span<const PageId> dead,
                             Decisions* out) {
  live_.erase(block);
  if (recording_started_) {
    recording_.changes.emplace_back(block, false);
    recording_.change_op.push_back(position_);
  }
  for (const PageId page : dead) out->push_back({Decision::Kind::kDiscard, page});
}

void AutoSwapPolicy::on_op_start(const OpView& op, Decisions* out) {
  if (recording_started_) {
    recording_.durations.push_back(op.duration_ns);
    recording_.op_blocks.emplace_back(op.blocks.begin(), op.blocks.end());
  }
  if (position_ >= in_at_start_.size()) return;
  for (const PageRange& range : in_at_start_[position_]) {
    for (PageId page = range.first; page <= range.last; ++page) {
      if (residency_.state(page) == PageState::kAbsent) out->push_back({Decision::Kind::kPrefetch, page});
    }
  }
}

void AutoSwapPolicy::on_op_end(const OpView& /*op*/, Decisions* out) {
  if (position_ < out_at_end_.size()) {
    for (const PageRange& range : out_at_end_[position_]) {
      for (PageId page = range.first; page <= range.last; ++page) {
        if (residency_.state(page) == PageState::kResident) out->push_back({Decision::Kind::kEvict, page});
      }
    }
  }
  ++position_;
}

void AutoSwapPolicy::on_iteration(uint32_t /*n*/, Decisions* /*out*/) {
  if (recording_started_ && !recording_.durations.empty()) plan(recording_);
  recording_ = Recording{};
  recording_started_ = true;
  for (const auto& [block, extent] : live_) {
    recording_.live_at_start.push_back(block);
    recording_.extents[block] = extent;
  }
  position_ = 0;
}

void AutoSwapPolicy::plan(const Recording& r) {
  const auto ops = static_cast<uint32_t>(r.durations.size());
  in_at_start_.assign(ops, {});
  out_at_end_.assign(ops, {});

  // The in-memory timeline: op i starts at start[i]; the iteration lasts total.
  std::vector<uint64_t> start(ops);
  uint64_t total = 0;
  for (uint32_t i = 0; i < ops; ++i) {
    start[i] = total;
    total += r.durations[i];
  }
  auto unrolled_start = [&](uint32_t p) { return p < ops ? start[p] : total + start[p - ops]; };

  // Live bytes at each op (the load curve), and each block's life and uses.
  struct Life {
    uint32_t from = 0;
    uint32_t to = 0;  // alive at ops [from, to)
    std::vector<uint32_t> uses;
  };
  std::unordered_map<uint32_t, Life> lives;
  std::vector<int64_t> delta(ops + 1, 0);
  for (const uint32_t block : r.live_at_start) {
    lives[block] = {0, ops, {}};
    delta[0] += static_cast<int64_t>(r.extents.at(block).bytes);
  }
  for (size_t i = 0; i < r.changes.size(); ++i) {
    const auto [block, allocated] = r.changes[i];
    const uint32_t at = r.change_op[i];
    const auto bytes = static_cast<int64_t>(r.extents.at(block).bytes);
    if (allocated) {
      lives[block] = {at, ops, {}};
      delta[at] += bytes;
    } else {
      lives[block].to = at;
      delta[at] -= bytes;
    }
  }
  std::vector<int64_t> load(ops);
  int64_t running = 0;
  for (uint32_t i = 0; i < ops; ++i) load[i] = running += delta[i];
  for (uint32_t i = 0; i < ops; ++i) {
    for (const uint32_t block : r.op_blocks[i]) {
      const auto it = lives.find(block);
      if (it != lives.end()) it->second.uses.push_back(i);
    }
  }

  std::vector<Candidate> candidates;
  for (const auto& entry : lives) {
    const uint32_t block = entry.first;
    const Life& life = entry.second;
    const uint64_t bytes = r.extents.at(block).bytes;
    if (bytes < kMinBlockBytes || life.uses.empty()) continue;
    const uint64_t swap_ns = model_.d2h_ns(bytes, false) + model_.h2d_ns(bytes, false);
    auto add = [&](uint32_t last_use, uint32_t next_use) {
      const uint64_t gap_start = start[last_use] + r.durations[last_use];
      const uint64_t gap_end = unrolled_start(next_use);
      if (gap_end <= gap_start || gap_end - gap_start <= swap_ns) return;
      const double duration = static_cast<double>(gap_end - gap_start);
      const double score = duration * static_cast<double>(bytes);
      candidates.push_back({block, last_use, next_use, gap_start, gap_end, bytes, score});
    };
    for (size_t j = 0; j + 1 < life.uses.size(); ++j) add(life.uses[j], life.uses[j + 1]);
    // Across the iteration's end, for blocks that outlive it.
    if (life.from == 0 && life.to == ops) add(life.uses.back(), life.uses.front() + ops);
  }
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    return a.score != b.score ? a.score > b.score : a.block < b.block;
  });

  const auto limit = static_cast<int64_t>(uint64_t{residency_.budget_pages()} * residency_.page_bytes());
  int64_t peak = ops == 0 ? 0 : *std::max_element(load.begin(), load.end());
  for (const Candidate& c : candidates) {
    if (peak <= limit) break;
    const uint64_t away_from = c.gap_start + model_.d2h_ns(c.bytes, false);
    const uint64_t away_until = c.gap_end - model_.h2d_ns(c.bytes, false);
    bool helps = false;
    for (uint32_t p = c.last_use + 1; p < c.next_use; ++p) {
      const uint64_t t = unrolled_start(p);
      if (t >= away_from && t < away_until && load[p % ops] > limit) {
        helps = true;
        break;
      }
    }
    if (!helps) continue;
    uint32_t swap_in_at = c.last_use + 1;
    for (uint32_t p = c.last_use + 1; p < c.next_use; ++p) {
      const uint64_t t = unrolled_start(p);
      if (t >= away_from && t < away_until) load[p % ops] -= static_cast<int64_t>(c.bytes);
      if (t <= away_until) swap_in_at = p;
    }
    peak = *std::max_element(load.begin(), load.end());
    const PageRange range = pages_of(r.extents.at(c.block));
    add_pages(&out_at_end_[c.last_use], range);
    add_pages(&in_at_start_[swap_in_at % ops], range);
  }
}

}  // namespace zico::prefetch
