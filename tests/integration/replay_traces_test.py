"""zico-umctl replay on the committed real-model traces.

Memory targets are deterministic (the traces and the allocator are), so they are checked here:
peak mapped / peak live <= 1.10 for zicoum's online allocator and <= 1.03 in steady state with the
lifetime plan, on every trace. Timings are never asserted. Also checks that bad input is refused with
a clear message and exit status 2, and that an allocation an allocator refuses is shown and fails the
run (exit 1).

usage: replay_traces_test.py ZICO_UMCTL TRACE_DIR
"""
import glob
import gzip
import json
import os
import subprocess
import sys
import tempfile
import unittest

UMCTL, TRACE_DIR = sys.argv[1], sys.argv[2]
TRACES = sorted(glob.glob(os.path.join(TRACE_DIR, "*.ztrace.gz")))


def run(*args):
    return subprocess.run([UMCTL, *args], capture_output=True, text=True, timeout=300)


class CommittedTraces(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        result = run("replay", "--json", *TRACES)
        # 1 with complete output: an allocation failed, which test_every_trace_replays names.
        if result.returncode not in (0, 1) or not result.stdout:
            raise AssertionError(f"replay failed ({result.returncode}): {result.stderr}")
        cls.status, cls.stderr = result.returncode, result.stderr
        cls.report = json.loads(result.stdout)["traces"]

    def test_every_trace_replays(self):
        self.assertGreaterEqual(len(TRACES), 8)
        self.assertEqual(len(self.report), len(TRACES))
        for trace in self.report:
            self.assertGreaterEqual(trace["iterations_count"], 3, trace["trace"])
            names = [a["name"] for a in trace["allocators"]]
            self.assertEqual(names, ["naive", "pytorch-caching", "zicoum"])
            for allocator in trace["allocators"]:
                self.assertEqual(allocator["failed_allocations"], 0, (trace["trace"], allocator["name"]))
                self.assertEqual(allocator["peak_live_bytes"], trace["peak_live_bytes"])
                self.assertGreaterEqual(allocator["peak_mapped_bytes"], allocator["peak_live_bytes"])
        self.assertEqual(self.status, 0, self.stderr)

    def test_online_allocator_fragmentation_at_most_1_10(self):
        for trace in self.report:
            zicoum = next(a for a in trace["allocators"] if a["name"] == "zicoum")
            self.assertLessEqual(zicoum["fragmentation"], 1.10, trace["trace"])

    def test_lifetime_plan_fragmentation_at_most_1_03(self):
        for trace in self.report:
            plan = trace["lifetime_plan"]
            self.assertLessEqual(plan["fragmentation"], 1.03, trace["trace"])
            self.assertGreaterEqual(plan["region_bytes"], plan["lower_bound_bytes"], trace["trace"])

    def test_summary_prints_every_iteration(self):
        result = run("replay", "--summary", TRACES[0])
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("persistent", result.stdout)
        self.assertIn("transient", result.stdout)


def write_trace(path, records):
    """A version 1 trace (no op records) of the given records."""
    lines = ["zicoum-trace 1", "meta model test", "meta command test", "meta source meta", "meta batch 1",
             "meta iterations 2", "meta timing none", *records, f"end {len(records)}"]
    with gzip.open(path, "wt") as f:
        f.write("\n".join(lines) + "\n")


class FailedAllocations(unittest.TestCase):
    # A 2 TiB block, more than the replay's simulated device: naive and zicoum refuse it, the
    # caching model (no device) does not.
    RECORDS = ["a 0 4096 0 param -1", "i 0 0", "a 1 2199023255552 1 act -1", "f 1 2", "i 1 10",
               "a 2 1024 11 act -1", "f 2 12"]

    def test_a_refused_allocation_is_shown_and_fails_the_run(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "huge.ztrace.gz")
            write_trace(path, self.RECORDS)
            result = run("replay", "--summary", path)
            self.assertEqual(result.returncode, 1, result.stderr)
            rows = {line.split()[0]: line.split() for line in result.stdout.splitlines()[1:]}
            self.assertEqual(rows["allocator"][-1], "failed", result.stdout)
            self.assertEqual([rows[name][-1] for name in ("naive", "pytorch-caching", "zicoum")], ["1", "0", "1"])
            self.assertIn(f"{path}: 1 allocation failed under naive (out of memory)", result.stderr)
            # The summary is the trace's: the 2 TiB block is live in iteration 0.
            self.assertEqual(rows["0"][1:3], ["2.00", "TiB"], result.stdout)
            result = run("replay", "--json", path)
            self.assertEqual(result.returncode, 1, result.stderr)
            failed = [a["failed_allocations"] for a in json.loads(result.stdout)["traces"][0]["allocators"]]
            self.assertEqual(failed, [1, 0, 1])


class BadInput(unittest.TestCase):
    def test_invalid_trace_names_file_and_line(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "broken.ztrace.gz")
            with gzip.open(path, "wt") as f:
                f.write("zicoum-trace 1\nmeta model x\n")
            result = run("replay", path)
            self.assertEqual(result.returncode, 2)
            self.assertIn("broken.ztrace.gz:", result.stderr)
            self.assertEqual(result.stdout, "")

    def test_missing_file_and_bad_options(self):
        self.assertEqual(run("replay", "/nonexistent.ztrace.gz").returncode, 2)
        result = run("replay", "--frobnicate", TRACES[0])
        self.assertEqual(result.returncode, 2)
        self.assertIn("--frobnicate", result.stderr)
        self.assertEqual(run("replay").returncode, 2)
        self.assertEqual(run("no-such-command").returncode, 2)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
