#!/usr/bin/env python3
"""Capture a zicoum memory trace (docs/trace-format.md) of a real model's training loop.

Two modes, picked by --device. `meta` (the default, and how the committed traces were made) uses no GPU;
`cuda` runs the same loop on a real GPU and measures each op's time (see "GPU mode" below). Nothing is
downloaded in either mode. In meta mode, the model is built from its config with random weights on
PyTorch's `meta` device, where every tensor has a shape, a dtype and a storage of the right size but no
data, so a full-size batch costs no memory and little time. A TorchDispatchMode sees every ATen op the
training loop runs (forward, autograd's backward, the optimizer) and turns it into trace records:

  * Allocation: an op's output whose storage was not live before the op is a new block; an output
    that shares an input's storage (a view, an in-place op) is not. Its size is the storage's nbytes,
    as the CUDA caching allocator would be asked for it (before the allocator's own rounding).
  * Free: the recorder holds only a weak reference to each live storage. Before every op, and after a
    gc.collect() at the end of each iteration, it sweeps them: a storage nobody references any more
    (not Python, not autograd's saved tensors, not the optimizer) is freed at the current time.
  * Op: one `o` record per kernel: the op's reads (live blocks of its tensor inputs) and writes (its
    new blocks and the blocks of the arguments it mutates). Ops that only make a view launch nothing
    and are not recorded; ops that only allocate (empty, empty_strided...) are recorded with DUR 0.
  * Time: a roofline estimate on one H100-class GPU, one op after another on one stream, ignoring
    CPU-side overhead (the GPU is assumed to be the bottleneck). See the constants below.
  * Category: decided when the trace is written, since an allocation's role is often known only
    later (autograd steals a backward op's output as a parameter's .grad). Parameters and buffers are
    `param`, the parameters' .grad after backward `grad`, tensors in optimizer.state `optim`, the batch
    and labels `input`; any other block freed within TEMP_MAX_OPS ops of the op that made it is
    `temp`, the rest `act`. A block found live but never seen allocated is `other`.

Where CUDA would pick a different kernel than the meta device does, the capture makes CUDA's choice so
the memory matches a GPU run: dropout is ATen's fused native_dropout (a bool mask), and
scaled_dot_product_attention is the memory-efficient kernel (what PyTorch picks on an H100 for fp32,
an attention mask included, which is converted, padded and expanded as CUDA does: T5 passes its
position bias as one; --attention math keeps the math path instead, which materialises the S x S
attention scores). Grouped-query attention (enable_gqa) keeps PyTorch's own path. Adam/AdamW run with
foreach=True, PyTorch's default on CUDA (--optimizer sgd-momentum: SGD with momentum 0.9, foreach too).
All floating tensors are float32.

Your own model: --model MODULE:CALLABLE imports MODULE (the current directory first on sys.path) and
calls CALLABLE with those of the keyword options batch, seq_len, image_size (None unless given) and
device (the torch.device captured on) that its signature names, inside `with torch.device(device)`. It
returns (model, batch) or (model, batch, loss_fn): an nn.Module, a dict or tuple of tensors, and
loss_fn(model, batch) -> scalar loss. Each iteration trains on a fresh copy of the batch (made
unrecorded, category `input`) with AdamW(foreach=True) unless --optimizer says otherwise; the loss is
loss_fn(model, batch), or without one model(**batch).loss for a dict batch and
cross_entropy(model(*inputs), target) for a tuple
(inputs..., target). Anything unusable is a usage error naming the value (exit 2). See load_user_model
and tools/traces/README.md (tools/traces/example_model.py has examples).

GPU mode (--device cuda): the same model, built with random weights directly on the current CUDA
device (torch.manual_seed(0)), trains on real random batches through the same loop and the same
Recorder, so sizes, categories and op indices mean what they mean in meta mode and the two traces can be
compared (compare_devices.py). The differences:

  * Kernels are PyTorch's own choice on the GPU: nothing is substituted (on CUDA dropout is
    native_dropout and fp32 attention the memory-efficient kernel anyway); --attention math forces
    SDPBackend.MATH. What was picked is counted in `meta kernels`. Matmuls run in TF32
    (set_float32_matmul_precision("high")), as the roofline assumes; cuDNN keeps its defaults.
  * Time: one pair of CUDA events per recorded op, recorded on the current stream immediately before and
    after the op runs; no synchronisation per op. The events come from a pool, read after a
    torch.cuda.synchronize() at each iteration's end and reused. DUR is an op's elapsed time, T the sum
    of the DURs of all earlier ops (GPU time; the gaps between ops are left out). Where the GPU is
    faster than the CPU launching work (small kernels, and this recorder's Python cost per op), the
    first event runs before the kernel is even launched, so DUR includes the op's CPU launch time.
    The first iteration's DURs also include one-time costs (CUDA's lazy loading of each kernel,
    cuBLAS and cuDNN handles). Records are written with provisional times (an op count) that are
    resolved once the durations are known.
  * Safety on a shared GPU: before touching the GPU's memory the expected footprint is estimated by a
    meta-mode capture of the same settings (a child process), and the capture refuses to start (exit
    3) unless the GPU has that much free, with allowances (torch.cuda.mem_get_info); the caching
    allocator is then capped at the estimate plus its allowance (set_per_process_memory_fraction), so an
    underestimate ends in an out-of-memory error inside this process instead of taking memory from
    others. See gpu_memory_plan().
  * The meta keys add the GPU, driver and library versions, the footprint plan, and PyTorch's own peak
    of allocated and reserved bytes (which include workspaces and rounding the trace leaves out).

Needs torch, torchvision, transformers and timm (tools/traces/requirements.txt); CI does not run it.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import gzip
import os
import shlex
import subprocess
import sys
import tempfile
import time
from typing import Callable

# --- Roofline constants (H100 SXM class). Recorded in `meta timing`. ---
# Matmul-class ops (mm, addmm, bmm, convolutions, attention) on tensor cores in TF32 (cuDNN's default
# for convolutions; torch.set_float32_matmul_precision("high") for matmuls): about 80 % of the
# ~495 TFLOP/s dense TF32 peak, which large GEMMs reach and small convolutions do not.
MATMUL_FLOPS_PER_S = 400e12
# Everything else is bound by HBM3: bytes read + written over 3.35 TB/s at 80 % efficiency. Matmul-class
# ops take the larger of their compute and memory times.
HBM_BYTES_PER_S = 3.35e12 * 0.8
# Floor per kernel: launch and tail overhead of a small kernel.
MIN_KERNEL_NS = 4_000
# A block freed within this many ops of the op that allocated it is `temp`, otherwise `act`.
TEMP_MAX_OPS = 4


def timing_meta() -> str:
    return (
        f"roofline estimate per op, ops serialised on one stream: matmul-class ops (mm, addmm, bmm, "
        f"baddbmm, convolution and its backward, efficient attention and its backward; FLOPs from "
        f"torch.utils.flop_counter) at max({MATMUL_FLOPS_PER_S / 1e12:g} TFLOP/s, memory time); other ops "
        f"at (bytes read + written) / ({HBM_BYTES_PER_S / 1e12:g} TB/s = 3.35 TB/s x 0.8); "
        f"at least {MIN_KERNEL_NS} ns per kernel; allocation-only ops (empty*) 0 ns; CPU overhead ignored"
    )


TIMING_CUDA_META = (
    "CUDA events per op: a torch.cuda.Event pair (enable_timing) recorded on the current stream "
    "immediately before and after each recorded op, read after torch.cuda.synchronize() at each "
    "iteration's end; DUR = the pair's elapsed time, T = sum of the DURs of all earlier ops (GPU time, "
    "gaps between ops left out); where the GPU outruns the CPU a DUR includes the op's CPU launch time; "
    "allocation-only ops (empty*) 0 ns, no events; event resolution about 0.5 us"
)

# Seed of the random weights and batches in GPU mode (meta tensors hold no values).
CUDA_SEED = 0

# GPU mode's memory plan (gpu_memory_plan): the caching allocator may hold up to the estimated tensor
# peak x ALLOCATOR_FACTOR + ALLOCATOR_EXTRA (512-byte rounding, fragmentation, cuDNN and cuBLAS
# workspaces, which come from the same allocator), and the GPU must have OUTSIDE_ALLOCATOR more free
# than that (CUDA libraries' kernels and handles, loaded lazily, outside the allocator).
GIB = 1 << 30
ALLOCATOR_FACTOR = 1.5
ALLOCATOR_EXTRA = 1 * GIB
OUTSIDE_ALLOCATOR = 1 * GIB

# Exit status of main() when the GPU cannot be used (no CUDA device, not enough free memory); 2 is a
# usage error, 1 a failure (including a failed footprint estimate).
EXIT_NO_GPU = 3

# Op names counted in GPU mode's `meta kernels`: those whose kernel PyTorch chooses by device.
KERNEL_CHOICE_WORDS = ("dropout", "bernoulli", "attention", "batch_norm", "cudnn")

# Outputs that CUDA keeps in host memory although the meta device makes them device tensors: the
# philox seed and offset of the memory-efficient attention kernel. They are not recorded as blocks.
HOST_OUTPUTS = {"aten::_scaled_dot_product_efficient_attention": (2, 3)}

# Ops that allocate without launching a kernel.
ALLOC_ONLY_OPS = {
    "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty",
    "aten::new_empty_strided", "aten::empty_permuted",
}


@dataclasses.dataclass(eq=False)
class Block:
    id: int
    wref: object            # StorageWeakRef
    alloc_op: int           # op index, or -1
    record: list            # the `a` record, whose category is filled in when the trace is written
    role: str | None = None  # param, grad, optim, input, or None (decided by lifetime)
    persistent: bool = False  # swept only at iteration ends (parameters, optimizer state)


class Recorder:
    """Turns the ATen ops of a training loop on `device` into trace records.

    Single-threaded use only: autograd's engine may run backward on another thread, but the caller's
    thread waits for it, so the recorder is never entered concurrently.
    """

    def __init__(self, device, timer=None):
        import torch
        from torch.multiprocessing.reductions import StorageWeakRef
        from torch.utils.flop_counter import flop_registry

        self._torch = torch
        self._weakref = StorageWeakRef
        self._flop_registry = flop_registry
        self.device = device
        self.records: list[list] = []
        self.live: dict[int, Block] = {}     # storage cdata -> block
        self.host: dict[int, object] = {}    # storage cdata -> StorageWeakRef, see HOST_OUTPUTS
        self.clock_ns = 0
        self.op_count = 0
        self.next_id = 0
        self.iteration = -1
        self.untracked_found = 0
        self.paused = False   # while True, ops run unrecorded (making the batch, like a host copy)
        self._mutable_args: dict[object, list[tuple[int, str, bool]]] = {}
        # None: roofline estimates (meta mode). Otherwise measured times (CudaOpTimer): records get
        # provisional times, the number of ops before them, resolved by finish() into real times.
        self.timer = timer
        self.durations_ns: list[int | None] = []   # per op, measured mode only; None until read
        self._in_op = False
        self._resolved = False

    def _now(self) -> int:
        """The time field of a record made now: the clock, or in measured mode the number of ops so far
        (the op about to be recorded starts, and the last one recorded ends, at that position)."""
        return self.clock_ns if self.timer is None else self.op_count

    # -- blocks -----------------------------------------------------------------------------------

    def _key(self, t):
        return t.untyped_storage()._cdata

    def _allocate(self, storage, op: int, role: str | None = None) -> Block | None:
        nbytes = storage.nbytes()
        if nbytes == 0:
            return None  # the caching allocator is not called for an empty tensor
        rec = ["a", self.next_id, nbytes, self._now(), None, op]
        block = Block(self.next_id, self._weakref(storage), op, rec, role)
        self.next_id += 1
        self.records.append(rec)
        self.live[storage._cdata] = block
        return block

    def _free(self, key: int) -> None:
        block = self.live.pop(key)
        self.records.append(["f", block.id, self._now()])
        if block.role is not None:
            block.record[4] = block.role
        else:
            lifetime = self.op_count - block.alloc_op
            block.record[4] = "temp" if block.alloc_op >= 0 and lifetime <= TEMP_MAX_OPS else "act"

    def sweep(self, everything: bool = False) -> None:
        dead = [k for k, b in self.live.items()
                if (everything or not b.persistent) and b.wref.expired()]
        for k in dead:
            self._free(k)
        for k in [k for k, ref in self.host.items() if ref.expired()]:
            del self.host[k]

    def block_of(self, t) -> Block | None:
        if not isinstance(t, self._torch.Tensor) or t.device != self.device:
            return None
        block = self.live.get(self._key(t))
        if block is not None and block.wref.expired():
            raise AssertionError("a live tensor's storage reads as expired")
        return block

    def register(self, tensors, role: str, persistent: bool = False) -> None:
        """Record tensors made outside any op (parameters, the batch) as blocks with OP -1."""
        for t in tensors:
            if t is None or t.device != self.device:
                continue
            block = self.block_of(t)
            if block is None:
                block = self._allocate(t.untyped_storage(), -1, role)
            if block is not None:
                block.role = role
                block.persistent = block.persistent or persistent

    def mark(self, tensors, role: str, persistent: bool = False) -> None:
        """Give live blocks a role learned after their allocation (.grad, optimizer state)."""
        for t in tensors:
            block = self.block_of(t)
            if block is not None:
                block.role = role
                block.persistent = block.persistent or persistent

    def begin_iteration(self) -> None:
        self.iteration += 1
        self.records.append(["i", self.iteration, self._now()])

    def end_iteration(self) -> None:
        gc.collect()
        self.sweep(everything=True)
        if self.timer is not None:
            self.timer.collect(self.durations_ns)  # synchronises; the event pool is free again

    # -- ops --------------------------------------------------------------------------------------

    def _mutable(self, func) -> list[tuple[int, str, bool]]:
        """(position, name, kwarg_only) of the arguments the op writes to."""
        spec = self._mutable_args.get(func)
        if spec is None:
            spec = [(i, a.name, a.kwarg_only) for i, a in enumerate(func._schema.arguments)
                    if a.alias_info is not None and a.alias_info.is_write]
            self._mutable_args[func] = spec
        return spec

    def _tensors(self, value) -> list:
        from torch.utils._pytree import tree_leaves
        torch = self._torch
        return [t for t in tree_leaves(value)
                if isinstance(t, torch.Tensor) and t.device == self.device
                and self._key(t) not in self.host]

    @staticmethod
    def _tensor_bytes(t) -> int:
        return min(t.numel() * t.element_size(), t.untyped_storage().nbytes())

    def _duration_ns(self, func, args, kwargs, out, reads, writes, alloc_only: bool) -> int:
        if alloc_only:
            return 0
        moved = sum(self._tensor_bytes(t) for t in reads) + sum(self._tensor_bytes(t) for t in writes)
        ns = moved / HBM_BYTES_PER_S * 1e9
        flop_fn = self._flop_registry.get(func._overloadpacket)
        if flop_fn is not None:
            flops = flop_fn(*args, **kwargs, out_val=out)
            ns = max(ns, flops / MATMUL_FLOPS_PER_S * 1e9)
        return max(MIN_KERNEL_NS, round(ns))

    def on_op(self, func, args, kwargs, run: Callable):
        if self.paused:
            return run()
        if self.timer is None:
            return self._on_op(func, args, kwargs, run)
        # Measured mode runs backward on autograd's CUDA thread. The caller's thread waits for it, so
        # ops never overlap; if they ever did, the records and the event pool would be corrupt: stop.
        if self._in_op:
            raise RuntimeError("capture.py: two ops recorded at once (autograd ran ops concurrently); "
                               "the trace would be wrong")
        self._in_op = True
        try:
            return self._on_op(func, args, kwargs, run)
        finally:
            self._in_op = False

    def _on_op(self, func, args, kwargs, run: Callable):
        self.sweep()
        mutable = self._mutable(func)
        out_names = {name for _, name, kwarg_only in mutable if kwarg_only}
        reads = []     # tensor inputs, except out= arguments
        written = []   # tensor arguments the op writes to (in-place and out=)
        for value in args:
            reads += self._tensors(value)
        for name, value in kwargs.items():
            if name not in out_names:
                reads += self._tensors(value)
        for pos, name, kwarg_only in mutable:
            value = kwargs.get(name) if kwarg_only or pos >= len(args) else args[pos]
            written += self._tensors(value)

        # Blocks made where the recorder could not see them: recorded as made outside any op.
        for t in reads + written:
            if self.block_of(t) is None:
                if self._allocate(t.untyped_storage(), -1, "other") is not None:
                    self.untracked_found += 1

        alloc_only = func._schema.name in ALLOC_ONLY_OPS
        timed = self.timer is not None and not alloc_only
        if timed:
            self.timer.before()   # the pair is claimed below only if the op is recorded
        out = run()
        if timed:
            self.timer.after()

        for pos in HOST_OUTPUTS.get(func._schema.name, ()):
            storage = out[pos].untyped_storage()
            self.host[storage._cdata] = self._weakref(storage)
        out_tensors = self._tensors(out)
        if not out_tensors and not written and not reads:
            return out  # nothing on the device: no kernel there

        op = self.op_count
        new_blocks = []
        new_outs = []
        for t in out_tensors:
            if self.block_of(t) is None:
                block = self._allocate(t.untyped_storage(), op)
                if block is not None:
                    new_blocks.append(block)
                    new_outs.append(t)
        if not new_blocks and not written and out_tensors:
            return out  # a view of its inputs: no kernel

        read_ids = _unique_ids(self.block_of(t) for t in reads)
        write_ids = _unique_ids([self.block_of(t) for t in written] + new_blocks)
        if self.timer is None:
            dur = self._duration_ns(func, args, kwargs, out, reads, written + new_outs, alloc_only)
        else:
            dur = 0  # resolved by finish()
            self.durations_ns.append(None if timed else 0)
            if timed:
                self.timer.claim(op)
        name = func.name().replace("aten::", "")
        self.records.append(["o", op, self._now(), dur, name,
                             ",".join(map(str, read_ids)) or "-",
                             ",".join(map(str, write_ids)) or "-"])
        self.op_count += 1
        self.clock_ns += dur
        return out

    # -- output -----------------------------------------------------------------------------------

    def finish(self) -> int:
        """Sweeps once more and names every block's category; returns how many live blocks had none."""
        gc.collect()
        self.sweep(everything=True)
        if self.timer is not None:
            self.timer.collect(self.durations_ns)
            self._resolve_times()
        unnamed = 0
        for block in self.live.values():
            if block.role is None:
                unnamed += 1
            block.record[4] = block.role or "other"
        return unnamed

    def _resolve_times(self) -> None:
        """Measured mode: turns each record's provisional time (ops before it) into nanoseconds."""
        if self._resolved:
            return
        if len(self.durations_ns) != self.op_count or any(d is None for d in self.durations_ns):
            raise AssertionError("an op's duration was never read from its CUDA events")
        starts = [0]
        for d in self.durations_ns:
            starts.append(starts[-1] + d)
        for rec in self.records:
            kind = rec[0]
            if kind == "a":
                rec[3] = starts[rec[3]]
            elif kind in ("f", "i"):
                rec[2] = starts[rec[2]]
            else:  # "o"
                rec[2], rec[3] = starts[rec[1]], self.durations_ns[rec[1]]
        self.clock_ns = starts[-1]
        self._resolved = True

    def write(self, path: str, meta: dict[str, str]) -> int:
        lines = ["zicoum-trace 1"]
        for key, value in meta.items():
            lines.append(f"meta {key} {value}")
        for rec in self.records:
            lines.append(" ".join(map(str, rec)))
        lines.append(f"end {len(self.records)}")
        data = ("\n".join(lines) + "\n").encode()
        tmp = path + ".tmp"
        with open(tmp, "wb") as raw:
            with gzip.GzipFile(filename="", mode="wb", compresslevel=9, fileobj=raw, mtime=0) as gz:
                gz.write(data)
        os.replace(tmp, path)
        return len(self.records)


