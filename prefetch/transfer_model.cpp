#include "transfer_model.h"

#include <cmath>
#include <numbers>

namespace zico::prefetch {
namespace {

uint64_t seconds_to_ns(double bytes, double bytes_per_s) {
  return static_cast<uint64_t>(std::ceil(bytes / bytes_per_s * 1e9));
}

}  // namespace

double TransferModel::efficiency(uint64_t bytes) const {
  if (size_knee_bytes <= 0) return 1.0;
  return 2 / std::numbers::pi * std::atan(static_cast<double>(bytes) / size_knee_bytes);
}

uint64_t TransferModel::h2d_ns(uint64_t bytes, bool duplex) const {
  const double bandwidth = h2d_bytes_per_s * (duplex ? duplex_factor : 1.0) * efficiency(bytes);
  return seconds_to_ns(static_cast<double>(bytes), bandwidth);
}

uint64_t TransferModel::d2h_ns(uint64_t bytes, bool duplex) const {
  const double bandwidth = d2h_bytes_per_s * (duplex ? duplex_factor : 1.0) * efficiency(bytes);
  return seconds_to_ns(static_cast<double>(bytes), bandwidth);
}

uint64_t TransferModel::fault_transfer_ns(uint64_t bytes) const {
  return seconds_to_ns(static_cast<double>(bytes), fault_bytes_per_s);
}

uint64_t TransferModel::fault_evict_ns(uint64_t bytes) const {
  return seconds_to_ns(static_cast<double>(bytes), d2h_bytes_per_s);
}

std::string TransferModel::invalid_field() const {
  auto positive = [](double v) { return std::isfinite(v) && v > 0; };
  if (!positive(h2d_bytes_per_s)) return "h2d_bytes_per_s " + std::to_string(h2d_bytes_per_s) + " (must be > 0)";
  if (!positive(d2h_bytes_per_s)) return "d2h_bytes_per_s " + std::to_string(d2h_bytes_per_s) + " (must be > 0)";
  if (!positive(fault_bytes_per_s)) {
    return "fault_bytes_per_s " + std::to_string(fault_bytes_per_s) + " (must be > 0)";
  }
  if (!(duplex_factor > 0 && duplex_factor <= 1)) {
    return "duplex_factor " + std::to_string(duplex_factor) + " (must be in (0, 1])";
  }
  if (fault_batch_pages == 0) return "fault_batch_pages 0 (must be >= 1)";
  if (!(size_knee_bytes >= 0) || !std::isfinite(size_knee_bytes)) {
    return "size_knee_bytes " + std::to_string(size_knee_bytes) + " (must be >= 0)";
  }
  return {};
}

}  // namespace zico::prefetch
