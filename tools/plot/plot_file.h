// Writing a plot to the file a user named. A path that cannot be written is
// reported with the path and the system's reason, and a missing folder is
// named as such: the tools never create folders on the way to their output.
#pragma once

#include <string>
#include <string_view>

namespace zico::plot {

// Writes `content` to `path`, replacing the file. On failure, false and
// *why = "cannot write PATH: REASON" (REASON from strerror, then the folder
// that does not exist, when that is why).
[[nodiscard]] bool write_plot_file(const std::string& path, std::string_view content, std::string* why);

}  // namespace zico::plot
