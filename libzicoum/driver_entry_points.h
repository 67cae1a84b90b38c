// The driver's lookup functions, as libzicoum hands them out
// (driver_entry_points.cpp).
#pragma once

namespace zico {

// `found` is what dlsym answered for `name` on a handle. Where `name` is the
// driver's lookup (cuGetProcAddress or cuGetProcAddress_v2) and `found` is not
// libzicoum's own, libzicoum's, which swaps what it hands out; else `found`.
[[nodiscard]] void* substitute_driver_lookup(const char* name, void* found) noexcept;

}  // namespace zico
