#include "slurm_share.h"

#include <algorithm>
#include <cctype>

#include "sizes.h"

namespace zico::slurm {

namespace {

constexpr uint32_t kInteractiveStep = 0xfffffffa;
constexpr uint32_t kBatchStep = 0xfffffffb;
constexpr uint32_t kExternStep = 0xfffffffc;

bool is_name(std::string_view text) {
  if (text.empty() || text.size() > 64) return false;
  for (const char c : text) {
    if (std::isalnum(static_cast<unsigned char>(c)) == 0 && c != '_' && c != '-') return false;
  }
  return true;
}

// A Slurm count: digits and an optional K, M, G, T (powers of 1024).
std::optional<uint64_t> slurm_count(std::string_view text) {
  if (text.empty()) return std::nullopt;
  uint64_t multiplier = 1;
  switch (std::toupper(static_cast<unsigned char>(text.back()))) {
    case 'K': multiplier = 1ull << 10; break;
    case 'M': multiplier = 1ull << 20; break;
    case 'G': multiplier = 1ull << 30; break;
    case 'T': multiplier = 1ull << 40; break;
    default: break;
  }
  if (multiplier != 1) text.remove_suffix(1);
  if (text.empty() || text.size() > 19) return std::nullopt;
  uint64_t value = 0;
  for (const char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + static_cast<uint64_t>(c - '0');
  }
  if (value > UINT64_MAX / multiplier) return std::nullopt;
  return value * multiplier;
}

}  // namespace

std::optional<PluginArgs> parse_plugin_args(const std::vector<std::string>& args, std::string* why) {
  PluginArgs parsed;
  for (const std::string& arg : args) {
    const size_t equals = arg.find('=');
    const std::string key = arg.substr(0, equals);
    const std::string value = equals == std::string::npos ? std::string() : arg.substr(equals + 1);
    if (key == "socket" && !value.empty() && value.front() == '/') {
      parsed.socket = value;
    } else if (key == "library" && !value.empty() && value.front() == '/' &&
               value.find_first_of(": ") == std::string::npos) {
      parsed.library = value;
    } else if (key == "gres" && is_name(value)) {
      parsed.gres = value;
    } else {
      *why = "plugstack.conf argument '" + arg +
             "' is not valid; expected socket=/ABSOLUTE/PATH, library=/ABSOLUTE/PATH/libzicoum.so "
             "(no ':' or ' ') or gres=NAME";
      return std::nullopt;
    }
  }
  return parsed;
}

std::optional<uint64_t> parse_budget_option(std::string_view text, std::string* why) {
  const std::optional<uint64_t> bytes = parse_size(text);
  if (bytes && *bytes > 0) return bytes;
  *why = "--zico-budget='" + std::string(text) + "' is not valid; expected a size > 0: " + kSizeForm;
  return std::nullopt;
}

std::optional<uint64_t> gres_bytes(std::string_view tres_per_node, std::string_view gres) {
  while (!tres_per_node.empty()) {
    const size_t end = std::min(tres_per_node.find_first_of(",;"), tres_per_node.size());
    std::string_view item = tres_per_node.substr(0, end);
    tres_per_node.remove_prefix(std::min(end + 1, tres_per_node.size()));
    if (item.starts_with("gres:") || item.starts_with("gres/")) item.remove_prefix(5);
    // NAME[:TYPE]:COUNT or NAME[:TYPE]=COUNT
    const size_t name_end = std::min(item.find_first_of(":="), item.size());
    if (item.substr(0, name_end) != gres || name_end == item.size()) continue;
    const size_t count_start = item.find_last_of(":=") + 1;
    return slurm_count(item.substr(count_start));
  }
  return std::nullopt;
}

std::string job_name(uint32_t job_id, uint32_t step_id) {
  std::string step;
  switch (step_id) {
    case kBatchStep: step = "batch"; break;
    case kInteractiveStep: step = "interactive"; break;
    case kExternStep: step = "extern"; break;
    default: step = std::to_string(step_id); break;
  }
  return "slurm-" + std::to_string(job_id) + "." + step;
}

std::optional<uint64_t> task_budget(std::optional<uint64_t> option, std::optional<uint64_t> node_share,
                                    uint32_t local_tasks) {
  if (option) return option;
  if (!node_share || local_tasks == 0 || *node_share / local_tasks == 0) return std::nullopt;
  return *node_share / local_tasks;
}

std::string preload_value(const std::string& library, std::string_view inherited) {
  if (inherited.empty()) return library;
  return library + ":" + std::string(inherited);
}

}  // namespace zico::slurm
