// CorrelationTable: DeepUM's two tables, learned from a running job.
//
// - The execution-ID table: for each kernel launch identity (execution ID:
//   kernel and arguments, hashed), the launches seen right after it, most
//   recent first, at most kSuccessors (SnuRHAC's correlator keeps 4, MRU).
//   Following the first successor from launch to launch predicts the kernels
//   to come.
// - The page table: for each execution ID, the pages its launches faulted on.
//   Only faults teach it, as in DeepUM (a page that was already resident
//   never shows up), so the table fills while the job runs on demand paging
//   and is complete once a launch's pages have all faulted once.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "access_stream.h"

namespace zico::prefetch {

class CorrelationTable {
 public:
  static constexpr size_t kSuccessors = 4;

  // `next` ran right after `previous`.
  void record_successor(uint64_t previous, uint64_t next);
  // The most recent successor of `exec_id`; false when none was seen.
  [[nodiscard]] bool predict_next(uint64_t exec_id, uint64_t* next) const;

  // Adds faulted pages to the launch's page table (duplicates are dropped).
  void record_faults(uint64_t exec_id, std::span<const PageId> pages);
  [[nodiscard]] std::span<const PageId> pages(uint64_t exec_id) const;

 private:
  struct Successors {
    std::array<uint64_t, kSuccessors> ids{};
    uint8_t count = 0;
  };
  std::unordered_map<uint64_t, Successors> successors_;
  std::unordered_map<uint64_t, std::vector<PageId>> pages_;  // sorted
};

}  // namespace zico::prefetch
