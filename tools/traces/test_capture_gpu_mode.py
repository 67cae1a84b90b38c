#!/usr/bin/env python3
"""What can be tested of capture.py's GPU mode (--device cuda) without a GPU, and compare_devices.py.

    python3 tools/traces/test_capture_gpu_mode.py

  * argument validation, and the refusals: no CUDA device (with CUDA_VISIBLE_DEVICES="" so that it
    also holds on a GPU machine), and not enough free GPU memory (torch.cuda's answers faked);
  * the footprint estimate (a meta-mode capture in a child process) against a meta capture;
  * the measured-time path of the Recorder and CudaOpTimer, run on the CPU with real tensors and fake
    CUDA events: the trace is valid, T is the running sum of DUR, the event pool is reused, and the
    sizes equal those of a meta-mode capture of the same settings (compare_devices.py says so);
  * compare_devices.py's verdicts on traces made by hand.

Needs torch (tools/traces/requirements.txt; resnet110 needs nothing else). Exits 77 (CTest: skipped)
without it. The real CUDA path is tested by tests/integration/gpu_capture_test.sh on a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import os
import subprocess
import sys
import tempfile
import time
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

try:
    import torch
except ImportError:
    print("SKIP: torch is not installed (pip install -r tools/traces/requirements.txt)")
    sys.exit(77)

import capture  # noqa: E402
import check_trace  # noqa: E402
import compare_devices  # noqa: E402

CAPTURE = os.path.join(HERE, "capture.py")
GIB = 1 << 30


def run_capture(*argv, env=None):
    return subprocess.run([sys.executable, CAPTURE, *argv], capture_output=True, text=True,
                          env=dict(os.environ, **(env or {})))


def meta_capture(path, model="resnet110", batch=2, iterations=2):
    done = run_capture("--model", model, "--batch", str(batch), "--iterations", str(iterations),
                       "--out", path)
    assert done.returncode == 0, done.stderr
    return path


class FakeEvent:
    """A torch.cuda.Event stand-in: record() takes the host clock; elapsed_time() is in ms."""
    records = 0

    def __init__(self, enable_timing=False):
        assert enable_timing
        self.t = None

    def record(self, stream=None):
        assert stream == "stream"
        FakeEvent.records += 1
        self.t = time.perf_counter_ns()

    def elapsed_time(self, end):
        assert self.t is not None and end.t is not None, "an event read before it was recorded"
        return (end.t - self.t) / 1e6


class FakeCuda:
    Event = FakeEvent

    def __init__(self):
        self.synchronized = 0

    def current_stream(self, device):
        return "stream"

    def synchronize(self, device):
        self.synchronized += 1


class ArgumentTest(unittest.TestCase):
    def test_device_defaults_to_meta(self):
        args = capture.parse_args(["--model", "resnet110", "--batch", "8", "--out", "/tmp/x.ztrace.gz"])
        self.assertEqual(args.device, "meta")

    def test_unknown_device_is_a_usage_error(self):
        done = run_capture("--device", "tpu", "--model", "resnet110", "--batch", "8",
                           "--out", "/tmp/x.ztrace.gz")
        self.assertEqual(done.returncode, 2)
        self.assertIn("--device", done.stderr)

    def test_cuda_without_a_gpu_is_refused(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "t.ztrace.gz")
            started = time.monotonic()
            done = run_capture("--device", "cuda", "--model", "resnet110", "--batch", "8", "--out", out,
                               env={"CUDA_VISIBLE_DEVICES": ""})
            self.assertEqual(done.returncode, capture.EXIT_NO_GPU, done.stderr)
            self.assertIn("torch.cuda.is_available() is False", done.stderr)
            self.assertIn("--device meta", done.stderr)
            self.assertNotIn("Traceback", done.stderr)
            self.assertFalse(os.listdir(tmp), "a refused capture wrote something")
            self.assertLess(time.monotonic() - started, 60, "the refusal should come before any work")

    def test_cuda_still_validates_arguments_first(self):
        done = run_capture("--device", "cuda", "--model", "resnet110", "--batch", "0",
                           "--out", "/tmp/x.ztrace.gz", env={"CUDA_VISIBLE_DEVICES": ""})
        self.assertEqual(done.returncode, 2)
        self.assertIn("--batch must be at least 1", done.stderr)


class MemoryPlanTest(unittest.TestCase):
    def test_plan_fits(self):
        plan = capture.gpu_memory_plan(2 * GIB, 80 * GIB, 80 * GIB)
        self.assertEqual(plan["cap"], 3 * GIB + capture.ALLOCATOR_EXTRA)
        self.assertEqual(plan["need"], plan["cap"] + capture.OUTSIDE_ALLOCATOR)

    def test_plan_refused_one_byte_short(self):
        need = capture.gpu_memory_plan(GIB, 80 * GIB, 80 * GIB)["need"]
        capture.gpu_memory_plan(GIB, need, 80 * GIB)  # exactly enough
        with self.assertRaises(capture.GpuUnavailable) as e:
            capture.gpu_memory_plan(GIB, need - 1, 80 * GIB, "cuda:0 (Fake)")
        self.assertIn("refusing to run on cuda:0 (Fake)", str(e.exception))
        self.assertIn("never oversubscribed", str(e.exception))

    def _main_with_fake_gpu(self, free, estimate):
        """main() --device cuda with torch.cuda's answers faked; nothing may reach a real GPU."""
        err = io.StringIO()
        with contextlib.ExitStack() as stack:
            stack.enter_context(mock.patch.object(torch.cuda, "is_available", return_value=True))
            stack.enter_context(mock.patch.object(torch.cuda, "current_device", return_value=0))
            stack.enter_context(mock.patch.object(torch.cuda, "get_device_name", return_value="Fake GPU"))
            stack.enter_context(mock.patch.object(torch.cuda, "mem_get_info",
                                                  return_value=(free, 80 * GIB)))
            cap = stack.enter_context(mock.patch.object(torch.cuda, "set_per_process_memory_fraction"))
            stack.enter_context(mock.patch.object(capture, "estimate_peak_bytes", return_value=estimate))
            ran = stack.enter_context(mock.patch.object(capture, "capture"))
            stack.enter_context(contextlib.redirect_stderr(err))
            status = capture.main(["--device", "cuda", "--model", "resnet110", "--batch", "8",
                                   "--out", os.path.join(tempfile.gettempdir(), "x.ztrace.gz")])
        return status, err.getvalue(), cap, ran

    def test_main_refuses_without_free_memory(self):
        status, err, cap, ran = self._main_with_fake_gpu(free=2 * GIB, estimate=2 * GIB)
        self.assertEqual(status, capture.EXIT_NO_GPU)
        self.assertIn("refusing to run on cuda:0 (Fake GPU)", err)
        cap.assert_not_called()
        ran.assert_not_called()

    def test_main_caps_the_allocator_when_it_fits(self):
        status, err, cap, ran = self._main_with_fake_gpu(free=40 * GIB, estimate=2 * GIB)
        self.assertEqual(status, 0, err)
        ran.assert_called_once()
        (fraction, index), _ = cap.call_args
        self.assertEqual(index, 0)
        self.assertAlmostEqual(fraction, (3 * GIB + capture.ALLOCATOR_EXTRA) / (80 * GIB))
        self.assertEqual(ran.call_args[0][0].gpu_plan["estimate"], 2 * GIB)

    def test_estimate_is_the_meta_peak(self):
        args = capture.parse_args(["--device", "cuda", "--model", "resnet110", "--batch", "2",
                                   "--iterations", "5", "--out", "/tmp/x.ztrace.gz"])
        estimate = capture.estimate_peak_bytes(args)
        with tempfile.TemporaryDirectory() as tmp:
            path = meta_capture(os.path.join(tmp, "m.ztrace.gz"), batch=2, iterations=2)
            self.assertEqual(estimate, compare_devices.trace_stats(path)["peak"])


