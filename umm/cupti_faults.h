// CuptiFaults: the GPU's unified-memory page faults, from CUPTI's activity
// API, as fault reports naming the op that faulted (driver.h, ManagedFault).
//
// libcupti is loaded at run time: the copy the process already has (PyTorch
// loads one with its profiler), else libcupti.so.13, .12 or libcupti.so from
// the loader's path (one newer than the driver refuses, and says so).
// Nothing links it and no CUPTI header is needed to build: the few entry
// points, enumerators and record fields used are declared in
// cupti_faults.cpp (checked against CUPTI's headers where they are
// present). The record kinds enabled: unified-memory counters (GPU page
// faults, and host-to-device transfers, of which those a fault caused are
// read as that fault: some platforms report no fault records at all),
// concurrent kernels (their runs on the GPU; this kind does
// not serialize kernels), external correlations, which carry the tag pushed
// around each announced launch (CUPTI's CUSTOM2 kind, which PyTorch's
// profiler leaves alone), and the driver's and runtime's API calls, whose
// records CUPTI ties those tags to (they are skipped). FaultCorrelator
// matches them. A take flushes what CUPTI has finished, and forces the
// buffers still open over when a few takes in a row got nothing. What this
// costs a running job: docs/benchmarks.md ("On an H100").
//
// CUPTI's activity buffers are the process's: once another tool registers
// its own callbacks (PyTorch's profiler does when it starts), the reports
// stop for good; a buffer CUPTI hands over that this code did not allocate
// is read and left alone. One instance per process, never destroyed (CUPTI
// may hand buffers back until the process ends). Thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "driver.h"
#include "status.h"

namespace zico {

class CuptiFaults {
 public:
  // Starts the reports for CUDA device `ordinal` (a second call adds a
  // device). Null, with one sentence in *why, when libcupti cannot be loaded
  // or refuses (an old CUPTI, no unified-memory profiling on this system).
  [[nodiscard]] static CuptiFaults* start(int ordinal, std::string* why) noexcept;

  void push_tag(uint64_t tag) noexcept;
  void pop_tag() noexcept;
  // Hands CUPTI's finished buffers over and appends the faults they hold
  // of pages inside `range` (one device's arena); the others wait for
  // their own device's take (at most kMaxWaiting reports, then dropped).
  [[nodiscard]] Status take(VaRange range, std::vector<ManagedFault>* out) noexcept;
  static constexpr size_t kMaxWaiting = size_t{1} << 20;

 private:
  CuptiFaults() = default;
};

}  // namespace zico