class CudaOpTimer:
    """Times recorded ops with CUDA events: before() and after() record a pair on the current stream
    around an op, claim() keeps the pair for a recorded op (an unclaimed pair is simply recorded over by
    the next op), and collect() synchronises once and reads every claimed pair's elapsed time. Pairs
    come from a pool that grows to the largest number of ops in one iteration and is reused after each
    collect(), so no event is re-recorded before the GPU has passed it and been waited for.
    """

    def __init__(self, torch, device):
        self._cuda = torch.cuda
        self._device = device
        self._pairs: list[tuple[object, object]] = []
        self._used = 0                # pairs claimed since the last collect()
        self._ops: list[int] = []     # the op index of each claimed pair

    def before(self) -> None:
        if self._used == len(self._pairs):
            self._pairs.append((self._cuda.Event(enable_timing=True),
                                self._cuda.Event(enable_timing=True)))
        self._pairs[self._used][0].record(self._cuda.current_stream(self._device))

    def after(self) -> None:
        self._pairs[self._used][1].record(self._cuda.current_stream(self._device))

    def claim(self, op: int) -> None:
        self._ops.append(op)
        self._used += 1

    def collect(self, durations_ns: list) -> None:
        self._cuda.synchronize(self._device)
        for (start, end), op in zip(self._pairs, self._ops):
            durations_ns[op] = max(0, round(start.elapsed_time(end) * 1e6))  # ms -> ns
        self._ops.clear()
        self._used = 0