class MeasuredModeOnCpuTest(unittest.TestCase):
    """The cuda code path minus CUDA: real tensors on the CPU, CudaOpTimer with fake events.

    On the CPU, Adam's step counters (one float32 scalar per parameter, host tensors on CUDA and
    next to meta tensors) are on the recorded device, so this trace has them, and their .item() reads,
    where meta and cuda traces do not; everything else must be the same as in meta mode.
    """

    def test_cpu_trace_matches_meta_and_times_add_up(self):
        args = argparse.Namespace(model="resnet110", batch=2, iterations=3, image_size=32,
                                  seq_len=None, attention="efficient", device="cpu", optimizer="adam")
        training = capture.build_training(args)
        fake = FakeCuda()
        timer = capture.CudaOpTimer(argparse.Namespace(cuda=fake), training.device)
        recorder = capture.Recorder(training.device, timer)
        capture.record_training(training, args, recorder)
        self.assertEqual(recorder.finish(), 0)
        self.assertEqual(fake.synchronized, args.iterations + 1)  # each iteration's end, and finish()
        ops_per_iteration, n = [], 0
        for rec in recorder.records:
            if rec[0] == "i" and rec[1] > 0:
                ops_per_iteration.append(n)
                n = 0
            n += rec[0] == "o"
        ops_per_iteration.append(n)
        self.assertLessEqual(len(timer._pairs), max(ops_per_iteration) + 1,
                             "the event pool is not reused across iterations")

        with tempfile.TemporaryDirectory() as tmp:
            cpu = os.path.join(tmp, "cpu.ztrace.gz")
            recorder.write(cpu, {"model": "resnet110", "command": "python3 capture.py --model resnet110",
                                 "source": "cpu", "batch": "2", "iterations": "3",
                                 "timing": "fake CUDA events on the host clock", "image_size": "32"})
            result = check_trace.check(cpu)
            self.assertEqual(result["ops"], recorder.op_count)

            # T is the running sum of DUR; a, f and i records carry the time of their position.
            clock = 0
            with gzip.open(cpu, "rt") as f:
                for line in f:
                    fields = line.split()
                    if fields[0] == "o":
                        self.assertEqual(int(fields[2]), clock)
                        clock += int(fields[3])
                    elif fields[0] in ("f", "i"):
                        self.assertEqual(int(fields[2]), clock)
                    elif fields[0] == "a":
                        self.assertEqual(int(fields[3]), clock)
            self.assertEqual(clock, recorder.clock_ns)
            self.assertGreater(clock, 0)

            meta = meta_capture(os.path.join(tmp, "meta.ztrace.gz"), batch=2, iterations=3)
            a, b = compare_devices.trace_stats(meta), compare_devices.trace_stats(cpu)
            params = len(training.params)
            steps = 4 * params   # the step counters' bytes
            self.assertEqual(b["at_peak"], dict(a["at_peak"], optim=a["at_peak"]["optim"] + steps))
            self.assertEqual(b["peak"], a["peak"] + steps)
            self.assertEqual(b["end_live"], a["end_live"] + steps)
            # The counters, and the 1.0 that foreach Adam adds to them once per step.
            self.assertEqual(b["blocks"], a["blocks"] + params + args.iterations)
            extra_ops = b["ops"] - a["ops"]
            self.assertEqual(dict(extra_ops), {"_foreach_add_.Tensor": args.iterations,
                                               # both bias corrections read the counter
                                               "_local_scalar_dense": 2 * params * args.iterations})
            self.assertFalse(a["ops"] - b["ops"])
            report = io.StringIO()
            tolerance = steps / a["peak"] * 1.0001
            self.assertEqual(compare_devices.compare(meta, cpu, tolerance, out=report), 1,
                             report.getvalue())  # the end state differs by the counters
            self.assertIn("within the tolerance", report.getvalue())


