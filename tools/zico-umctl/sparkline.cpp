#include "sparkline.h"

#include <algorithm>
#include <vector>

namespace zico::umctl {

std::string sparkline(std::span<const uint64_t> samples, size_t per_column, uint64_t scale) {
  static constexpr const char* kBlocks[] = {"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
  per_column = std::max<size_t>(per_column, 1);
  std::vector<uint64_t> columns;
  // From the newest backwards, so the last column is always a whole group.
  for (size_t end = samples.size(); end > 0;) {
    const size_t begin = end > per_column ? end - per_column : 0;
    columns.push_back(*std::max_element(samples.begin() + static_cast<std::ptrdiff_t>(begin),
                                        samples.begin() + static_cast<std::ptrdiff_t>(end)));
    end = begin;
  }
  std::reverse(columns.begin(), columns.end());
  if (scale == 0 && !columns.empty()) scale = *std::max_element(columns.begin(), columns.end());
  std::string line;
  for (const uint64_t value : columns) {
    if (value == 0 || scale == 0) {
      line += ' ';
      continue;
    }
    // Level 1..8 in proportion, rounded up so that any memory shows.
    const double ratio = std::min(1.0, static_cast<double>(value) / static_cast<double>(scale));
    const auto level = std::clamp<size_t>(static_cast<size_t>(ratio * 8.0 + 0.999999), 1, 8);
    line += kBlocks[level - 1];
  }
  return line;
}

}  // namespace zico::umctl
