"""Make PyTorch allocate CUDA memory through zicoum.

    import zicoum.torch
    zicoum.torch.enable(budget="6GiB")  # before the first CUDA tensor

PyTorch then calls libzicoum's zico_torch_malloc / zico_torch_free for every
CUDA tensor instead of using its own caching allocator, and its memory queries
(torch.cuda.mem_get_info, memory_allocated, max_memory_allocated,
memory_reserved, max_memory_reserved, memory_stats, empty_cache) answer from
zicoum: the budget, not the card. Tensor.record_stream reaches zicoum too (a
block another stream used waits for that stream's work before reuse); the
C++ callers of record_stream in torch.distributed are asked to keep such
tensors alive instead (TORCH_NCCL_AVOID_RECORD_STREAMS=1 unless set). To run a script unmodified instead, use
`zico-run --budget 6GiB -- python train.py`.

    zicoum.torch.mark_iterations()  # with enable() or under zico-run

marks an iteration after each optimizer step, so that zicoum learns the
training loop from the marks instead of looking for it in the kernel launches.
"""

import collections
import os
import weakref

import zicoum

__all__ = ["enable", "mark_iterations"]

_BACKENDS = ("cuda", "sim")
_MODES = ("vmm", "um")
_LOG_LEVELS = ("error", "warn", "info", "debug")
_SETTINGS = ("ZICO_BACKEND", "ZICO_BUDGET", "ZICO_LOG", "ZICO_MODE")

# (settings, allocator) once enable() has succeeded.
_enabled = None
# The optimizer step hook's handle once mark_iterations() installed it.
_marking = None


def _effective(environment):
    """What libzicoum would make of these variables, so that "1GiB" and "1024MiB" compare equal."""
    budget = environment.get("ZICO_BUDGET")
    try:
        budget = zicoum.parse_size(budget) if budget is not None else None
    except ValueError:
        pass  # compared as text; libzicoum itself will report it
    return (environment.get("ZICO_BACKEND", "cuda"), budget, environment.get("ZICO_LOG", "warn"),
            environment.get("ZICO_MODE", "vmm"))


def _describe(environment):
    shown = [f"{name}={environment[name]}" for name in _SETTINGS if name in environment]
    return " ".join(shown) if shown else "the default settings"


def _validated(budget, backend, log, mode=None):
    """The ZICO_* variables the arguments ask for; raises ValueError or TypeError."""
    settings = {}
    if budget is not None:
        if isinstance(budget, bool) or not isinstance(budget, (str, int)):
            raise TypeError(f"budget must be a size such as '6GiB' or a number of bytes, not {budget!r}")
        text = str(budget)
        try:
            valid = zicoum.parse_size(text) > 0
        except ValueError:
            valid = False
        if not valid:
            raise ValueError(f"budget '{text}' is not a size above 0; expected {zicoum.SIZE_FORM}")
        settings["ZICO_BUDGET"] = text
    if backend is not None:
        if backend not in _BACKENDS:
            raise ValueError(f"backend {backend!r} is not valid; expected cuda or sim")
        settings["ZICO_BACKEND"] = backend
    if log is not None:
        if log not in _LOG_LEVELS:
            raise ValueError(f"log {log!r} is not valid; expected error, warn, info or debug")
        settings["ZICO_LOG"] = log
    if mode is not None:
        if mode not in _MODES:
            raise ValueError(f"mode {mode!r} is not valid; expected vmm or um")
        settings["ZICO_MODE"] = mode
    return settings


def _import_torch():
    try:
        import torch
    except ImportError as error:
        raise ImportError(f"zicoum.torch.enable() needs PyTorch, which cannot be imported: {error}") from error
    if not hasattr(torch.cuda.memory, "CUDAPluggableAllocator"):
        raise RuntimeError(f"PyTorch {torch.__version__} has no CUDAPluggableAllocator; zicoum needs PyTorch 2.0 or newer")
    if not torch.cuda.is_available():
        raise RuntimeError(f"PyTorch {torch.__version__} sees no usable CUDA device "
                           f"(built with CUDA {torch.version.cuda}); zicoum replaces its CUDA allocator")
    return torch


