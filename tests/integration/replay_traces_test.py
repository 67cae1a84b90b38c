"""zico-umctl replay on the committed real-model traces.

Memory targets are deterministic (the traces and the allocator are), so they are checked here:
peak mapped / peak live <= 1.10 for zicoum's online allocator and <= 1.03 in steady state with the
lifetime plan, on every trace. Timings are never asserted. Also checks that bad input is refused with
a clear message and exit status 2.

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
        if result.returncode != 0:
            raise AssertionError(f"replay failed ({result.returncode}): {result.stderr}")
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
