// UmPolicy: plain CUDA Unified Memory oversubscription, the baseline users
// get from cudaMallocManaged today. It decides nothing: every page is faulted
// in when a kernel touches it, the driver evicts the least recently migrated
// page when the budget is full, and since nobody tells the driver which
// memory is dead, freed blocks are written back and fetched again like live
// ones. All of that is the executor's fault path; this class only names it.
#pragma once

#include "paging_policy.h"

namespace zico::prefetch {

class UmPolicy final : public PagingPolicy {
 public:
  [[nodiscard]] const char* name() const override { return "um"; }
};

}  // namespace zico::prefetch
