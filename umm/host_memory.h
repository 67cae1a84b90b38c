// How much memory this process may still take from the host: the machine's
// (/proc/meminfo) and, inside a container or a systemd slice, its memory
// cgroup's limit (v2 memory.max, v1 memory.limit_in_bytes, the tightest of
// the process's cgroup and its ancestors), whichever is less. The simulated
// backend's device memory is host memory, so it asks this before it creates
// any (sim_driver.cpp): a container limited below the host's RAM would
// otherwise be killed by the kernel's OOM killer long before MemAvailable
// ran low.
#pragma once

#include <cstdint>
#include <string>

namespace zico {

struct HostMemory {
  bool known = false;            // false: nothing could be read (then both are 0)
  uint64_t total_bytes = 0;      // the machine's RAM, or the cgroup limit if lower
  uint64_t available_bytes = 0;  // what can still be taken without swapping or an OOM kill
};

// `root` prefixes every path read (tests point it at a fake /proc and /sys).
[[nodiscard]] HostMemory read_host_memory(const std::string& root = "");

}  // namespace zico
