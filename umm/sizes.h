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
// ("ZICO_BUDGET=", written ZICO_BUDGET='0').
[[nodiscard]] std::string size_above_zero_error(std::string_view what, std::string_view text);

// nullopt when `text` is not a size or overflows 64 bits.
[[nodiscard]] std::optional<uint64_t> parse_size(std::string_view text) noexcept;

// Durations: a non-negative integer with a unit ms, s, m or h ("500ms", "60s").
inline constexpr const char* kDurationForm = "an integer with a unit ms, s, m or h, e.g. 500ms, 60s, 5m";
[[nodiscard]] std::optional<uint64_t> parse_duration_ns(std::string_view text) noexcept;

// "64 MiB", "1.50 GiB", "512 B": exact for whole units, 2 decimals otherwise.
[[nodiscard]] std::string format_size(uint64_t bytes);

}  // namespace zico