def _unique_ids(blocks) -> list[int]:
    seen = []
    for b in blocks:
        if b is not None and b.id not in seen:
            seen.append(b.id)
    return seen


def make_dispatch_mode(recorder: Recorder):
    from torch.utils._python_dispatch import TorchDispatchMode

    class RecordingMode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            return recorder.on_op(func, args, kwargs, lambda: func(*args, **kwargs))

    return RecordingMode()


# --- CUDA's kernel choices, made on the meta device ---------------------------------------------

def install_cuda_kernel_choices(device, attention: str) -> None:
    """Route dropout and attention to the kernels CUDA would run, so their memory matches a GPU run.

    On the meta device ATen falls back to decompositions: dropout as a float mask multiplied in, and
    attention as the math path that materialises the S x S score matrix. On CUDA, dropout is the fused
    native_dropout (bool mask) and fp32 attention on an H100 is the memory-efficient kernel, unless
    `attention` is "math" (what PyTorch runs where no fused kernel applies, and eager attention costs).
    """
    import torch
    import torch.nn.functional as F

    original_dropout = F.dropout
    original_sdpa = F.scaled_dot_product_attention

    def dropout(input, p=0.5, training=True, inplace=False):
        if training and 0.0 < p < 1.0 and not inplace and input.device == device:
            return torch.ops.aten.native_dropout(input, p, True)[0]
        return original_dropout(input, p, training, inplace)

    def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                     is_causal=False, scale=None, enable_gqa=False):
        # Grouped-query attention, and a mask together with is_causal (an error) or of another dtype
        # than the query (an error), keep PyTorch's own path.
        if (query.device != device or enable_gqa or query.dim() != 4
                or (attn_mask is not None and (is_causal or attn_mask.dtype not in (torch.bool,
                                                                                  query.dtype)))):
            return original_sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                 is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
        need_lse = torch.is_grad_enabled() and any(
            t.requires_grad for t in (query, key, value))
        if attn_mask is not None:
            attn_mask = efficient_attention_bias(attn_mask, query, key)
        return torch.ops.aten._scaled_dot_product_efficient_attention(
            query, key, value, attn_mask, need_lse, dropout_p, is_causal, scale=scale)[0]

    F.dropout = dropout
    if attention == "efficient":
        F.scaled_dot_product_attention = scaled_dot_product_attention


def efficient_attention_bias(attn_mask, query, key):
    """The mask as CUDA's scaled_dot_product_attention hands it to the memory-efficient kernel
    (ATen's attention.cu and attention.cpp: convert_boolean_attn_mask, then preprocess_mask): a bool
    mask becomes an additive float one (0 where True, -inf where False), a mask whose strides are not
    multiples of 8 elements (or whose last stride is not 1) is copied into a padded buffer and sliced
    back, and the result is expanded, a view, to (batch, heads, L, S). Its gradient, if it needs one
    (T5's learned position bias), is the kernel's grad_bias, allocated at that full expanded size."""
    import torch
    import torch.nn.functional as F
    if attn_mask.dtype == torch.bool:
        attn_mask = torch.where(attn_mask, 0.0, torch.scalar_tensor(
            float("-inf"), dtype=query.dtype, device=attn_mask.device))
    alignment = 8
    if (any(attn_mask.stride(i) % alignment for i in range(attn_mask.dim() - 1))
            or attn_mask.stride(-1) != 1):
        last = attn_mask.size(-1)
        attn_mask = F.pad(attn_mask, (0, alignment - last % alignment))[..., :last]
    return attn_mask.expand(query.size(0), query.size(1), query.size(2), key.size(2))


