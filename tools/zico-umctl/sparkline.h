// Sparklines: a series of values drawn as one line of Unicode blocks
// (▁▂▃▄▅▆▇█), for zico-umctl top's memory history.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace zico::umctl {

// One character (UTF-8) per `per_column` samples, oldest on the left: each
// shows the largest of its samples, grouped from the newest so the last
// column is always whole. The tallest block is `scale` (the largest sample
// when 0); a zero is a blank, any other value at least ▁.
[[nodiscard]] std::string sparkline(std::span<const uint64_t> samples, size_t per_column, uint64_t scale = 0);

}  // namespace zico::umctl
