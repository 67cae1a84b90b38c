#include "op_replay.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <zicoum/zicoum.h>

#include "access_stream.h"
#include "trace_stream.h"

namespace zico::demo {
namespace {

constexpr size_t kPatternBytes = 8;

// The block's bytes are host memory (simulated backend) or unified (UM mode).
bool host_accessible() {
  const char* backend = std::getenv("ZICO_BACKEND");
  const char* mode = std::getenv("ZICO_MODE");
  return (backend != nullptr && std::strcmp(backend, "sim") == 0) || (mode != nullptr && std::strcmp(mode, "um") == 0);
}

void pattern(uint64_t block, uint8_t out[kPatternBytes]) {
  uint64_t x = (block + 1) * 0x9e3779b97f4a7c15ull ^ 0x5a17;
  std::memcpy(out, &x, kPatternBytes);
}

zico_stats_t stats_now() {
  zico_stats_t stats{};
  stats.struct_size = sizeof stats;
  (void)zico_get_stats(0, &stats);
  return stats;
}

}  // namespace

bool replay_ops(const trace::Trace& trace, uint32_t iterations, double memory_scale, OpReplayResult* out,
                std::string* error) {
  *out = OpReplayResult{};
  prefetch::AccessStream stream;
  if (!page::build_access_stream(trace, uint64_t{2} << 20, iterations, &stream, error)) return false;
  if (stream.ops.empty()) {
    *error = "the trace records no kernels (a version 1 trace): --ops needs a version 2 trace";
    return false;
  }
  const bool check = host_accessible();
  std::vector<void*> ptrs(stream.blocks.size(), nullptr);
  std::vector<uint64_t> sizes(stream.blocks.size(), 0);
  std::vector<const void*> used;
  std::vector<double> marks;  // the clock at each mark, seconds
  const auto wall_start = std::chrono::steady_clock::now();
  const auto now_s = [&] {
    const zico_stats_t s = stats_now();
    if (s.modelled_ns != 0) {
      out->modelled = true;
      return static_cast<double>(s.modelled_ns) / 1e9;
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  };
  const auto fail = [&](const std::string& what, zico_status_t status) {
    *error = what + ": " + zico_status_string(status) + ": " + zico_last_error();
    return false;
  };
  for (const prefetch::StreamEvent& e : stream.events) {
    switch (e.kind) {
      case prefetch::StreamEvent::Kind::kAllocate: {
        const double scaled = std::round(static_cast<double>(stream.blocks[e.index].bytes) * memory_scale);
        const uint64_t bytes = std::max<uint64_t>(static_cast<uint64_t>(scaled), 1);
        if (zico_status_t s = zico_malloc(&ptrs[e.index], bytes, 0, nullptr); s != ZICO_OK) {
          return fail("block " + std::to_string(e.index) + " (" + std::to_string(bytes) + " bytes, iteration " +
                          std::to_string(marks.size()) + ")",
                      s);
        }
        sizes[e.index] = bytes;
        if (check) {
          uint8_t p[kPatternBytes];
          pattern(e.index, p);
          std::memcpy(ptrs[e.index], p, std::min<uint64_t>(bytes, kPatternBytes));
          if (bytes > kPatternBytes) {
            std::memcpy(static_cast<uint8_t*>(ptrs[e.index]) + bytes - kPatternBytes, p, kPatternBytes);
          }
        }
        break;
      }
      case prefetch::StreamEvent::Kind::kFree: {
        void* ptr = ptrs[e.index];
        if (ptr == nullptr) break;
        if (check) {
          uint8_t p[kPatternBytes];
          pattern(e.index, p);
          const uint64_t bytes = sizes[e.index];
          const uint64_t head = std::min<uint64_t>(bytes, kPatternBytes);
          if (std::memcmp(ptr, p, head) != 0 ||
              (bytes > kPatternBytes &&
               std::memcmp(static_cast<uint8_t*>(ptr) + bytes - kPatternBytes, p, kPatternBytes) != 0)) {
            *error = "block " + std::to_string(e.index) + " lost its contents (iteration " +
                     std::to_string(marks.size()) + ")";
            return false;
          }
        }
        if (zico_status_t s = zico_free(ptr, nullptr); s != ZICO_OK) return fail("free of block " + std::to_string(e.index), s);
        ptrs[e.index] = nullptr;
        break;
      }
      case prefetch::StreamEvent::Kind::kOp: {
        const prefetch::StreamOp& op = stream.ops[e.index];
        used.clear();
        for (const uint32_t block : stream.op_blocks(op)) {
          if (ptrs[block] != nullptr) used.push_back(ptrs[block]);
        }
        if (zico_status_t s = zico_op_begin(op.exec_id, used.data(), used.size(), op.duration_ns); s != ZICO_OK) {
          return fail("op " + std::to_string(e.index), s);
        }
        if (zico_status_t s = zico_op_end(); s != ZICO_OK) return fail("op " + std::to_string(e.index), s);
        break;
      }
      case prefetch::StreamEvent::Kind::kIteration:
        marks.push_back(now_s());
        if (zico_status_t s = zico_mark_iteration(); s != ZICO_OK) return fail("iteration mark", s);
        break;
    }
  }
  marks.push_back(now_s());
  const zico_stats_t s = stats_now();
  out->peak_allocated_bytes = s.peak_allocated_bytes;
  out->peak_resident_bytes = s.peak_resident_bytes;
  out->faulted_pages = s.faulted_pages;
  out->prefetched_pages = s.prefetched_pages;
  out->evicted_pages = s.evicted_pages;
  for (size_t block = 0; block < ptrs.size(); ++block) {
    if (ptrs[block] != nullptr) (void)zico_free(ptrs[block], nullptr);
  }
  // marks[0] is the first iteration's start; marks.back() the last one's end.
  out->iterations = marks.size() >= 2 ? static_cast<uint32_t>(marks.size() - 1) : 0;
  if (out->iterations >= 1) out->first_iteration_s = marks[1] - marks[0];
  if (out->iterations >= 2) {
    out->steady_iteration_s = (marks.back() - marks[1]) / static_cast<double>(out->iterations - 1);
  } else {
    out->steady_iteration_s = out->first_iteration_s;
  }
  return true;
}

}  // namespace zico::demo