def install_known_batch_facts() -> None:
    """Answer data-dependent questions whose answer is known, since meta tensors hold no values.

    transformers asks whether a batch without an attention mask packs several sequences per row (a
    GPU-to-host read of `(mask[:, -1] == 0).all()`). Ours never do: the same kernels run, and the
    answer is the one a real batch of whole sequences gives.
    """
    import torch
    import transformers.masking_utils as masking

    def find_packed_sequence_indices(position_ids):
        first_dummy_value = position_ids[:, :1] - 1
        position_diff = torch.diff(position_ids, prepend=first_dummy_value, dim=-1)
        packed_sequence_mask = (position_diff != 1).cumsum(-1)
        (packed_sequence_mask[:, -1] == 0).all()  # the check's kernels; its answer is "not packed"
        return None

    masking.find_packed_sequence_indices = find_packed_sequence_indices


# --- Models ----------------------------------------------------------------------------------------

def cifar_resnet(depth: int, num_classes: int = 10):
    """The CIFAR-10 ResNet of He et al. 2016 (sec. 4.2): 3 stages of (depth - 2) / 6 basic blocks
    with 16, 32 and 64 channels, identity shortcuts that subsample and zero-pad channels (option A)."""
    import torch.nn as nn
    import torch.nn.functional as F

    class BasicBlock(nn.Module):
        def __init__(self, in_planes: int, planes: int, stride: int):
            super().__init__()
            self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.pad = (planes - in_planes) // 2 if stride != 1 or in_planes != planes else None

        def forward(self, x):
            out = F.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            shortcut = x if self.pad is None else F.pad(
                x[:, :, ::2, ::2], (0, 0, 0, 0, self.pad, self.pad))
            return F.relu(out + shortcut)

    class CifarResNet(nn.Module):
        def __init__(self):
            super().__init__()
            n = (depth - 2) // 6
            self.conv1 = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(16)
            layers, in_planes = [], 16
            for planes, stride in ((16, 1), (32, 2), (64, 2)):
                for i in range(n):
                    layers.append(BasicBlock(in_planes, planes, stride if i == 0 else 1))
                    in_planes = planes
            self.layers = nn.Sequential(*layers)
            self.fc = nn.Linear(64, num_classes)

        def forward(self, x):
            out = F.relu(self.bn1(self.conv1(x)))
            out = self.layers(out)
            out = F.adaptive_avg_pool2d(out, 1).flatten(1)
            return self.fc(out)

    return CifarResNet()


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    # "image" (classification), "mlm" / "clm" / "s2s" (token models: masked LM, causal LM,
    # encoder-decoder), or "user" (--model MODULE:CALLABLE, see load_user_model)
    kind: str
    source: str          # where the architecture comes from, for --list and meta
    build: Callable      # image: build(image_size) -> module; token: build() -> module; user: USER_CONTRACT
    default_image: int = 0
    max_seq: int = 0
    classes: int = 0
    transformer: bool = False
    # user models only, once built (build_training): the example batch and the optional loss function
    user_model: str = ""             # the --model value, MODULE:CALLABLE
    example_batch: object = None
    loss_fn: Callable | None = None


def _torchvision(name: str):
    def build(image_size: int):
        import torchvision
        if name == "vit_b_16":
            return torchvision.models.vit_b_16(weights=None, image_size=image_size)
        return getattr(torchvision.models, name)(weights=None)
    return build


def _timm(name: str):
    def build(image_size: int):
        import timm
        return timm.create_model(name, pretrained=False)
    return build


def _quiet_transformers() -> None:
    import transformers
    transformers.logging.set_verbosity_error()


def _bert_base():
    from transformers import BertConfig, BertForMaskedLM
    _quiet_transformers()
    return BertForMaskedLM(BertConfig(attn_implementation="sdpa"))


def _gpt2(n_embd: int, n_layer: int, n_head: int):
    def build():
        from transformers import GPT2Config, GPT2LMHeadModel
        _quiet_transformers()
        # use_cache=False, as for training: otherwise every layer copies its keys and values
        # into a KV cache that training never reads.
        return GPT2LMHeadModel(GPT2Config(n_embd=n_embd, n_layer=n_layer, n_head=n_head,
                                          use_cache=False, attn_implementation="sdpa"))
    return build


def _t5_small():
    from transformers import T5Config, T5ForConditionalGeneration
    _quiet_transformers()
    # T5Config()'s defaults are t5-small's: 6 + 6 layers x 512, 8 heads, d_ff 2048, vocab 32128,
    # tied embeddings. use_cache=False, as for training. decoder_start_token_id=0 as in t5-small's
    # config.json: T5Config() of transformers 5 no longer sets it, and training with labels needs it.
    return T5ForConditionalGeneration(T5Config(use_cache=False, decoder_start_token_id=0,
                                               attn_implementation="sdpa"))


LLAMA_SMALL = dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                   num_attention_heads=12, num_key_value_heads=12, max_position_embeddings=2048)


def _llama_small():
    from transformers import LlamaConfig, LlamaForCausalLM
    _quiet_transformers()
    # LLaMA's architecture (RMSNorm, rotary positions, SwiGLU MLP, untied LM head, LLaMA's 32000-token
    # vocabulary) at GPT-2-small scale. Multi-head attention, as in LLaMA and LLaMA-2 7B: with
    # grouped-query heads transformers would ask for enable_gqa, which fp32 on CUDA runs on the
    # math kernel. use_cache=False, as for training.
    return LlamaForCausalLM(LlamaConfig(**LLAMA_SMALL, use_cache=False, attn_implementation="sdpa"))


MODELS: dict[str, ModelSpec] = {
    "resnet50": ModelSpec("image", "torchvision resnet50", _torchvision("resnet50"), 224, classes=1000),
    "resnet110": ModelSpec("image", "CIFAR ResNet-110 (He et al. 2016), built here",
                           lambda size: cifar_resnet(110), 32, classes=10),
    "mobilenet_v2": ModelSpec("image", "torchvision mobilenet_v2", _torchvision("mobilenet_v2"), 224,
                              classes=1000),
    "vit_b_16": ModelSpec("image", "torchvision vit_b_16", _torchvision("vit_b_16"), 224,
                          classes=1000, transformer=True),
    "nasnetalarge": ModelSpec("image", "timm nasnetalarge", _timm("nasnetalarge"), 331, classes=1000),
    "bert_base": ModelSpec("mlm", "transformers BertForMaskedLM, BertConfig() (bert-base-uncased)",
                           _bert_base, max_seq=512, transformer=True),
    "gpt2": ModelSpec("clm", "transformers GPT2LMHeadModel, GPT2Config() (GPT-2 small, 124M)",
                      _gpt2(768, 12, 12), max_seq=1024, transformer=True),
    "gpt2_medium": ModelSpec("clm", "transformers GPT2LMHeadModel, 24 layers x 1024 (GPT-2 medium, 355M)",
                             _gpt2(1024, 24, 16), max_seq=1024, transformer=True),
    "t5_small": ModelSpec("s2s", "transformers T5ForConditionalGeneration, T5Config() (t5-small, 60M); "
                                 "decoder labels as long as the input", _t5_small, max_seq=512,
                          transformer=True),
    "llama_small": ModelSpec("clm", "transformers LlamaForCausalLM, 12 layers x 768, 12 heads, MLP 2048, "
                                    "vocab 32000 (LLaMA architecture, 134M)", _llama_small, max_seq=2048,
                             transformer=True),
}


# --- Your own model: --model MODULE:CALLABLE ----------------------------------------------------------

USER_FORM = "MODULE:CALLABLE (e.g. mypkg.models:build)"
# The options a user's callable may take, by keyword; it is given those its signature names.
USER_OPTIONS = ("batch", "seq_len", "image_size", "device")
USER_CONTRACT = ("CALLABLE(batch=, seq_len=, image_size=, device=) must return (model, batch) or "
                 "(model, batch, loss_fn): an nn.Module, a dict or tuple of tensors, and "
                 "loss_fn(model, batch) -> scalar tensor")


class UserModelError(Exception):
    """A --model MODULE:CALLABLE that cannot be used. A usage error: exit 2, one line, no traceback."""


def is_user_model(name: str) -> bool:
    return ":" in name


def _a(value) -> str:
    """'a list', 'an int': the article and the type name of value."""
    name = type(value).__name__
    return ("an " if name[:1].lower() in "aeiou" else "a ") + name


