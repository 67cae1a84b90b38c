"""zicoum.torch.enable() with real PyTorch on a GPU: the budget is enforced.

Exits 77 (CTest: skipped) when PyTorch or a CUDA device is missing.
Run with PYTHONPATH=<build>/python.
"""

import os
import subprocess
import sys

MiB = 1 << 20
GiB = 1 << 30
TENSOR = 16 * MiB
SKIP = 77


def fail(message):
    print(f"FAIL: {message}")
    sys.exit(1)


def allocate_until_oom(torch):
    tensors = []
    while len(tensors) * TENSOR < 4 * GiB:  # far past the budget: a runaway guard
        try:
            tensor = torch.empty(TENSOR, dtype=torch.uint8, device="cuda")
        except torch.cuda.OutOfMemoryError:
            return tensors
        except RuntimeError as error:
            # zico_torch_malloc throws std::bad_alloc, which PyTorch raises as RuntimeError.
            if "CUDA out of memory." in str(error):
                return tensors
            fail(f"allocation failed with an unexpected error: {error}")
        if tensor.data_ptr() == 0:
            # CUDAPluggableAllocator does not check for NULL (pytorch/pytorch#133280).
            fail(f"after {len(tensors)} tensors PyTorch returned a tensor at address 0 "
                 "instead of raising an out-of-memory error")
        tensor.fill_(len(tensors) % 251)
        tensors.append(tensor)
    fail(f"{len(tensors) * TENSOR // MiB} MiB allocated under a 1 GiB budget")


def check_refused_after_cuda_init():
    """enable() after PyTorch's allocator is initialized must say so, in a fresh process."""
    script = ("import torch, zicoum.torch\n"
              "torch.zeros(1, device='cuda')\n"
              "try:\n    zicoum.torch.enable(backend='cuda')\n"
              "except RuntimeError as e:\n    print(e)\n    raise SystemExit(0)\n"
              "raise SystemExit('enable() did not refuse')\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=os.environ)
    if result.returncode != 0 or "already initialized" not in result.stdout:
        fail(f"enable() after CUDA init: exit {result.returncode}\n{result.stdout}{result.stderr}")


def main():
    try:
        import torch
    except ImportError as error:
        print(f"SKIP: PyTorch is not importable ({error})")
        return SKIP
    if not torch.cuda.is_available():
        print(f"SKIP: PyTorch {torch.__version__} sees no CUDA device")
        return SKIP

    import zicoum
    import zicoum.torch

    for bad in [dict(budget="12XB"), dict(budget=0), dict(backend="gpu"), dict(log="loud")]:
        try:
            zicoum.torch.enable(**bad)
            fail(f"enable({bad}) was accepted")
        except ValueError:
            pass

    zicoum.torch.enable(budget="1GiB", backend="cuda")
    if zicoum.stats()["budget_bytes"] != GiB:
        fail(f"budget_bytes is {zicoum.stats()['budget_bytes']}, want 1 GiB")

    tensors = allocate_until_oom(torch)
    reached = len(tensors) * TENSOR
    print(f"out of memory after {len(tensors)} x {TENSOR // MiB} MiB = {reached // MiB} MiB")
    if not GiB - 4 * TENSOR <= reached <= GiB:
        fail(f"out of memory at {reached // MiB} MiB, want close to 1024 MiB")
    torch.cuda.synchronize()
    for i, tensor in enumerate(tensors):
        if tensor[-1].item() != i % 251:
            fail(f"tensor {i} lost its contents")

    del tensors
    torch.cuda.synchronize()
    again = allocate_until_oom(torch)
    if len(again) * TENSOR < GiB - 4 * TENSOR:
        fail(f"after freeing everything only {len(again) * TENSOR // MiB} MiB fit again")
    del again

    check_refused_after_cuda_init()
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
