// UmReplay: an access stream run by the live pager (prefetch/um_pager.h) on
// SimDriver's unified memory, the way libzicoum runs a job in UM mode: the
// blocks are laid out in one managed arena, each op is a kernel that uses its
// blocks (SimDriver::run_kernel), and the pager is told of every event. The
// time is SimDriver's modelled clock. It checks the runtime against the paging
// simulator (paging_simulator.h), which models the same policies with its own
// executor: the two should agree on iteration times.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "access_stream.h"
#include "transfer_model.h"
#include "um_pager.h"

namespace zico::page {

struct UmReplayResult {
  std::string policy;
  std::vector<uint64_t> iteration_ns;  // by iteration; ops before the first mark count in 0
  prefetch::UmPagerStats pager;
  uint64_t device_peak_resident_bytes = 0;  // what SimDriver saw on the device
  uint64_t device_faulted_pages = 0;
  uint64_t device_driver_evictions = 0;     // the driver made room itself: the pager let it run out
  uint64_t device_prefetch_calls = 0;       // calls into the driver that moved pages
  uint64_t stall_ns = 0;
  uint64_t fault_ns = 0;
};

// What the arena is: managed memory (the UVM driver's way), or device
// memory swapped explicitly (swap_arena_driver.h: ZICO_UM_MEMORY=swap).
enum class UmArena : uint8_t { kManaged, kSwapped };

// False with *error when the pager cannot be made or a kernel cannot run
// (a swapped page absent when its kernel runs is an illegal address).
// `pager_threads`: the pager's moves run on its own threads, as in a job on
// a GPU (its modelled times then depend on how the OS runs the threads);
// else inline, deterministically (um_pager.h). Swapped, the device's counts
// are the swap's: device memory mapped, calls that moved pages.
[[nodiscard]] bool run_um_replay(const prefetch::AccessStream& stream, const std::string& policy,
                                 uint64_t budget_bytes, const prefetch::TransferModel& model, UmReplayResult* out,
                                 std::string* error, bool pager_threads = false, UmArena arena = UmArena::kManaged);

}  // namespace zico::page
