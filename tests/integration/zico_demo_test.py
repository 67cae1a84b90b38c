#!/usr/bin/env python3
"""zico-demo end to end, small: two jobs, a few iterations, fast time scale.

    zico_demo_test.py ZICO_DEMO

Checks that it exits 0, writes both timelines, reports every job's
iterations and never sees the node budget exceeded; and that bad options
are refused with exit status 2; and that --turns runs below the jobs' best
overlap.
"""
import json
import os
import subprocess
import sys
import tempfile


def main():
    demo = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="zico-demo-test-") as out:
        iterations = 3
        command = [demo, "--traces", "bert_base,vit_b_16", "--budget", "12GiB", "--iterations", str(iterations),
                   "--time-scale", "2", "--out", out, "--json"]
        run = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if run.returncode != 0:
            sys.exit(f"zico-demo exited {run.returncode}\nstdout:\n{run.stdout}\nstderr:\n{run.stderr}")
        result = json.loads(run.stdout)
        assert result["budget_exceeded"] is False, result
        assert result["node_budget_bytes"] == 12 * 2**30 // 256, result["node_budget_bytes"]
        # Every run states what the simulator predicts for the same set-up beside what it got.
        simulated = result["simulated"]
        assert simulated["known"] is True, simulated
        assert simulated["zico_iters_per_s"] > 0 and simulated["static_iters_per_s"] > 0, simulated
        expected = simulated["zico_iters_per_s"] / simulated["static_iters_per_s"]
        assert abs(simulated["throughput_ratio"] - expected) <= 1e-3 * expected, simulated
        assert simulated["zico_deadlocks"] >= 0, simulated
        for name in ("zico", "static"):
            phase = result["phases"][name]
            assert phase["budget_exceeded"] is False, (name, phase)
            assert phase["samples"] > 10, (name, phase["samples"])
            assert 0 < phase["peak_held_node_bytes"] <= result["node_budget_bytes"], (name, phase)
            assert [job["name"] for job in phase["jobs"]] == ["bert_base", "vit_b_16"], phase["jobs"]
            for job in phase["jobs"]:
                assert job["iterations"] == iterations, (name, job)
                assert job["iterations_per_s"] > 0, (name, job)
            svg = os.path.join(out, f"zico-demo-{name}.svg")
            with open(svg, encoding="utf-8") as f:
                text = f.read()
            assert "<svg" in text and "bert_base" in text and "vit_b_16" in text, svg
            assert phase["svg"] == svg, (phase["svg"], svg)
        # Static partitioning: the two reservations do not fit together, so
        # the second job starts after the first ends.
        jobs = result["phases"]["static"]["jobs"]
        assert jobs[1]["start_s"] >= jobs[0]["end_s"] - 0.05, jobs
        assert result["throughput_ratio"] > 0
        # The job zico slowed most against static, named with its ratio.
        slowest = result["slowest_against_static"]
        assert slowest["name"] in ("bert_base", "vit_b_16") and slowest["iteration_ratio"] > 0, slowest

        # With zico-umd's turns, below the pair's best overlap (10.58 GiB):
        # the jobs finish and the budget holds.
        run = subprocess.run(command[:3] + ["--budget", "9.5GiB"] + command[5:] + ["--turns"], capture_output=True,
                             text=True, timeout=120)
        if run.returncode != 0:
            sys.exit(f"zico-demo --turns exited {run.returncode}\nstdout:\n{run.stdout}\nstderr:\n{run.stderr}")
        result = json.loads(run.stdout)
        assert result["budget_exceeded"] is False, result
        zico = result["phases"]["zico"]
        assert "with turns" in zico["description"], zico["description"]
        assert [job["iterations"] for job in zico["jobs"]] == [iterations, iterations], zico["jobs"]

    for bad in (["--budget", "lots"], ["--iterations", "0"], ["--time-scale", "-1"], ["--memory-scale", "2"],
                ["--backend", "tpu"], ["--traces", "no_such_model"], ["--traces", "bert_base,"], ["--bogus"]):
        run = subprocess.run([demo] + bad, capture_output=True, text=True, timeout=30)
        assert run.returncode == 2, (bad, run.returncode, run.stderr)
        assert run.stderr.startswith("zico-demo: "), (bad, run.stderr)
    print("OK")


if __name__ == "__main__":
    main()
