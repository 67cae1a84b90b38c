#include "autoswap_policy.h"
#include "deepum_policy.h"
#include "paging_policy.h"
#include "um_policy.h"
#include "zico_policy.h"

namespace zico::prefetch {

std::unique_ptr<PagingPolicy> make_policy(std::string_view name, const Residency& residency,
                                          const TransferModel& model) {
  if (name == "um") return std::make_unique<UmPolicy>();
  if (name == "deepum") return std::make_unique<DeepUmPolicy>(residency, model);
  if (name == "autoswap") return std::make_unique<AutoSwapPolicy>(residency, model);
  if (name == "zico") return std::make_unique<ZicoPolicy>(residency, model);
  return nullptr;
}

}  // namespace zico::prefetch
