// LatencyHistogram: how long something took, counted in fixed buckets, for
// zico-umd's Prometheus histograms (metrics.h): a request's wait for its
// grant, a job's wait at its iteration gate.
//
// The buckets are fixed so that every zico-umd serves the same `le` labels:
// Prometheus sums and compares histograms across nodes and restarts only
// when their bucket bounds agree. They span a grant served at once (well
// under a millisecond) to one that waited out a job's ZICO_WAIT_TIMEOUT (60 s
// by default). Observations are kept per bucket, not cumulatively; the
// exposition adds them up. Not thread-safe: the daemon's thread owns it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace zico::sharing {

class LatencyHistogram {
 public:
  // Upper bounds (inclusive, Prometheus's `le`), in seconds; +Inf follows.
  static constexpr std::array<double, 12> kBoundsSeconds = {0.0001, 0.001, 0.005, 0.01, 0.05, 0.1,
                                                            0.5,    1,     5,     10,   30,   60};

  void observe(uint64_t ns) noexcept {
    const double seconds = static_cast<double>(ns) / 1e9;
    size_t bucket = 0;
    while (bucket < kBoundsSeconds.size() && seconds > kBoundsSeconds[bucket]) ++bucket;
    ++counts_[bucket];
    ++count_;
    sum_ns_ += ns;
  }
  // Observations up to kBoundsSeconds[bucket], or all of them for bucket ==
  // kBoundsSeconds.size() (+Inf).
  [[nodiscard]] uint64_t cumulative(size_t bucket) const noexcept {
    uint64_t total = 0;
    for (size_t i = 0; i <= bucket && i < counts_.size(); ++i) total += counts_[i];
    return total;
  }
  [[nodiscard]] uint64_t count() const noexcept { return count_; }
  [[nodiscard]] double sum_seconds() const noexcept { return static_cast<double>(sum_ns_) / 1e9; }

 private:
  std::array<uint64_t, kBoundsSeconds.size() + 1> counts_{};
  uint64_t count_ = 0;
  uint64_t sum_ns_ = 0;  // exact: 584 years of waiting before it wraps
};

}  // namespace zico::sharing
