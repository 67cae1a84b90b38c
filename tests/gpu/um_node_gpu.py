#!/usr/bin/env python3
"""Two UM PyTorch jobs under zico-umd on a real GPU (the GPU suite's um_node step).

    um_node_gpu.py BIN_DIR NATIVE_LOG BUDGET_BYTES OUTDIR

Starts zico-umd holding BUDGET_BYTES (below the two jobs' summed peaks), then
two copies of torch_training.py's MLP under zico-run --mode um at once, and
polls zico-umctl status all along. Passes when both complete with losses
bitwise equal to NATIVE_LOG's run, zicoum saw their kernels, the daemon never
lent more than the budget, and each job's pages on the GPU (as its pager
counts them) stayed within it. Prints one JSON line: each job's iteration time
against native's, its faults, evictions and kernels seen, the GPU's memory in
use at its peak (NVML, both jobs and their contexts), and what was lent at
most. Logs land in OUTDIR (umd.log, um_node_job0.log, um_node_job1.log).
"""
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def last_json(text):
    lines = [line for line in text.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def daemon_env():
    """The environment of zico-umd and its jobs on the GPU; a job adds ZICO_SOCKET."""
    env = dict(os.environ, ZICO_BACKEND="cuda")
    env.pop("ZICO_SOCKET", None)
    return env


def start_daemon(bin_dir, socket, budget, log_path):
    """zico-umd holding `budget` bytes on `socket`, its output in `log_path`: (process, why), why
    None once its socket exists. The caller stops the process (stop_daemon) either way."""
    with open(log_path, "w") as log:
        daemon = subprocess.Popen([os.path.join(bin_dir, "zico-umd"), "--socket", socket, "--budget", str(budget)],
                                  env=daemon_env(), stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(200):
            if os.path.exists(socket) or daemon.poll() is not None:
                break
            time.sleep(0.05)
    except BaseException:  # stopped while waiting: the caller never gets the process to stop
        stop_daemon(daemon)
        raise
    if not os.path.exists(socket):
        return daemon, f"zico-umd did not create its socket: see {os.path.basename(log_path)}"
    return daemon, None


def stop_daemon(daemon):
    daemon.terminate()
    try:
        daemon.wait(timeout=10)
    except subprocess.TimeoutExpired:
        daemon.kill()


def um_job(bin_dir, socket, iterations, *extra):
    """(command, environment) of torch_training.py's MLP in UM mode under the daemon on `socket`."""
    # A 16 GiB arena: never more managed memory than the GPU has free.
    env = dict(daemon_env(), ZICO_SOCKET=socket, ZICO_ARENA_SIZE=str(16 << 30))
    command = [os.path.join(bin_dir, "zico-run"), "--backend", "cuda", "--mode", "um", "--",
               sys.executable, os.path.join(HERE, "torch_training.py"), "native", "--model", "mlp",
               "--iterations", str(iterations), "--mark-iterations", "--zico-stats", *extra]
    return command, env


def main():
    bin_dir, native_log, budget, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    # Stopped by the suite's step limit: end the jobs and the daemon too (the finally below).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    native = last_json(open(native_log, errors="replace").read())
    if native is None:
        print(json.dumps({"passed": False, "why": f"no native result in {native_log}"}))
        return 1
    socket = os.path.join(out, "umd.sock")
    daemon, why = start_daemon(bin_dir, socket, budget, os.path.join(out, "umd.log"))
    figures = {"passed": False, "budget_bytes": budget}
    jobs = []
    try:
        if why is not None:
            figures["why"] = why
            print(json.dumps(figures))
            return 1
        command, job_env = um_job(bin_dir, socket, 10, "--sample-gpu-memory")
        logs = [open(os.path.join(out, f"um_node_job{i}.log"), "w+") for i in range(2)]
        jobs = [subprocess.Popen(command, env=job_env, stdout=log, stderr=subprocess.STDOUT) for log in logs]
        most_lent, over = 0, None
        while any(job.poll() is None for job in jobs):
            status = subprocess.run([os.path.join(bin_dir, "zico-umctl"), "status", "--json", "--socket", socket],
                                    capture_output=True, text=True)
            if status.returncode == 0:
                gpu = json.loads(status.stdout)["gpus"][0]
                most_lent = max(most_lent, gpu["granted_bytes"])
                if gpu["granted_bytes"] > budget and over is None:
                    over = gpu["granted_bytes"]
            time.sleep(0.05)
        figures["most_lent_bytes"] = most_lent
        results = []
        for i, (job, log) in enumerate(zip(jobs, logs)):
            log.seek(0)
            result = last_json(log.read())
            if job.returncode != 0 or result is None:
                figures["why"] = f"job {i} failed (exit {job.returncode}): see um_node_job{i}.log"
                print(json.dumps(figures))
                return 1
            results.append(result)
            figures[f"job{i}_iteration_x_native"] = round(result["iteration_ms"] / native["iteration_ms"], 3)
            figures[f"job{i}_peak_resident_bytes"] = result["zico"]["peak_resident_bytes"]
            for name in ("faulted_pages", "evicted_pages", "kernels"):
                figures[f"job{i}_{name}"] = result["zico"].get(name)
            if "gpu_used_peak_bytes" in result:
                figures[f"job{i}_gpu_used_peak_bytes"] = result["gpu_used_peak_bytes"]
        equal = all(result["losses"] == native["losses"] for result in results)
        within = all(result["zico"]["peak_resident_bytes"] <= budget for result in results)
        observed = all(result["zico"].get("kernels", 0) > 0 for result in results)
        figures["equal"], figures["within_budget"] = equal, within
        if over is not None:
            figures["why"] = f"the daemon lent {over} bytes, budget {budget}"
        elif not equal:
            figures["why"] = "a job's losses differ from native's"
        elif not observed:
            figures["why"] = "a job's kernels went unseen: nothing paged them"
        elif not within:
            figures["why"] = "a job kept more pages on the GPU than the budget"
        elif most_lent == 0:
            figures["why"] = "the daemon never lent anything: the jobs did not run under it"
        else:
            figures["passed"] = True
        print(json.dumps(figures))
        return 0 if figures["passed"] else 1
    finally:
        for job in jobs:
            if job.poll() is None:
                job.kill()
        stop_daemon(daemon)


if __name__ == "__main__":
    sys.exit(main())
