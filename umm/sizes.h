// Human-readable byte sizes: "512MiB", "40GiB", "1.5GB", "4096".
//
// Accepted form: a non-negative decimal number, optionally fractional, then an
// optional unit, case-insensitive. Binary units: KiB MiB GiB TiB, Kubernetes'
// Ki Mi Gi Ti, and the shorthands K M G T (as in `docker -m 6g`; Kubernetes
// reads its M as decimal, this file as binary). Decimal units: KB MB GB TB.
// "B" or no unit means bytes. Fractions are rounded down to whole bytes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace zico {

// The accepted form, for error messages.
inline constexpr const char* kSizeForm =
    "a number with an optional unit B, KiB, MiB, GiB, TiB (or Ki, Mi, Gi, Ti, or K, M, G, T) or KB, MB, GB, TB, "
    "e.g. 512MiB, 40Gi, 1.5GB";

// The one wording of every tool for a size it cannot use, naming the value
// and kSizeForm: "--budget '0' is not a size above 0; expected ...". `what`
// is an option or a noun ("--budget", "budget"), or a variable ending in '='
// ("ZICO_BUDGET=", written ZICO_BUDGET='0'). A number and a unit written
// apart ("6 GB") are named as such instead: "--budget '6 GB' is not a size:
// no space between number and unit (6GB)".
[[nodiscard]] std::string size_above_zero_error(std::string_view what, std::string_view text);
// The same for a size that may be 0: "... is not a size; expected ...".
[[nodiscard]] std::string size_error(std::string_view what, std::string_view text);

// nullopt when `text` is not a size or overflows 64 bits.
[[nodiscard]] std::optional<uint64_t> parse_size(std::string_view text) noexcept;

// Rates, as ZICO_HOST_BANDWIDTH and the tools' --host-bandwidth take them: a
// size per second above 0, "25GB/s" (the "/s" may be left out). nullopt for
// anything else, 0 included.
inline constexpr const char* kRateForm = "a size per second above 0, e.g. 25GB/s or 12GiB/s";
[[nodiscard]] std::optional<uint64_t> parse_rate(std::string_view text) noexcept;

// Durations: a non-negative integer with a unit ms, s, m or h ("500ms", "60s").
inline constexpr const char* kDurationForm = "an integer with a unit ms, s, m or h, e.g. 500ms, 60s, 5m";
[[nodiscard]] std::optional<uint64_t> parse_duration_ns(std::string_view text) noexcept;

// "64 MiB", "1.50 GiB", "512 B": exact for whole units, 2 decimals otherwise.
[[nodiscard]] std::string format_size(uint64_t bytes);
// format_size(bytes), with as many more decimals as it takes not to read as
// `other` does in bytes' unit: a size set beside another it differs from
// ("needs 5.002 GiB, more than the budget 5 GiB", not "5.00 GiB ... 5 GiB").
[[nodiscard]] std::string format_size_apart(uint64_t bytes, uint64_t other);

}  // namespace zico
