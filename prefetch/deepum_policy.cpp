#include "deepum_policy.h"

namespace zico::prefetch {

DeepUmPolicy::DeepUmPolicy(const Residency& residency, const TransferModel& /*model*/)
    : residency_(residency), predicted_(residency.page_count(), 0), decided_(residency.page_count(), 0) {}

void DeepUmPolicy::on_free(uint32_t /*block*/, const BlockExtent& /*extent*/, std::span<const PageId> dead,
                           Decisions* out) {
  for (const PageId page : dead) out->push_back({Decision::Kind::kDiscard, page});
}

void DeepUmPolicy::on_faults(const OpView& op, std::span<const PageId> faulted) {
  table_.record_faults(op.exec_id, faulted);
}

void DeepUmPolicy::on_op_start(const OpView& op, Decisions* out) {
  if (has_previous_) table_.record_successor(previous_, op.exec_id);
  previous_ = op.exec_id;
  has_previous_ = true;
  ++launches_;
  ++stamp_;

  // The kernels predicted to run next, the current one first: their pages
  // are what pre-eviction must spare.
  std::vector<uint64_t> chain{op.exec_id};
  for (uint32_t i = 0; i < kLookahead; ++i) {
    uint64_t next = 0;
    if (!table_.predict_next(chain.back(), &next)) break;
    chain.push_back(next);
  }
  for (const PageId page : op.pages) predicted_[page] = stamp_;
  for (const uint64_t id : chain) {
    for (const PageId page : table_.pages(id)) predicted_[page] = stamp_;
  }

  // Slots this walk may fill: free ones, plus those that evictions in flight
  // will free and no queued prefetch has claimed.
  int64_t slots = int64_t{residency_.free_pages()} + residency_.leaving_pages() - residency_.queued_pages();
  const auto& lru = residency_.by_migration();
  auto victim = lru.begin();
  for (size_t k = 1; k < chain.size(); ++k) {
    for (const PageId page : table_.pages(chain[k])) {
      if (residency_.present_or_coming(page) || decided_[page] == stamp_) continue;
      if (slots <= 0) {
        // Pre-evict the least recently migrated page no predicted kernel needs.
        while (victim != lru.end() && (predicted_[victim->second] == stamp_ || decided_[victim->second] == stamp_)) {
          ++victim;
        }
        if (victim == lru.end()) return;  // everything resident is needed soon
        const PageId leaving = victim->second;
        ++victim;
        decided_[leaving] = stamp_;
        out->push_back({Decision::Kind::kEvict, leaving});
        ++slots;
      }
      decided_[page] = stamp_;
      out->push_back({Decision::Kind::kPrefetch, page, launches_ + k});  // kernel order
      --slots;
    }
  }
}

}  // namespace zico::prefetch