def _restore(saved):
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def enable(budget=None, backend=None, log=None, mode=None):
    """Makes PyTorch allocate CUDA memory through zicoum; returns the installed
    torch.cuda.memory.CUDAPluggableAllocator.

    budget: cap on device memory per GPU, a size such as "6GiB" or a number of
    bytes (ZICO_BUDGET); backend: "cuda" or "sim" (ZICO_BACKEND); log: "error",
    "warn", "info" or "debug" (ZICO_LOG); mode: "vmm" or "um" (ZICO_MODE: in
    "um" the budget caps the pages on the GPU and the rest pages to host
    memory; the pager learns PyTorch's kernels only when libzicoum is
    preloaded, with zico-run, which sees their launches). None leaves the
    variable as the environment has it. Must be called before PyTorch's first
    CUDA allocation.

    Raises ValueError or TypeError for a bad argument (before anything else
    happens); ImportError if PyTorch cannot be imported; RuntimeError if
    PyTorch has no usable CUDA, if it already initialized its CUDA allocator,
    or if libzicoum already read different settings in this process (it reads
    them once: preloaded by zico-run, used through this package, or an earlier
    enable() call). Calling it again with the same settings returns the same
    allocator. On failure the environment is left as it was.
    """
    global _enabled
    overrides = _validated(budget, backend, log, mode)
    requested = {name: os.environ[name] for name in _SETTINGS if name in os.environ}
    requested.update(overrides)
    if _enabled is not None:
        if _effective(requested) == _enabled[0]:
            return _enabled[1]
        raise RuntimeError(f"zicoum.torch.enable() already installed zicoum with other settings; "
                           f"it cannot switch to {_describe(requested)}")

    zicoum._library()  # notes whether a preloaded copy already read its settings
    already_read = zicoum._settings_read
    if already_read is not None and _effective(already_read) != _effective(requested):
        raise RuntimeError(
            f"libzicoum is already in use in this process with {_describe(already_read)} "
            f"and reads its settings only once, so it cannot switch to {_describe(requested)}; "
            "give them before zicoum is first used (in the environment, or with zico-run --budget ...)")

    torch = _import_torch()
    path = zicoum.library_path()
    saved = {name: os.environ.get(name) for name in overrides}
    # libzicoum reads these at its first allocation, after PyTorch loads it below.
    os.environ.update(overrides)
    try:
        allocator = torch.cuda.memory.CUDAPluggableAllocator(path, "zico_torch_malloc", "zico_torch_free")
    except (RuntimeError, OSError) as error:
        _restore(saved)
        raise RuntimeError(f"PyTorch could not load the zicoum allocator from {path}: {error}") from error
    try:
        torch.cuda.memory.change_current_allocator(allocator)
    except RuntimeError as error:
        _restore(saved)
        raise RuntimeError(
            "PyTorch has already initialized its CUDA allocator (some CUDA tensor or operation came "
            "first), so it cannot be replaced; call zicoum.torch.enable() before any CUDA work, or run "
            f"the script under zico-run instead ({error})") from error
    if zicoum._settings_read is None:
        zicoum._settings_read = requested
    _answer_memory_queries(torch)
    _follow_record_stream(torch)
    _enabled = (_effective(requested), allocator)
    return allocator


def mark_iterations():
    """Marks an iteration (zicoum.mark_iteration) after each step of the first
    optimizer that steps, through PyTorch's global optimizer step post-hook
    (torch.optim.optimizer.register_optimizer_step_post_hook): a step ends one
    iteration, and what follows it begins the next. A job with several
    optimizers (a GAN's two) gets one mark per step of the first, one per
    iteration. Without marks, UM mode finds the iteration in the kernel
    launches, which a job that launches differently from one iteration to the
    next defeats. Works with enable() and under zico-run alike; calling it
    again returns the same handle. Returns the hook's handle: remove() stops
    the marks.

    Raises ImportError if PyTorch cannot be imported, RuntimeError if it has no
    global optimizer step hooks (PyTorch before 2.0). A mark that fails raises
    zicoum.ZicoError from the optimizer's step.
    """
    global _marking
    if _marking is not None:
        return _marking
    try:
        import torch.optim.optimizer as optimizer_module
    except ImportError as error:
        raise ImportError(f"zicoum.torch.mark_iterations() needs PyTorch, which cannot be imported: {error}") from error
    register = getattr(optimizer_module, "register_optimizer_step_post_hook", None)
    if register is None:
        raise RuntimeError("this PyTorch has no global optimizer step hooks "
                           "(register_optimizer_step_post_hook, PyTorch 2.0 or newer); call zicoum.mark_iteration() "
                           "at the start of each iteration instead")
    first = None  # a weak reference to the optimizer whose steps mark

    def mark_after_step(optimizer, args, kwargs):
        nonlocal first
        if first is None or first() is None:
            first = weakref.ref(optimizer)
        if first() is optimizer:
            zicoum.mark_iteration()

    _marking = _MarkHandle(register(mark_after_step))
    return _marking


