// DeepUmPolicy: DeepUM (Jung, Kim, Lee, ASPLOS'23), as a policy.
//
// What it does, in DeepUM's terms:
// - Correlation prefetching. Every launch's execution ID updates the
//   execution-ID table (which launch follows which) and every fault the
//   launch's page table (correlation_table.h). At each launch the policy
//   follows the table from the current ID to the predicted next kernels, up
//   to kLookahead of them, and prefetches the pages their tables list, in the
//   order the kernels will need them.
// - Pre-eviction. When a prefetch finds no free slot, the least recently
//   migrated resident page that no predicted kernel needs leaves first, so the
//   fault path rarely has to evict.
// - Invalidation. A page whose blocks were all freed is discarded: dead data
//   is never written back.
// DeepUM's prefetch depth is not published; kLookahead kernels (far more than
// the three levels of SnuRHAC's correlator) leaves it every chance to hide a
// transfer behind compute. Its driver-side details (a fault queue, fault
// priority over prefetches) belong to the executor here, shared by all
// policies.
#pragma once

#include <cstdint>
#include <vector>

#include "correlation_table.h"
#include "paging_policy.h"

namespace zico::prefetch {

class DeepUmPolicy final : public PagingPolicy {
 public:
  static constexpr uint32_t kLookahead = 32;

  DeepUmPolicy(const Residency& residency, const TransferModel& model);
  [[nodiscard]] const char* name() const override { return "deepum"; }

  void on_free(uint32_t block, const BlockExtent& extent, std::span<const PageId> dead, Decisions* out) override;
  void on_op_start(const OpView& op, Decisions* out) override;
  void on_faults(const OpView& op, std::span<const PageId> faulted) override;

 private:
  const Residency& residency_;
  CorrelationTable table_;
  uint64_t previous_ = 0;
  bool has_previous_ = false;
  uint64_t launches_ = 0;  // prefetches are prioritised by the launch they are predicted for
  // Per page: the stamp of the walk that predicted it, of the walk that
  // prefetched or evicted it (so one walk decides each page once).
  std::vector<uint32_t> predicted_;
  std::vector<uint32_t> decided_;
  uint32_t stamp_ = 0;
};

}  // namespace zico::prefetch