def _one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}".replace("\n", " ")


def load_user_model(name: str) -> ModelSpec:
    """The ModelSpec of --model MODULE:CALLABLE: imports MODULE (the current directory first on
    sys.path, as for `python3 -m`) and checks that CALLABLE is a callable whose required parameters are
    among USER_OPTIONS. Raises UserModelError, naming the value, for anything wrong."""
    import importlib
    import inspect

    module_name, _, attr = name.partition(":")
    bad_form = f"--model {name!r}: expected {USER_FORM}"
    if not module_name:
        raise UserModelError(f"{bad_form}: the MODULE before ':' is missing")
    if not attr:
        raise UserModelError(f"{bad_form}: the CALLABLE after ':' is missing")
    if not all(part.isidentifier() for part in module_name.split(".")):
        raise UserModelError(f"{bad_form}: {module_name!r} is not a module name (dotted identifiers)")
    if not all(part.isidentifier() for part in attr.split(".")):
        raise UserModelError(f"{bad_form}: {attr!r} is not a callable's name (dotted identifiers)")

    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is not None and (module_name == e.name or module_name.startswith(e.name + ".")):
            hint = " (a module's name, not its file's: without .py)" if module_name.endswith(".py") else ""
            raise UserModelError(f"--model {name!r}: no module named {e.name!r}{hint} (looked in the "
                                 f"current directory {here} and on sys.path); expected {USER_FORM}") from None
        raise UserModelError(f"--model {name!r}: importing module {module_name!r} failed: "
                             f"{_one_line(e)}") from None
    except Exception as e:  # noqa: BLE001 - any failure of the user's module is reported in one line
        raise UserModelError(f"--model {name!r}: importing module {module_name!r} failed: "
                             f"{_one_line(e)}") from None

    build = module
    for i, part in enumerate(attr.split(".")):
        if not hasattr(build, part):
            where = module_name if i == 0 else f"{module_name}:{'.'.join(attr.split('.')[:i])}"
            path = getattr(module, "__file__", None)
            raise UserModelError(f"--model {name!r}: {where} has no attribute {part!r}"
                                 + (f" (module file {path})" if path and i == 0 else "")
                                 + f"; expected {USER_FORM}")
        build = getattr(build, part)
    if not callable(build):
        raise UserModelError(f"--model {name!r}: {module_name}:{attr} is {_a(build)}, not "
                             f"a callable; {USER_CONTRACT}")
    try:
        params = inspect.signature(build).parameters.values()
    except (TypeError, ValueError):
        params = None  # no signature to read (some builtins): it is given every option
    if params is not None:
        P = inspect.Parameter
        for p in params:
            if p.kind in (P.VAR_POSITIONAL, P.VAR_KEYWORD) or p.default is not P.empty:
                continue
            if p.kind == P.POSITIONAL_ONLY or p.name not in USER_OPTIONS:
                raise UserModelError(
                    f"--model {name!r}: {module_name}:{attr} requires parameter {p.name!r}, which "
                    f"capture.py does not give; it passes {', '.join(USER_OPTIONS)} by keyword, each "
                    f"only if the signature names it (or has **kwargs)")
    path = getattr(module, "__file__", None)
    if path:
        rel = os.path.relpath(path)
        path = rel if not rel.startswith("..") else path
    source = f"user callable {name}" + (f" ({path})" if path else "")
    return ModelSpec("user", source, build, user_model=name)


def resolve_model(name: str) -> ModelSpec:
    """A built-in model's spec, or a user model's (MODULE:CALLABLE). Raises UserModelError."""
    if is_user_model(name):
        return load_user_model(name)
    spec = MODELS.get(name)
    if spec is None:
        raise UserModelError(f"unknown model {name!r}; known: {', '.join(MODELS)}, or {USER_FORM}")
    return spec


@dataclasses.dataclass(eq=False)
class BatchTensor:
    """A tensor of a user's example batch, kept off the device so that nothing outside the trace
    holds device memory: on the meta device its layout (its values do not exist), elsewhere a copy in
    host memory, copied to the device for each iteration as a data loader's batch is."""
    size: tuple
    stride: tuple
    dtype: object
    requires_grad: bool
    host: object = None   # real devices: the values, on the CPU

    @classmethod
    def of(cls, t, device) -> "BatchTensor":
        import torch
        like = torch.empty_like(t)   # the layout clone() would give: dense, in t's dimension order
        host = None if device.type == "meta" else t.detach().to("cpu", copy=True)
        return cls(tuple(like.size()), tuple(like.stride()), t.dtype, t.requires_grad, host)

    def make(self, device):
        import torch
        if self.host is None:
            t = torch.empty_strided(self.size, self.stride, dtype=self.dtype, device=device)
        else:
            t = self.host.to(device, copy=True)
        return t.requires_grad_(self.requires_grad)


def build_user_model(spec: ModelSpec, args, device):
    """Calls a user model's callable (inside `with torch.device(device)`) and checks what it returns.
    Returns (model, the spec with the example batch and loss function). Raises UserModelError."""
    import inspect
    import torch
    from torch.utils._pytree import tree_leaves

    name = args.model
    given = {"batch": args.batch, "seq_len": getattr(args, "seq_len", None),
             "image_size": getattr(args, "image_size", None), "device": device}
    try:
        params = inspect.signature(spec.build).parameters
        if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
            given = {k: v for k, v in given.items() if k in params}
    except (TypeError, ValueError):
        pass
    with torch.device(device):
        result = spec.build(**given)

    def bad(what: str) -> UserModelError:
        return UserModelError(f"--model {name!r}: {what}; {USER_CONTRACT}")

    if not isinstance(result, (tuple, list)) or len(result) not in (2, 3):
        got = (f"{_a(result)} of {len(result)}" if isinstance(result, (tuple, list)) else _a(result))
        raise bad(f"the callable returned {got}, not (model, batch) or (model, batch, loss_fn)")
    model, batch = result[0], result[1]
    loss_fn = result[2] if len(result) == 3 else None
    if not isinstance(model, torch.nn.Module):
        raise bad(f"the model it returned is {_a(model)}, not a torch.nn.Module")
    if not isinstance(batch, (dict, tuple, list)):
        raise bad(f"the batch it returned is {_a(batch)}, not a dict or tuple of tensors")
    if isinstance(batch, dict) and not all(isinstance(k, str) for k in batch):
        raise bad("the batch it returned is a dict whose keys are not all strings (keyword arguments)")
    tensors = [t for t in tree_leaves(batch) if isinstance(t, torch.Tensor)]
    if not tensors:
        raise bad("the batch it returned holds no tensor")
    if loss_fn is not None and not callable(loss_fn):
        raise bad(f"the loss_fn it returned is {_a(loss_fn)}, not callable")
    if loss_fn is None and not isinstance(batch, dict) and len(batch) < 2:
        raise bad("without loss_fn a tuple batch is (inputs..., target), at least two items")
    for what, ts in (("batch", tensors), ("model", list(model.parameters()) + list(model.buffers()))):
        elsewhere = sorted({str(t.device) for t in ts if t.device != device})
        if elsewhere:
            raise bad(f"the {what} has tensors on {', '.join(elsewhere)}, not on {device}: make them "
                      f"without device= (capture.py sets the default device) or with device=device")
    n_params = sum(p.numel() for p in model.parameters())
    source = (f"{spec.source}: {type(model).__module__}.{type(model).__qualname__}, "
              f"{n_params:,} parameters")
    # The example itself is dropped here: each iteration gets a new batch made from these.
    from torch.utils._pytree import tree_map
    kept: dict[int, BatchTensor] = {}

    def keep(v):
        if not isinstance(v, torch.Tensor):
            return v
        if id(v) not in kept:
            kept[id(v)] = BatchTensor.of(v, device)
        return kept[id(v)]
    template = tree_map(keep, batch)
    return model, dataclasses.replace(spec, source=source, example_batch=template, loss_fn=loss_fn)


# --- The training loop -----------------------------------------------------------------------------

