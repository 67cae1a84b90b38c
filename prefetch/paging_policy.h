// PagingPolicy: the brain of beyond-capacity paging, one class per strategy.
//
// A policy is fed one job's events in program order, each with the residency
// as it stands when the event happens, and answers with decisions that the
// executor carries out in the order given:
//   prefetch — bring a page to the GPU ahead of use (a slot must be free now,
//              or freed by an eviction in flight; otherwise it is refused);
//   evict    — move a resident page to the host (a copy when it holds data);
//   discard  — drop a dead page's contents wherever they are, so it is never
//              copied again (refused, and counted, if the page is still live);
//              a resident page keeps its slot, and evicting it is then free.
// Whatever a policy leaves undone the executor's fault path does as the UVM
// driver would: a page an op needs and does not find is faulted in, and room
// is made by evicting the least recently migrated page.
//
// The same policy objects run in the paging simulator (tools/page), in the UM
// runtime, and in the tests; nothing here knows about CUDA, time sources or
// sockets. Events carry no clock: policies plan by op positions and the op
// durations they are told.
//
// Not thread-safe: one policy per job, driven by one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "access_stream.h"
#include "residency.h"
#include "transfer_model.h"

namespace zico::prefetch {

struct Decision {
  enum class Kind : uint8_t { kPrefetch, kEvict, kDiscard };
  Kind kind = Kind::kPrefetch;
  PageId page = 0;
  // Prefetches: the smaller, the sooner the page is needed. The executor
  // copies queued pages in this order, then in the order issued.
  uint64_t priority = 0;
};
using Decisions = std::vector<Decision>;

struct OpView {
  uint64_t exec_id = 0;
  uint64_t duration_ns = 0;
  std::span<const PageId> pages;     // sorted, no repeats
  std::span<const uint32_t> blocks;  // the blocks it uses, by the ids on_allocate gave
};

class PagingPolicy {
 public:
  virtual ~PagingPolicy() = default;
  [[nodiscard]] virtual const char* name() const = 0;
  // Whether the executor fetches, before the op runs, the pages an op names
  // that are still absent after on_op_start's decisions (room made as for a
  // fault), instead of letting the op fault them in. A fetch runs at the copy
  // engine's rate, a fault at the fault path's, with the op's threads waiting.
  [[nodiscard]] virtual bool fetches_named_pages() const { return false; }

  // Block ids are the caller's (an allocation counter), unique among live blocks.
  virtual void on_allocate(uint32_t /*block*/, const BlockExtent& /*extent*/, Decisions* /*out*/) {}
  // `dead`: the pages this free left without live bytes.
  virtual void on_free(uint32_t /*block*/, const BlockExtent& /*extent*/, std::span<const PageId> /*dead*/,
                       Decisions* /*out*/) {}
  // Before the op runs; its pages are pinned from the decisions on until it
  // ends (evicting one is refused).
  virtual void on_op_start(const OpView& /*op*/, Decisions* /*out*/) {}
  // The pages the op faulted on (DeepUM learns its tables from these).
  virtual void on_faults(const OpView& /*op*/, std::span<const PageId> /*faulted*/) {}
  virtual void on_op_end(const OpView& /*op*/, Decisions* /*out*/) {}
  // Iteration `n` begins (an explicit mark or a detected boundary).
  virtual void on_iteration(uint32_t /*n*/, Decisions* /*out*/) {}
  // Ops in the last iteration the policy found in the op stream itself,
  // where no marks came (0: none found, marked, or the policy looks for none).
  [[nodiscard]] virtual uint32_t found_iteration_ops() const { return 0; }
};

// The policies by name: "um", "deepum", "autoswap", "zico"; nullptr for
// another name. `residency` and `model` must outlive the policy.
[[nodiscard]] std::unique_ptr<PagingPolicy> make_policy(std::string_view name, const Residency& residency,
                                                        const TransferModel& model);
inline constexpr std::string_view kPolicyNames[] = {"um", "deepum", "autoswap", "zico"};

}  // namespace zico::prefetch
