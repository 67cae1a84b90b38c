#!/usr/bin/env python3
"""Two UM jobs with swapped pages share one zico-umd budget on one simulated device.

    um_swap_sharing_test.py BUILD_DIR

Every process shares one simulated device (a board file, as tests/bench/physical_memory.py sets up).
zico-umd holds 184 MiB of a 512 MiB device; two jobs (trace_job --ops, BERT-base at 1/64, 141 MiB at
its peak) run under it in UM mode with ZICO_UM_MEMORY=swap and no cap of their own, so the time
shift moves memory between them: every grant and reclaim goes through the pager's budget and the
swap's held limit. Passes when both jobs finish (a page a kernel touched unmapped fails its job) and
the device never holds more than the node budget at any sample (every 5 ms). Exit 0, or 1 naming
what failed.
"""
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
from physical_memory import MIB, Sampler  # noqa: E402

CAPACITY_MIB, BUDGET_MIB, ITERATIONS = 512, 184, 12


def main():
    build = sys.argv[1]
    trace = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "traces",
                         "bert_base.ztrace.gz")
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        board, socket = os.path.join(tmp, "device.board"), os.path.join(tmp, "umd.sock")
        env = {key: value for key, value in os.environ.items() if not key.startswith("ZICO_")}
        env.update(ZICO_BACKEND="sim", ZICO_SIM_DEVICE_BOARD=board, ZICO_SIM_CAPACITY=f"{CAPACITY_MIB}MiB")
        with open(os.path.join(tmp, "umd.log"), "w+") as daemon_log:
            daemon = subprocess.Popen([os.path.join(build, "bin", "zico-umd"), "--socket", socket, "--budget",
                                       f"{BUDGET_MIB}MiB"], env=env, stdout=subprocess.DEVNULL, stderr=daemon_log)
            sampler = Sampler(board)
            jobs = []
            try:
                for _ in range(250):
                    if os.path.exists(socket) or daemon.poll() is not None:
                        break
                    time.sleep(0.02)
                if not os.path.exists(socket):
                    daemon_log.seek(0)
                    print("FAIL: zico-umd did not start:\n" + daemon_log.read())
                    return 1
                sampler.start()
                job_env = dict(env, ZICO_SOCKET=socket, ZICO_UM_MEMORY="swap")
                for _ in range(2):
                    jobs.append(subprocess.Popen(
                        [os.path.join(build, "bin", "zico-run"), "--backend", "sim", "--mode", "um", "--",
                         os.path.join(build, "bin", "trace_job"), "--ops", "--trace", trace, "--iterations",
                         str(ITERATIONS), "--memory-scale", "1/64"],
                        env=job_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
                for number, job in enumerate(jobs, 1):
                    out, err = job.communicate(timeout=240)
                    if job.returncode != 0 or "result " not in out:
                        failures.append(f"job {number} failed (exit {job.returncode}): {err.strip()[-1500:]}")
            finally:
                sampler.stop.set()
                for job in jobs:
                    if job.poll() is None:
                        job.kill()
                        job.wait()
                daemon.terminate()
                daemon.wait(timeout=10)
    if sampler.peak > BUDGET_MIB * MIB:
        failures.append(f"the device held {sampler.peak / MIB:.0f} MiB, above the node budget {BUDGET_MIB} MiB")
    for failure in failures:
        print(f"FAIL: {failure}")
    if not failures:
        print(f"both swapped jobs finished; the device held at most {sampler.peak / MIB:.0f} MiB of the "
              f"{BUDGET_MIB} MiB budget")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
