#include "demo_report.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "plot_file.h"
#include "timeline_plot.h"

namespace zico::demo {
namespace {

constexpr double kGiB = double(uint64_t{1} << 30);

double model_gib(const DemoSetup& setup, uint64_t node_bytes) {
  return static_cast<double>(node_bytes) / setup.memory_scale / kGiB;
}

uint64_t model_bytes(const DemoSetup& setup, uint64_t node_bytes) {
  return static_cast<uint64_t>(static_cast<double>(node_bytes) / setup.memory_scale + 0.5);
}

double job_iterations_per_s(const JobRun& job) {
  const double seconds = job.number("iteration_s");
  return seconds > 0 ? job.number("iterations") / seconds : 0;
}

double slowdown(const JobRun& job) {
  const double ideal = job.number("ideal_iter_s");
  return ideal > 0 ? job.number("mean_iter_s") / ideal : 0;
}

// The job that zico slowed most against static partitioning, per iteration:
// the trade-off behind the aggregate figure (under zico a job runs beside
// more others and waits at its peaks; under static it waits to start).
struct Tradeoff {
  size_t job = 0;
  double ratio = 0;  // zico's mean iteration / static's
};

Tradeoff largest_tradeoff(const PhaseRun& zico, const PhaseRun& fixed) {
  Tradeoff worst;
  for (size_t i = 0; i < zico.jobs.size() && i < fixed.jobs.size(); ++i) {
    const double static_iter = fixed.jobs[i].number("mean_iter_s");
    if (static_iter <= 0) continue;
    const double ratio = zico.jobs[i].number("mean_iter_s") / static_iter;
    if (ratio > worst.ratio) worst = Tradeoff{i, ratio};
  }
  return worst;
}

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string json_number(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.6g", value);
  return text;
}

std::string phase_json(const DemoSetup& setup, const PhaseRun& phase) {
  std::string out = "{\"description\": " + json_string(phase.description) +
                    ", \"makespan_s\": " + json_number(phase.makespan_s) +
                    ", \"iterations_per_s\": " + json_number(phase.iterations_per_s()) +
                    ", \"model_iterations_per_s\": " + json_number(phase.iterations_per_s() * setup.time_scale) +
                    ", \"peak_held_bytes\": " + std::to_string(model_bytes(setup, phase.peak_granted_bytes)) +
                    ", \"peak_held_node_bytes\": " + std::to_string(phase.peak_granted_bytes) +
                    ", \"peak_reserved_bytes\": " + std::to_string(model_bytes(setup, phase.peak_reserved_bytes)) +
                    ", \"budget_exceeded\": " + (phase.samples_over_budget > 0 ? "true" : "false") +
                    ", \"samples\": " + std::to_string(phase.samples.size()) +
                    ", \"deadlocks\": " + std::to_string(phase.deadlocks) +
                    ", \"svg\": " + json_string(phase.svg_path) + ", \"jobs\": [";
  for (size_t i = 0; i < phase.jobs.size(); ++i) {
    const JobRun& job = phase.jobs[i];
    out += std::string(i == 0 ? "" : ", ") + "{\"name\": " + json_string(setup.jobs[i].name) +
           ", \"start_s\": " + json_number(job.start_s) + ", \"end_s\": " + json_number(job.end_s);
    for (const char* key : {"iterations", "iteration_s", "mean_iter_s", "ideal_iter_s", "delay_s", "gate_wait_s",
                            "malloc_wait_s", "late_s"}) {
      out += std::string(", \"") + key + "\": " + json_number(job.number(key));
    }
    out += ", \"iterations_per_s\": " + json_number(job_iterations_per_s(job)) +
           ", \"model_iterations_per_s\": " + json_number(job_iterations_per_s(job) * setup.time_scale) +
           ", \"model_iteration_ms\": " + json_number(job.number("mean_iter_s") / setup.time_scale * 1e3) +
           ", \"slowdown\": " + json_number(slowdown(job)) +
           ", \"peak_held_bytes\": " + std::to_string(model_bytes(setup, job.peak_held_bytes)) + "}";
  }
  return out + "]}";
}

}  // namespace

double JobRun::number(const std::string& key) const {
  const auto it = result.find(key);
  return it == result.end() ? 0 : std::strtod(it->second.c_str(), nullptr);
}

double PhaseRun::iterations_per_s() const {
  double iterations = 0;
  for (const JobRun& job : jobs) iterations += job.number("iterations");
  return makespan_s > 0 ? iterations / makespan_s : 0;
}

void summarize_samples(const std::vector<uint32_t>& pids, PhaseRun* phase) {
  for (const NodeSample& sample : phase->samples) {
    phase->peak_granted_bytes = std::max(phase->peak_granted_bytes, sample.granted_bytes);
    if (sample.granted_bytes > sample.budget_bytes) ++phase->samples_over_budget;
    phase->deadlocks = std::max(phase->deadlocks, sample.deadlocks);
    for (const auto& [pid, bytes] : sample.held) {
      const auto it = std::find(pids.begin(), pids.end(), pid);
      if (it == pids.end()) continue;
      JobRun& job = phase->jobs[static_cast<size_t>(it - pids.begin())];
      job.peak_held_bytes = std::max(job.peak_held_bytes, bytes);
    }
  }
}

bool write_timeline_svg(const DemoSetup& setup, const std::vector<uint32_t>& pids, const PhaseRun& phase,
                        const std::string& path, std::string* why) {
  std::vector<simulate::TimelineSeries> series(setup.jobs.size());
  for (size_t i = 0; i < series.size(); ++i) series[i].name = setup.jobs[i].name;
  std::vector<uint64_t> last(series.size(), 0);
  for (const NodeSample& sample : phase.samples) {
    std::vector<uint64_t> held(series.size(), 0);
    for (const auto& [pid, bytes] : sample.held) {
      const auto it = std::find(pids.begin(), pids.end(), pid);
      if (it != pids.end()) held[static_cast<size_t>(it - pids.begin())] = model_bytes(setup, bytes);
    }
    for (size_t i = 0; i < series.size(); ++i) {
      if (series[i].steps.empty() || held[i] != last[i]) series[i].steps.emplace_back(sample.time_ns, held[i]);
      last[i] = held[i];
    }
  }
  // Every series runs to the last sample, so the plot spans the whole phase.
  if (!phase.samples.empty()) {
    for (size_t i = 0; i < series.size(); ++i) {
      if (series[i].steps.back().first != phase.samples.back().time_ns) {
        series[i].steps.emplace_back(phase.samples.back().time_ns, last[i]);
      }
    }
  }
  simulate::TimelinePlotOptions options;
  options.title = "zico-demo, " + phase.name + ": " + phase.description;
  char subtitle[320];
  std::snprintf(subtitle, sizeof subtitle,
                "memory each job holds from zico-umd (sampled every 10 ms), in model bytes (x %g); time in seconds "
                "of the replay, %gx slower than the model; peak %.2f GiB, budget %.2f GiB; makespan %.1f s",
                1 / setup.memory_scale, setup.time_scale, model_gib(setup, phase.peak_granted_bytes),
                static_cast<double>(setup.budget_bytes) / kGiB, phase.makespan_s);
  options.subtitle = subtitle;
  const simulate::TimeSteps budget = {{0, setup.budget_bytes}};
  const std::string svg = simulate::timeline_plot_svg(series, budget, options);
  return plot::write_plot_file(path, svg, why);
}

void print_table(const DemoSetup& setup, const PhaseRun& zico, const PhaseRun& fixed, const Prediction& predicted,
                 double wall_s) {
  uint64_t peaks = 0;
  for (const DemoJob& job : setup.jobs) peaks += job.model.peak_bytes;
  const double budget_gib = static_cast<double>(setup.budget_bytes) / kGiB;
  std::printf("\nzico-demo: %zu training jobs share one %s GPU with a node budget of %.2f GiB;\n", setup.jobs.size(),
              setup.backend == "sim" ? "simulated" : "CUDA", budget_gib);
  std::printf("their peaks sum to %.2f GiB (%.2fx the budget). Each replays %u iterations of its trace,\n",
              static_cast<double>(peaks) / kGiB, static_cast<double>(peaks) / static_cast<double>(setup.budget_bytes),
              setup.iterations);
  std::printf("memory scaled %s (zico-umd lends %.1f MiB", setup.memory_scale_text.c_str(),
              static_cast<double>(setup.node_budget_bytes) / double(1 << 20));
  if (setup.chunk_bytes != 0) std::printf(" in %llu KiB chunks", static_cast<unsigned long long>(setup.chunk_bytes >> 10));
  std::printf("), time x%g (1 model second takes %g s).\n", setup.time_scale, setup.time_scale);
  std::printf("Model units (*): memory / memory scale, time / time scale.\n\n");

  std::printf("%-14s %8s %9s | %-37s | %-36s\n", "", "", "", "zico: time-shift sharing", "static: each reserves its peak");
  std::printf("%-14s %8s %9s | %6s %7s %8s %6s %6s | %7s %6s %7s %8s %6s\n", "job", "peak", "period*", "it/s",
              "it/s*", "iter*", "slow", "delay", "reserve", "start", "it/s*", "iter*", "slow");
  std::printf("%-14s %8s %9s | %6s %7s %8s %6s %6s | %7s %6s %7s %8s %6s\n", "", "GiB", "ms", "", "", "ms", "x",
              "s", "GiB*", "s", "", "ms", "x");
  for (size_t i = 0; i < setup.jobs.size(); ++i) {
    const DemoJob& job = setup.jobs[i];
    const JobRun& z = zico.jobs[i];
    const JobRun& s = fixed.jobs[i];
    std::printf("%-14s %8.2f %9.2f | %6.2f %7.2f %8.2f %6.2f %6.2f | %7.2f %6.2f %7.2f %8.2f %6.2f\n",
                job.name.c_str(), static_cast<double>(job.model.peak_bytes) / kGiB,
                static_cast<double>(job.model.steady_period_ns) / 1e6, job_iterations_per_s(z),
                job_iterations_per_s(z) * setup.time_scale, z.number("mean_iter_s") / setup.time_scale * 1e3,
                slowdown(z), z.number("delay_s"), model_gib(setup, job.reservation_bytes), s.start_s,
                job_iterations_per_s(s) * setup.time_scale, s.number("mean_iter_s") / setup.time_scale * 1e3,
                slowdown(s));
  }
  std::printf("(slow: mean iteration / the trace's own; delay: time blocked in zicoum, at iteration gates and in\n"
              " allocations; reserve: its peak alone under zicoum's allocator; start: when that fit)\n");
  if (const Tradeoff t = largest_tradeoff(zico, fixed); t.ratio > 1.05) {
    std::printf("The trade-off: %s's iterations took %.2fx as long under zico as under static (more jobs sharing\n"
                "the GPU at once, and %.2f s blocked in zicoum at its gates and in allocations); static made it wait\n"
                "%.2f s to start instead.\n",
                setup.jobs[t.job].name.c_str(), t.ratio, zico.jobs[t.job].number("delay_s"), fixed.jobs[t.job].start_s);
  }
  std::printf("\n");

  std::printf("%-8s %9s %7s %7s %10s %9s %8s %14s %10s\n", "phase", "makespan", "it/s", "it/s*", "peak held",
              "reserved", "budget", "budget kept", "yields");
  std::printf("%-8s %9s %7s %7s %10s %9s %8s %14s %10s\n", "", "s", "", "", "GiB*", "GiB*", "GiB*", "(samples)",
              "to host");
  for (const PhaseRun* phase : {&zico, &fixed}) {
    char kept[32];
    std::snprintf(kept, sizeof kept, "%s (%zu)", phase->samples_over_budget == 0 ? "yes" : "NO", phase->samples.size());
    char reserved[16] = "-";
    if (phase->peak_reserved_bytes != 0) std::snprintf(reserved, sizeof reserved, "%.2f", model_gib(setup, phase->peak_reserved_bytes));
    std::printf("%-8s %9.2f %7.2f %7.2f %10.2f %9s %8.2f %14s %10llu\n", phase->name.c_str(), phase->makespan_s,
                phase->iterations_per_s(), phase->iterations_per_s() * setup.time_scale,
                model_gib(setup, phase->peak_granted_bytes), reserved, budget_gib, kept,
                static_cast<unsigned long long>(phase->deadlocks));
  }
  const double ratio = fixed.iterations_per_s() > 0 ? zico.iterations_per_s() / fixed.iterations_per_s() : 0;
  std::printf("\nzico / static: %.2fx the aggregate throughput, %.2fx the makespan.\n", ratio,
              fixed.makespan_s > 0 ? zico.makespan_s / fixed.makespan_s : 0);
  if (predicted.known) {
    std::printf("The simulator, on these jobs, budget and iterations (zico-umd's ledger and scheduler in virtual\n"
                "time, the jobs sharing no compute as here), predicts %.2fx with %llu yields to host; this run got\n"
                "%.2fx with %llu. Where the live daemon falls short: docs/benchmarks.md, \"zico-demo\".\n",
                predicted.ratio(), static_cast<unsigned long long>(predicted.zico_deadlocks), ratio,
                static_cast<unsigned long long>(zico.deadlocks));
  }
  std::printf("timelines: %s  %s\n", zico.svg_path.c_str(), fixed.svg_path.c_str());
  std::printf("(the demo took %.1f s)\n", wall_s);
}

void print_json(const DemoSetup& setup, const PhaseRun& zico, const PhaseRun& fixed, const Prediction& predicted,
                double wall_s) {
  std::string out = "{\"backend\": " + json_string(setup.backend) +
                    ", \"budget_bytes\": " + std::to_string(setup.budget_bytes) +
                    ", \"node_budget_bytes\": " + std::to_string(setup.node_budget_bytes) +
                    ", \"chunk_bytes\": " + std::to_string(setup.chunk_bytes) +
                    ", \"memory_scale\": " + json_number(setup.memory_scale) +
                    ", \"time_scale\": " + json_number(setup.time_scale) +
                    ", \"iterations\": " + std::to_string(setup.iterations) + ", \"jobs\": [";
  for (size_t i = 0; i < setup.jobs.size(); ++i) {
    const DemoJob& job = setup.jobs[i];
    out += std::string(i == 0 ? "" : ", ") + "{\"name\": " + json_string(job.name) +
           ", \"trace\": " + json_string(job.trace_path) +
           ", \"peak_bytes\": " + std::to_string(job.model.peak_bytes) +
           ", \"steady_period_ns\": " + std::to_string(job.model.steady_period_ns) +
           ", \"reservation_bytes\": " + std::to_string(model_bytes(setup, job.reservation_bytes)) + "}";
  }
  const double ratio = fixed.iterations_per_s() > 0 ? zico.iterations_per_s() / fixed.iterations_per_s() : 0;
  const Tradeoff tradeoff = largest_tradeoff(zico, fixed);
  out += "], \"slowest_against_static\": {\"name\": " +
         json_string(tradeoff.ratio > 0 ? setup.jobs[tradeoff.job].name : std::string()) +
         ", \"iteration_ratio\": " + json_number(tradeoff.ratio) + "}";
  out += ", \"phases\": {\"zico\": " + phase_json(setup, zico) + ", \"static\": " + phase_json(setup, fixed) +
         "}, \"throughput_ratio\": " + json_number(ratio) + ", \"budget_exceeded\": " +
         (zico.samples_over_budget + fixed.samples_over_budget > 0 ? "true" : "false") +
         ", \"simulated\": {\"known\": " + (predicted.known ? "true" : "false") +
         ", \"zico_iters_per_s\": " + json_number(predicted.zico_iters_per_s) +
         ", \"static_iters_per_s\": " + json_number(predicted.static_iters_per_s) +
         ", \"throughput_ratio\": " + json_number(predicted.ratio()) +
         ", \"zico_deadlocks\": " + std::to_string(predicted.zico_deadlocks) + "}" +
         ", \"wall_s\": " + json_number(wall_s) + "}\n";
  std::fputs(out.c_str(), stdout);
}

}  // namespace zico::demo
