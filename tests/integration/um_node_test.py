#!/usr/bin/env python3
"""UM jobs under zico-umd, end to end on the simulated backend.

Two Unified Memory jobs replaying BERT-base (9.4 GB at their peak each) and
one ordinary (VMM) job holding 1 GiB share a 6 GiB budget, far below the
jobs' summed peaks. Checked:
  - both UM jobs complete with every block intact (trace_job verifies), each
    with no more of its pages on the GPU than the budget;
  - the daemon lent them memory (they were counted, not running outside the
    budget), and never lent more than the budget, polled all along;
  - a budget cut to 4 GiB while they run is followed: what is lent falls to
    the new budget (they page out) and they complete all the same;
  - zico-umctl suspend of a UM job sends its pages to the host and gives its
    share back (suspended, nothing held); resumed, it completes;
  - the VMM job keeps its memory and its data through all of it.

Usage: um_node_test.py ZICO_UMD ZICO_UMCTL ZICO_RUN TRACE_JOB HOLD_MEMORY TRACE
"""
import json
import os
import subprocess
import sys
import tempfile
import time

GiB = 1 << 30


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def control(umctl, socket, action, job_id):
    result = subprocess.run([umctl, action, str(job_id), "--socket", socket], capture_output=True, text=True)
    if result.returncode != 0:
        fail(f"zico-umctl {action} {job_id}: {result.stderr}")


def main():
    umd, umctl, zico_run, trace_job, hold_memory, trace = sys.argv[1:7]
    with tempfile.TemporaryDirectory() as tmp:
        socket = os.path.join(tmp, "umd.sock")
        env = dict(os.environ, ZICO_BACKEND="sim")
        daemon_log = open(os.path.join(tmp, "umd.log"), "w+")
        daemon = subprocess.Popen([umd, "--socket", socket, "--budget", "6GiB"], env=env, stdout=daemon_log,
                                  stderr=subprocess.STDOUT)
        try:
            for _ in range(100):
                if os.path.exists(socket):
                    break
                time.sleep(0.05)
            else:
                fail("zico-umd did not create its socket")
            job_env = dict(env, ZICO_SOCKET=socket, ZICO_SWAP_DIR=tmp)
            holder = subprocess.Popen([hold_memory, "1GiB"], env=job_env, stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            if holder.stdout.readline().strip() != "ready":
                fail("hold_memory did not get ready: " + holder.stderr.read())
            um_jobs = [
                subprocess.Popen([zico_run, "--backend", "sim", "--mode", "um", "--", trace_job, "--ops", "--trace",
                                  trace, "--iterations", "60"], env=job_env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
                for _ in range(2)
            ]
            budget = 6 * GiB
            most_lent = {}  # pid -> the most the daemon lent it
            cut = False
            suspended, resumed = None, False
            while any(job.poll() is None for job in um_jobs):
                status = subprocess.run([umctl, "status", "--json", "--socket", socket], capture_output=True,
                                        text=True)
                if status.returncode != 0:
                    fail("zico-umctl status: " + status.stderr)
                state = json.loads(status.stdout)
                gpu = state["gpus"][0]
                # Lent above the budget only while a cut is being followed (pages on their way out).
                if gpu["granted_bytes"] > gpu["budget_bytes"] and not (cut and time.monotonic() - cut_at < 1.0):
                    fail(f"the daemon lent {gpu['granted_bytes']} bytes, budget {gpu['budget_bytes']}")
                for job in state["jobs"]:
                    most_lent[job["pid"]] = max(most_lent.get(job["pid"], 0), job["granted_bytes"])
                    want = "vmm" if job["pid"] == holder.pid else "um"
                    if job["mode"] != want:
                        fail(f"job {job['pid']} shows mode {job['mode']}, not {want}")
                lent_now = [job for job in state["jobs"] if job["granted_bytes"] > 0]
                if not cut and len(lent_now) == 3:  # both UM jobs run under the daemon, beside the VMM one
                    result = subprocess.run([umctl, "budget", "set", "4GiB", "--socket", socket],
                                            capture_output=True, text=True)
                    if result.returncode != 0:
                        fail("budget set 4GiB: " + result.stderr)
                    budget, cut = 4 * GiB, True
                    cut_at = time.monotonic()
                if cut and suspended is None and time.monotonic() - cut_at > 0.3:
                    # zico-umctl suspend: a UM job sends every page to the host and gives its share back.
                    suspended = next(job for job in state["jobs"] if job["pid"] == um_jobs[0].pid)["id"]
                    control(umctl, socket, "suspend", suspended)
                    suspend_at = time.monotonic()
                if suspended is not None and not resumed:
                    row = next((job for job in state["jobs"] if job["id"] == suspended), None)
                    if row is not None and row["state"] == "suspended" and row["granted_bytes"] == 0:
                        control(umctl, socket, "resume", suspended)
                        resumed = True
                    elif time.monotonic() - suspend_at > 10:
                        fail(f"the UM job did not suspend with nothing held: {row}")
                time.sleep(0.02)
            if not cut or not resumed:
                fail("the UM jobs ended before the budget cut, or the suspension, was checked")
            for job in um_jobs:
                out, err = job.communicate()
                if job.returncode != 0:
                    fail(f"a UM job failed (exit {job.returncode}):\n{out}\n{err}")
                print(out.strip())
                fields = dict(item.split("=", 1) for item in out.split() if "=" in item)
                if int(fields["peak_resident_bytes"]) > 6 * GiB:
                    fail(f"a UM job kept {fields['peak_resident_bytes']} bytes on the GPU, budget 6 GiB")
                if int(fields["peak_allocated_bytes"]) < 8 * GiB:
                    fail("a UM job allocated less than its peak: " + out)
                if most_lent.get(job.pid, 0) == 0:
                    fail(f"UM job {job.pid} was never lent anything: it did not run under the daemon")
            holder.stdin.close()
            if holder.wait(timeout=30) != 0:
                fail("the VMM job's data changed or it failed: " + holder.stderr.read())
        finally:
            daemon.terminate()
            daemon.wait(timeout=10)
            daemon_log.seek(0)
            log = daemon_log.read()
        if "yields its memory" in log or "waits its turn" in log:
            fail("a UM job was made to yield or park:\n" + log)
    print("OK")


if __name__ == "__main__":
    main()
