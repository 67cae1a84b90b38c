// The calling thread's last failure, in words, for zico_last_error().
// Entry points set it whenever they return an error; success leaves it alone.
#pragma once

#include <string>

namespace zico {

inline std::string& thread_last_error() {
  thread_local std::string text;
  return text;
}

inline void set_last_error(std::string text) { thread_last_error() = std::move(text); }

}  // namespace zico
