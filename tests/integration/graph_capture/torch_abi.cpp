// PyTorch's pluggable-allocator ABI while a CUDA graph is captured on one
// stream (ZICO_SIM_CAPTURING_STREAM=0x5000, sim backend): an allocation there
// fails loudly (the exception PyTorch turns into a RuntimeError), a free
// there keeps the block out of every cache, and other streams are served. The
// legacy stream, blocked by the capture, refuses allocations too but frees as
// ever (a free there makes no CUDA call). Prints OK when all hold.
#include <sys/types.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>

#include "zicoum/zicoum.h"

extern "C" void* zico_torch_malloc(ssize_t size, int device, void* stream);
extern "C" void zico_torch_free(void* ptr, ssize_t size, int device, void* stream);

int main() {
  void* capturing = reinterpret_cast<void*>(uintptr_t{0x5000});
  void* eager = reinterpret_cast<void*>(uintptr_t{0x6000});
  std::string refusal;
  try {
    (void)zico_torch_malloc(1 << 20, 0, capturing);
  } catch (const std::exception& e) {
    refusal = e.what();
  }
  std::printf("allocation during capture: %s\n", refusal.empty() ? "(served)" : refusal.c_str());
  void* block = zico_torch_malloc(1 << 20, 0, eager);
  zico_torch_free(block, 1 << 20, 0, capturing);  // kept: a replay may still use it
  void* next = zico_torch_malloc(1 << 20, 0, eager);
  std::printf("block %p freed during capture; the next allocation got %p\n", block, next);
  std::string blocked;
  try {
    (void)zico_torch_malloc(1 << 20, 0, nullptr);
  } catch (const std::exception& e) {
    blocked = e.what();
  }
  zico_stats_t before{};
  before.struct_size = sizeof before;
  zico_stats_t after = before;
  (void)zico_get_stats(0, &before);
  zico_torch_free(next, 1 << 20, 0, nullptr);  // the legacy stream: blocked, not capturing
  (void)zico_get_stats(0, &after);
  std::printf("legacy stream: allocation %s; a free there released %llu bytes\n",
              blocked.empty() ? "served" : "refused",
              static_cast<unsigned long long>(before.allocated_bytes - after.allocated_bytes));
  const bool ok = refusal.find("CUDA graph") != std::string::npos && block != nullptr && next != nullptr &&
                  next != block && !blocked.empty() && before.allocated_bytes - after.allocated_bytes == (1u << 20);
  std::printf(ok ? "OK\n" : "FAIL\n");
  return ok ? 0 : 1;
}
