"""zicoum from Python: statistics, iteration marks and sizes, through libzicoum's C API.

libzicoum is loaded with ctypes on first use. Which copy, in order:

1. one already mapped into this process (preloaded by zico-run, or loaded by
   PyTorch after zicoum.torch.enable()): a second copy would be a second
   memory manager with a budget of its own;
2. $ZICO_LIBRARY;
3. the library this package was built or installed with (recorded in _paths.py
   by CMake).

To make PyTorch allocate through zicoum, see zicoum.torch.enable().
"""

import ctypes
import enum
import os
import sys
import tempfile
import threading

__all__ = [
    "SIZE_FORM", "Status", "ZicoError", "empty_cache", "library_path", "mark_iteration", "mem_get_info",
    "reset_peak_stats",
    "parse_size", "stats", "status_string",
]

# Mirrors kSizeForm in umm/sizes.h (python_api_test checks they agree).
SIZE_FORM = ("a number with an optional unit B, KiB, MiB, GiB, TiB (or Ki, Mi, Gi, Ti, or K, M, G, T) or KB, MB, GB, "
             "TB, e.g. 512MiB, 40Gi, 1.5GB")


class Status(enum.IntEnum):
    """zico_status_t."""
    OK = 0
    OUT_OF_MEMORY = 1
    INVALID_VALUE = 2
    CONFIG = 3
    NO_DEVICE = 4
    NOT_SUPPORTED = 5
    DRIVER = 6
    INTERNAL = 7
    SUSPENDED = 8


class ZicoError(RuntimeError):
    """A zicoum call failed. `status` is the Status (or int) it returned and
    `detail` is zico_last_error() at the time: which variable was malformed,
    how much of the budget was in use."""

    def __init__(self, function, status, detail):
        self.status = Status(status) if status in Status._value2member_map_ else status
        self.detail = detail
        text = f"{function}: {status_string(status)}"
        super().__init__(f"{text}: {detail}" if detail else text)


class _Stats(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t)] + [(name, ctypes.c_uint64) for name in (
        "budget_bytes", "allocated_bytes", "peak_allocated_bytes", "mapped_bytes", "peak_mapped_bytes",
        "allocations", "frees", "failed_allocations", "chunk_maps", "chunk_unmaps", "iterations",
        "last_iteration_peak_bytes", "resident_bytes", "peak_resident_bytes", "faulted_pages",
        "prefetched_pages", "evicted_pages", "modelled_ns", "outside_bytes", "kernels", "kernels_without_blocks",
        "unnamed_faults", "learnt_pages", "unasked_arrivals", "copies", "peak_over_budget_bytes")]


_lock = threading.Lock()
_lib = None
_path = None
# The ZICO_* settings libzicoum read (or may have read) when it initialized;
# None while it provably has not. It reads them once, so zicoum.torch.enable()
# must refuse different ones.
_settings_read = None


def _mapped_copies():
    """Paths of every libzicoum already mapped into this process."""
    found = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(None, 5)
                path = fields[5].strip() if len(fields) == 6 else ""
                if os.path.basename(path).startswith("libzicoum.so") and path not in found:
                    found.append(path)
    except OSError:
        pass
    return found


def _zico_environment(environ):
    return {name: value for name, value in environ.items() if name.startswith("ZICO_")}


def _startup_environment():
    """The environment this process was started with: what a preloaded libzicoum saw."""
    try:
        with open("/proc/self/environ", "rb") as f:
            entries = f.read().split(b"\0")
    except OSError:
        return dict(os.environ)
    return dict(os.fsdecode(e).split("=", 1) for e in entries if b"=" in e)


def library_path():
    """Absolute path of the libzicoum.so this package uses (see the module doc
    for the order). Raises FileNotFoundError naming the path and where it came
    from when there is no such file."""
    if _path is not None:
        return _path
    mapped = _mapped_copies()
    if mapped:
        return mapped[0]
    if os.environ.get("ZICO_LIBRARY"):
        path, source = os.path.abspath(os.environ["ZICO_LIBRARY"]), "$ZICO_LIBRARY"
    else:
        try:
            from . import _paths
        except ImportError:
            raise FileNotFoundError(
                "zicoum: this copy of the package was not built or installed by CMake, so it does "
                "not know where libzicoum.so is; set ZICO_LIBRARY to its path") from None
        path, source = _paths.LIBRARY, f"recorded in {_paths.__file__}"
    if not os.path.isfile(path):
        raise FileNotFoundError(f"zicoum: libzicoum not found at {path} ({source}); "
                                "set ZICO_LIBRARY to its path")
    return path


def _library():
    global _lib, _path, _settings_read
    with _lock:
        if _lib is not None:
            return _lib
        preloaded = bool(_mapped_copies())
        path = library_path()
        lib = ctypes.CDLL(path)
        c_int, c_char_p, c_void_p = ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p
        for name, restype, argtypes in (
                ("zico_status_string", c_char_p, [c_int]),
                ("zico_last_error", c_char_p, []),
                ("zico_get_stats", c_int, [c_int, ctypes.POINTER(_Stats)]),
                ("zico_mark_iteration", c_int, []),
                ("zico_empty_cache", c_int, [c_int]),
                ("zico_record_stream", c_int, [c_void_p, c_void_p]),
                ("zico_reset_peak_stats", c_int, [c_int]),
                ("zico_mem_get_info", c_int, [c_int, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]),
                ("zico_suspend", c_int, [c_int, c_int]),
                ("zico_resume", c_int, [c_int]),
                ("zico_parse_size", c_int, [c_char_p, ctypes.POINTER(ctypes.c_uint64)]),
                ("zico_torch_malloc", c_void_p, [ctypes.c_ssize_t, c_int, c_void_p]),
                ("zico_torch_free", None, [c_void_p, ctypes.c_ssize_t, c_int, c_void_p])):
            function = getattr(lib, name)
            function.restype, function.argtypes = restype, argtypes
        if preloaded:
            _settings_read = _zico_environment(_startup_environment())
        _lib, _path = lib, path
        return lib


