#!/usr/bin/env python3
"""capture.py --model MODULE:CALLABLE: a user's own model captured from the current directory, and
every unusable value refused with exit status 2 and a one-line message naming it.

    python3 tools/traces/test_capture_user_model.py

  * example_model.py's three callables (tuple batch, dict batch of a transformers model, loss_fn),
    captured from a temporary directory holding a copy of it (the current directory is on the import
    path): each trace passes check_trace.py and its meta lines say what was captured;
  * the options reach the callable as documented (only those it names; None where not given);
  * bad values: a missing MODULE or CALLABLE, an unimportable or failing module, a missing attribute,
    something not callable, an unknown required parameter, and each wrong return (not a pair, not a
    Module, not a dict/tuple batch, loss_fn not callable, tensors on another device, a loss that is not
    a scalar, a dict batch without a loss): exit 2, the value named, no traceback, nothing written;
  * --device cuda's footprint estimate (a child process) imports the module from the same directory,
    and reports a bad return value as a usage error;
  * README.md shows example_model.py as it is.

Needs torch (tools/traces/requirements.txt; the dict-batch example also transformers). Exits 77
(CTest: skipped) without torch.
"""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

try:
    import torch  # noqa: F401
except ImportError:
    print("SKIP: torch is not installed (pip install -r tools/traces/requirements.txt)")
    sys.exit(77)

import check_trace  # noqa: E402

CAPTURE = os.path.join(HERE, "capture.py")
EXAMPLE = os.path.join(HERE, "example_model.py")

# Modules the bad cases import, written into the temporary directory the captures run in.
BAD_MODELS = '''
import torch
import torch.nn as nn

NOT_CALLABLE = 42


def pair(batch):
    return torch.randn(batch, 4), torch.randint(0, 2, (batch,))


def only_model(batch):
    return nn.Linear(4, 2)


def four_items(batch):
    return nn.Linear(4, 2), pair(batch), None, None


def not_a_module(batch):
    return "a model", pair(batch)


def batch_not_tensors(batch):
    return nn.Linear(4, 2), "a batch"


def loss_fn_not_callable(batch):
    return nn.Linear(4, 2), pair(batch), 5


def batch_on_cpu(batch):
    return nn.Linear(4, 2), (torch.randn(batch, 4, device="cpu"), torch.zeros(batch, dtype=torch.long,
                                                                          device="cpu"))


def model_on_cpu(batch):
    return nn.Linear(4, 2, device="cpu"), pair(batch)


def loss_not_scalar(batch):
    return nn.Linear(4, 2), pair(batch), lambda model, b: model(b[0])


def loss_without_grad(batch):
    return nn.Linear(4, 2), pair(batch), lambda model, b: torch.zeros(())


def dict_without_loss(batch):
    return nn.Linear(4, 2), {"input": torch.randn(batch, 4)}


def needs_foo(batch, foo):
    raise AssertionError("never called")


def options(batch, seq_len, image_size, device):
    """Checks what it is given against the OPTIONS_* environment variables."""
    import os
    assert batch == int(os.environ["OPTIONS_BATCH"]), batch
    assert seq_len == (int(os.environ["OPTIONS_SEQ_LEN"]) if "OPTIONS_SEQ_LEN" in os.environ else None)
    assert image_size is None, image_size
    assert device == torch.device("meta"), device
    assert torch.empty(1).device == device, "not called under `with torch.device(device)`"
    return nn.Linear(4, 2), pair(batch)


def everything(**kwargs):
    assert sorted(kwargs) == ["batch", "device", "image_size", "seq_len"], sorted(kwargs)
    return nn.Linear(4, 2), pair(kwargs["batch"])
'''

# (--model value, what the one-line message must also say)
BAD_VALUES = [
    (":build", "the MODULE before ':' is missing"),
    ("bad_models:", "the CALLABLE after ':' is missing"),
    ("bad-models:build", "is not a module name"),
    ("bad_models:not-a-name", "is not a callable's name"),
    ("no_such_module_zicoum:build", "no module named 'no_such_module_zicoum'"),
    ("bad_models.py:build", "without .py"),
    ("broken_module:build", "importing module 'broken_module' failed: RuntimeError: broken on purpose"),
    ("bad_models:no_such_callable", "bad_models has no attribute 'no_such_callable'"),
    ("bad_models:NOT_CALLABLE", "bad_models:NOT_CALLABLE is an int, not a callable"),
    ("bad_models:needs_foo", "requires parameter 'foo'"),
    ("bad_models:only_model", "the callable returned a Linear, not (model, batch)"),
    ("bad_models:four_items", "the callable returned a tuple of 4"),
    ("bad_models:not_a_module", "the model it returned is a str, not a torch.nn.Module"),
    ("bad_models:batch_not_tensors", "the batch it returned is a str, not a dict or tuple"),
    ("bad_models:loss_fn_not_callable", "the loss_fn it returned is an int, not callable"),
    ("bad_models:batch_on_cpu", "the batch has tensors on cpu, not on meta"),
    ("bad_models:model_on_cpu", "the model has tensors on cpu, not on meta"),
    ("bad_models:loss_not_scalar", "gave a tensor of shape (2, 2), not a scalar tensor"),
    ("bad_models:loss_without_grad", "gave a loss that does not require grad"),
    ("bad_models:dict_without_loss", "model(**batch) returned a Tensor without a loss"),
    ("no_colon_model", "unknown model 'no_colon_model'"),
]


