#include "text_table.h"

#include <algorithm>

namespace zico::umctl {
namespace {

size_t display_width(const std::string& text) {
  // Continuation bytes (10xxxxxx) do not start a character.
  return static_cast<size_t>(std::count_if(text.begin(), text.end(), [](char c) {
    return (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  }));
}

}  // namespace

std::string TextTable::render(const std::string& indent) const {
  std::vector<size_t> widths(columns_.size());
  for (size_t c = 0; c < columns_.size(); ++c) widths[c] = display_width(columns_[c].title);
  for (const auto& row : rows_) {
    for (size_t c = 0; c < columns_.size() && c < row.size(); ++c) {
      widths[c] = std::max(widths[c], display_width(row[c]));
    }
  }
  std::string out;
  const auto line = [&](const auto& cell_of) {
    out += indent;
    for (size_t c = 0; c < columns_.size(); ++c) {
      const std::string& cell = cell_of(c);
      const std::string padding(widths[c] - display_width(cell), ' ');
      const bool last = c + 1 == columns_.size();
      if (columns_[c].align == Align::kRight) {
        out += padding + cell;
      } else {
        out += cell;
        if (!last) out += padding;
      }
      if (!last) out += "  ";
    }
    out += '\n';
  };
  line([&](size_t c) -> const std::string& { return columns_[c].title; });
  static const std::string kEmpty;
  for (const auto& row : rows_) {
    line([&](size_t c) -> const std::string& { return c < row.size() ? row[c] : kEmpty; });
  }
  return out;
}

}  // namespace zico::umctl
