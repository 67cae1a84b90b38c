// What zico-demo measured, and how it is shown: a side-by-side table (or
// JSON) of the two phases, and one timeline SVG per phase.
//
// Units: the jobs run scaled (memory × memory_scale, time × time_scale);
// everything shown in "model" terms is scaled back: bytes / memory_scale,
// durations / time_scale (so iterations per second × time_scale).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "demo_node.h"
#include "job_model.h"

namespace zico::demo {

struct DemoJob {
  std::string name;
  std::string trace_path;
  simulate::JobModel model;
  uint64_t reservation_bytes = 0;  // node bytes static partitioning reserves for it
};

struct DemoSetup {
  std::vector<DemoJob> jobs;
  uint64_t budget_bytes = 0;       // model bytes
  uint64_t node_budget_bytes = 0;  // what zico-umd lends: budget × memory scale, whole chunks
  uint64_t chunk_bytes = 0;        // zico-umd's chunk (0: the driver's granularity)
  uint32_t iterations = 0;
  double time_scale = 1;
  double memory_scale = 1;
  std::string memory_scale_text;   // "1/256"
  std::string backend;             // sim or cuda
};

struct JobRun {
  std::map<std::string, std::string> result;  // trace_job's result line, key=value
  double start_s = 0;  // since the phase began
  double end_s = 0;
  uint64_t peak_held_bytes = 0;  // node bytes, from the daemon's samples

  [[nodiscard]] double number(const std::string& key) const;
};

struct PhaseRun {
  std::string name;  // zico or static
  std::string description;
  double makespan_s = 0;
  std::vector<JobRun> jobs;
  std::vector<NodeSample> samples;
  uint64_t peak_granted_bytes = 0;   // node bytes
  uint64_t peak_reserved_bytes = 0;  // node bytes; static only
  uint64_t samples_over_budget = 0;
  uint64_t deadlocks = 0;
  std::string svg_path;

  [[nodiscard]] double iterations_per_s() const;
};

// Fills the peaks and checks from the samples; `pids` are the jobs' pids in order.
void summarize_samples(const std::vector<uint32_t>& pids, PhaseRun* phase);

// Writes the phase's timeline (what each job holds, in model bytes, and the budget).
[[nodiscard]] bool write_timeline_svg(const DemoSetup& setup, const std::vector<uint32_t>& pids, const PhaseRun& phase,
                                      const std::string& path, std::string* why);

// What the simulator predicts for the same jobs, budget and iterations
// (zico-umd's ledger and time-shift scheduler in virtual time, the jobs
// sharing no compute, as the demo's), beside which each run is printed.
struct Prediction {
  bool known = false;
  double zico_iters_per_s = 0;    // model iterations per second
  double static_iters_per_s = 0;  // static partitioning with the demo's plan
  uint64_t zico_deadlocks = 0;  // deadlocks broken, each a yield to host (the live column)
  [[nodiscard]] double ratio() const { return static_iters_per_s > 0 ? zico_iters_per_s / static_iters_per_s : 0; }
};

void print_table(const DemoSetup& setup, const PhaseRun& zico, const PhaseRun& fixed, const Prediction& predicted,
                 double wall_s);
void print_json(const DemoSetup& setup, const PhaseRun& zico, const PhaseRun& fixed, const Prediction& predicted,
                double wall_s);

}  // namespace zico::demo