class _MarkHandle:
    """mark_iterations()'s hook: remove() takes it out (a later call installs a new one)."""

    def __init__(self, handle):
        self._handle = handle

    def remove(self):
        global _marking
        if _marking is self:
            _marking = None
        self._handle.remove()


def _device_index(torch, device):
    """The CUDA ordinal that torch.cuda's memory functions mean by `device`."""
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    index = torch.device(device).index
    return torch.cuda.current_device() if index is None else index


def _follow_record_stream(torch):
    """PyTorch's pluggable allocator drops Tensor.record_stream (its hook can
    only be set from C++): without it, a block freed on its own stream would be
    reused there at once while another stream still reads it. Python callers
    (user code, FSDP) reach zicoum through the patched method; the C++ callers
    in torch.distributed keep such tensors alive themselves when
    TORCH_NCCL_AVOID_RECORD_STREAMS is 1, read when a process group starts."""
    original = torch.Tensor.record_stream

    def record_stream(tensor, stream):
        original(tensor, stream)
        if not tensor.is_cuda:
            return
        pointer = tensor.untyped_storage().data_ptr()
        try:
            zicoum.record_stream(pointer, stream.cuda_stream)
        except zicoum.ZicoError as error:
            if "not allocated by zicoum" not in error.detail:  # e.g. memory shared in from elsewhere
                raise

    record_stream.__name__ = "record_stream"
    record_stream.__doc__ = original.__doc__
    torch.Tensor.record_stream = record_stream
    os.environ.setdefault("TORCH_NCCL_AVOID_RECORD_STREAMS", "1")


def _answer_memory_queries(torch):
    """Replaces PyTorch's memory queries, which the pluggable allocator leaves
    unanswered (they raise) or answers for the whole card, with zicoum's numbers."""

    def stats(device):
        return zicoum.stats(_device_index(torch, device))

    def mem_get_info(device=None):
        return zicoum.mem_get_info(_device_index(torch, device))

    def memory_allocated(device=None):
        return stats(device)["allocated_bytes"]

    def max_memory_allocated(device=None):
        return stats(device)["peak_allocated_bytes"]

    def memory_reserved(device=None):
        return stats(device)["mapped_bytes"]

    def max_memory_reserved(device=None):
        return stats(device)["peak_mapped_bytes"]

    def memory_stats(device=None):
        s = stats(device)
        # The keys of PyTorch's own memory_stats() that a zicoum counter
        # answers; any other reads 0 (memory_summary() asks for many).
        return collections.defaultdict(int, {
            "allocated_bytes.all.current": s["allocated_bytes"],
            "allocated_bytes.all.peak": s["peak_allocated_bytes"],
            "active_bytes.all.current": s["allocated_bytes"],
            "active_bytes.all.peak": s["peak_allocated_bytes"],
            "reserved_bytes.all.current": s["mapped_bytes"],
            "reserved_bytes.all.peak": s["peak_mapped_bytes"],
            "allocation.all.allocated": s["allocations"],
            "allocation.all.freed": s["frees"],
            "allocation.all.current": s["allocations"] - s["frees"],
            "num_ooms": s["failed_allocations"],
            "num_alloc_retries": 0,
        })

    def reset_peak_memory_stats(device=None):
        zicoum.reset_peak_stats(_device_index(torch, device))

    def empty_cache():
        zicoum.empty_cache(torch.cuda.current_device())

    answers = {
        "mem_get_info": mem_get_info, "memory_allocated": memory_allocated,
        "max_memory_allocated": max_memory_allocated, "memory_reserved": memory_reserved,
        "max_memory_reserved": max_memory_reserved, "memory_stats": memory_stats, "empty_cache": empty_cache,
        "reset_peak_memory_stats": reset_peak_memory_stats, "reset_max_memory_allocated": reset_peak_memory_stats,
        "reset_max_memory_cached": reset_peak_memory_stats,
    }
    for name, function in answers.items():
        function.__name__ = name
        function.__doc__ = f"torch.cuda.{name}, answered by zicoum (zicoum.torch.enable)."
        # Both: torch.cuda re-exports them, and code calls either.
        setattr(torch.cuda, name, function)
        if hasattr(torch.cuda, "memory"):
            setattr(torch.cuda.memory, name, function)
