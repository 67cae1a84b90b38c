#include "log.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <cstdio>

namespace zico {
namespace {

std::atomic<LogLevel> g_level{LogLevel::kWarn};

const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kError: return "error";
    case LogLevel::kWarn: return "warning";
    case LogLevel::kInfo: return "info";
    case LogLevel::kDebug: return "debug";
  }
  return "?";
}

}  // namespace

void set_log_level(LogLevel level) noexcept { g_level.store(level, std::memory_order_relaxed); }

bool log_enabled(LogLevel level) noexcept { return level <= g_level.load(std::memory_order_relaxed); }

void log(LogLevel level, const char* format, ...) noexcept {
  char line[1024];
  int used = std::snprintf(line, sizeof line, "zicoum[%d] %s: ", static_cast<int>(getpid()), level_name(level));
  va_list args;
  va_start(args, format);
  used += std::vsnprintf(line + used, sizeof line - static_cast<size_t>(used), format, args);
  va_end(args);
  size_t length = used < 0 ? 0 : std::min(static_cast<size_t>(used), sizeof line - 2);
  line[length++] = '\n';
  ssize_t ignored = write(STDERR_FILENO, line, length);
  (void)ignored;
}

}  // namespace zico
