// TransferModel: what moving a page between host and GPU costs, in one place.
//
// The paging simulator charges every transfer and every fault batch from these
// numbers, and the planners read them to time their work; calibrating them on
// a GPU means changing this struct only. Defaults model an H100 on PCIe Gen5
// x16 with an x86 host. Each default names its source (the numbered rows of
// the team's paging-numbers note, which cites the primary sources); none was
// measured here, so all of them await calibration on the device.
//
// The model:
// - Two copy engines, one per direction, each running its transfers one after
//   another while compute runs. A transfer of s bytes takes s / (bandwidth x
//   efficiency(s)); while the other direction is busy at the same moment,
//   bandwidth is scaled by `duplex_factor`.
// - A fault stalls the GPU. Faults are served in batches of up to
//   `fault_batch_pages` pages: each batch costs `fault_batch_ns` (fetching the
//   fault buffer, page-table walks, mapping; the GPU waits), then, serially as
//   the UVM driver does it, evicts what it must to make room (D2H at link
//   rate) and migrates the faulted pages at the lower fault-driven bandwidth.
// - A page that holds no data (never written, or discarded) is populated on
//   the GPU without a transfer; a fault on it still pays the batch cost.
// - Host time (the calibration's figures; none by default): the moves decided
//   at one event are one driver call per direction, each on its own pager
//   thread, which pays per call, per contiguous range and per page before its
//   copies may start, waits first for its stream's earlier copies where
//   ordered_call_waits says so, and, for a move to the host under
//   to_host_sync, for the copies and the CPU's mapping of each page after.
//   A faulted page stalls the GPU fault_block_ns more than its copy.
#pragma once

#include <cstdint>
#include <string>

namespace zico::prefetch {

struct TransferModel {
  // Explicit copies and prefetches, host to device: H100 SXM copy-engine
  // H2D 55.36 GB/s with nvbandwidth (row 3.1).
  double h2d_bytes_per_s = 55e9;
  // Pre-evictions, device to host: 55.20 GB/s (row 3.1).
  double d2h_bytes_per_s = 55e9;
  // Each direction's share of its bandwidth while the other one runs too:
  // 0.86-0.93 on a Gen5 host path (row 3.3, B300; no H100 figure exists).
  double duplex_factor = 0.9;
  // Small copies run below the link's rate: efficiency(s) = (2 / pi) x
  // atan(s / knee), the shape GPGPU-Sim's UVMSmart fits to measured transfer
  // latency against size (row 1.19: half the rate at 13.7 KB; 0.87 at
  // 64 KiB, 0.996 at 2 MiB). 0 turns it off.
  double size_knee_bytes = 13.7e3;
  // Fault-driven migration: about 0.4 x the link on streaming access (row
  // 1.25: 22.1 GB/s effective on a Gen5 RTX 5090 at 1.2x oversubscription).
  double fault_bytes_per_s = 20e9;
  // Pages served per fault batch: 256 fault entries per batch (row 1.1),
  // counted here as one entry per page of the model.
  uint32_t fault_batch_pages = 256;
  // Fixed cost of one fault batch, GPU stalled: 45 us, the far-fault cost
  // GPGPU-Sim's UVMSmart model and the G10 simulator both use (rows 1.13,
  // 1.14; 30-45 us in row 1.15).
  uint64_t fault_batch_ns = 45000;

  // What the GPU suite's calibration step measures beyond the rates
  // (docs/gpu-report.md; umm/gpu_calibration.h sets them from its file).
  // Each default is today's model: nothing charged.
  // The GPU's stall per faulted 2 MiB block beyond its copy (fault and
  // replay rounds: UVM fills a block 64 KiB at a time).
  uint64_t fault_block_ns = 0;
  // Host time, on the thread that issues the call: per migration call into
  // the driver, per contiguous range in it (one UVM ioctl each), per 2 MiB
  // block it moves.
  uint64_t call_ns = 0;
  uint64_t range_ns = 0;
  uint64_t block_ns = 0;
  // A move to the host returns only after its copy (UVM maps the CPU after
  // the copy, inside the ioctl), then pays cpu_map_block_ns per block for
  // the CPU's page-table entries.
  bool to_host_sync = false;
  uint64_t cpu_map_block_ns = 0;
  // A migration call on a stream returns only once the stream's earlier work
  // is done (the UVM migrate ioctl takes no "after this" input: the library
  // enforces the order, on the calling thread or not).
  bool ordered_call_waits = false;
  // Host time of one discard call, and of one kernel launch (the
  // application's own, which the calls above delay).
  uint64_t discard_call_ns = 0;
  uint64_t launch_ns = 0;

  // The share of the link's rate a copy of `bytes` gets.
  [[nodiscard]] double efficiency(uint64_t bytes) const;
  // Time for one transfer of `bytes` in one direction; `duplex`: the other
  // direction is busy at the same time.
  [[nodiscard]] uint64_t h2d_ns(uint64_t bytes, bool duplex) const;
  [[nodiscard]] uint64_t d2h_ns(uint64_t bytes, bool duplex) const;
  // Migration time of `bytes` on the fault path (its rate is measured on
  // streaming faults, size effects included).
  [[nodiscard]] uint64_t fault_transfer_ns(uint64_t bytes) const;
  // Write-back of `bytes` evicted on the fault path (link rate).
  [[nodiscard]] uint64_t fault_evict_ns(uint64_t bytes) const;

  // Empty when every field is usable; otherwise names the first bad one and
  // its value.
  [[nodiscard]] std::string invalid_field() const;
};

}  // namespace zico::prefetch
