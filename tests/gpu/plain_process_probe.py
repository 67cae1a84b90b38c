"""A plain CUDA process beside a zicoum job (the GPU suite's um_physical step): PyTorch with no
zicoum, told what to do on stdin, one JSON line on stdout for each thing it did.

    plain_process_probe.py [--deadline SECONDS]

First it creates its CUDA context and prints {"ready": true, "pid", "free_bytes", "total_bytes"}
(cudaMemGetInfo's, through torch.cuda.mem_get_info). Then, a command a line:
    alloc BYTES   reads cudaMemGetInfo, then allocates BYTES (a multiple of 2 MiB, so that
                  PyTorch's caching allocator asks cudaMalloc for exactly that) and holds it:
                  {"free_bytes", "alloc_bytes", "alloc_ok", "alloc_ms", "free_after_alloc_bytes"
                  or "error"}.
It exits, freeing what it holds, at the end of its input, or on its own after --deadline seconds
(default 170) whatever it was told, so that it never outlives a suite that died. A malformed
command gets {"error"} and is otherwise ignored.
"""
import argparse
import json
import os
import select
import sys
import time

BLOCK = 2 << 20


def say(**fields):
    print(json.dumps(fields), flush=True)


class Commands:
    """Lines from stdin, read unbuffered so that select() sees every one, until a deadline."""

    def __init__(self, deadline):
        self._deadline = deadline
        self._pending = b""

    def next(self):
        """The next line without its newline, or None at the end of input or past the deadline."""
        while b"\n" not in self._pending:
            left = self._deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([0], [], [], left)
            if not ready:
                return None
            chunk = os.read(0, 4096)
            if not chunk:  # the end of input: a last line without its newline, then None
                line, self._pending = self._pending, b""
                return line.decode(errors="replace").strip() or None
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return line.decode(errors="replace").strip()


def allocate(torch, text):
    """The allocation's line for `alloc TEXT`, and the tensor that holds it (None where it failed)."""
    try:
        size = int(text)
    except ValueError:
        return {"error": f"alloc '{text}': not a number of bytes"}, None
    if size <= 0 or size % BLOCK:
        return {"error": f"alloc {size}: not a positive multiple of 2 MiB"}, None
    free, _ = torch.cuda.mem_get_info()
    line = {"free_bytes": free, "alloc_bytes": size}
    start = time.perf_counter()
    try:
        held = torch.empty(size, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
    except RuntimeError as error:  # torch.OutOfMemoryError among them
        line.update(alloc_ok=False, alloc_ms=round((time.perf_counter() - start) * 1e3, 3),
                    error=(str(error).splitlines() or [type(error).__name__])[0][:300])
        return line, None
    line.update(alloc_ok=True, alloc_ms=round((time.perf_counter() - start) * 1e3, 3),
                free_after_alloc_bytes=torch.cuda.mem_get_info()[0])
    return line, held


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--deadline", type=float, default=170.0)
    args = parser.parse_args()
    if args.deadline <= 0:
        parser.error(f"--deadline {args.deadline}: must be above 0")
    deadline = time.monotonic() + args.deadline
    import torch

    free, total = torch.cuda.mem_get_info()  # creates the context, allocates nothing
    say(ready=True, pid=os.getpid(), free_bytes=free, total_bytes=total)
    commands, held = Commands(deadline), None
    while (command := commands.next()) is not None:
        verb, _, rest = command.partition(" ")
        if verb == "alloc" and held is None:
            line, held = allocate(torch, rest.strip())
            say(**line)
        elif verb == "alloc":
            say(error="alloc: already holding an allocation")
        elif command:
            say(error=f"'{command[:100]}': not alloc BYTES")
    return 0


if __name__ == "__main__":
    sys.exit(main())
