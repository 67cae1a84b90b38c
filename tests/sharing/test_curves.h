// Demand curves for the scheduler's tests and benchmark.
#pragma once

#include <cstdint>

#include "demand_curve.h"

namespace zico::sharing::testing {

// Memory climbing from `base` to `peak` over the first half of the period
// and falling back over the second: a forward pass, then a backward pass.
inline DemandCurve triangle_curve(uint64_t period_ns, uint64_t base, uint64_t peak) {
  DemandCurve curve;
  curve.period_ns = period_ns;
  for (size_t b = 0; b < kDemandBins; ++b) {
    const size_t rise = b < kDemandBins / 2 ? b + 1 : kDemandBins - b;
    curve.bins[b] = base + (peak - base) * rise / (kDemandBins / 2);
  }
  curve.persistent_bytes = base;
  curve.transient_bytes = peak - base;
  curve.end_bytes = base;
  return curve;
}

}  // namespace zico::sharing::testing
