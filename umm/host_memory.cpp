#include "host_memory.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

namespace zico {
namespace {

// A cgroup file's number, false if unreadable; "max" (v2's no limit) and
// v1's near-2^63 "no limit" read as UINT64_MAX.
bool read_number(const std::string& path, uint64_t* out) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text)) return false;
  if (text == "max") {
    *out = UINT64_MAX;
    return true;
  }
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != '\0') return false;
  *out = value >= (uint64_t{1} << 62) ? UINT64_MAX : value;
  return true;
}

// `key`'s value in a "key value" file (memory.stat), 0 if absent.
uint64_t stat_value(const std::string& path, const char* key) {
  std::ifstream in(path);
  std::string name;
  uint64_t value = 0;
  while (in >> name >> value) {
    if (name == key) return value;
  }
  return 0;
}

// The process's memory cgroup directories, innermost first, up to the root
// of the hierarchy as mounted: v2 (`0::/path`) or v1 (a `memory` hierarchy).
struct CgroupDirs {
  bool v2 = false;
  std::vector<std::string> dirs;
};

CgroupDirs memory_cgroup_dirs(const std::string& root) {
  CgroupDirs found;
  std::ifstream in(root + "/proc/self/cgroup");
  std::string line;
  std::string path;
  bool have = false;
  while (std::getline(in, line)) {
    const size_t first = line.find(':');
    const size_t second = first == std::string::npos ? std::string::npos : line.find(':', first + 1);
    if (second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string where = line.substr(second + 1);
    std::stringstream list(controllers);
    bool memory = false;
    for (std::string c; std::getline(list, c, ',');) memory = memory || c == "memory";
    if (memory) {  // v1 wins where both are listed: the v2 hierarchy then has no memory controller
      found.v2 = false;
      path = where;
      have = true;
      break;
    }
    if (line.compare(0, 3, "0::") == 0) {
      found.v2 = true;
      path = where;
      have = true;
    }
  }
  if (!have) return found;
  const std::string mount = root + (found.v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory");
  // Inside a cgroup namespace the mount's root is the process's own cgroup,
  // and `path` names nothing under it: each ancestor that exists is read.
  for (std::string p = path; !p.empty() && p != "/";) {
    found.dirs.push_back(mount + p);
    const size_t slash = p.rfind('/');
    if (slash == std::string::npos) break;  // not a path the kernel writes; read no further up
    p.resize(slash);
  }
  found.dirs.push_back(mount);
  return found;
}

}  // namespace

HostMemory read_host_memory(const std::string& root) {
  HostMemory memory;
  if (FILE* meminfo = std::fopen((root + "/proc/meminfo").c_str(), "r")) {
    char line[128];
    unsigned long long kib = 0;
    while (std::fgets(line, sizeof line, meminfo) != nullptr) {
      if (std::sscanf(line, "MemTotal: %llu kB", &kib) == 1) memory.total_bytes = uint64_t{kib} << 10;
      if (std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
        memory.available_bytes = uint64_t{kib} << 10;
        memory.known = true;
      }
    }
    std::fclose(meminfo);
  }
  const CgroupDirs cgroup = memory_cgroup_dirs(root);
  const char* limit_file = cgroup.v2 ? "/memory.max" : "/memory.limit_in_bytes";
  const char* usage_file = cgroup.v2 ? "/memory.current" : "/memory.usage_in_bytes";
  // The page cache counts in a cgroup's usage but is given back under pressure.
  const char* inactive_file = cgroup.v2 ? "inactive_file" : "total_inactive_file";
  for (const std::string& dir : cgroup.dirs) {
    uint64_t limit = 0;
    uint64_t usage = 0;
    if (!read_number(dir + limit_file, &limit) || limit == UINT64_MAX) continue;
    if (!read_number(dir + usage_file, &usage)) continue;
    const uint64_t reclaimable = std::min(usage, stat_value(dir + "/memory.stat", inactive_file));
    const uint64_t left = limit - std::min(limit, usage - reclaimable);
    memory.total_bytes = memory.total_bytes == 0 ? limit : std::min(memory.total_bytes, limit);
    memory.available_bytes = memory.known ? std::min(memory.available_bytes, left) : left;
    memory.known = true;
  }
  return memory;
}

}  // namespace zico
