// Status: how every internal zicoum call reports failure.
//
// Errors are values, never exceptions: the library sits under C entry points
// (cudaMalloc interposition, the PyTorch ABI) that must not throw, so every
// fallible call returns a [[nodiscard]] Status. A Status carries a category
// (what the caller can do about it) and a detail code (the CUresult or errno
// that caused it) so logs can name the root cause.
#pragma once

#include <cstdint>
#include <string>

namespace zico {

enum class Errc : uint8_t {
  kOk = 0,
  kOutOfMemory,      // budget or device memory exhausted; the process may retry after freeing
  kInvalidArgument,  // caller error: bad pointer, size, range, or handle
  kNotFound,         // pointer or handle unknown to this component
  kNoDriver,         // libcuda.so.1 could not be loaded or resolved
  kNoDevice,         // the driver loaded but the device ordinal does not exist
  kNotSupported,     // the driver lacks a capability (fd export, discard, managed memory)
  kDriverError,      // any other CUresult
  kOsError,          // a system call failed; detail is errno
  kConfigError,      // a ZICO_* variable is malformed
  kFenceViolation,   // SimDriver: a VA edit raced in-flight stream work
  kInjectedFault,    // SimDriver: a fault-injection knob fired
  kSuspended,        // the allocator's memory is evicted until resume()
  kYield,            // the node manager picked this job to break a deadlock: give all memory back, ask again
};

const char* to_string(Errc code) noexcept;

class [[nodiscard]] Status {
 public:
  constexpr Status() noexcept = default;
  constexpr Status(Errc code, int64_t detail = 0) noexcept : code_(code), detail_(detail) {}

  static constexpr Status ok() noexcept { return Status(); }

  [[nodiscard]] constexpr bool is_ok() const noexcept { return code_ == Errc::kOk; }
  [[nodiscard]] constexpr Errc code() const noexcept { return code_; }
  [[nodiscard]] constexpr int64_t detail() const noexcept { return detail_; }
  // "out of memory (detail 2)" style text for logs and error messages.
  [[nodiscard]] std::string message() const;

  friend constexpr bool operator==(const Status& a, const Status& b) noexcept {
    return a.code_ == b.code_;
  }

 private:
  Errc code_ = Errc::kOk;
  int64_t detail_ = 0;
};

}  // namespace zico

// Returns the status from the enclosing function when an expression fails.
#define ZICO_RETURN_IF_ERROR(expr)          \
  do {                                      \
    ::zico::Status zico_status_ = (expr);   \
    if (!zico_status_.is_ok()) return zico_status_; \
  } while (0)
