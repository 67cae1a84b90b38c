// PyTorch's CUDAPluggableAllocator ABI (torch/csrc/cuda/CUDAPluggableAllocator.h):
//   void* malloc(ssize_t size, int device, cudaStream_t stream)
//   void  free(void* ptr, ssize_t size, int device, cudaStream_t stream)
//
// The one zicoum entry point that throws. The ABI has no error path and
// PyTorch does not check for NULL (CUDAPluggableAllocator::malloc wraps
// whatever comes back into a tensor, so NULL would become a tensor at address
// 0 and the first kernel would fault). Like RMM's torch allocator, a failure
// is therefore a C++ exception, which PyTorch turns into a Python
// RuntimeError; the message starts with "CUDA out of memory." as PyTorch's own
// does, which is what OOM-retry helpers (e.g. Accelerate's batch-size finder)
// look for. Call these only from C++ that expects exceptions, never from C.
// free cannot fail in a way PyTorch could act on, so it logs instead.
#include <new>
#include <stdexcept>
#include <string>

#include "api_calls.h"
#include "last_error.h"
#include "log.h"
#include "zicoum/zicoum.h"

namespace zico {
namespace {

class TorchOutOfMemory : public std::bad_alloc {
 public:
  explicit TorchOutOfMemory(std::string message) : message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

}  // namespace
}  // namespace zico

extern "C" {

void* zico_torch_malloc(ssize_t size, int device, void* stream) {
  if (size == 0) return nullptr;  // PyTorch asks for zero-size tensors and accepts NULL for them
  if (size < 0) throw std::invalid_argument("zicoum: zico_torch_malloc called with negative size " + std::to_string(size));
  if (zico::api_capture_state(zico::StreamHandle{reinterpret_cast<uintptr_t>(stream)}) != zico::CaptureState::kNone) {
    throw std::runtime_error(
        "zicoum: a CUDA graph is being captured (torch.cuda.graph, torch.compile(mode=\"reduce-overhead\")); "
        "zicoum has no private memory pool for graphs yet and refuses rather than let eager tensors reuse graph "
        "memory: capture without zicoum.torch.enable");
  }
  void* ptr = nullptr;
  const zico::Status status = zico::api_allocate(static_cast<size_t>(size), zico::DeviceId{device},
                                                 zico::StreamHandle{reinterpret_cast<uintptr_t>(stream)}, &ptr);
  if (status.code() == zico::Errc::kOutOfMemory) {
    throw zico::TorchOutOfMemory("CUDA out of memory. zicoum: " + zico::thread_last_error());
  }
  if (!status.is_ok()) throw std::runtime_error("zicoum: " + zico::thread_last_error());
  return ptr;
}

void zico_torch_free(void* ptr, ssize_t /*size*/, int /*device*/, void* stream) {
  if (ptr == nullptr) return;
  if (zico::api_capture_state(zico::StreamHandle{reinterpret_cast<uintptr_t>(stream)}) ==
      zico::CaptureState::kCapturing) {
    // The graph's kernels may still use it at every replay: never reuse it.
    ZICO_LOG(kWarn, "zico_torch_free(%p) during a CUDA graph capture: the block is kept, never reused", ptr);
    return;
  }
  const zico::Status status = zico::api_free(ptr, zico::StreamHandle{reinterpret_cast<uintptr_t>(stream)});
  if (!status.is_ok()) ZICO_LOG(kError, "zico_torch_free(%p): %s", ptr, zico::thread_last_error().c_str());
}

}  // extern "C"
