// GpuCalibration: the cost figures the GPU suite's calibration step measured
// on one device (tests/gpu/run.sh, step `calibration`, which writes
// OUTDIR/calibration.json), for the models that charge what unified memory
// costs: SimDriver's managed memory (SimManagedCosts), the paging
// simulator's and the live pager's transfer model (prefetch/TransferModel).
//
// The file is one JSON object:
//   {"device": "...", "driver": "...", "cuda": "...", "commit": "...", "date": "YYYY-MM-DD",
//    "model": {"h2d_bytes_per_s": 5.5e10, ..., "launch_ns": 0},
//    "sources": {"h2d_bytes_per_s": "P2: 256 contiguous blocks, median of 5", ...}}
// Every key is optional; a model key that is absent leaves the model's own
// default. The model keys and their meaning are those of kCalibrationKeys
// (below). Anything else is refused: an unknown key, a value of the wrong
// kind or out of range, JSON that does not parse. The error names the key or
// value and the accepted form, as ZICO_* variables do.
//
// ZICO_GPU_CALIBRATION=FILE (umm/config.cpp) and zico-umctl page/simulate's
// --calibration FILE read it. Where a host link rate is also given
// (ZICO_HOST_BANDWIDTH, --host-bandwidth), the calibration is applied first
// and the explicit rate then moves the link as on_host_link does: the
// explicit figure wins.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "status.h"

namespace zico {

struct GpuCalibration {
  // Where and when it was measured (free text, as the suite wrote it).
  std::string device, driver, cuda, commit, date;

  // Link rates, bytes per second, > 0.
  std::optional<double> h2d_bytes_per_s;    // explicit prefetch to the GPU, 2 MiB blocks, idle link
  std::optional<double> d2h_bytes_per_s;    // explicit prefetch to the host
  std::optional<double> duplex_factor;      // each direction's share while the other runs, (0, 1]
  std::optional<double> fault_bytes_per_s;  // fault-path migration, streaming access
  // Times in nanoseconds, >= 0.
  std::optional<uint64_t> fault_block_ns;    // GPU stall per faulted 2 MiB block beyond its copy
  std::optional<uint64_t> call_ns;           // host time per migration call into the driver
  std::optional<uint64_t> range_ns;          // host time per contiguous range in a call
  std::optional<uint64_t> block_ns;          // host time per 2 MiB block moved
  std::optional<bool> to_host_sync;          // a move to the host returns only after its copy
  std::optional<bool> ordered_call_waits;    // a migration call waits for its stream's earlier work
  std::optional<uint64_t> cpu_map_block_ns;  // host time per block moved to the host, after its copy
  std::optional<uint64_t> discard_call_ns;   // host time per discard call
  std::optional<uint64_t> launch_ns;         // host time of one kernel launch
  // Host time of each virtual-memory call on one 2 MiB chunk (a swapped
  // page's trip in and out, ZICO_UM_MEMORY=swap).
  std::optional<uint64_t> chunk_create_ns;   // cuMemCreate
  std::optional<uint64_t> chunk_map_ns;      // cuMemMap
  std::optional<uint64_t> chunk_access_ns;   // cuMemSetAccess
  std::optional<uint64_t> chunk_unmap_ns;    // cuMemUnmap
  std::optional<uint64_t> chunk_release_ns;  // cuMemRelease

  // Model key -> how it was measured (one line each).
  std::map<std::string, std::string> sources;
};

// The "model" keys a calibration file may hold, in the file's order.
inline constexpr std::string_view kCalibrationKeys[] = {
    "h2d_bytes_per_s", "d2h_bytes_per_s", "duplex_factor",   "fault_bytes_per_s",
    "fault_block_ns",  "call_ns",         "range_ns",        "block_ns",
    "to_host_sync",    "cpu_map_block_ns", "discard_call_ns", "launch_ns",
    "ordered_call_waits", "chunk_create_ns", "chunk_map_ns", "chunk_access_ns", "chunk_unmap_ns",
    "chunk_release_ns"};

// Parses the file's text. On failure returns kConfigError and sets *error to
// one line naming the key or value at fault and the accepted form.
[[nodiscard]] Status parse_gpu_calibration(std::string_view text, GpuCalibration* out, std::string* error);
// Reads and parses FILE; an unreadable file is an error naming it.
[[nodiscard]] Status read_gpu_calibration_file(const std::string& path, GpuCalibration* out, std::string* error);

// `model` (a TransferModel, a SimManagedCosts: any struct with the model
// keys as members; the chunk keys only where it has them: the planners do
// not charge them) with every figure the calibration holds set, the others
// left as they were.
template <typename Model>
[[nodiscard]] Model with_calibration(Model model, const GpuCalibration& c) {
  if (c.h2d_bytes_per_s) model.h2d_bytes_per_s = *c.h2d_bytes_per_s;
  if (c.d2h_bytes_per_s) model.d2h_bytes_per_s = *c.d2h_bytes_per_s;
  if (c.duplex_factor) model.duplex_factor = *c.duplex_factor;
  if (c.fault_bytes_per_s) model.fault_bytes_per_s = *c.fault_bytes_per_s;
  if (c.fault_block_ns) model.fault_block_ns = *c.fault_block_ns;
  if (c.call_ns) model.call_ns = *c.call_ns;
  if (c.range_ns) model.range_ns = *c.range_ns;
  if (c.block_ns) model.block_ns = *c.block_ns;
  if (c.to_host_sync) model.to_host_sync = *c.to_host_sync;
  if (c.ordered_call_waits) model.ordered_call_waits = *c.ordered_call_waits;
  if (c.cpu_map_block_ns) model.cpu_map_block_ns = *c.cpu_map_block_ns;
  if (c.discard_call_ns) model.discard_call_ns = *c.discard_call_ns;
  if (c.launch_ns) model.launch_ns = *c.launch_ns;
  if constexpr (requires { model.chunk_map_ns; }) {
    if (c.chunk_create_ns) model.chunk_create_ns = *c.chunk_create_ns;
    if (c.chunk_map_ns) model.chunk_map_ns = *c.chunk_map_ns;
    if (c.chunk_access_ns) model.chunk_access_ns = *c.chunk_access_ns;
    if (c.chunk_unmap_ns) model.chunk_unmap_ns = *c.chunk_unmap_ns;
    if (c.chunk_release_ns) model.chunk_release_ns = *c.chunk_release_ns;
  }
  return model;
}

}  // namespace zico