@contextlib.contextmanager
def cuda_faked_on_cpu():
    """torch.cuda answering as a free 80 GiB GPU, and the model built on the CPU instead: main()
    --device cuda then runs its whole GPU path, CUDA calls excepted. Nothing reaches a real GPU."""
    free = 80 * GIB
    fake = FakeCuda()
    props = argparse.Namespace(name="Fake GPU", major=9, minor=0, multi_processor_count=132,
                               total_memory=free)
    build = capture.build_training
    with contextlib.ExitStack() as stack:
        for name, value in (("is_available", True), ("current_device", 0),
                            ("get_device_name", "Fake GPU"), ("mem_get_info", (free, free)),
                            ("set_per_process_memory_fraction", None), ("reset_peak_memory_stats", None),
                            ("max_memory_allocated", 123456), ("max_memory_reserved", 2 * 1 << 20),
                            ("get_device_properties", props)):
            stack.enter_context(mock.patch.object(torch.cuda, name, return_value=value))
        stack.enter_context(mock.patch.object(torch.cuda, "synchronize", fake.synchronize))
        stack.enter_context(mock.patch.object(torch.cuda, "current_stream", fake.current_stream))
        stack.enter_context(mock.patch.object(torch.cuda, "Event", FakeEvent))
        # The optimizer asks the (fake) accelerator whether a CUDA graph is being captured.
        stack.enter_context(mock.patch.object(torch.optim.Optimizer,
                                              "_accelerator_graph_capture_health_check", lambda self: None))
        stack.enter_context(mock.patch.object(
            capture, "build_training",
            lambda args: build(argparse.Namespace(**dict(vars(args), device="cpu")))))
        yield fake