def _first_call(lib, function, args):
    """The first call starts libzicoum, which logs on stderr why it could not start (a
    malformed variable, no driver); ZicoError carries that reason, so its log line is
    dropped here and every other line passes. Returns (status, detail)."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to keep clean
        status = getattr(lib, function)(*args)
        return status, lib.zico_last_error().decode(errors="replace") if status != Status.OK else ""
    with tempfile.TemporaryFile() as captured:
        try:
            os.dup2(captured.fileno(), 2)
            status = getattr(lib, function)(*args)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        detail = lib.zico_last_error().decode(errors="replace") if status != Status.OK else ""
        captured.seek(0)
        logged = captured.read().decode(errors="replace")
    kept = [line for line in logged.splitlines(keepends=True) if not (detail and detail in line)]
    if kept:
        sys.stderr.write("".join(kept))
        sys.stderr.flush()
    return status, detail


def _initializing_call(function, *args):
    """Calls a function that makes libzicoum read its settings; raises ZicoError on failure."""
    global _settings_read
    lib = _library()
    if _settings_read is None:
        _settings_read = _zico_environment(os.environ)
        status, detail = _first_call(lib, function, args)
    else:
        status = getattr(lib, function)(*args)
        detail = lib.zico_last_error().decode(errors="replace") if status != Status.OK else ""  # before another call
    if status != Status.OK:
        raise ZicoError(function, status, detail)


def status_string(status):
    """A human-readable description of a zico_status_t value."""
    return _library().zico_status_string(int(status)).decode(errors="replace")


def stats(device=0):
    """Counters for `device` as a dict: budget_bytes, allocated_bytes, mapped_bytes,
    their peaks, allocations, frees, failed_allocations, ... (zico_stats_t).
    Raises ZicoError (e.g. INVALID_VALUE for a bad device, CONFIG for a bad ZICO_* variable)."""
    result = _Stats(struct_size=ctypes.sizeof(_Stats))
    _initializing_call("zico_get_stats", int(device), ctypes.byref(result))
    return {name: getattr(result, name) for name, _ in _Stats._fields_[1:]}


def reset_peak_stats(device=0):
    """The peaks in stats(device) start again from the current values. Raises ZicoError."""
    _initializing_call("zico_reset_peak_stats", int(device))


def mem_get_info(device=0):
    """(free, total) bytes on `device` as zicoum offers them to this job: total is the
    budget, free the budget less the job's allocations (also capped by what the device
    has free). Raises ZicoError."""
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    _initializing_call("zico_mem_get_info", int(device), ctypes.byref(free), ctypes.byref(total))
    return free.value, total.value


def mark_iteration():
    """Marks the start of a training iteration, so zicoum learns the job's memory
    cycle. Raises ZicoError."""
    _initializing_call("zico_mark_iteration")


def empty_cache(device=0):
    """Returns cached, unused physical memory on `device` to the driver. Raises ZicoError."""
    _initializing_call("zico_empty_cache", int(device))


def record_stream(pointer, stream):
    """Work queued on `stream` (a cudaStream_t as an int, e.g. torch.cuda.Stream's
    cuda_stream) uses the zicoum allocation starting at `pointer`, which was allocated
    for another stream: once freed, it is not reused before that work is done (what
    PyTorch's Tensor.record_stream asks of its allocator). Raises ZicoError
    (INVALID_VALUE for a pointer that is not the start of a live zicoum allocation)."""
    _initializing_call("zico_record_stream", ctypes.c_void_p(int(pointer)), ctypes.c_void_p(int(stream)))


_STORES = {"host": 0, "nvme": 1}


def suspend(device=0, to="host"):
    """Saves every allocation on `device` to host memory (to="host") or to a swap file
    (to="nvme"), after waiting for all GPU work, and releases the device's memory, like
    vLLM's sleep mode. Tensors keep their addresses but must not be used until resume();
    allocations fail meanwhile. Raises ValueError for an unknown `to`, ZicoError if the
    suspend failed (then nothing changed)."""
    if to not in _STORES:
        raise ValueError(f"to={to!r} is not a store; expected one of {sorted(_STORES)}")
    _initializing_call("zico_suspend", int(device), _STORES[to])


def resume(device=0):
    """Maps `device`'s memory back at the same addresses and restores its contents.
    A no-op when not suspended. Raises ZicoError (the data stays saved; call again)."""
    _initializing_call("zico_resume", int(device))


def parse_size(text):
    """Bytes in a size such as "512MiB", "40GiB", "1.5GB" or "4096", parsed exactly
    as libzicoum parses ZICO_BUDGET. Raises ValueError naming `text` and the
    accepted form, TypeError if `text` is not a str."""
    if not isinstance(text, str):
        raise TypeError(f"parse_size expects a str such as '6GiB', not {type(text).__name__}")
    result = ctypes.c_uint64()
    if "\0" in text or _library().zico_parse_size(text.encode(), ctypes.byref(result)) != Status.OK:
        raise ValueError(f"'{text}' is not a size; expected {SIZE_FORM}")
    return result.value
