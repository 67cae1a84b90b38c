// A job's id on the node: given by zico-umd when the job registers, kept
// across reconnections; never a pid (pids are reused).
#pragma once

#include <cstdint>

namespace zico::sharing {

using JobId = uint64_t;

}  // namespace zico::sharing
