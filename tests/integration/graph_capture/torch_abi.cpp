// PyTorch's pluggable-allocator ABI while a CUDA graph is captured on one
// stream (ZICO_SIM_CAPTURING_STREAM=0x5000, sim backend): an allocation there
// fails loudly (the exception PyTorch turns into a RuntimeError), a free
// there keeps the block out of every cache, and other streams are served.
// Prints OK when all three hold.
#include <sys/types.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>

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
  const bool ok = refusal.find("CUDA graph") != std::string::npos && block != nullptr && next != nullptr &&
                  next != block;
  std::printf(ok ? "OK\n" : "FAIL\n");
  return ok ? 0 : 1;
}
