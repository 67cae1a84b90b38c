#include "plot_file.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

namespace zico::plot {

bool write_plot_file(const std::string& path, std::string_view content, std::string* why) {
  std::FILE* file = std::fopen(path.c_str(), "wb");
  int error = file == nullptr ? errno : 0;
  if (file != nullptr) {
    if (std::fwrite(content.data(), 1, content.size(), file) != content.size()) error = errno;
    if (std::fclose(file) != 0 && error == 0) error = errno;
  }
  if (error == 0) return true;
  *why = "cannot write " + path + ": " + std::strerror(error);
  if (error == ENOENT) {
    const std::filesystem::path folder = std::filesystem::path(path).parent_path();
    std::error_code ignored;
    if (!folder.empty() && !std::filesystem::is_directory(folder, ignored)) {
      *why += " (the folder " + folder.string() + " does not exist)";
    }
  }
  return false;
}

}  // namespace zico::plot
