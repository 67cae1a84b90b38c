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

// The block's bytes are host memory (simulated backend) or unified (UM
// mode), unless UM mode swaps them (ZICO_UM_MEMORY=swap): a swapped page is
// mapped only while an op that names it runs (the paging tests check that
// its bytes survive).
bool host_accessible() {
  const char* backend = std::getenv("ZICO_BACKEND");
  const char* mode = std::getenv("ZICO_MODE");
  const char* um_memory = std::getenv("ZICO_UM_MEMORY");
  if (mode != nullptr && std::strcmp(mode, "um") == 0 && um_memory != nullptr && std::strcmp(um_memory, "swap") == 0) {
    return false;
  }
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

bool replay_ops(const trace::Trace& trace, uint32_t iterations, double time_scale, double memory_scale,
                OpReplayResult* out, std::string* error) {
  *out = OpReplayResult{};
  // Refusals before anything runs are the trace's (or the iteration count's).
  const auto unusable = [&](std::string why) {
    *error = std::move(why);
    out->unusable_trace = true;
    return false;
  };
  prefetch::AccessStream stream;
  if (!page::build_access_stream(trace, uint64_t{2} << 20, 0, &stream, error)) return unusable(*error);
  if (stream.ops.empty()) {
    return unusable("the trace records no kernels (a version 1 trace): --ops needs a version 2 trace");
  }
  // Segments: [0] everything before the first mark, then one per iteration.
  std::vector<size_t> segment_start{0};
  for (size_t i = 0; i < stream.events.size(); ++i) {
    if (stream.events[i].kind == prefetch::StreamEvent::Kind::kIteration) segment_start.push_back(i);
  }
  segment_start.push_back(stream.events.size());
  const auto recorded = static_cast<uint32_t>(segment_start.size() - 2);
  if (recorded == 0) return unusable("the trace marks no iteration");
  // Iterations beyond the recorded ones repeat the last: its blocks are made
  // anew each time, and those it takes from the iteration before it (made
  // there, freed or used here) are the previous repetition's, by their order
  // of allocation. That needs the last two iterations to allocate alike.
  const size_t last = segment_start.size() - 2;  // the last iteration's segment
  std::vector<int64_t> segment_of(stream.blocks.size(), -1);
  std::vector<uint32_t> ordinal(stream.blocks.size(), 0);
  std::vector<std::vector<uint64_t>> segment_sizes(segment_start.size() - 1);
  for (size_t seg = 0; seg + 1 < segment_start.size(); ++seg) {
    for (size_t i = segment_start[seg]; i < segment_start[seg + 1]; ++i) {
      const prefetch::StreamEvent& e = stream.events[i];
      if (e.kind != prefetch::StreamEvent::Kind::kAllocate) continue;
      segment_of[e.index] = static_cast<int64_t>(seg);
      ordinal[e.index] = static_cast<uint32_t>(segment_sizes[seg].size());
      segment_sizes[seg].push_back(stream.blocks[e.index].bytes);
    }
  }
  if (iterations > recorded) {
    const auto& a = segment_sizes[last - 1];
    const auto& b = segment_sizes[last];
    if (recorded < 2 || a != b) {
      return unusable("the trace records " + std::to_string(recorded) + " iteration(s) whose last two do not " +
                      "allocate alike: at most " + std::to_string(recorded) + " iterations can be replayed");
    }
    for (size_t i = segment_start[last]; i < segment_start[last + 1]; ++i) {
      const prefetch::StreamEvent& e = stream.events[i];
      if (e.kind == prefetch::StreamEvent::Kind::kFree && segment_of[e.index] < static_cast<int64_t>(last) - 1) {
        return unusable("the last iteration frees a block made before the iteration it follows: it cannot be repeated");
      }
    }
  }

  const bool check = host_accessible();
  struct Live {
    void* ptr = nullptr;
    uint64_t bytes = 0;
    uint64_t key = 0;  // the block's pattern
  };
  std::vector<Live> original(stream.blocks.size());
  std::vector<Live> previous(segment_sizes[last].size());  // the last repetition's blocks, by ordinal
  std::vector<Live> current(segment_sizes[last].size());
  uint64_t repetition = 0;  // 0: the recorded events themselves
  uint64_t next_key = 0;
  const auto slot = [&](uint32_t block) -> Live& {
    if (repetition == 0) return original[block];
    if (segment_of[block] == static_cast<int64_t>(last)) return current[ordinal[block]];
    if (segment_of[block] == static_cast<int64_t>(last) - 1) return previous[ordinal[block]];
    return original[block];
  };
  // The first repetition's "iteration before" is the recorded last one:
  // its blocks move over, by ordinal.
  const auto recorded_last_as_previous = [&] {
    for (size_t i = segment_start[last]; i < segment_start[last + 1]; ++i) {
      const prefetch::StreamEvent& e = stream.events[i];
      if (e.kind != prefetch::StreamEvent::Kind::kAllocate) continue;
      previous[ordinal[e.index]] = original[e.index];
      original[e.index] = Live{};
    }
  };

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
  const auto where = [&] { return " (iteration " + std::to_string(marks.empty() ? 0 : marks.size() - 1) + ")"; };
  const auto play = [&](const prefetch::StreamEvent& e) {
    switch (e.kind) {
      case prefetch::StreamEvent::Kind::kAllocate: {
        Live& live = slot(e.index);
        const double scaled = std::round(static_cast<double>(stream.blocks[e.index].bytes) * memory_scale);
        live.bytes = std::max<uint64_t>(static_cast<uint64_t>(scaled), 1);
        live.key = next_key++;
        if (zico_status_t s = zico_malloc(&live.ptr, live.bytes, 0, nullptr); s != ZICO_OK) {
          return fail("a block of " + std::to_string(live.bytes) + " bytes" + where(), s);
        }
        if (check) {
          uint8_t p[kPatternBytes];
          pattern(live.key, p);
          std::memcpy(live.ptr, p, std::min<uint64_t>(live.bytes, kPatternBytes));
          if (live.bytes > kPatternBytes) {
            std::memcpy(static_cast<uint8_t*>(live.ptr) + live.bytes - kPatternBytes, p, kPatternBytes);
          }
        }
        return true;
      }
      case prefetch::StreamEvent::Kind::kFree: {
        Live& live = slot(e.index);
        if (live.ptr == nullptr) return true;
        if (check) {
          uint8_t p[kPatternBytes];
          pattern(live.key, p);
          const uint64_t head = std::min<uint64_t>(live.bytes, kPatternBytes);
          if (std::memcmp(live.ptr, p, head) != 0 ||
              (live.bytes > kPatternBytes &&
               std::memcmp(static_cast<uint8_t*>(live.ptr) + live.bytes - kPatternBytes, p, kPatternBytes) != 0)) {
            *error = "a block of " + std::to_string(live.bytes) + " bytes lost its contents" + where();
            return false;
          }
        }
        if (zico_status_t s = zico_free(live.ptr, nullptr); s != ZICO_OK) return fail("a free" + where(), s);
        live = Live{};
        return true;
      }
      case prefetch::StreamEvent::Kind::kOp: {
        const prefetch::StreamOp& op = stream.ops[e.index];
        used.clear();
        for (const uint32_t block : stream.op_blocks(op)) {
          if (const Live& live = slot(block); live.ptr != nullptr) used.push_back(live.ptr);
        }
        if (zico_status_t s = zico_op_begin(op.exec_id, used.data(), used.size(),
                                                static_cast<uint64_t>(static_cast<double>(op.duration_ns) * time_scale)); s != ZICO_OK) {
          return fail("an op" + where(), s);
        }
        if (zico_status_t s = zico_op_end(); s != ZICO_OK) return fail("an op" + where(), s);
        return true;
      }
      case prefetch::StreamEvent::Kind::kIteration:
        marks.push_back(now_s());
        if (zico_status_t s = zico_mark_iteration(); s != ZICO_OK) return fail("an iteration mark", s);
        return true;
    }
    return true;
  };

  const size_t recorded_end = segment_start[std::min<size_t>(iterations, recorded) + 1];
  for (size_t i = 0; i < recorded_end; ++i) {
    if (!play(stream.events[i])) return false;
  }
  for (uint32_t n = recorded; n < iterations; ++n) {
    ++repetition;
    if (repetition == 1) recorded_last_as_previous();
    for (size_t i = segment_start[last]; i < segment_start[last + 1]; ++i) {
      if (!play(stream.events[i])) return false;
    }
    previous = current;
    std::fill(current.begin(), current.end(), Live{});
  }
  marks.push_back(now_s());
  for (const std::vector<Live>* set : {&original, &previous, &current}) {
    for (const Live& live : *set) {
      if (live.ptr != nullptr) (void)zico_free(live.ptr, nullptr);
    }
  }
  // Read after the last frees, which let the pages of the blocks still live
  // go (evictions too): the counts are the whole run's, the same figures as
  // the library's exit log (ZICO_LOG=info).
  const zico_stats_t s = stats_now();
  out->peak_allocated_bytes = s.peak_allocated_bytes;
  out->peak_resident_bytes = s.peak_resident_bytes;
  out->peak_over_budget_bytes = s.peak_over_budget_bytes;
  out->faulted_pages = s.faulted_pages;
  out->prefetched_pages = s.prefetched_pages;
  out->evicted_pages = s.evicted_pages;
  // marks[0] is the first iteration's start; marks.back() the last one's end.
  out->iterations = marks.size() >= 2 ? static_cast<uint32_t>(marks.size() - 1) : 0;
  if (out->iterations >= 1) {
    out->first_iteration_s = marks[1] - marks[0];
    out->last_iteration_s = marks.back() - marks[marks.size() - 2];
  }
  if (out->iterations >= 2) {
    out->steady_iteration_s = (marks.back() - marks[1]) / static_cast<double>(out->iterations - 1);
  } else {
    out->steady_iteration_s = out->first_iteration_s;
  }
  return true;
}

}  // namespace zico::demo
