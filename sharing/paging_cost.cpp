#include "paging_cost.h"

#include <algorithm>
#include <cmath>

namespace zico::sharing {

double PagingCost::stretch_at(uint64_t cap_bytes) const {
  if (points.empty()) return 1.0;
  if (cap_bytes <= points.front().cap_bytes) return points.front().stretch;
  if (cap_bytes >= points.back().cap_bytes) return points.back().stretch;
  const auto above = std::upper_bound(points.begin(), points.end(), cap_bytes,
                                      [](uint64_t cap, const Point& point) { return cap < point.cap_bytes; });
  const Point& hi = *above;
  const Point& lo = *(above - 1);
  const double at = static_cast<double>(cap_bytes - lo.cap_bytes) / static_cast<double>(hi.cap_bytes - lo.cap_bytes);
  return lo.stretch + (hi.stretch - lo.stretch) * at;
}

uint64_t PagingCost::least_cap_within(double stretch) const {
  if (points.empty()) return floor_bytes;
  if (points.front().stretch <= stretch) return points.front().cap_bytes;
  for (size_t i = 1; i < points.size(); ++i) {
    const Point& hi = points[i];
    if (hi.stretch > stretch) continue;
    // Between the points the stretch falls linearly from lo's to hi's.
    const Point& lo = points[i - 1];
    const double at = (lo.stretch - stretch) / (lo.stretch - hi.stretch);
    return lo.cap_bytes + static_cast<uint64_t>(std::ceil(at * static_cast<double>(hi.cap_bytes - lo.cap_bytes)));
  }
  return points.back().cap_bytes;
}

std::string PagingCost::invalid() const {
  for (size_t i = 0; i < points.size(); ++i) {
    const Point& point = points[i];
    const std::string which = "paging cost point " + std::to_string(i);
    if (point.cap_bytes < floor_bytes) {
      return which + ": cap " + std::to_string(point.cap_bytes) + " B is below the floor " +
             std::to_string(floor_bytes) + " B";
    }
    if (!std::isfinite(point.stretch) || point.stretch < 1.0) {
      return which + ": stretch " + std::to_string(point.stretch) + " is not a number >= 1";
    }
    if (i > 0 && point.cap_bytes <= points[i - 1].cap_bytes) return which + ": caps must increase";
    if (i > 0 && point.stretch > points[i - 1].stretch) {
      return which + ": stretch " + std::to_string(point.stretch) + " rises with a larger cap";
    }
  }
  return {};
}

uint64_t gate_paging_bytes(double link_bytes_per_second, uint64_t period_ns) {
  if (!(link_bytes_per_second > 0) || period_ns == 0) return 0;
  const double bytes = link_bytes_per_second * static_cast<double>(period_ns) / 1e9;
  return bytes >= 1.8e19 ? UINT64_MAX : static_cast<uint64_t>(bytes);
}

}  // namespace zico::sharing
