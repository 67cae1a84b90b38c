// Column-aligned text tables for zico-umctl's human output. Widths count
// UTF-8 characters (top's sparklines), not bytes; the last column is not
// padded, so lines carry no trailing blanks.
#pragma once

#include <string>
#include <vector>

namespace zico::umctl {

class TextTable {
 public:
  enum class Align { kLeft, kRight };
  struct Column {
    std::string title;
    Align align = Align::kLeft;
  };

  explicit TextTable(std::vector<Column> columns) : columns_(std::move(columns)) {}

  // One cell per column.
  void add_row(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }

  // The title line and the rows, each line starting with `indent`, columns
  // two spaces apart.
  [[nodiscard]] std::string render(const std::string& indent = "") const;

 private:
  std::vector<Column> columns_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace zico::umctl
