// FaultCorrelator: CUPTI's activity records turned into fault reports that
// name the op which faulted.
//
// CUPTI reports a GPU page fault with the page's address and the time the
// driver began to serve it, but not the kernel (its stream field is
// documented as invalid). A kernel's record has its run on the GPU (start,
// end) and CUPTI's correlation ID; an external-correlation record ties that
// ID to the tag pushed around the launch (Driver::tag_work). So a fault
// belongs to the kernel whose run covers the fault's time (the latest to
// start, where kernels overlap), and carries that kernel's tag.
//
// Records come in buffers, the kinds in no set order: a fault no kernel seen
// yet covers, later than every kernel seen, waits for one more resolve(), then
// goes untagged (its page is still reported). Kernels and tags are kept for
// one resolve() after the one they arrived before. Between two resolves at
// most kMaxRecords of each kind are kept (a job that runs long without one:
// the rest are dropped and counted).
//
// Not thread-safe: CuptiFaults calls it under its mutex.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "driver.h"

namespace zico {

class FaultCorrelator {
 public:
  static constexpr size_t kMaxRecords = size_t{1} << 20;

  void add_kernel(uint32_t correlation_id, uint64_t start_ns, uint64_t end_ns);
  void add_tag(uint32_t correlation_id, uint64_t tag);
  void add_fault(uint64_t time_ns, uintptr_t address);
  // Appends every fault that can be told now to *out, each with its
  // kernel's tag (0: none, or a kernel launched untagged), oldest first.
  void resolve(std::vector<ManagedFault>* out);
  // Faults waiting for their kernel's record.
  [[nodiscard]] size_t waiting() const { return faults_.size(); }
  // Records dropped for want of a resolve().
  [[nodiscard]] uint64_t dropped() const { return dropped_; }

 private:
  struct Kernel {
    uint64_t start_ns = 0;
    uint64_t end_ns = 0;
    uint32_t correlation_id = 0;
  };
  struct Fault {
    uint64_t time_ns = 0;
    uintptr_t address = 0;
    bool waited = false;  // kept over one resolve() already
  };

  // The tag of the kernel running at `time_ns`; false when none covers it.
  bool tag_at(uint64_t time_ns, uint64_t* tag) const;
  uint64_t tag_of(uint32_t correlation_id) const;

  std::vector<Kernel> kernels_;       // sorted by start at resolve()
  std::vector<Kernel> new_kernels_;   // since the last resolve()
  std::unordered_map<uint32_t, uint64_t> tags_;
  std::unordered_map<uint32_t, uint64_t> older_tags_;
  std::vector<Fault> faults_;
  uint64_t dropped_ = 0;
};

}  // namespace zico
