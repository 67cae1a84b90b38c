#include "demand_curve.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace zico::sharing {
namespace {

// Differences are compared in double: exact for anything below 2^53 bytes or
// ns, and a tolerance is a fraction anyway.
bool moved(uint64_t a, uint64_t b, double limit) {
  const uint64_t diff = a > b ? a - b : b - a;
  return static_cast<double>(diff) > limit;
}

}  // namespace

size_t DemandCurve::bin_of(uint64_t phase_ns) const {
  if (period_ns == 0) return 0;
  if (phase_ns >= period_ns) return kDemandBins - 1;
  // phase * kDemandBins / period is exact, so bin i covers
  // [i * period / kDemandBins, (i + 1) * period / kDemandBins) with no
  // rounding drift across the 128 bins. The product only overflows for
  // periods of years; those fall back to whole-ns bins.
  if (period_ns <= UINT64_MAX / kDemandBins) return static_cast<size_t>(phase_ns * kDemandBins / period_ns);
  return std::min<size_t>(kDemandBins - 1, static_cast<size_t>(phase_ns / (period_ns / kDemandBins)));
}

uint64_t DemandCurve::peak() const { return *std::max_element(bins.begin(), bins.end()); }

uint64_t DemandCurve::trough() const { return *std::min_element(bins.begin(), bins.end()); }

uint64_t DemandCurve::max_from(uint64_t phase_ns) const {
  return *std::max_element(bins.begin() + static_cast<std::ptrdiff_t>(bin_of(phase_ns)), bins.end());
}

bool materially_different(const DemandCurve& previous, const DemandCurve& next, double tolerance) {
  if (previous.known() != next.known()) return true;
  if (!previous.known()) return false;
  if (moved(previous.period_ns, next.period_ns, tolerance * static_cast<double>(previous.period_ns))) return true;
  // Bins are judged against the larger peak, not their own size: a bin going
  // from 1 MiB to 2 MiB beside a 10 GiB peak changes no plan.
  const double limit = tolerance * static_cast<double>(std::max(previous.peak(), next.peak()));
  if (moved(previous.peak(), next.peak(), limit)) return true;
  for (size_t i = 0; i < kDemandBins; ++i) {
    if (moved(previous.bins[i], next.bins[i], limit)) return true;
  }
  return false;
}

}  // namespace zico::sharing
