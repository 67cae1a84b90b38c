#include "driver_factory.h"

#include "cuda_driver.h"
#include "gpu_calibration.h"
#include "host_link.h"
#include "sim_driver.h"

namespace zico {

Status open_driver(const Config& config, std::unique_ptr<Driver>* out, std::string* why) {
  if (config.backend == Backend::kSim) {
    SimOptions options;
    options.device_count = config.sim_devices;
    options.capacity = config.sim_capacity / config.sim_granularity * config.sim_granularity;
    options.granularity = config.sim_granularity;
    options.process_memory = config.sim_process_memory;
    options.capturing_stream = config.sim_capturing_stream;
    // The device's link as the pager's model sees it: the calibration's
    // figures, then an explicit host link rate over its rates.
    if (config.gpu_calibration) options.managed_costs = with_calibration(options.managed_costs, *config.gpu_calibration);
    if (config.host_bytes_per_second) {
      options.managed_costs = on_host_link(options.managed_costs, *config.host_bytes_per_second);
    }
    std::unique_ptr<SimDriver> driver;
    try {
      driver = std::make_unique<SimDriver>(options);
    } catch (const std::bad_alloc&) {
      *why = "no host memory for the simulated driver";
      return Status(Errc::kOutOfMemory);
    }
    if (!config.sim_device_board.empty()) {
      if (Status status = driver->share_devices(config.sim_device_board, why); !status.is_ok()) {
        *why = "ZICO_SIM_DEVICE_BOARD: " + *why;
        return status;
      }
    }
    *out = std::move(driver);
    return Status::ok();
  }
  const Status status = CudaDriver::open(out, why);
  if (!status.is_ok()) *why += " (ZICO_BACKEND=sim runs without a GPU)";
  return status;
}

}  // namespace zico
