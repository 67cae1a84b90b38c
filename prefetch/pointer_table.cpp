#include "pointer_table.h"

#include <algorithm>
#include <cstring>

namespace zico::prefetch {

void arena_addresses(std::span<const std::byte> bytes, uintptr_t destination, VaRange arena,
                     std::vector<uintptr_t>* out) {
  out->clear();
  const size_t read = std::min(bytes.size(), kTableBytesRead);
  // Words are aligned on the device, where the kernel reads them.
  const size_t first = (8 - destination % 8) % 8;
  size_t words = 0;
  for (size_t at = first; at + sizeof(uint64_t) <= read; at += sizeof(uint64_t)) {
    ++words;
    uint64_t word = 0;
    std::memcpy(&word, bytes.data() + at, sizeof word);
    if (arena.contains(static_cast<uintptr_t>(word))) out->push_back(static_cast<uintptr_t>(word));
  }
  if (out->empty() || out->size() * kTableShare < words) {
    out->clear();
    return;
  }
  std::sort(out->begin(), out->end());
  out->erase(std::unique(out->begin(), out->end()), out->end());
}

}  // namespace zico::prefetch
