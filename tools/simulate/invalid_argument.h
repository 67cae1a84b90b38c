// The simulator library's one way to refuse an argument: the message goes to
// *error (when given) and the status is kInvalidArgument.
#pragma once

#include <string>
#include <utility>

#include "status.h"

namespace zico::simulate {

inline Status invalid(std::string* error, std::string text) {
  if (error != nullptr) *error = std::move(text);
  return Status(Errc::kInvalidArgument);
}

}  // namespace zico::simulate
