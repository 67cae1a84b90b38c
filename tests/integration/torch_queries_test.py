"""zicoum.torch.enable() answers PyTorch's memory queries from zicoum, on the
CPU: a stand-in `torch` package offers what enable() uses (the pluggable
allocator, change_current_allocator) and memory queries that fail as the real
ones do under a pluggable allocator. After enable() they must give zicoum's
numbers: the budget as total memory, the job's allocations, its peaks.
    torch_queries_test.py   (PYTHONPATH holds the zicoum package)
"""
import ctypes
import os
import sys
import tempfile
import textwrap

MiB = 1 << 20

FAKE_TORCH = {
    "torch/__init__.py": """
        __version__ = "stand-in"
        class device:
            def __init__(self, spec):
                kind, _, index = str(spec).partition(":")
                self.type, self.index = kind, (int(index) if index else None)
        class Tensor:
            def __init__(self, pointer):
                self.pointer, self.is_cuda, self.recorded = pointer, True, []
            def untyped_storage(self):
                return self
            def data_ptr(self):
                return self.pointer
            def record_stream(self, stream):
                self.recorded.append(stream)
        from . import cuda
        """,
    "torch/cuda/__init__.py": """
        from . import memory
        from .memory import mem_get_info, memory_allocated, max_memory_allocated, memory_reserved
        from .memory import max_memory_reserved, memory_stats, empty_cache
        def is_available():
            return True
        def current_device():
            return 0
        class Stream:
            def __init__(self, handle):
                self.cuda_stream = handle
        """,
    "torch/cuda/memory.py": """
        import ctypes
        class CUDAPluggableAllocator:
            def __init__(self, path, malloc, free):
                library = ctypes.CDLL(path)
                getattr(library, malloc), getattr(library, free)
        current = None
        def change_current_allocator(allocator):
            global current
            current = allocator
        def _unanswered(*args, **kwargs):
            raise RuntimeError("CUDAPluggableAllocator does not yet support getDeviceStats")
        mem_get_info = memory_allocated = max_memory_allocated = memory_reserved = _unanswered
        max_memory_reserved = memory_stats = empty_cache = reset_peak_memory_stats = _unanswered
        """,
}


def main():
    root = tempfile.mkdtemp(prefix="zicoum-torch-")
    for path, text in FAKE_TORCH.items():
        os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
        with open(os.path.join(root, path), "w") as out:
            out.write(textwrap.dedent(text))
    sys.path.insert(0, root)
    os.environ["ZICO_SOCKET"] = "off"
    import torch
    import zicoum
    import zicoum.torch

    try:
        zicoum.torch.enable(budget="64MiB", backend="sim", mode="paged")
        raise AssertionError("mode='paged' was accepted")
    except ValueError as error:
        assert "'paged'" in str(error) and "vmm or um" in str(error), error
    zicoum.torch.enable(budget="64MiB", backend="sim", mode="vmm")
    zicoum.torch.enable(budget="64MiB", backend="sim")  # the same settings: vmm is the default
    try:
        zicoum.torch.enable(budget="64MiB", backend="sim", mode="um")
        raise AssertionError("enable() switched to UM mode after libzicoum read its settings")
    except RuntimeError as error:
        assert "ZICO_MODE=um" in str(error), error
    free, total = torch.cuda.mem_get_info()
    assert total == 64 * MiB, f"mem_get_info total {total}, expected the 64 MiB budget"
    assert free == total, (free, total)

    lib = zicoum._library()
    block = lib.zico_torch_malloc(3 * MiB, 0, None)
    assert block, "zico_torch_malloc failed"
    allocated = zicoum.stats()["allocated_bytes"]
    assert allocated >= 3 * MiB, allocated
    assert torch.cuda.memory_allocated() == allocated
    assert torch.cuda.memory.memory_allocated("cuda:0") == allocated
    assert torch.cuda.memory_allocated(torch.device("cuda:0")) == allocated
    assert torch.cuda.mem_get_info(0)[0] == 64 * MiB - allocated
    stats = torch.cuda.memory_stats()
    assert stats["allocated_bytes.all.current"] == allocated, stats
    assert stats["reserved_bytes.all.current"] >= allocated, stats
    assert torch.cuda.memory_reserved() >= allocated

    # Tensor.record_stream reaches zicoum, and PyTorch's own method still runs.
    seen = []
    real_record_stream = zicoum.record_stream
    zicoum.record_stream = lambda pointer, stream: (seen.append((pointer, stream)), real_record_stream(pointer, stream))
    tensor, side = torch.Tensor(block), torch.cuda.Stream(0x7000)
    tensor.record_stream(side)
    assert seen == [(block, 0x7000)] and tensor.recorded == [side], (seen, tensor.recorded)
    torch.Tensor(id(seen)).record_stream(side)  # memory zicoum did not allocate: PyTorch's business only
    zicoum.record_stream = real_record_stream
    assert os.environ.get("TORCH_NCCL_AVOID_RECORD_STREAMS") == "1"

    lib.zico_torch_free(block, 3 * MiB, 0, None)
    assert torch.cuda.memory_allocated() == 0
    assert torch.cuda.max_memory_allocated() >= 3 * MiB
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() == 0, "empty_cache left memory mapped"
    assert torch.cuda.max_memory_reserved() >= 3 * MiB
    assert torch.cuda.memory_stats()["inactive_split.all.current"] == 0  # keys zicoum has no counter for
    torch.cuda.memory.reset_peak_memory_stats()
    assert torch.cuda.max_memory_allocated() == 0, "the peak did not start again"
    assert torch.cuda.max_memory_reserved() == torch.cuda.memory_reserved()
    print("OK")


if __name__ == "__main__":
    main()
