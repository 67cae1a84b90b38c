// Quiet, structured logging to stderr (never stdout: the library lives inside
// the user's process). One write(2) per line so lines from threads do not mix.
// Level comes from ZICO_LOG; the default shows warnings and errors only.
#pragma once

#include <cstdint>

namespace zico {

enum class LogLevel : uint8_t { kError, kWarn, kInfo, kDebug };

void set_log_level(LogLevel level) noexcept;
[[nodiscard]] bool log_enabled(LogLevel level) noexcept;
// printf-style; prints "zicoum[<pid>] <level>: <message>\n".
void log(LogLevel level, const char* format, ...) noexcept __attribute__((format(printf, 2, 3)));

}  // namespace zico

#define ZICO_LOG(level, ...)                                                     \
  do {                                                                           \
    if (::zico::log_enabled(::zico::LogLevel::level)) ::zico::log(::zico::LogLevel::level, __VA_ARGS__); \
  } while (0)
