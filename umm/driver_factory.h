// The driver a configuration asks for (ZICO_BACKEND and the ZICO_SIM_*
// variables): one rule for libzicoum and zico-umd alike.
#pragma once

#include <memory>
#include <string>

#include "config.h"
#include "driver.h"
#include "status.h"

namespace zico {

// SimDriver as configured, or CudaDriver (kNoDriver with *why when libcuda
// cannot be loaded; the text suggests ZICO_BACKEND=sim).
[[nodiscard]] Status open_driver(const Config& config, std::unique_ptr<Driver>* out, std::string* why);

}  // namespace zico
