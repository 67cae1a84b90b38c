#include "replay.h"

#include <time.h>

#include <algorithm>

namespace zico::replay {
namespace {

double thread_cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

}  // namespace

double ReplayResult::ns_per_operation() const {
  const uint64_t operations = 2 * allocations;  // each allocation and, nearly always, its free
  return operations == 0 ? 0 : cpu_seconds * 1e9 / static_cast<double>(operations);
}

Status replay(const trace::Trace& trace, ReplayTarget& target, ReplayResult* out, std::string* error) {
  ReplayResult result;
  result.target = target.name();
  result.iterations.resize(std::max<size_t>(trace.iteration_starts.size(), 1));
  std::vector<void*> pointers(trace.blocks.size(), nullptr);
  uint64_t live = 0;
  uint64_t live_persistent = 0;
  size_t iteration = 0;
  const auto observe = [&] {
    IterationResult& it = result.iterations[iteration];
    const uint64_t mapped = target.mapped_bytes();
    result.peak_mapped_bytes = std::max(result.peak_mapped_bytes, mapped);
    it.peak_mapped_bytes = std::max(it.peak_mapped_bytes, mapped);
    result.peak_live_bytes = std::max(result.peak_live_bytes, live);
    if (live > it.peak_live_bytes) {
      it.peak_live_bytes = live;
      it.persistent_bytes = live_persistent;
      it.transient_bytes = live - live_persistent;
    }
  };

  const double start = thread_cpu_seconds();
  for (const trace::Event& event : trace.events) {
    switch (event.kind) {
      case trace::Event::Kind::kIteration:
        iteration = event.index;
        target.iteration_started(event.index);
        observe();
        break;
      case trace::Event::Kind::kAllocate: {
        const trace::Block& block = trace.blocks[event.index];
        const Status status = target.allocate(event.index, block.bytes, &pointers[event.index]);
        if (status.code() == Errc::kOutOfMemory) {
          ++result.failed_allocations;
          break;
        }
        if (!status.is_ok()) {
          *error = std::string(target.name()) + " failed on block " + std::to_string(event.index) + " of " +
                   trace.name + ": " + status.message();
          return status;
        }
        ++result.allocations;
        live += block.bytes;
        if (block.persistent()) live_persistent += block.bytes;
        observe();
        break;
      }
      case trace::Event::Kind::kFree: {
        void*& ptr = pointers[event.index];
        if (ptr == nullptr) break;  // its allocation was refused
        const trace::Block& block = trace.blocks[event.index];
        target.free(event.index, ptr);
        ptr = nullptr;
        live -= block.bytes;
        if (block.persistent()) live_persistent -= block.bytes;
        break;
      }
      case trace::Event::Kind::kOp:
        break;
    }
  }
  result.cpu_seconds = thread_cpu_seconds() - start;
  result.map_calls = target.map_calls();
  result.unmap_calls = target.unmap_calls();
  *out = std::move(result);
  return Status::ok();
}

}  // namespace zico::replay
