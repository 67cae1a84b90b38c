// How the templates are numbered, and how a replay renumbers them.
//
// Replay ids are dense and never reused: the prologue's blocks are 0..P-1 in
// allocation order, iteration 0's are P..P+F-1, and steady repetition n >= 1
// allocates base(n)..base(n)+S-1 with base(n) = P + F + (n-1)*S. The prologue
// and first templates therefore hold final ids. The steady template holds
// slots: an allocation or a same-iteration free names slot s (its position
// among the iteration's allocations); a free of a block from the iteration
// before is a *carried* free, flagged with kCarried, naming the slot the block
// had in the previous repetition, and, in bits 32..62, the replay id it frees
// in repetition 1, where the previous iteration is iteration 0 (or the
// prologue), whose blocks have other ids.
//
// Which trace block a carried free stands for is learned from positions: the
// steady iteration L frees blocks of iteration L-1, and the k-th allocation of
// L-1 is, on replay, the k-th allocation of the previous repetition. This needs
// L-1 to be a steady iteration too; with only two iterations (L = 1, whose
// carried frees name iteration-0 blocks) a carried free takes the first block
// of L still live at L's end with the same size, in allocation order.
#include "job_model.h"

#include <algorithm>
#include <map>
#include <utility>

namespace zico::simulate {
namespace {

constexpr uint64_t kCarried = uint64_t{1} << 63;
constexpr uint64_t kSlotMask = 0xFFFFFFFFull;
constexpr uint64_t kMaxFirstId = (uint64_t{1} << 31) - 1;
constexpr int32_t kPrologue = -1;

using trace::Event;

// Where each block of the trace was allocated: its phase (kPrologue or the
// iteration) and its position among that phase's allocations.
struct BlockOrigin {
  int32_t phase = kPrologue;
  uint32_t position = 0;
};

struct Phases {
  // Event index ranges [begin, end) of the prologue (index 0) and of every
  // iteration (index i + 1).
  std::vector<std::pair<size_t, size_t>> ranges;
  std::vector<BlockOrigin> origin;
  std::vector<std::vector<uint32_t>> allocations;  // per phase index: blocks in allocation order
};

Phases split_phases(const trace::Trace& trace) {
  Phases phases;
  const size_t iterations = trace.iteration_starts.size();
  phases.ranges.emplace_back(0, trace.iteration_starts[0]);
  for (size_t i = 0; i < iterations; ++i) {
    const size_t end = i + 1 < iterations ? trace.iteration_starts[i + 1] : trace.events.size();
    phases.ranges.emplace_back(trace.iteration_starts[i] + 1, end);
  }
  phases.origin.resize(trace.blocks.size());
  phases.allocations.resize(phases.ranges.size());
  for (size_t p = 0; p < phases.ranges.size(); ++p) {
    for (size_t e = phases.ranges[p].first; e < phases.ranges[p].second; ++e) {
      const Event& event = trace.events[e];
      if (event.kind != Event::Kind::kAllocate) continue;
      phases.origin[event.index] = {static_cast<int32_t>(p) - 1, static_cast<uint32_t>(phases.allocations[p].size())};
      phases.allocations[p].push_back(event.index);
    }
  }
  return phases;
}

std::string phase_name(int32_t phase) {
  return phase == kPrologue ? std::string("the prologue") : "iteration " + std::to_string(phase);
}

// When the iteration's last event or op ends: the trace's end for the last iteration.
uint64_t end_time(const trace::Trace& trace, std::pair<size_t, size_t> range, uint64_t start) {
  uint64_t end = start;
  for (size_t e = range.first; e < range.second; ++e) {
    const Event& event = trace.events[e];
    end = std::max(end, event.time);
    if (event.kind == Event::Kind::kOp) {
      const trace::Op& op = trace.ops[event.index];
      end = std::max(end, op.start + op.duration);
    }
  }
  return end;
}

Status refuse(std::string* error, const trace::Trace& trace, const std::string& why) {
  if (error != nullptr) *error = trace.name + ": " + why;
  return Status(Errc::kInvalidArgument);
}

// Replays prologue + iteration 0 + `repetitions` steady iterations and
// returns the most bytes live at once; *boundary gets the bytes live after iteration 0.
uint64_t replay_peak(const JobModel& model, uint32_t repetitions, uint64_t* boundary) {
  std::vector<ReplayEvent> events;
  append_prologue_events(model, &events);
  uint64_t live = 0;
  uint64_t peak = 0;
  const auto run = [&] {
    for (const ReplayEvent& event : events) {
      if (event.kind == ReplayEvent::Kind::kAllocate) {
        live += event.bytes;
        peak = std::max(peak, live);
      } else {
        live -= event.bytes;
      }
    }
    events.clear();
  };
  run();
  append_iteration_events(model, 0, &events);
  run();
  *boundary = live;
  for (uint32_t n = 1; n <= repetitions; ++n) {
    append_iteration_events(model, n, &events);
    run();
  }
  return peak;
}

}  // namespace

Status build_job_model(const trace::Trace& trace, JobModel* out, std::string* error) {
  const size_t iterations = trace.iteration_starts.size();
  if (iterations < 2) {
    return refuse(error, trace, "has " + std::to_string(iterations) + " iteration(s); a job model needs at least 2");
  }
  JobModel model;
  const auto meta_model = trace.meta.find("model");
  model.name = meta_model != trace.meta.end() && !meta_model->second.empty() ? meta_model->second : trace.name;

  const Phases phases = split_phases(trace);
  const uint32_t last = static_cast<uint32_t>(iterations - 1);
  const auto range_of = [&](int32_t phase) { return phases.ranges[static_cast<size_t>(phase + 1)]; };
  const auto allocations_of = [&](int32_t phase) -> const std::vector<uint32_t>& {
    return phases.allocations[static_cast<size_t>(phase + 1)];
  };
  const auto iteration_time = [&](uint32_t i) { return trace.events[trace.iteration_starts[i]].time; };

  // Periods.
  const uint64_t first_start = iteration_time(0);
  const uint64_t trace_start = trace.events.empty() ? 0 : trace.events.front().time;
  model.prologue_ns = first_start - trace_start;
  model.first_period_ns = iteration_time(1) - first_start;
  const uint64_t steady_start = iteration_time(last);
  model.steady_period_ns = end_time(trace, range_of(static_cast<int32_t>(last)), steady_start) - steady_start;

  // Utilization: op time inside the steady iteration over its period.
  uint64_t busy_ns = 0;
  bool any_op = false;
  for (size_t e = range_of(static_cast<int32_t>(last)).first; e < range_of(static_cast<int32_t>(last)).second; ++e) {
    if (trace.events[e].kind != Event::Kind::kOp) continue;
    any_op = true;
    busy_ns += trace.ops[trace.events[e].index].duration;
  }
  if (any_op && model.steady_period_ns > 0) {
    model.utilization = std::clamp(static_cast<double>(busy_ns) / static_cast<double>(model.steady_period_ns), 1e-6, 1.0);
  }

  // Prologue and iteration 0: final ids (prologue blocks first).
  const uint64_t prologue_blocks = allocations_of(kPrologue).size();
  const auto first_id = [&](uint32_t block) -> uint64_t {
    const BlockOrigin& o = phases.origin[block];
    return o.phase == kPrologue ? o.position : prologue_blocks + o.position;
  };
  for (int32_t phase : {kPrologue, int32_t{0}}) {
    const uint64_t base_time = phase == kPrologue ? trace_start : first_start;
    std::vector<ReplayEvent>& out_events = phase == kPrologue ? model.prologue : model.first;
    for (size_t e = range_of(phase).first; e < range_of(phase).second; ++e) {
      const Event& event = trace.events[e];
      if (event.kind != Event::Kind::kAllocate && event.kind != Event::Kind::kFree) continue;
      const auto kind = event.kind == Event::Kind::kAllocate ? ReplayEvent::Kind::kAllocate : ReplayEvent::Kind::kFree;
      out_events.push_back({kind, event.time - base_time, first_id(event.index), trace.blocks[event.index].bytes});
    }
  }
  if (prologue_blocks + allocations_of(0).size() > kMaxFirstId) {
    return refuse(error, trace, "has too many blocks in its prologue and iteration 0 to model");
  }

  // Every block must die in the iteration it was born in, the one after, or never:
  // only those lifetimes repeat.
  for (uint32_t b = 0; b < trace.blocks.size(); ++b) {
    const trace::Block& block = trace.blocks[b];
    if (block.free_time == trace::kNever) continue;
    const int32_t born = phases.origin[b].phase;
    const int32_t died = static_cast<int32_t>(block.free_iteration);
    if (died > std::max(born, 0) + 1) {
      return refuse(error, trace,
                    "steady iteration does not repeat: a block allocated in " + phase_name(born) + " is freed in " +
                        phase_name(died) + "; only blocks of the previous iteration may be freed");
    }
  }

  // The steady template.
  const int32_t steady = static_cast<int32_t>(last);
  const std::vector<uint32_t>& steady_allocations = allocations_of(steady);
  std::vector<bool> live_at_end(steady_allocations.size(), false);
  for (uint32_t s = 0; s < steady_allocations.size(); ++s) {
    live_at_end[s] = trace.blocks[steady_allocations[s]].free_time == trace::kNever;
  }
  std::vector<bool> carried_slot(steady_allocations.size(), false);  // freed by a carried free
  int64_t net_bytes = 0;
  for (size_t e = range_of(steady).first; e < range_of(steady).second; ++e) {
    const Event& event = trace.events[e];
    if (event.kind != Event::Kind::kAllocate && event.kind != Event::Kind::kFree) continue;
    const trace::Block& block = trace.blocks[event.index];
    const BlockOrigin& origin = phases.origin[event.index];
    const uint64_t offset = event.time - steady_start;
    if (event.kind == Event::Kind::kAllocate) {
      net_bytes += static_cast<int64_t>(block.bytes);
      model.steady.push_back({ReplayEvent::Kind::kAllocate, offset, origin.position, block.bytes});
      continue;
    }
    net_bytes -= static_cast<int64_t>(block.bytes);
    if (origin.phase == steady) {
      model.steady.push_back({ReplayEvent::Kind::kFree, offset, origin.position, block.bytes});
      continue;
    }
    // A carried free: which slot of the previous repetition it frees.
    uint64_t slot = steady_allocations.size();
    if (last >= 2) {
      if (origin.phase != steady - 1) {
        return refuse(error, trace,
                      "steady iteration does not repeat: iteration " + std::to_string(last) +
                          " frees a block allocated in " + phase_name(origin.phase));
      }
      slot = origin.position;
      if (slot >= steady_allocations.size() || trace.blocks[steady_allocations[slot]].bytes != block.bytes) {
        return refuse(error, trace,
                      "steady iteration does not repeat: iteration " + std::to_string(last) + " frees allocation " +
                          std::to_string(slot) + " of iteration " + std::to_string(last - 1) + " (" +
                          std::to_string(block.bytes) + " bytes), which iteration " + std::to_string(last) +
                          " does not allocate with that size");
      }
    } else {
      for (uint64_t s = 0; s < steady_allocations.size(); ++s) {
        if (live_at_end[s] && !carried_slot[s] && trace.blocks[steady_allocations[s]].bytes == block.bytes) {
          slot = s;
          break;
        }
      }
      if (slot == steady_allocations.size()) {
        return refuse(error, trace,
                      "steady iteration does not repeat: iteration 1 frees a " + std::to_string(block.bytes) +
                          "-byte block of " + phase_name(origin.phase) + " that no block of iteration 1 replaces");
      }
    }
    if (carried_slot[slot]) {
      return refuse(error, trace, "steady iteration does not repeat: allocation " + std::to_string(slot) +
                                      " of the previous iteration is freed twice");
    }
    carried_slot[slot] = true;
    model.steady.push_back({ReplayEvent::Kind::kFree, offset, kCarried | slot, block.bytes});
  }
  if (net_bytes != 0) {
    return refuse(error, trace,
                  "steady iteration does not repeat: iteration " + std::to_string(last) + " allocates " +
                      std::to_string(net_bytes) + " bytes more than it frees");
  }
  for (uint32_t s = 0; s < steady_allocations.size(); ++s) {
    if (live_at_end[s] != carried_slot[s]) {
      return refuse(error, trace,
                    "steady iteration does not repeat: allocation " + std::to_string(s) + " of iteration " +
                        std::to_string(last) + (live_at_end[s] ? " outlives it" : " does not outlive it") +
                        " but the same allocation of iteration " + std::to_string(last - 1) +
                        (live_at_end[s] ? " is not freed in it" : " is freed in it"));
    }
  }

  // Repetition 1 frees blocks of iteration 0 and the prologue: the ones trace
  // iteration 1 frees, in the same order as the template's carried frees.
  std::vector<uint32_t> first_carried;  // trace blocks
  for (size_t e = range_of(1).first; e < range_of(1).second; ++e) {
    const Event& event = trace.events[e];
    if (event.kind == Event::Kind::kFree && phases.origin[event.index].phase < 1) first_carried.push_back(event.index);
  }
  size_t j = 0;
  for (ReplayEvent& event : model.steady) {
    if (event.kind != ReplayEvent::Kind::kFree || (event.block & kCarried) == 0) continue;
    if (j >= first_carried.size() || trace.blocks[first_carried[j]].bytes != event.bytes) {
      return refuse(error, trace,
                    "steady iteration does not repeat: iteration 1 frees the blocks of iteration 0 differently "
                    "from how iteration " + std::to_string(last) + " frees those of iteration " +
                        std::to_string(last - 1) + " (free " + std::to_string(j) + ")");
    }
    event.block |= first_id(first_carried[j]) << 32;
    ++j;
  }
  if (j != first_carried.size()) {
    return refuse(error, trace,
                  "steady iteration does not repeat: iteration 1 frees " + std::to_string(first_carried.size()) +
                      " blocks of iteration 0 and the prologue, iteration " + std::to_string(last) + " frees " +
                      std::to_string(j) + " of the iteration before");
  }

  model.peak_bytes = replay_peak(model, 2, &model.persistent_bytes);
  *out = std::move(model);
  return Status::ok();
}

void append_prologue_events(const JobModel& model, std::vector<ReplayEvent>* out) {
  out->insert(out->end(), model.prologue.begin(), model.prologue.end());
}

void append_iteration_events(const JobModel& model, uint32_t n, std::vector<ReplayEvent>* out) {
  if (n == 0) {
    out->insert(out->end(), model.first.begin(), model.first.end());
    return;
  }
  // Allocation counts, from the templates (ids there are dense per phase).
  uint64_t prologue_blocks = 0;
  for (const ReplayEvent& e : model.prologue) prologue_blocks += e.kind == ReplayEvent::Kind::kAllocate ? 1 : 0;
  uint64_t first_blocks = 0;
  for (const ReplayEvent& e : model.first) first_blocks += e.kind == ReplayEvent::Kind::kAllocate ? 1 : 0;
  uint64_t steady_blocks = 0;
  for (const ReplayEvent& e : model.steady) steady_blocks += e.kind == ReplayEvent::Kind::kAllocate ? 1 : 0;
  const uint64_t base = prologue_blocks + first_blocks + (n - 1) * steady_blocks;
  out->reserve(out->size() + model.steady.size());
  for (ReplayEvent event : model.steady) {
    if ((event.block & kCarried) == 0) {
      event.block = base + event.block;
    } else if (n == 1) {
      event.block = (event.block & ~kCarried) >> 32;
    } else {
      event.block = base - steady_blocks + (event.block & kSlotMask);
    }
    out->push_back(event);
  }
}

}  // namespace zico::simulate
