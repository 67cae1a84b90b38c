#include "trace_stream.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "caching_model.h"

namespace zico::page {
namespace {

uint64_t mix(uint64_t hash, uint64_t value) {
  // splitmix64's finaliser over the running hash and the next value.
  uint64_t x = hash ^ (value + 0x9e3779b97f4a7c15ULL + (hash << 6) + (hash >> 2));
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

bool build_access_stream(const trace::Trace& trace, uint64_t page_bytes, uint32_t iterations,
                         prefetch::AccessStream* out, std::string* error) {
  using prefetch::PageId;
  *out = prefetch::AccessStream{};
  if (page_bytes < 4096 || page_bytes > (uint64_t{1} << 30) || (page_bytes & (page_bytes - 1)) != 0) {
    *error = "page size " + std::to_string(page_bytes) + " is not a power of two from 4 KiB to 1 GiB";
    return false;
  }
  if (trace.ops.empty()) {
    *error = trace.name + ": the trace has no op records, so nothing says which memory each kernel uses";
    return false;
  }

  // Lay the blocks out, in trace order, and keep the events to replay.
  replay::CachingAllocatorModel layout;
  std::vector<uintptr_t> address(trace.blocks.size(), 0);
  std::vector<trace::Event> events;
  uint32_t marks = 0;
  for (const trace::Event& e : trace.events) {
    if (e.kind == trace::Event::Kind::kIteration) {
      if (iterations != 0 && marks == iterations) break;
      ++marks;
    }
    if (e.kind == trace::Event::Kind::kAllocate) {
      void* where = nullptr;
      if (!layout.allocate(e.index, trace.blocks[e.index].bytes, &where).is_ok()) {
        *error = trace.name + ": the caching allocator model could not place block " + std::to_string(e.index);
        return false;
      }
      address[e.index] = reinterpret_cast<uintptr_t>(where);
    } else if (e.kind == trace::Event::Kind::kFree) {
      layout.free(e.index, reinterpret_cast<void*>(address[e.index]));
    }
    events.push_back(e);
  }
  uintptr_t base = std::numeric_limits<uintptr_t>::max();
  uint64_t end = 0;
  for (const auto& segment : layout.segments()) {
    base = std::min(base, segment.address);
    end = std::max<uint64_t>(end, segment.address + segment.bytes);
  }
  if (base == std::numeric_limits<uintptr_t>::max()) {
    *error = trace.name + ": the trace allocates nothing";
    return false;
  }
  if ((end - base + page_bytes - 1) / page_bytes > UINT32_MAX) {
    *error = trace.name + ": more than 2^32 pages of " + std::to_string(page_bytes) + " bytes";
    return false;
  }

  prefetch::AccessStream& s = *out;
  s.name = trace.meta.count("model") ? trace.meta.at("model") : trace.name;
  s.page_bytes = page_bytes;
  s.page_count = static_cast<uint32_t>((end - base + page_bytes - 1) / page_bytes);
  s.blocks.resize(trace.blocks.size());
  for (size_t b = 0; b < trace.blocks.size(); ++b) {
    s.blocks[b] = {address[b] - base, trace.blocks[b].bytes};
  }
  std::vector<uint32_t> used;
  for (const trace::Event& e : events) {
    switch (e.kind) {
      case trace::Event::Kind::kAllocate:
        s.events.push_back({prefetch::StreamEvent::Kind::kAllocate, e.index});
        break;
      case trace::Event::Kind::kFree: s.events.push_back({prefetch::StreamEvent::Kind::kFree, e.index}); break;
      case trace::Event::Kind::kIteration:
        s.events.push_back({prefetch::StreamEvent::Kind::kIteration, s.iterations++});
        break;
      case trace::Event::Kind::kOp: {
        const trace::Op& op = trace.ops[e.index];
        used.assign(op.reads.begin(), op.reads.end());
        used.insert(used.end(), op.writes.begin(), op.writes.end());
        std::sort(used.begin(), used.end());
        used.erase(std::unique(used.begin(), used.end()), used.end());
        prefetch::StreamOp stream_op;
        stream_op.duration_ns = op.duration;
        stream_op.exec_id = mix(0, op.name);
        stream_op.first_ref = static_cast<uint32_t>(s.page_refs.size());
        stream_op.first_block = static_cast<uint32_t>(s.block_refs.size());
        for (const uint32_t block : used) {
          const prefetch::BlockExtent& extent = s.blocks[block];
          stream_op.exec_id = mix(stream_op.exec_id, extent.offset);
          for (PageId p = s.first_page(extent); p <= s.last_page(extent); ++p) s.page_refs.push_back(p);
          s.block_refs.push_back(block);
        }
        const auto pages = s.page_refs.begin() + stream_op.first_ref;
        std::sort(pages, s.page_refs.end());
        s.page_refs.erase(std::unique(pages, s.page_refs.end()), s.page_refs.end());
        stream_op.ref_count = static_cast<uint32_t>(s.page_refs.size() - stream_op.first_ref);
        stream_op.block_count = static_cast<uint32_t>(used.size());
        s.events.push_back({prefetch::StreamEvent::Kind::kOp, static_cast<uint32_t>(s.ops.size())});
        s.ops.push_back(stream_op);
        break;
      }
    }
  }
  return true;
}

}  // namespace zico::page