class MainCudaPathOnCpuTest(unittest.TestCase):
    def test_cuda_trace_and_its_meta_keys(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "cuda.ztrace.gz")
            err = io.StringIO()
            with cuda_faked_on_cpu() as fake, contextlib.redirect_stderr(err):
                status = capture.main(["--device", "cuda", "--model", "resnet110", "--batch", "2",
                                       "--iterations", "2", "--out", out])
            self.assertEqual(status, 0, err.getvalue())
            self.assertEqual(fake.synchronized, 1 + 2 + 1)  # before, after each iteration, finish()
            self.assertIn("ms measured GPU time", err.getvalue())
            result = check_trace.check(out)
            self.assertGreater(result["end_time"], 0)
            meta = compare_devices.trace_stats(out)["meta"]
            self.assertEqual(meta["source"], "cuda")
            self.assertTrue(meta["timing"].startswith("CUDA events per op"))
            self.assertTrue(meta["device"].startswith("cpu (Fake GPU)"))  # the model ran on the CPU
            self.assertIn("none substituted", meta["kernels"])
            self.assertIn("native_batch_norm x109", meta["kernels"])
            self.assertEqual(meta["gpu"], "Fake GPU, compute capability 9.0, 132 SMs, "
                                          f"{80 * GIB} bytes")
            for key in ("nvidia_driver", "cuda_driver_api", "cuda_runtime", "cudnn", "cuda_settings"):
                self.assertIn(key, meta)
            self.assertIn("float32_matmul_precision high", meta["cuda_settings"])
            self.assertRegex(meta["footprint"], r"^estimated tensor peak [0-9]+ B \(meta capture\); "
                                                r"caching allocator capped at [0-9]+ B; ")
            self.assertEqual(meta["allocator_max_allocated"], "123456")
            # Only on the CPU: Adam's step counters (329 parameters) and the 1.0 added to them each
            # step (2 iterations), made by torch.tensor(), which no dispatch mode sees.
            self.assertEqual(meta["untracked_blocks"], str(329 + 2))
        torch.set_float32_matmul_precision("highest")


def write_trace(path, meta, body):
    lines = ["zicoum-trace 1"] + [f"meta {k} {v}" for k, v in meta.items()] + body
    lines.append(f"end {len(body)}")
    with gzip.open(path, "wt") as f:
        f.write("\n".join(lines) + "\n")


class CompareDevicesTest(unittest.TestCase):
    META = {"model": "m", "command": "python3 capture.py --model m --batch 1", "source": "meta",
            "batch": "1", "iterations": "1", "timing": "t"}

    def _pair(self, tmp, act_b, param_b=100, meta_b=None):
        a = os.path.join(tmp, "a.ztrace.gz")
        b = os.path.join(tmp, "b.ztrace.gz")
        body = lambda act, param: ["i 0 0", f"a 0 {param} 0 param -1", f"a 1 {act} 0 act 0",
                                   "o 0 0 5 relu 0 1", "f 1 5"]
        write_trace(a, self.META, body(1000, 100))
        write_trace(b, dict(self.META, source="cuda", allocator_max_allocated="4096",
                            **(meta_b or {})), body(act_b, param_b))
        for path in (a, b):
            check_trace.check(path)
        return a, b

    def _compare(self, a, b, tolerance=0.01):
        out = io.StringIO()
        return compare_devices.compare(a, b, tolerance, out=out), out.getvalue()

    def test_same(self):
        with tempfile.TemporaryDirectory() as tmp:
            status, text = self._compare(*self._pair(tmp, 1000))
            self.assertEqual(status, 0, text)
            self.assertIn("max_memory_allocated 4096 B", text)

    def test_within_and_beyond_tolerance(self):
        with tempfile.TemporaryDirectory() as tmp:
            self.assertEqual(self._compare(*self._pair(tmp, 1010))[0], 0)   # 10 B of a 1100 B peak
            status, text = self._compare(*self._pair(tmp, 1020))            # 20 B: beyond 1 %
            self.assertEqual(status, 1)
            self.assertIn("DIFFERENT", text)

    def test_end_state_must_match(self):
        with tempfile.TemporaryDirectory() as tmp:
            status, text = self._compare(*self._pair(tmp, 1000 - 4, param_b=104))
            self.assertEqual(status, 1)
            self.assertIn("bytes live at the end", text)

    def test_different_settings(self):
        with tempfile.TemporaryDirectory() as tmp:
            a, b = self._pair(tmp, 1000, meta_b={"batch": "2"})
            self.assertEqual(self._compare(a, b)[0], 2)
            a, b = self._pair(tmp, 1000, meta_b={"command": "python3 capture.py --attention math"})
            status, text = self._compare(a, b)
            self.assertEqual(status, 2)
            self.assertIn("attention", text)


if __name__ == "__main__":
    unittest.main(verbosity=2)
