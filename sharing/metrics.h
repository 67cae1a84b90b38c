// Metrics: zico-umd's state in the Prometheus text format (version 0.0.4),
// served over HTTP on `--metrics HOST:PORT` by MetricsServer
// (metrics_server.h). docs/operations.md lists every metric for operators.
//
// Names follow Prometheus's conventions: a `zicoum_` prefix, the unit in the
// name (`_bytes`, `_seconds`), `_total` on counters, HELP and TYPE for every
// family, also when it has no series yet (so that dashboards and rules can
// be checked against a daemon without jobs). Labels: `gpu` (the daemon's
// index) and `uuid` (`GPU-` and the 8-4-4-4-12 hex form nvidia-smi and DCGM's
// exporter print, so the series join with theirs) on every per-GPU and
// per-job series; `job_id`, `job_name`, `uid` and `pid` on per-job ones
// (never `job`, which Prometheus reserves for the scrape job).
//
// Three sources: the status every zico-umctl also reads (proto::StatusReply:
// budgets, holdings, the ledger's counts), and EventCounts, what the daemon
// counts only for its metrics: the events operators alert on and the waits
// as histograms.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "latency_histogram.h"
#include "protocol.h"

namespace zico::sharing {

// Updated by the daemon's thread as things happen; read by render_metrics
// on the same thread.
struct EventCounts {
  struct Gpu {
    uint64_t grants = 0;    // requests granted
    uint64_t denials = 0;   // requests refused: beyond every limit, a deadlock's victim under
                            // --on-deadlock fail, a process holding more than it was lent, chunks
                            // that could not be created
    uint64_t timeouts = 0;  // requests a job withdrew after waiting its ZICO_WAIT_TIMEOUT
    uint64_t reclaims = 0;  // asks to a job to give idle memory back
    uint64_t parks = 0;     // jobs sent to host memory to let another's iteration run (--turns)
    LatencyHistogram grant_wait;  // from a request's arrival to its grant
  };
  std::vector<Gpu> gpus;  // by the daemon's GPU index
  uint64_t suspends = 0;  // jobs that suspended (zico-umctl suspend, or parked)
  uint64_t resumes = 0;   // jobs that ran again after a suspension
  LatencyHistogram gate_delay;  // from a job's iteration mark to its go (kProceed)
};

// The uuid label's value: "GPU-" and 8-4-4-4-12 lowercase hex digits.
[[nodiscard]] std::string uuid_label(const proto::GpuUuid& uuid);

[[nodiscard]] std::string render_metrics(const proto::StatusReply& status, const EventCounts& events);

}  // namespace zico::sharing
