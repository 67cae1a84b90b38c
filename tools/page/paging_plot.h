// The paging plot: one panel per policy over its steady iteration, on one
// time scale: resident bytes (a step area) under the budget line, and below
// it two strips showing when each copy engine was busy (host to device,
// device to host). Standalone SVG, text XML-escaped, no scripts.
#pragma once

#include <string>

#include "paging_study.h"

namespace zico::page {

// The study must have been run with record_last_iteration. False with
// *error naming the file when it cannot be written.
[[nodiscard]] bool write_paging_plot(const PagingStudy& study, const std::string& path, std::string* error);
// The SVG text itself.
[[nodiscard]] std::string render_paging_plot(const PagingStudy& study);

}  // namespace zico::page
