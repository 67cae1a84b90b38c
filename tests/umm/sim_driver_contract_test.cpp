#include "driver_contract_test.h"
#include "sim_driver.h"

namespace zico::testing {

struct SimFactory {
  static Status make(std::unique_ptr<Driver>* out, std::string*) {
    SimOptions options;
    options.capacity = size_t{1} << 30;
    *out = std::make_unique<SimDriver>(options);
    return Status::ok();
  }
};

// A small granularity catches code that silently assumes 2 MiB.
struct SimSmallGranularityFactory {
  static Status make(std::unique_ptr<Driver>* out, std::string*) {
    SimOptions options;
    options.capacity = size_t{64} << 20;
    options.granularity = size_t{64} << 10;
    options.discard = false;
    options.posix_fd_export = false;
    *out = std::make_unique<SimDriver>(options);
    return Status::ok();
  }
};

using SimFactories = ::testing::Types<SimFactory, SimSmallGranularityFactory>;
INSTANTIATE_TYPED_TEST_SUITE_P(Sim, DriverContractTest, SimFactories);

}  // namespace zico::testing
