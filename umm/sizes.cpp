#include "sizes.h"

#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>

namespace zico {
namespace {

struct Unit {
  std::string_view name;
  uint64_t multiplier;
};

// Kubernetes writes binary units without the B ("64Mi"); its "64M" is
// decimal, but here M stays binary, as in docker and HAMi.
constexpr std::array<Unit, 18> kUnits{{
    {"", 1}, {"b", 1},
    {"k", uint64_t{1} << 10}, {"ki", uint64_t{1} << 10}, {"kib", uint64_t{1} << 10}, {"kb", 1000},
    {"m", uint64_t{1} << 20}, {"mi", uint64_t{1} << 20}, {"mib", uint64_t{1} << 20}, {"mb", 1000'000},
    {"g", uint64_t{1} << 30}, {"gi", uint64_t{1} << 30}, {"gib", uint64_t{1} << 30}, {"gb", 1000'000'000},
    {"t", uint64_t{1} << 40}, {"ti", uint64_t{1} << 40}, {"tib", uint64_t{1} << 40}, {"tb", 1000'000'000'000},
}};

// "6 GB" -> "6GB", when that is a size; else empty.
std::string without_unit_space(std::string_view text) {
  const size_t number_end = text.find_first_not_of("0123456789.");
  if (number_end == 0 || number_end == std::string_view::npos || text[number_end] != ' ') return {};
  const size_t unit_start = text.find_first_not_of(' ', number_end);
  if (unit_start == std::string_view::npos) return {};
  std::string joined(text.substr(0, number_end));
  joined += text.substr(unit_start);
  return parse_size(joined) ? joined : std::string();
}

std::string quoted(std::string_view what, std::string_view text) {
  std::string message(what);
  if (!what.ends_with('=')) message += ' ';
  return message + "'" + std::string(text) + "'";
}

// What follows the quoted value: the space, or `otherwise`.
std::string reason(std::string_view text, std::string_view otherwise) {
  const std::string joined = without_unit_space(text);
  if (!joined.empty()) return " is not a size: no space between number and unit (" + joined + ")";
  return std::string(otherwise) + kSizeForm;
}

std::string with_decimals(uint64_t bytes, uint64_t scale, int decimals) {
  char text[48];
  std::snprintf(text, sizeof text, "%.*f", decimals, static_cast<double>(bytes) / static_cast<double>(scale));
  return text;
}

}  // namespace

std::optional<uint64_t> parse_size(std::string_view text) noexcept {
  size_t i = 0;
  uint64_t whole = 0;
  bool any_digit = false;
  for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i) {
    const uint64_t digit = static_cast<uint64_t>(text[i] - '0');
    if (whole > (UINT64_MAX - digit) / 10) return std::nullopt;
    whole = whole * 10 + digit;
    any_digit = true;
  }
  // Fraction digits are kept exactly as numerator/denominator (up to 18 digits).
  uint64_t frac_num = 0;
  uint64_t frac_den = 1;
  if (i < text.size() && text[i] == '.') {
    ++i;
    for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i) {
      any_digit = true;
      if (frac_den < 1000'000'000'000'000'000ULL) {
        frac_num = frac_num * 10 + static_cast<uint64_t>(text[i] - '0');
        frac_den *= 10;
      }
    }
  }
  if (!any_digit) return std::nullopt;
  std::string unit;
  for (; i < text.size(); ++i) unit.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(text[i]))));
  for (const Unit& u : kUnits) {
    if (u.name != unit) continue;
    if (whole > UINT64_MAX / u.multiplier) return std::nullopt;
    const uint64_t base = whole * u.multiplier;
    // frac_num/frac_den < 1, so this product fits in 128 bits.
    __extension__ using U128 = unsigned __int128;
    const auto extra = static_cast<uint64_t>(static_cast<U128>(frac_num) * u.multiplier / frac_den);
    if (base > UINT64_MAX - extra) return std::nullopt;
    return base + extra;
  }
  return std::nullopt;
}

std::string size_above_zero_error(std::string_view what, std::string_view text) {
  return quoted(what, text) + reason(text, " is not a size above 0; expected ");
}

std::string size_error(std::string_view what, std::string_view text) {
  return quoted(what, text) + reason(text, " is not a size; expected ");
}

namespace {

constexpr std::array<const char*, 5> kUnitNames{"B", "KiB", "MiB", "GiB", "TiB"};

// The largest unit not above `bytes` (bytes for 0), and its size.
size_t unit_of(uint64_t bytes, uint64_t* scale) {
  size_t unit = 0;
  *scale = 1;
  while (unit + 1 < kUnitNames.size() && bytes >= (*scale << 10)) {
    *scale <<= 10;
    ++unit;
  }
  return unit;
}

}  // namespace

std::string format_size(uint64_t bytes) {
  uint64_t scale = 1;
  const size_t unit = unit_of(bytes, &scale);
  if (bytes % scale == 0) return std::to_string(bytes / scale) + " " + kUnitNames[unit];
  return with_decimals(bytes, scale, 2) + " " + kUnitNames[unit];
}

std::string format_size_apart(uint64_t bytes, uint64_t other) {
  uint64_t scale = 1;
  const size_t unit = unit_of(bytes, &scale);
  if (bytes == other || bytes % scale == 0) return format_size(bytes);
  // 2^40 / 10^13 < 1 byte: beyond 13 decimals every unit tells bytes apart.
  for (int decimals = 2; decimals <= 13; ++decimals) {
    const std::string text = with_decimals(bytes, scale, decimals);
    if (text != with_decimals(other, scale, decimals)) return text + " " + kUnitNames[unit];
  }
  return std::to_string(bytes) + " B";
}

std::optional<uint64_t> parse_rate(std::string_view text) noexcept {
  if (text.ends_with("/s")) text.remove_suffix(2);
  const std::optional<uint64_t> bytes = parse_size(text);
  if (!bytes || *bytes == 0) return std::nullopt;
  return bytes;
}

std::optional<uint64_t> parse_duration_ns(std::string_view text) noexcept {
  size_t digits = 0;
  uint64_t value = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') {
    if (value > 1'000'000'000'000) return std::nullopt;
    value = value * 10 + static_cast<uint64_t>(text[digits] - '0');
    ++digits;
  }
  if (digits == 0) return std::nullopt;
  const std::string_view unit = text.substr(digits);
  uint64_t scale = 0;
  if (unit == "ms") {
    scale = 1'000'000;
  } else if (unit == "s") {
    scale = 1'000'000'000;
  } else if (unit == "m") {
    scale = 60'000'000'000;
  } else if (unit == "h") {
    scale = 3'600'000'000'000;
  } else {
    return std::nullopt;
  }
  if (value > UINT64_MAX / scale) return std::nullopt;
  return value * scale;
}

}  // namespace zico
