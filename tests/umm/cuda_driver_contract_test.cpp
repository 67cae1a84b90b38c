// The driver contract on a real GPU. Skips, with the reason, where
// libcuda.so.1 or a device is missing (every CPU-only machine, CI included).
#include "cuda_driver.h"
#include "driver_contract_test.h"

namespace zico::testing {

struct CudaFactory {
  static Status make(std::unique_ptr<Driver>* out, std::string* why) {
    const Status status = CudaDriver::open(out, why);
    if (!status.is_ok()) return status;
    int count = 0;
    if (Status s = (*out)->device_count(&count); !s.is_ok() || count == 0) {
      *why = "the CUDA driver reports no devices";
      return Status(Errc::kNoDevice);
    }
    return Status::ok();
  }
};

INSTANTIATE_TYPED_TEST_SUITE_P(Cuda, DriverContractTest, CudaFactory);

}  // namespace zico::testing
