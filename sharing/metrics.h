// Metrics: zico-umd's state in Prometheus text format, served over HTTP on
// `--metrics HOST:PORT` by MetricsServer (metrics_server.h).
//
// Per GPU: budget, granted, pool and waiting bytes, counters of chunks
// granted and returned, bytes moved and deadlocks broken, and the grant and
// return rates over the last 10 s (Prometheus can compute rates from the
// counters too; the gauges are for eyes and simple dashboards). Per job:
// granted, allocated, persistent, waiting bytes and seconds spent waiting.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "protocol.h"

namespace zico::sharing {

// Recent counter values, to turn counters into per-second rates.
class RateWindow {
 public:
  static constexpr uint64_t kWindowNs = 10'000'000'000;
  void sample(uint64_t now_ns, const proto::StatusReply& status);
  // Chunks per second over the window; 0 until two samples exist.
  [[nodiscard]] double grants_per_s(uint32_t gpu) const;
  [[nodiscard]] double returns_per_s(uint32_t gpu) const;

 private:
  struct Sample {
    uint64_t at_ns;
    std::vector<uint64_t> grants;
    std::vector<uint64_t> returns;
  };
  [[nodiscard]] double rate(uint32_t gpu, bool grants) const;
  std::deque<Sample> samples_;
};

[[nodiscard]] std::string render_metrics(const proto::StatusReply& status, const RateWindow& rates);

}  // namespace zico::sharing