def parse_args(argv):
    global MATMUL_FLOPS_PER_S  # --matmul-tflops sets the rate the roofline uses
    parser = argparse.ArgumentParser(
        description="Capture a zicoum memory trace of a model's training loop (docs/trace-format.md): "
                    "on the meta device with roofline-estimated H100 times, or on a CUDA GPU with "
                    "times measured by CUDA events.")
    parser.add_argument("--list", action="store_true", help="list the models and exit")
    parser.add_argument("--model", help="model name (see --list), or your own model as MODULE:CALLABLE "
                                        "(e.g. mypkg.models:build; the current directory is on the "
                                        "import path; see tools/traces/README.md)")
    parser.add_argument("--batch", type=int, help="batch size")
    parser.add_argument("--seq-len", type=int,
                        help="sequence length (token models; passed to a MODULE:CALLABLE as seq_len)")
    parser.add_argument("--image-size", type=int,
                        help="image side in pixels (image models; passed to a MODULE:CALLABLE as "
                             "image_size)")
    parser.add_argument("--iterations", type=int, default=3,
                        help="training iterations: forward, backward, optimizer step (default 3)")
    parser.add_argument("--attention", choices=("efficient", "math"),
                        help="scaled_dot_product_attention kernel: efficient (CUDA's choice for fp32 "
                             "on an H100, the default) or math (materialises the S x S scores)")
    parser.add_argument("--device", choices=("meta", "cuda"), default="meta",
                        help="meta (the default): no GPU, estimated times; cuda: the current CUDA "
                             "device, random weights, measured times, refused unless the GPU has the "
                             f"memory free (exit {EXIT_NO_GPU})")
    parser.add_argument("--optimizer", choices=("adam", "sgd-momentum"), default="adam",
                        help="adam (the default): Adam, AdamW for transformers and your own models; "
                             "sgd-momentum: SGD with momentum 0.9, one state buffer per parameter "
                             "instead of two (both foreach)")
    parser.add_argument("--matmul-tflops", type=float, default=MATMUL_FLOPS_PER_S / 1e12,
                        help="meta device: the rate matmul-class ops are estimated at, in TFLOP/s "
                             f"(default {MATMUL_FLOPS_PER_S / 1e12:g}: TF32 on an H100; about 58 for "
                             "plain fp32, PyTorch's default for matmuls)")
    parser.add_argument("--out", help="output file, NAME.ztrace.gz")
    args = parser.parse_args(argv)
    if args.list:
        return args
    if args.model is None or args.batch is None or args.out is None:
        parser.error("--model, --batch and --out are required (or --list)")
    try:
        spec = resolve_model(args.model)
    except UserModelError as e:
        parser.error(str(e))
    if args.batch < 1:
        parser.error("--batch must be at least 1")
    if args.iterations < 1:
        parser.error("--iterations must be at least 1")
    if args.attention is not None and not spec.transformer and spec.kind != "user":
        parser.error(f"--attention does not apply to {args.model}, which has no attention")
    args.attention = args.attention or "efficient"
    if not (0 < args.matmul_tflops < 1e6):  # also refuses nan and inf
        parser.error(f"--matmul-tflops {args.matmul_tflops:g} is not a rate; expected TFLOP/s above 0, "
                     f"e.g. 400 (TF32) or 58 (fp32)")
    MATMUL_FLOPS_PER_S = args.matmul_tflops * 1e12
    if spec.kind == "user":
        # Passed through to the callable; it may ignore them.
        if args.seq_len is not None and args.seq_len < 1:
            parser.error("--seq-len must be at least 1")
        if args.image_size is not None and args.image_size < 1:
            parser.error("--image-size must be at least 1")
    elif spec.kind == "image":
        if args.seq_len is not None:
            parser.error(f"--seq-len does not apply to image model {args.model}")
        if args.image_size is None:
            args.image_size = spec.default_image
        if args.image_size < 32:
            parser.error("--image-size must be at least 32")
        if args.model == "vit_b_16" and args.image_size % 16:
            parser.error("--image-size for vit_b_16 must be a multiple of 16")
        if args.model == "nasnetalarge" and args.image_size < 64:
            parser.error("--image-size for nasnetalarge must be at least 64")
    else:
        if args.image_size is not None:
            parser.error(f"--image-size does not apply to token model {args.model}")
        if args.seq_len is None:
            args.seq_len = spec.max_seq
        if not 1 <= args.seq_len <= spec.max_seq:
            parser.error(f"--seq-len for {args.model} must be between 1 and {spec.max_seq}")
    if not args.out.endswith(".gz"):
        parser.error("--out must end in .gz (the trace is gzip-compressed), e.g. NAME.ztrace.gz")
    out_dir = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(out_dir):
        parser.error(f"--out: directory {out_dir} does not exist")
    return args


def make_batch(spec: ModelSpec, args, device, vocab_size: int):
    import torch
    if spec.kind == "user":
        # A new batch like the callable's, as a data loader hands one over each iteration; a tensor
        # that appears twice (labels=tokens) is made once.
        from torch.utils._pytree import tree_map
        made: dict[int, object] = {}

        def make(v):
            if not isinstance(v, BatchTensor):
                return v
            if id(v) not in made:
                made[id(v)] = v.make(device)
            return made[id(v)]
        return tree_map(make, spec.example_batch)
    if spec.kind == "image":
        images = torch.randn(args.batch, 3, args.image_size, args.image_size, device=device)
        labels = torch.randint(0, spec.classes, (args.batch,), device=device)
        return (images, labels)
    tokens = torch.randint(0, vocab_size, (args.batch, args.seq_len), device=device)
    if spec.kind in ("mlm", "s2s"):
        # Masked-LM labels: the token at masked positions, -100 elsewhere; the shape is what counts.
        # Encoder-decoder: the target sequence, as long as the input; the model shifts it right into
        # the decoder's input.
        labels = torch.randint(0, vocab_size, (args.batch, args.seq_len), device=device)
        return (tokens, labels)
    return (tokens,)  # causal LM: labels are the tokens, shifted inside the model


def loss_of(model, spec: ModelSpec, batch):
    import torch.nn.functional as F
    if spec.kind == "user":
        return user_loss(model, spec, batch)
    if spec.kind == "image":
        images, labels = batch
        return F.cross_entropy(model(images), labels)
    if spec.kind in ("mlm", "s2s"):
        tokens, labels = batch
        return model(input_ids=tokens, labels=labels).loss
    (tokens,) = batch
    return model(input_ids=tokens, labels=tokens).loss


def user_loss(model, spec: ModelSpec, batch):
    """A user model's loss: loss_fn(model, batch) if the callable returned one; otherwise
    model(**batch).loss (or ["loss"]) for a dict batch, cross_entropy(model(*inputs), target) for a
    tuple (inputs..., target). Raises UserModelError unless it is a tensor of one element."""
    import collections.abc
    import torch
    import torch.nn.functional as F
    if spec.loss_fn is not None:
        loss, how = spec.loss_fn(model, batch), "loss_fn(model, batch)"
    elif isinstance(batch, dict):
        out, how = model(**batch), "model(**batch)"
        loss = (out.get("loss") if isinstance(out, collections.abc.Mapping)
                else getattr(out, "loss", None))
        if loss is None:
            raise UserModelError(f"--model {spec.user_model!r}: {how} returned "
                                 f"{_a(out)} without a loss (put the labels in the batch, or "
                                 f"return a loss_fn); {USER_CONTRACT}")
        how += ".loss"
    else:
        *inputs, target = batch
        loss, how = F.cross_entropy(model(*inputs), target), "cross_entropy(model(*inputs), target)"
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        got = (f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor)
               else _a(loss))
        raise UserModelError(f"--model {spec.user_model!r}: {how} gave {got}, not a scalar "
                             f"tensor; {USER_CONTRACT}")
    if not loss.requires_grad:
        raise UserModelError(f"--model {spec.user_model!r}: {how} gave a loss that does not require "
                             f"grad, so backward cannot run (is it computed from the model's output?)")
    return loss


@dataclasses.dataclass
class Training:
    spec: ModelSpec
    device: object
    model: object
    params: list
    optimizer: object
    vocab_size: int


