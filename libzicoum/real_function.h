// RealFunction: the real CUDA function behind one that libzicoum defines.
//
// dlsym(RTLD_NEXT) sees only the global scope, and cudart or libcuda loaded
// by a library opened with RTLD_LOCAL (Python extension modules: CuPy, JAX
// plugins; JNI) is not in it: then each loaded cudart (or libcuda) is opened
// again (RTLD_NOLOAD: the reference keeps it loaded while we hold its
// function) and asked alone. A lookup that finds nothing is tried again once
// another library was loaded; one that succeeds is kept.
#pragma once

#include <atomic>

namespace zico {

namespace real_function_detail {
// The symbol `name` of the library that defines it for real (cudart for
// cuda*, the driver for cu*), or nullptr; *loaded_count receives how many
// objects the loader had loaded when it looked.
void* find(const char* name, unsigned long long* loaded_count);
// How many objects the loader has loaded so far.
unsigned long long libraries_loaded();
}  // namespace real_function_detail

template <typename Fn>
class RealFunction {
 public:
  explicit constexpr RealFunction(const char* name) : name_(name) {}
  Fn get() {
    if (Fn known = cached_.load(std::memory_order_acquire)) return known;
    const unsigned long long missed = missed_at_.load(std::memory_order_acquire);
    if (missed != kNever && real_function_detail::libraries_loaded() == missed) return nullptr;
    unsigned long long loaded = 0;
    const auto function = reinterpret_cast<Fn>(real_function_detail::find(name_, &loaded));
    if (function != nullptr) {
      cached_.store(function, std::memory_order_release);
    } else {
      missed_at_.store(loaded, std::memory_order_release);
    }
    return function;
  }

 private:
  static constexpr unsigned long long kNever = ~0ull;
  const char* name_;
  std::atomic<Fn> cached_{nullptr};
  std::atomic<unsigned long long> missed_at_{kNever};
};

}  // namespace zico
