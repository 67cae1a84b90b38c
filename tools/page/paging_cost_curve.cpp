#include "paging_cost_curve.h"

#include <algorithm>
#include <vector>

#include "access_stream.h"
#include "paging_simulator.h"
#include "trace_stream.h"

namespace zico::page {

bool measure_paging_cost(const trace::Trace& trace, const PagingCostOptions& options, sharing::PagingCost* out,
                         std::string* error) {
  *out = sharing::PagingCost{};
  prefetch::AccessStream stream;
  if (!build_access_stream(trace, options.page_bytes, 0, &stream, error)) return false;
  if (stream.iterations < 2) {
    *error = stream.name + ": " + std::to_string(stream.iterations) +
             " iteration(s); measuring a steady iteration needs at least 2";
    return false;
  }
  const prefetch::StreamFacts facts = prefetch::stream_facts(stream);
  const uint64_t page = stream.page_bytes;
  const uint64_t floor = uint64_t{facts.max_op_pages} * page;
  const uint64_t peak = std::max(floor, (facts.peak_live_bytes + page - 1) / page * page);
  const double in_memory = static_cast<double>(std::max<uint64_t>(facts.steady_compute_ns, 1));
  out->floor_bytes = floor;
  const uint32_t points = std::max<uint32_t>(options.points, 2);
  std::vector<uint64_t> caps;
  for (uint32_t k = points; k-- > 0;) {
    // k = points - 1 is the floor, k = 0 the peak; squared, so most points
    // lie near the peak.
    const double from_peak = static_cast<double>(k) / static_cast<double>(points - 1);
    const auto below = static_cast<uint64_t>(static_cast<double>(peak - floor) * from_peak * from_peak);
    caps.push_back(std::max(floor, (peak - below) / page * page));
  }
  // Blocks share pages, so at the peak of live bytes a job may still page a
  // little; with every page it ever touches resident it pages nothing.
  caps.push_back(uint64_t{stream.page_count} * page);
  for (const uint64_t cap : caps) {
    if (!out->points.empty() && cap <= out->points.back().cap_bytes) continue;
    PagingOptions run;
    run.budget_bytes = cap;
    run.model = options.model;
    PagingResult result;
    if (!run_paging(stream, "zico", run, &result, error)) return false;
    double stretch = std::max(1.0, static_cast<double>(result.iterations.back().elapsed_ns()) / in_memory);
    // A larger cap can always do what a smaller one does.
    if (!out->points.empty()) stretch = std::min(stretch, out->points.back().stretch);
    out->points.push_back({cap, stretch});
  }
  return true;
}

}  // namespace zico::page
