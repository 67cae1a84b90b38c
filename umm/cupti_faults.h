// CuptiFaults: the GPU's unified-memory page faults, from CUPTI's activity
// API, as fault reports naming the op that faulted (driver.h, ManagedFault).
//
// libcupti is loaded at run time: the copy the process already has (PyTorch
// loads one with its profiler), else libcupti.so.13, .12 or libcupti.so from
// the loader's path. Nothing links it and no CUPTI header is needed to
// build: the few entry points, enumerators and record fields used are
// declared in cupti_faults.cpp (checked against CUPTI's headers where they
// are present). Three record kinds are enabled: unified-memory counters
// (GPU page faults only), concurrent kernels (their runs on the GPU; this
// kind does not serialize kernels) and external correlations, which carry
// the tag pushed around each announced launch (CUPTI's CUSTOM2 kind, which
// PyTorch's profiler leaves alone). FaultCorrelator matches them.
//
// CUPTI's activity buffers are the process's: while another tool registers
// its own (PyTorch's profiler does while it profiles), the reports stop.
// One instance per process, never destroyed (CUPTI may hand buffers back
// until the process ends). Thread-safe.
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
  // Hands CUPTI's finished buffers over and appends the faults they hold.
  [[nodiscard]] Status take(std::vector<ManagedFault>* out) noexcept;

 private:
  CuptiFaults() = default;
};

}  // namespace zico