def build_training(args) -> Training:
    """The model in training mode with its optimizer (also used by crosscheck.py).

    On the meta device (args.device "meta", or no args.device) with CUDA's kernel choices installed;
    otherwise on a real device ("cuda": the current CUDA device) with random weights from a fixed seed,
    where PyTorch picks its own kernels.
    """
    import torch
    spec = resolve_model(args.model)
    kind = getattr(args, "device", "meta")
    if kind == "meta":
        device = torch.device("meta")
        install_cuda_kernel_choices(device, args.attention)
    else:
        # With an index: tensors report cuda:N, and the Recorder compares devices exactly.
        device = (torch.device("cuda", torch.cuda.current_device()) if kind == "cuda"
                  else torch.device(kind))
        torch.manual_seed(CUDA_SEED)
    if spec.kind not in ("image", "user"):
        install_known_batch_facts()
    if spec.kind == "user":
        model, spec = build_user_model(spec, args, device)
        if "transformers" in sys.modules:  # the user's model may be one of transformers'
            install_known_batch_facts()
    else:
        with torch.device(device):
            model = spec.build(args.image_size) if spec.kind == "image" else spec.build()
    model.train()
    vocab_size = getattr(getattr(model, "config", None), "vocab_size", 0)
    params = list(model.parameters())
    if args.optimizer == "sgd-momentum":
        optimizer = torch.optim.SGD(params, lr=0.01, momentum=0.9, foreach=True)
    else:
        opt_cls = torch.optim.AdamW if spec.transformer or spec.kind == "user" else torch.optim.Adam
        optimizer = opt_cls(params, lr=1e-4, foreach=True)
    return Training(spec, device, model, params, optimizer, vocab_size)


def record_training(training: Training, args, recorder: Recorder, kernel_context=None) -> None:
    """Runs args.iterations training iterations (forward, backward, optimizer step) under recording."""
    import contextlib
    import torch
    from torch.utils._pytree import tree_leaves
    spec, device, model, params, optimizer = (training.spec, training.device, training.model,
                                              training.params, training.optimizer)
    recorder.register(params, "param", persistent=True)
    recorder.register(list(model.buffers()), "param", persistent=True)
    mode = make_dispatch_mode(recorder)

    gc.collect()
    gc.disable()  # frees happen when references drop, and cycles only at iteration ends: deterministic
    try:
        with kernel_context or contextlib.nullcontext(), mode:
            for _ in range(args.iterations):
                recorder.begin_iteration()
                optimizer.zero_grad(set_to_none=True)
                recorder.paused = True
                batch = make_batch(spec, args, device, training.vocab_size)
                recorder.paused = False
                recorder.register([t for t in tree_leaves(batch) if isinstance(t, torch.Tensor)],
                                  "input")
                loss = loss_of(model, spec, batch)
                loss.backward()
                recorder.mark([p.grad for p in params], "grad")
                optimizer.step()
                recorder.mark([t for state in optimizer.state.values() for t in state.values()
                               if isinstance(t, torch.Tensor)], "optim", persistent=True)
                del loss, batch
                recorder.end_iteration()
    finally:
        gc.enable()


def package_versions() -> str:
    import importlib.metadata as md
    parts = []
    for p in ("torch", "torchvision", "transformers", "timm"):
        try:
            parts.append(f"{p}=={md.version(p)}")
        except md.PackageNotFoundError:
            parts.append(f"{p} (not installed)")  # resnet110 needs only torch
    return " ".join(parts)


def observed_kernels(records: list) -> str:
    """Forward ops of the first iteration whose kernel PyTorch picks by device, with their counts."""
    counts: dict[str, int] = {}
    for rec in records:
        if rec[0] == "i" and rec[1] > 0:
            break
        if rec[0] == "o" and "backward" not in rec[4] and any(w in rec[4] for w in KERNEL_CHOICE_WORDS):
            counts[rec[4]] = counts.get(rec[4], 0) + 1
    return ", ".join(f"{name} x{n}" for name, n in sorted(counts.items())) or "none"


def capture(args) -> None:
    import torch
    started = time.monotonic()
    cuda = getattr(args, "device", "meta") == "cuda"
    training = build_training(args)
    spec, device, optimizer = training.spec, training.device, training.optimizer

    kernel_context = None
    if cuda:
        # TF32 matmuls, as the roofline of meta mode assumes (cuDNN convolutions use TF32 by default).
        torch.set_float32_matmul_precision("high")
        if args.attention == "math":
            from torch.nn.attention import SDPBackend, sdpa_kernel
            kernel_context = sdpa_kernel(SDPBackend.MATH)
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    recorder = Recorder(device, CudaOpTimer(torch, device) if cuda else None)
    record_training(training, args, recorder, kernel_context)
    unnamed = recorder.finish()
    elapsed = time.monotonic() - started

    meta = {
        "model": args.model,
        "command": shlex.join([os.path.basename(sys.executable)] + sys.argv),
        "source": "cuda" if cuda else "meta",
        "batch": str(args.batch),
        "iterations": str(args.iterations),
        "timing": TIMING_CUDA_META if cuda else timing_meta(),
    }
    if spec.kind == "user":
        for key in ("image_size", "seq_len"):  # those given, which the callable may have used
            if getattr(args, key) is not None:
                meta[key] = str(getattr(args, key))
    elif spec.kind == "image":
        meta["image_size"] = str(args.image_size)
    else:
        meta["seq_len"] = str(args.seq_len)
    meta.update({
        "architecture": spec.source,
        "dtype": "float32 (all floating tensors; labels and token ids int64, dropout masks bool)",
        "device": "one GPU; sizes are storage nbytes before the caching allocator's rounding",
        "optimizer": f"{type(optimizer).__name__}("
                     f"{'momentum=0.9, ' if isinstance(optimizer, torch.optim.SGD) else ''}foreach=True); "
                     f"zero_grad(set_to_none=True) at the start "
                     f"of each iteration",
        "kernels": "dropout = native_dropout; scaled_dot_product_attention = " + (
            "memory-efficient kernel (CUDA's fp32 choice)" if args.attention == "efficient"
            else "math (S x S scores materialised)"),
        "categories": f"param = parameters and buffers; grad = .grad after backward; optim = "
                      f"optimizer.state; input = batch and labels; temp = freed within "
                      f"{TEMP_MAX_OPS} ops of its op; act = the rest",
        "versions": package_versions(),
    })
    if cuda:
        seen = observed_kernels(recorder.records)
        try:
            name = torch.cuda.get_device_name(device)
        except Exception:  # noqa: BLE001 - the name is only a label; gpu_meta says more or why not
            name = "name unknown"
        meta["device"] = (f"{device} ({name}); sizes are storage nbytes before the caching "
                          f"allocator's rounding")
        meta["kernels"] = ("PyTorch's own choices on this GPU, none substituted" + (
            ", scaled_dot_product_attention restricted to SDPBackend.MATH (--attention math)"
            if args.attention == "math" else "") + f"; forward ops of iteration 0 that depend on "
            f"the choice: {seen}")
        meta.update(gpu_meta(torch, device, args))
        meta["allocator_max_allocated"] = str(torch.cuda.max_memory_allocated(device))
        meta["allocator_max_reserved"] = str(torch.cuda.max_memory_reserved(device))
        meta["untracked_blocks"] = str(recorder.untracked_found)
        if (spec.transformer and args.attention == "efficient"
                and "_scaled_dot_product_efficient_attention" not in seen):
            print(f"capture.py: warning: PyTorch did not pick the memory-efficient attention kernel "
                  f"that meta mode assumes ({seen}); sizes will differ from a meta trace",
                  file=sys.stderr)
    count = recorder.write(args.out, meta)
    print(f"{args.out}: {count} records, {recorder.op_count} ops, {recorder.next_id} blocks, "
          f"{recorder.clock_ns / 1e6:.1f} ms {'measured' if cuda else 'estimated'} GPU time, "
          f"{elapsed:.1f} s to capture, "
          f"{recorder.untracked_found} blocks found untracked, {unnamed} live without a category",
          file=sys.stderr)


# --- GPU mode: what the GPU is, and whether it has room ---------------------------------------------

class GpuUnavailable(Exception):
    """--device cuda cannot run: no CUDA device, or not enough free memory. Nothing ran on the GPU."""


class FootprintUnknown(Exception):
    """The meta-mode capture that estimates GPU mode's footprint failed. Nothing ran on the GPU."""


