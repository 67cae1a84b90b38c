#include "paging_study.h"

#include <algorithm>
#include <cmath>

#include "belady_bound.h"
#include "peak_bound.h"
#include "segment_bound.h"

namespace zico::page {

bool study_paging(const prefetch::AccessStream& stream, uint64_t budget_bytes, const prefetch::TransferModel& model,
                  const std::vector<std::string>& policies, bool record_last_iteration, PagingStudy* out,
                  std::string* error) {
  *out = PagingStudy{};
  if (stream.iterations < 2) {
    *error = stream.name + ": " + std::to_string(stream.iterations) +
             " iteration(s); a steady iteration needs at least 2";
    return false;
  }
  const prefetch::StreamFacts facts = prefetch::stream_facts(stream);
  out->name = stream.name;
  out->page_bytes = stream.page_bytes;
  out->budget_bytes = budget_bytes;
  out->peak_live_bytes = facts.peak_live_bytes;
  out->peak_live_page_bytes = uint64_t{facts.peak_live_pages} * stream.page_bytes;
  out->range_bytes = uint64_t{stream.page_count} * stream.page_bytes;
  out->host_bytes_per_s = model.h2d_bytes_per_s;
  out->largest_op_bytes = uint64_t{facts.max_op_pages} * stream.page_bytes;
  if (budget_bytes / stream.page_bytes < facts.max_op_pages) {
    *error = "the budget holds " + std::to_string(budget_bytes / stream.page_bytes) + " pages, below the " +
             std::to_string(facts.max_op_pages) + " pages the largest op uses at once";
    return false;
  }
  out->in_memory_iteration_ns = facts.steady_compute_ns;
  const auto fetched = prefetch::belady_fetch_bytes(stream, static_cast<uint32_t>(budget_bytes / stream.page_bytes));
  out->lower_bound_fetch_bytes = fetched.back();
  const auto transfer_ns =
      static_cast<uint64_t>(std::ceil(static_cast<double>(fetched.back()) / model.h2d_bytes_per_s * 1e9));
  out->peak = prefetch::peak_bound(stream, budget_bytes, model);
  out->segments = prefetch::segment_bound(stream, budget_bytes, model);
  out->lower_bound_iteration_ns =
      std::max({facts.steady_compute_ns, transfer_ns, out->peak.iteration_ns(), out->segments.iteration_ns});

  for (const std::string& policy : policies) {
    PagingOptions options;
    options.budget_bytes = budget_bytes;
    options.model = model;
    options.record_last_iteration = record_last_iteration;
    PolicySummary summary;
    summary.policy = policy;
    if (!run_paging(stream, policy, options, &summary.run, error)) return false;
    const IterationStats& steady = summary.run.iterations.back();
    summary.iteration_ns = steady.elapsed_ns();
    summary.stall_ns = steady.stall_ns;
    summary.faults = steady.faults;
    summary.h2d_bytes = steady.h2d_bytes;
    summary.d2h_bytes = steady.d2h_bytes;
    summary.peak_resident_bytes = summary.run.peak_resident_bytes;
    summary.refused_decisions = summary.run.refused_prefetches + summary.run.refused_evictions;
    summary.live_discards = summary.run.live_discards;
    out->policies.push_back(std::move(summary));
  }
  return true;
}

}  // namespace zico::page
