#!/usr/bin/env python3
"""A UM job under zico-umd keeps to what it is lent, on the simulated backend.

The README's daemon example: a VMM job replaying BERT-base at 1/256 of its
size holds part of a 96 MiB budget, and a UM job replays BERT-base at 1/64
(141 MiB of blocks) beside it. The UM job's kernels use up to tens of MiB of
pages at once, more than it holds when they start: each must first be lent
the rest, so that the driver never brings a kernel's pages beyond the job's
share (the job's peak_over_budget_bytes stays 0), and the job completes.

Usage: um_share_test.py ZICO_UMD ZICO_UMCTL ZICO_RUN TRACE_JOB TRACE
"""
import json
import os
import subprocess
import sys
import tempfile
import time


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def main():
    umd, umctl, zico_run, trace_job, trace = sys.argv[1:6]
    with tempfile.TemporaryDirectory() as tmp:
        socket = os.path.join(tmp, "umd.sock")
        env = dict(os.environ, ZICO_BACKEND="sim")
        daemon = subprocess.Popen([umd, "--socket", socket, "--budget", "96MiB"], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        job_env = dict(env, ZICO_SOCKET=socket)
        vmm = None
        try:
            for _ in range(100):
                if os.path.exists(socket):
                    break
                time.sleep(0.05)
            else:
                fail("zico-umd did not create its socket")
            vmm = subprocess.Popen([trace_job, "--name", "bert", "--trace", trace, "--iterations", "1000",
                                    "--time-scale", "10", "--memory-scale", "1/256"], env=job_env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            for _ in range(200):
                status = subprocess.run([umctl, "status", "--json", "--socket", socket], capture_output=True,
                                        text=True)
                if status.returncode == 0 and any(job["granted_bytes"] > 0 for job in json.loads(status.stdout)["jobs"]):
                    break
                time.sleep(0.05)
            else:
                fail("the VMM job never held memory under the daemon")
            for run in range(2):
                um = subprocess.run([zico_run, "--backend", "sim", "--mode", "um", "--", trace_job, "--ops",
                                     "--trace", trace, "--iterations", "20", "--memory-scale", "1/64"],
                                    env=dict(job_env, ZICO_LOG="info"), capture_output=True, text=True, timeout=120)
                if um.returncode != 0:
                    fail(f"the UM job failed (exit {um.returncode}):\n{um.stdout}\n{um.stderr}")
                if "registered with zico-umd" not in um.stderr:
                    fail("the UM job did not run under the daemon:\n" + um.stderr)
                fields = dict(item.split("=", 1) for item in um.stdout.split() if "=" in item)
                print(um.stdout.strip())
                if int(fields["peak_over_budget_bytes"]) != 0:
                    fail(f"run {run}: a kernel had {fields['peak_over_budget_bytes']} bytes brought beyond what the "
                         f"daemon lent the job:\n{um.stderr}")
            if vmm.poll() is not None:
                fail("the VMM job ended early: " + vmm.stderr.read())
        finally:
            if vmm is not None:
                vmm.kill()
                vmm.wait()
            daemon.terminate()
            daemon.wait(timeout=10)
    print("OK")


if __name__ == "__main__":
    main()
