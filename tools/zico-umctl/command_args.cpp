#include "command_args.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "exit_status.h"

namespace zico::umctl {

bool ArgReader::next() {
  if (!error_.empty() || index_ + 1 >= argc_) return false;
  ++index_;
  if (!operands_only_ && current() == "--") {
    operands_only_ = true;
    return next();
  }
  return true;
}

bool ArgReader::option(std::string_view name, std::string* value) {
  if (operands_only_) return false;
  const std::string_view arg = current();
  if (arg.size() > name.size() && arg.starts_with(name) && arg[name.size()] == '=') {
    *value = arg.substr(name.size() + 1);
  } else if (arg != name) {
    return false;
  } else if (index_ + 1 < argc_) {
    *value = argv_[++index_];
  } else {
    value->clear();
  }
  // No option of these commands has an empty value.
  if (value->empty()) error_ = std::string(name) + " needs a value";
  return true;
}

bool ArgReader::unknown_option() const {
  const std::string_view arg = current();
  // "-5GiB" is a negative number, a bad operand rather than an option.
  const bool negative_number = arg.size() > 1 && (std::isdigit(static_cast<unsigned char>(arg[1])) || arg[1] == '.');
  return !operands_only_ && arg.size() > 1 && arg[0] == '-' && !negative_number;
}

int usage_error(std::string_view command, const std::string& message) {
  const std::string name(command);
  std::fprintf(stderr, "zico-umctl %s: %s\nTry 'zico-umctl %s --help'.\n", name.c_str(), message.c_str(), name.c_str());
  return kExitUsage;
}

std::optional<uint64_t> parse_decimal(std::string_view text) {
  if (text.empty() || text.size() > 20) return std::nullopt;
  uint64_t value = 0;
  for (const char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    const auto digit = static_cast<uint64_t>(c - '0');
    if (value > (UINT64_MAX - digit) / 10) return std::nullopt;
    value = value * 10 + digit;
  }
  return value;
}

std::optional<double> parse_seconds(std::string_view text) {
  // strtod alone would take "inf", "1e3", hex and leading spaces.
  if (text.empty() || text.size() > 32 || text.find_first_not_of("0123456789.") != std::string_view::npos ||
      text.find('.') != text.rfind('.') || text == ".") {
    return std::nullopt;
  }
  const std::string copy(text);
  const double seconds = std::strtod(copy.c_str(), nullptr);
  if (!std::isfinite(seconds)) return std::nullopt;
  return seconds;
}

}  // namespace zico::umctl
