// Reading a zico-umctl command's arguments: flags, options with a value
// ("--socket PATH" or "--socket=PATH") and operands, in any order; "--" ends
// the options. Also the number forms the commands accept, and the one way a
// usage error is reported.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace zico::umctl {

class ArgReader {
 public:
  ArgReader(int argc, char** argv) : argc_(argc), argv_(argv) {}

  // Moves to the next argument; false at the end or after an error.
  [[nodiscard]] bool next();
  [[nodiscard]] std::string_view current() const { return argv_[index_]; }

  // The current argument is the flag `name`.
  [[nodiscard]] bool flag(std::string_view name) const { return !operands_only_ && current() == name; }
  // The current argument is the option `name`: its value goes to *value. A
  // missing or empty value ends the reading with error() set.
  [[nodiscard]] bool option(std::string_view name, std::string* value);
  // The current argument looks like an option none of the above matched
  // (a negative number such as -5GiB does not: it is an operand).
  [[nodiscard]] bool unknown_option() const;

  // Empty unless an option lacked its value: check it after the loop.
  [[nodiscard]] const std::string& error() const { return error_; }

 private:
  int argc_;
  char** argv_;
  int index_ = -1;
  bool operands_only_ = false;
  std::string error_;
};

// Prints "zico-umctl COMMAND: MESSAGE" and a hint to stderr; returns kExitUsage.
int usage_error(std::string_view command, const std::string& message);

// Digits only (no sign, no spaces), within 64 bits.
[[nodiscard]] std::optional<uint64_t> parse_decimal(std::string_view text);
// A non-negative decimal number of seconds such as 10, 0.2 or 1.5.
[[nodiscard]] std::optional<double> parse_seconds(std::string_view text);

}  // namespace zico::umctl
