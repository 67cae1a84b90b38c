// on_host_link: a model of the host link (SimManagedCosts here, the paging
// planners' TransferModel in prefetch/) moved to a link of another speed:
// the copy rates set to it each way, in the model's own ratio, and the
// fault path's rate scaled with them.
#pragma once

namespace zico {

template <typename LinkRates>
[[nodiscard]] LinkRates on_host_link(LinkRates rates, double host_bytes_per_s) {
  const double scale = host_bytes_per_s / rates.h2d_bytes_per_s;
  rates.h2d_bytes_per_s = host_bytes_per_s;
  rates.d2h_bytes_per_s *= scale;
  rates.fault_bytes_per_s *= scale;
  return rates;
}

}  // namespace zico