def gpu_memory_plan(estimated_peak: int, free: int, total: int, gpu: str = "the GPU") -> dict:
    """How much the capture may take, from the estimated tensor peak; raises GpuUnavailable unless the
    GPU's free memory covers it. The trace's peak is tensors only: the caching allocator also rounds
    every block up to 512 bytes, fragments, and serves cuDNN's and cuBLAS's workspaces, hence the cap
    of peak x ALLOCATOR_FACTOR + ALLOCATOR_EXTRA; CUDA libraries load kernels and create handles outside
    the allocator, hence OUTSIDE_ALLOCATOR on top of the cap.
    """
    cap = int(estimated_peak * ALLOCATOR_FACTOR) + ALLOCATOR_EXTRA
    need = cap + OUTSIDE_ALLOCATOR
    if need > free:
        raise GpuUnavailable(
            f"refusing to run on {gpu}: the capture needs about {need / GIB:.2f} GiB (an estimated "
            f"tensor peak of {estimated_peak / GIB:.2f} GiB x {ALLOCATOR_FACTOR:g} + "
            f"{ALLOCATOR_EXTRA / GIB:g} GiB for allocator rounding, fragmentation and cuDNN/cuBLAS "
            f"workspaces, + {OUTSIDE_ALLOCATOR / GIB:g} GiB for CUDA libraries), but only "
            f"{free / GIB:.2f} GiB of its {total / GIB:.2f} GiB are free; the GPU is never "
            f"oversubscribed: use a smaller --batch, or wait until the GPU has room")
    return {"estimate": estimated_peak, "cap": cap, "need": need, "free": free, "total": total}


def estimate_peak_bytes(args) -> int:
    """The peak of live tensor bytes of the same capture on the meta device, in a child process that
    sees no GPU (so it cannot touch one, and installs nothing in this process): min(iterations, 2)
    iterations, since the peak falls in the second, the first with optimizer state."""
    spec = resolve_model(args.model)
    with tempfile.TemporaryDirectory(prefix="zicoum-footprint-") as tmp:
        out = os.path.join(tmp, "estimate.ztrace.gz")
        command = [sys.executable, os.path.abspath(__file__), "--device", "meta",
                   "--model", args.model, "--batch", str(args.batch),
                   "--iterations", str(min(args.iterations, 2)), "--out", out,
                   "--optimizer", getattr(args, "optimizer", "adam")]
        if spec.kind == "user":
            for option, value in (("--image-size", args.image_size), ("--seq-len", args.seq_len)):
                if value is not None:
                    command += [option, str(value)]
        elif spec.kind == "image":
            command += ["--image-size", str(args.image_size)]
        else:
            command += ["--seq-len", str(args.seq_len)]
        if spec.transformer or spec.kind == "user":
            command += ["--attention", args.attention]
        done = subprocess.run(command, capture_output=True, text=True,
                              env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
        if done.returncode == 2 and spec.kind == "user":
            # The user's callable returned something unusable: the child said what, in one line.
            last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
            raise UserModelError(last.removeprefix("capture.py: error: "))
        if done.returncode != 0 or not os.path.exists(out):
            raise FootprintUnknown(
                f"cannot estimate the footprint, so the GPU is not used: {shlex.join(command)} exited "
                f"with {done.returncode}:\n{done.stderr[-4000:]}")
        here = os.path.dirname(os.path.abspath(__file__))
        if here not in sys.path:
            sys.path.insert(0, here)
        import summarize
        return summarize.summarize(out)["peak"]


def prepare_gpu(args, torch) -> dict:
    """Checks that --device cuda can run: a CUDA device, and the capture's footprint free on it; caps
    the caching allocator at the plan. Raises GpuUnavailable (or FootprintUnknown if the estimate
    fails), before any GPU memory is taken, if not."""
    if not torch.cuda.is_available():
        if torch.version.cuda is None:
            why = f"this PyTorch ({torch.__version__}) is a CPU-only build"
        else:
            why = f"PyTorch {torch.__version__} (CUDA {torch.version.cuda}) finds no usable CUDA device"
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            why += f" (CUDA_VISIBLE_DEVICES={visible!r})"
        raise GpuUnavailable(f"--device cuda needs a GPU, but torch.cuda.is_available() is False: "
                             f"{why}; --device meta captures without one")
    print("capture.py: estimating the footprint with a meta-device capture ...", file=sys.stderr)
    estimate = estimate_peak_bytes(args)
    try:
        index = torch.cuda.current_device()
        gpu = f"cuda:{index} ({torch.cuda.get_device_name(index)})"
        free, total = torch.cuda.mem_get_info(index)
    except RuntimeError as e:
        raise GpuUnavailable(f"--device cuda: cannot query the GPU: {e}") from None
    plan = gpu_memory_plan(estimate, free, total, gpu)
    torch.cuda.set_per_process_memory_fraction(plan["cap"] / total, index)
    print(f"capture.py: {gpu}: {free / GIB:.2f} GiB of {total / GIB:.2f} GiB free, estimated tensor "
          f"peak {estimate / GIB:.2f} GiB, caching allocator capped at {plan['cap'] / GIB:.2f} GiB",
          file=sys.stderr)
    return plan


def nvidia_driver_version() -> str:
    import re
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8", errors="replace") as f:
            found = re.search(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", f.read())
        if found:
            return found.group(1)
    except OSError:
        pass
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=60)
        if done.returncode == 0 and done.stdout.strip():
            return done.stdout.strip().splitlines()[0].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def cuda_driver_api_version() -> str:
    """The CUDA version the driver supports (cuDriverGetVersion), e.g. 12.4."""
    import ctypes
    try:
        version = ctypes.c_int()
        if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version)) == 0:
            return f"{version.value // 1000}.{version.value % 1000 // 10}"
    except (OSError, AttributeError):
        pass
    return "unknown"


def gpu_meta(torch, device, args) -> dict[str, str]:
    """Meta keys about the GPU and its software. Each is best effort: a fact that cannot be read is
    written as "unknown (...)" rather than losing a finished capture."""
    def fact(read) -> str:
        try:
            value = read()
        except Exception as e:  # noqa: BLE001 - any failure to read a fact only loses that fact
            return f"unknown ({type(e).__name__}: {e})".replace("\n", " ")
        return str(value) if value not in (None, "") else "unknown"

    def gpu() -> str:
        props = torch.cuda.get_device_properties(device)
        return (f"{props.name}, compute capability {props.major}.{props.minor}, "
                f"{props.multi_processor_count} SMs, {props.total_memory} bytes")

    meta = {
        "gpu": fact(gpu),
        "nvidia_driver": fact(nvidia_driver_version),
        "cuda_driver_api": fact(cuda_driver_api_version),
        "cuda_runtime": fact(lambda: torch.version.cuda),
        "cudnn": fact(torch.backends.cudnn.version),
        "cuda_settings": fact(lambda: f"seed {CUDA_SEED}; float32_matmul_precision "
                                      f"{torch.get_float32_matmul_precision()}; cudnn.allow_tf32 "
                                      f"{torch.backends.cudnn.allow_tf32}; cudnn.benchmark "
                                      f"{torch.backends.cudnn.benchmark}; cudnn.deterministic "
                                      f"{torch.backends.cudnn.deterministic}"),
    }
    plan = getattr(args, "gpu_plan", None)
    if plan is not None:
        meta["footprint"] = (f"estimated tensor peak {plan['estimate']} B (meta capture); caching "
                             f"allocator capped at {plan['cap']} B; {plan['free']} B of {plan['total']} B "
                             f"free at the start")
    return meta


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.list:
        for name, spec in MODELS.items():
            default = (f"image {spec.default_image}" if spec.kind == "image"
                       else f"seq-len up to {spec.max_seq}")
            print(f"{name:14} {spec.source} ({default})")
        print(f"{'MODULE:CALLABLE':14} your own model, e.g. mypkg.models:build "
              f"(tools/traces/README.md)")
        return 0
    try:
        import torch
    except ImportError:
        print("capture.py needs PyTorch: pip install -r tools/traces/requirements.txt", file=sys.stderr)
        return 2
    try:
        return run(args, torch)
    except UserModelError as e:
        print(f"capture.py: error: {e}", file=sys.stderr)
        return 2


def run(args, torch) -> int:
    if args.device != "cuda":
        capture(args)
        return 0
    try:
        args.gpu_plan = prepare_gpu(args, torch)
    except GpuUnavailable as e:
        print(f"capture.py: {e}", file=sys.stderr)
        return EXIT_NO_GPU
    except FootprintUnknown as e:
        print(f"capture.py: {e}", file=sys.stderr)
        return 1
    try:
        capture(args)
    except torch.cuda.OutOfMemoryError as e:
        print(f"capture.py: out of GPU memory under this capture's cap of "
              f"{args.gpu_plan['cap'] / GIB:.2f} GiB (the estimate was too low, or the allocator "
              f"fragmented more than allowed for); no trace written: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
