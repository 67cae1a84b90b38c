#include "um_replay.h"

#include <cstring>
#include <memory>
#include <unordered_map>

#include "sim_driver.h"
#include "swap_arena_driver.h"

namespace zico::page {

bool run_um_replay(const prefetch::AccessStream& stream, const std::string& policy, uint64_t budget_bytes,
                   const prefetch::TransferModel& model, UmReplayResult* out, std::string* error, bool pager_threads,
                   UmArena arena_kind) {
  *out = UmReplayResult{};
  out->policy = policy;
  const uint64_t arena_bytes = uint64_t{stream.page_count} * stream.page_bytes;
  SimOptions options;
  // The device is larger than the job: only the pager's budget binds, as on
  // a GPU shared under zico-umd or a budget set below the card's size.
  options.capacity = arena_bytes + stream.page_bytes;
  options.granularity = stream.page_bytes;
  options.managed_costs.h2d_bytes_per_s = model.h2d_bytes_per_s * model.efficiency(stream.page_bytes);
  options.managed_costs.d2h_bytes_per_s = model.d2h_bytes_per_s * model.efficiency(stream.page_bytes);
  options.managed_costs.fault_bytes_per_s = model.fault_bytes_per_s;
  options.managed_costs.fault_batch_pages = model.fault_batch_pages;
  options.managed_costs.fault_batch_ns = model.fault_batch_ns;
  SimDriver driver(options);
  SwapArenaDriver swap(driver);
  const bool swapped = arena_kind == UmArena::kSwapped;
  Driver& pages_driver = swapped ? static_cast<Driver&>(swap) : driver;
  void* arena = nullptr;
  VaRange reserved{};
  const Status made = swapped ? swap.reserve(DeviceId{0}, arena_bytes, 0, &reserved)
                              : driver.managed_allocate(arena_bytes, &arena);
  if (!made.is_ok()) {
    *error = std::string("cannot make the arena: ") + to_string(made.code());
    return false;
  }
  if (swapped) arena = reserved.ptr();
  const auto release_arena = [&] {
    if (swapped) {
      (void)swap.unreserve(reserved);
    } else {
      (void)driver.managed_free(arena);
    }
  };
  const auto base = reinterpret_cast<uintptr_t>(arena);
  std::unique_ptr<prefetch::UmPager> pager;
  prefetch::UmPagerOptions pager_options;
  pager_options.policy = policy;
  pager_options.budget_bytes = budget_bytes;
  pager_options.model = model;
  pager_options.pager_threads = pager_threads;
  if (Status status = prefetch::UmPager::create(pages_driver, DeviceId{0}, VaRange{base, arena_bytes},
                                                stream.page_bytes, pager_options, &pager, error);
      !status.is_ok()) {
    release_arena();
    return false;
  }
  if (swapped) swap.set_held_limit(DeviceId{0}, pager->budget_bytes());
  const auto block_ptr = [&](uint32_t block) { return reinterpret_cast<void*>(base + stream.blocks[block].offset); };
  // Swapped pages keep their bytes: each op finds at both ends of each block
  // it uses the stamp the block's last op left there, then leaves its own
  // (the simulated device is host memory, so the replay reads it while the
  // op's pages are mapped).
  std::unordered_map<uintptr_t, uint64_t> stamps;  // by block address
  const auto carry_stamps = [&stamps](std::span<const VaRange> blocks, uint64_t op, std::string* why) {
    for (const VaRange& block : blocks) {
      if (block.bytes < 2 * sizeof(uint64_t)) continue;
      // A block's end need not be aligned: the stamps are copied, not stored.
      void* head = block.ptr();
      void* tail = reinterpret_cast<void*>(block.end() - sizeof(uint64_t));
      const auto it = stamps.find(block.base);
      if (it != stamps.end()) {
        uint64_t at_head = 0, at_tail = 0;
        std::memcpy(&at_head, head, sizeof at_head);
        std::memcpy(&at_tail, tail, sizeof at_tail);
        if (at_head != it->second || at_tail != it->second) {
          *why = "op " + std::to_string(op) + " found a block's bytes changed since its last op";
          return false;
        }
      }
      const uint64_t stamp = op + 1;
      std::memcpy(head, &stamp, sizeof stamp);
      std::memcpy(tail, &stamp, sizeof stamp);
      stamps[block.base] = stamp;
    }
    return true;
  };
  std::vector<VaRange> used;
  uint64_t iteration_start = 0;
  bool ok = true;
  for (const prefetch::StreamEvent& e : stream.events) {
    switch (e.kind) {
      case prefetch::StreamEvent::Kind::kAllocate:
        pager->on_allocate(block_ptr(e.index), stream.blocks[e.index].bytes);
        break;
      case prefetch::StreamEvent::Kind::kFree:
        stamps.erase(reinterpret_cast<uintptr_t>(block_ptr(e.index)));
        pager->on_free(block_ptr(e.index), std::nullopt);
        break;
      case prefetch::StreamEvent::Kind::kOp: {
        const prefetch::StreamOp& op = stream.ops[e.index];
        used.clear();
        for (const uint32_t block : stream.op_blocks(op)) {
          used.push_back(VaRange{base + stream.blocks[block].offset, stream.blocks[block].bytes});
        }
        pager->before_kernel(op.exec_id, used, op.duration_ns);
        if (Status status = driver.run_kernel(used, op.duration_ns); !status.is_ok()) {
          *error = "op " + std::to_string(e.index) + " could not run: " + to_string(status.code());
          ok = false;
        } else if (swapped && !carry_stamps(used, e.index, error)) {
          ok = false;
        }
        pager->after_kernel();
        break;
      }
      case prefetch::StreamEvent::Kind::kIteration: {
        const uint64_t now = driver.managed_stats().now_ns;
        if (e.index > 0) out->iteration_ns.push_back(now - iteration_start);
        iteration_start = now;
        pager->on_iteration();
        break;
      }
    }
    if (!ok) break;
  }
  pager->go_inline();  // every move made: the counts are final
  const SimManagedStats device = driver.managed_stats();
  out->iteration_ns.push_back(device.now_ns - iteration_start);
  out->pager = pager->stats();
  const SwapArenaStats swapping = swap.stats();
  out->device_peak_resident_bytes = swapped ? swapping.peak_held_bytes : device.peak_resident_bytes;
  out->device_faulted_pages = device.faulted_pages;
  out->device_driver_evictions = device.driver_evictions;
  out->device_prefetch_calls = swapped ? swapping.move_calls : driver.counters().prefetch_calls;
  out->stall_ns = device.stall_ns;
  out->fault_ns = device.fault_ns;
  pager.reset();
  release_arena();
  return ok;
}

}  // namespace zico::page
