#include "fault_correlator.h"

#include <algorithm>

namespace zico {

void FaultCorrelator::add_kernel(uint32_t correlation_id, uint64_t start_ns, uint64_t end_ns) {
  if (new_kernels_.size() >= kMaxRecords) {
    ++dropped_;
    return;
  }
  new_kernels_.push_back(Kernel{start_ns, std::max(start_ns, end_ns), correlation_id});
}

void FaultCorrelator::add_tag(uint32_t correlation_id, uint64_t tag) {
  if (tags_.size() >= kMaxRecords) {
    ++dropped_;
    return;
  }
  tags_[correlation_id] = tag;
}

void FaultCorrelator::add_fault(uint64_t time_ns, uintptr_t address) {
  if (faults_.size() >= kMaxRecords) {
    ++dropped_;
    return;
  }
  faults_.push_back(Fault{time_ns, address, false});
}

uint64_t FaultCorrelator::tag_of(uint32_t correlation_id) const {
  if (const auto it = tags_.find(correlation_id); it != tags_.end()) return it->second;
  if (const auto it = older_tags_.find(correlation_id); it != older_tags_.end()) return it->second;
  return 0;
}

bool FaultCorrelator::tag_at(uint64_t time_ns, uint64_t* tag) const {
  // The kernels started by then, latest first: the first that still ran
  // then has the fault. Kernels overlap a few at a time, so the walk gives
  // up after kOverlapping.
  auto it = std::upper_bound(kernels_.begin(), kernels_.end(), time_ns,
                             [](uint64_t t, const Kernel& k) { return t < k.start_ns; });
  constexpr int kOverlapping = 64;
  for (int looked = 0; it != kernels_.begin() && looked < kOverlapping; ++looked) {
    --it;
    if (it->end_ns >= time_ns) {
      *tag = tag_of(it->correlation_id);
      return true;
    }
  }
  return false;
}

void FaultCorrelator::resolve(std::vector<ManagedFault>* out) {
  // The previous resolve's kernels and these, by start.
  std::sort(new_kernels_.begin(), new_kernels_.end(),
            [](const Kernel& a, const Kernel& b) { return a.start_ns < b.start_ns; });
  const size_t older = kernels_.size();
  kernels_.insert(kernels_.end(), new_kernels_.begin(), new_kernels_.end());
  std::inplace_merge(kernels_.begin(), kernels_.begin() + static_cast<std::ptrdiff_t>(older), kernels_.end(),
                     [](const Kernel& a, const Kernel& b) { return a.start_ns < b.start_ns; });
  uint64_t last_end = 0;
  for (const Kernel& kernel : kernels_) last_end = std::max(last_end, kernel.end_ns);

  std::stable_sort(faults_.begin(), faults_.end(), [](const Fault& a, const Fault& b) { return a.time_ns < b.time_ns; });
  std::vector<Fault> still_waiting;
  for (Fault& fault : faults_) {
    uint64_t tag = 0;
    if (!tag_at(fault.time_ns, &tag) && fault.time_ns > last_end && !fault.waited) {
      fault.waited = true;  // its kernel's record may be in a buffer not yet handed over
      still_waiting.push_back(fault);
      continue;
    }
    out->push_back(ManagedFault{tag, fault.address});
  }
  faults_ = std::move(still_waiting);

  // Keep this resolve's kernels and tags for the next one only.
  kernels_ = std::move(new_kernels_);
  new_kernels_.clear();
  older_tags_ = std::move(tags_);
  tags_.clear();
}

}  // namespace zico