def has_transformers() -> bool:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def meta_lines(path: str) -> dict[str, str]:
    meta = {}
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            if not line.startswith("meta "):
                if line.startswith(("a ", "i ")):
                    break
                continue
            _, key, value = line.rstrip("\n").split(" ", 2)
            meta[key] = value
    return meta


class UserModelTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="zicoum-user-model-")
        cls.dir = cls.tmp.name
        shutil.copy(EXAMPLE, cls.dir)
        with open(os.path.join(cls.dir, "bad_models.py"), "w") as f:
            f.write(BAD_MODELS)
        with open(os.path.join(cls.dir, "broken_module.py"), "w") as f:
            f.write('raise RuntimeError("broken on purpose\\nover two lines")\n')

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def capture(self, model, *options, env=None):
        """Runs capture.py in the temporary directory (so its modules import from the current
        directory); returns (the finished process, the output path)."""
        out = os.path.join(self.dir, "out", f"{model.replace(':', '-')}.ztrace.gz")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        done = subprocess.run([sys.executable, CAPTURE, "--model", model, *options, "--out", out],
                              cwd=self.dir, capture_output=True, text=True, timeout=600,
                              env=dict(os.environ, PYTHONPATH="", **(env or {})))
        return done, out

    def assert_valid_capture(self, model, *options, iterations=2):
        done, out = self.capture(model, "--iterations", str(iterations), *options)
        self.assertEqual(done.returncode, 0, done.stderr)
        result = check_trace.check(out)   # raises on any broken rule of the format
        self.assertEqual(result["iterations"], iterations)
        meta = meta_lines(out)
        self.assertEqual(meta["model"], model)
        self.assertIn(f"--model {model} ", meta["command"])
        self.assertTrue(meta["architecture"].startswith(f"user callable {model} (example_model.py): "),
                        meta["architecture"])
        self.assertRegex(meta["architecture"], r", [0-9,]+ parameters$")
        with gzip.open(out, "rt") as f:
            inputs = sum(1 for line in f if line.startswith("a ") and line.split()[4] == "input")
        return meta, inputs

    def test_tuple_batch(self):
        meta, inputs = self.assert_valid_capture("example_model:build", "--batch", "4",
                                                 "--image-size", "40", iterations=3)
        self.assertIn("example_model.SmallCNN, 20,138 parameters", meta["architecture"])
        self.assertEqual(meta["image_size"], "40")
        self.assertNotIn("seq_len", meta)
        self.assertEqual(meta["batch"], "4")
        self.assertEqual(inputs, 2 * 3)   # images and labels, fresh each iteration

    @unittest.skipUnless(has_transformers(), "transformers is not installed")
    def test_dict_batch_of_a_transformers_model(self):
        meta, inputs = self.assert_valid_capture("example_model:build_lm", "--batch", "2",
                                                 "--seq-len", "64")
        self.assertIn("GPT2LMHeadModel", meta["architecture"])
        self.assertEqual(meta["seq_len"], "64")
        self.assertEqual(inputs, 2)   # input_ids and labels are one tensor: one block per iteration

    def test_loss_fn(self):
        meta, inputs = self.assert_valid_capture("example_model:build_regression", "--batch", "8")
        self.assertIn("torch.nn.modules.container.Sequential", meta["architecture"])
        self.assertEqual(inputs, 2 * 2)

    def test_optimizer_choice_sets_the_state_it_keeps(self):
        """SGD with momentum keeps one buffer per parameter, AdamW two: the trace's `optim` blocks
        count them."""
        states = {}
        for optimizer in ("adam", "sgd-momentum"):
            done, out = self.capture("example_model:build_regression", "--batch", "8", "--iterations", "2",
                                     "--optimizer", optimizer)
            self.assertEqual(done.returncode, 0, done.stderr)
            check_trace.check(out)
            meta = meta_lines(out)
            with gzip.open(out, "rt") as f:
                states[optimizer] = sum(1 for line in f if line.startswith("a ") and line.split()[4] == "optim")
            self.assertIn("SGD(momentum=0.9" if optimizer == "sgd-momentum" else "AdamW(", meta["optimizer"])
        self.assertGreater(states["sgd-momentum"], 0)
        self.assertGreaterEqual(states["adam"], 2 * states["sgd-momentum"])
        done, _ = self.capture("example_model:build_regression", "--batch", "8", "--optimizer", "rmsprop")
        self.assertEqual(done.returncode, 2)
        self.assertIn("rmsprop", done.stderr)

    def test_matmul_rate_sets_the_matmul_times_only(self):
        """--matmul-tflops moves the estimated time of matmul-class ops, not of the others, and names
        the rate in the trace; a rate that is not above 0 is a usage error."""
        times = {}
        for rate in ("400", "0.001"):
            done, out = self.capture("example_model:build_regression", "--batch", "8", "--iterations", "1",
                                     "--matmul-tflops", rate)
            self.assertEqual(done.returncode, 0, done.stderr)
            self.assertIn(f"at max({rate} TFLOP/s", meta_lines(out)["timing"])
            with gzip.open(out, "rt") as f:
                ops = [line.split() for line in f if line.startswith("o ")]
            matmul = [int(op[3]) for op in ops if op[4] in ("addmm", "mm")]
            times[rate] = (sum(matmul), sum(int(op[3]) for op in ops) - sum(matmul))
        self.assertGreater(times["0.001"][0], times["400"][0])  # matmuls slower
        self.assertEqual(times["0.001"][1], times["400"][1])  # the rest unchanged
        os.remove(out)
        for bad in ("0", "-1", "nan", "inf"):
            done, out = self.capture("example_model:build_regression", "--batch", "8", "--matmul-tflops", bad)
            self.assertEqual(done.returncode, 2, done.stderr)
            self.assertIn(f"--matmul-tflops {bad}", done.stderr)
            self.assertFalse(os.path.exists(out), "a refused capture wrote a trace")

    def test_options_reach_the_callable(self):
        done, out = self.capture("bad_models:options", "--batch", "3", "--seq-len", "7",
                                 "--iterations", "1", env={"OPTIONS_BATCH": "3", "OPTIONS_SEQ_LEN": "7"})
        self.assertEqual(done.returncode, 0, done.stderr)
        check_trace.check(out)
        done, out = self.capture("bad_models:everything", "--batch", "2", "--iterations", "1")
        self.assertEqual(done.returncode, 0, done.stderr)
        check_trace.check(out)

    def test_bad_values_are_usage_errors(self):
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            runs = list(pool.map(lambda v: self.capture(v[0], "--batch", "2", "--iterations", "1"),
                                 BAD_VALUES))
        for (value, says), (done, out) in zip(BAD_VALUES, runs):
            with self.subTest(model=value):
                self.assertEqual(done.returncode, 2, done.stderr)
                self.assertNotIn("Traceback", done.stderr)
                errors = [line for line in done.stderr.splitlines() if "error:" in line]
                self.assertEqual(len(errors), 1, done.stderr)
                self.assertIn(f"--model {value!r}" if ":" in value else repr(value), errors[0])
                self.assertIn(says, errors[0])
                self.assertFalse(os.path.exists(out), "a refused capture wrote a trace")

    def test_gpu_mode_footprint_estimate(self):
        """--device cuda estimates its footprint with a meta capture in a child process, which must
        import the module from the same directory; a bad return value found there is still exit 2."""
        import capture
        here = os.getcwd()
        os.chdir(self.dir)
        try:
            args = capture.parse_args(["--device", "cuda", "--model", "example_model:build", "--batch",
                                       "4", "--iterations", "2", "--out", "/tmp/x.ztrace.gz"])
            estimate = capture.estimate_peak_bytes(args)
            args = capture.parse_args(["--device", "cuda", "--model", "bad_models:only_model",
                                       "--batch", "2", "--out", "/tmp/x.ztrace.gz"])
            with self.assertRaises(capture.UserModelError) as e:
                capture.estimate_peak_bytes(args)
        finally:
            os.chdir(here)
        self.assertIn("the callable returned a Linear", str(e.exception))
        self.assertNotIn("\n", str(e.exception))
        done, out = self.capture("example_model:build", "--batch", "4", "--iterations", "2")
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(estimate, check_trace.check(out)["peak"])

    def test_readme_shows_the_example_as_it_is(self):
        with open(os.path.join(HERE, "README.md"), encoding="utf-8") as f:
            readme = f.read()
        with open(EXAMPLE, encoding="utf-8") as f:
            example = f.read()
        self.assertIn("```python\n" + example + "```\n", readme,
                      "README.md's copy of example_model.py differs from the file")


if __name__ == "__main__":
    unittest.main(verbosity=2)
