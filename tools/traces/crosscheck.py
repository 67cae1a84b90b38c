#!/usr/bin/env python3
"""Cross-check traces against PyTorch's own memory accounting.

    python3 tools/traces/crosscheck.py tools/traces/*.ztrace.gz

For each trace, runs the same training loop as the capture (model, batch, kernels, read from the
trace's meta lines) for two iterations under torch.distributed._tools.mem_tracker.MemTracker, an
independent tracker of live storages, and compares its peak with the peak of live bytes in the
trace. They must agree to the byte, once MemTracker's count of the memory-efficient attention
kernel's philox seed and offset (8 bytes each per call, device tensors on the meta device, host
tensors on CUDA, so capture.py leaves them out) is taken off; at the peak, in backward, every
forward call's pair is live. Needs the packages of requirements.txt. Exits 1 if any peak differs.

Only meta-mode traces are checked; a GPU-mode trace (`meta source cuda`) is skipped with a note: compare
it with a meta-mode trace of the same settings using compare_devices.py.
"""

from __future__ import annotations

import argparse
import gzip
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import capture  # noqa: E402
import summarize  # noqa: E402


PHILOX_BYTES_PER_CALL = 16


def attention_calls_per_iteration(path: str) -> int:
    calls = 0
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.startswith("i 1 "):
                break
            fields = line.split(" ")
            if fields[0] == "o" and fields[4] == "_scaled_dot_product_efficient_attention":
                calls += 1
    return calls


def memtracker_peak(meta: dict[str, str]) -> int:
    from torch.distributed._tools.mem_tracker import MemTracker
    warnings.filterwarnings("ignore", message="Module is None")  # modules freed before backward hooks

    args = argparse.Namespace(
        model=meta["model"], batch=int(meta["batch"]),
        seq_len=int(meta["seq_len"]) if "seq_len" in meta else None,
        image_size=int(meta["image_size"]) if "image_size" in meta else None,
        attention="math" if "math" in meta.get("kernels", "") else "efficient")
    t = capture.build_training(args)
    tracker = MemTracker()
    tracker.track_external(t.model, t.optimizer)
    with tracker:
        for i in range(2):  # the second iteration has optimizer state and the previous grads
            t.optimizer.zero_grad(set_to_none=True)
            batch = capture.make_batch(t.spec, args, t.device, t.vocab_size)
            loss = capture.loss_of(t.model, t.spec, batch)
            loss.backward()
            t.optimizer.step()
            del loss, batch
            if i == 0:
                tracker.reset_mod_stats()
    return tracker.get_tracker_snapshot("peak")[t.device]["Total"]


def main(paths: list[str]) -> int:
    if not paths:
        print("usage: crosscheck.py TRACE.ztrace.gz...", file=sys.stderr)
        return 2
    bad = 0
    for path in paths:
        s = summarize.summarize(path)
        if s["meta"].get("source") != "meta":
            print(f"{path}: skipped, a {s['meta'].get('source')} trace: MemTracker reruns the loop on the "
                  f"meta device; compare it with a meta trace using compare_devices.py")
            continue
        philox = PHILOX_BYTES_PER_CALL * attention_calls_per_iteration(path)
        theirs = memtracker_peak(s["meta"])
        same = theirs - philox == s["peak"]
        bad += not same
        print(f"{path}: trace peak {s['peak']} B, MemTracker peak {theirs} B "
              f"({philox} B of attention philox state): {'same' if same else 'DIFFERENT'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
