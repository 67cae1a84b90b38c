#include "status.h"

namespace zico {

const char* to_string(Errc code) noexcept {
  switch (code) {
    case Errc::kOk: return "ok";
    case Errc::kOutOfMemory: return "out of memory";
    case Errc::kInvalidArgument: return "invalid argument";
    case Errc::kNotFound: return "not found";
    case Errc::kNoDriver: return "no CUDA driver";
    case Errc::kNoDevice: return "no such device";
    case Errc::kNotSupported: return "not supported";
    case Errc::kDriverError: return "driver error";
    case Errc::kOsError: return "system call failed";
    case Errc::kConfigError: return "configuration error";
    case Errc::kFenceViolation: return "VA edit while stream work in flight";
    case Errc::kInjectedFault: return "injected fault";
    case Errc::kSuspended: return "suspended: memory is evicted until resumed";
    case Errc::kYield: return "asked by zico-umd to give its memory back (deadlock)";
  }
  return "unknown status";
}

std::string Status::message() const {
  std::string text = to_string(code_);
  if (detail_ != 0) text += " (detail " + std::to_string(detail_) + ")";
  return text;
}

}  // namespace zico
