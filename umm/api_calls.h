// The allocate and free that every entry point (C API, PyTorch ABI, CUDA
// interposition) shares: runtime lookup, and a last-error text on failure.
#pragma once

#include <cstddef>

#include "status.h"
#include "types.h"

namespace zico {

[[nodiscard]] Status api_allocate(size_t bytes, DeviceId device, StreamHandle stream, void** out) noexcept;
// kNotFound when no zicoum arena holds `ptr` (the caller may forward it).
[[nodiscard]] Status api_free(void* ptr, StreamHandle stream) noexcept;

}  // namespace zico
