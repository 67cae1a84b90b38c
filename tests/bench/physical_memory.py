#!/usr/bin/env python3
"""What a UM job under zico-umd holds of the device, beside VMM jobs, live on SimDriver.

    physical_memory.py BUILD_DIR [--memory managed|swap] [--trace T] [--capacity MiB] [--budget MiB]
                       [--iterations N] [--vmm-jobs N] [--json] [--check]

Every process (zico-umd, the jobs) shares one simulated device through a board file
(ZICO_SIM_DEVICE_BOARD), which models what a GPU under the UVM driver does with memory: a managed
page the pager sends to the host keeps its device memory (unused) until an allocation that finds
the device full takes it (umm/sim_managed.h, umm/sim_device_board.h). A UM job (trace_job --ops
under zico-run --mode um, capped at half its peak with ZICO_BUDGET, its arena as --memory says:
ZICO_UM_MEMORY) runs under zico-umd holding --budget of a --capacity device, first alone, then
beside --vmm-jobs VMM jobs (hold_memory) that borrow the rest of the budget once the UM job holds what it
will hold (managed: the high-water mark of its pages; swap: its cap). The device's memory in use
is read from the board every 5 ms. Printed per run: the UM job's steady iteration time (modelled
clock), the device's peak use against the node budget and the capacity, and whether the VMM job
got its memory.

--check exits 1 unless what the model promises holds:
  managed (the CTest um_kept_memory): alone, the device reports at least the UM job's peak in use
    (its evicted pages keep their memory); beside, the VMM job gets its memory (taken from the UM
    job's kept memory where the device has no more) and the device never holds more than its
    capacity;
  swap (the CTest physical_budget): the VMM job gets its memory, the device never holds more than
    the node budget nor its capacity at any sample, alone or beside, and the UM job beside runs
    within 10 % of its time alone.

The board's layout is sim_device_board.cpp's Table: u64 magic, then 256 slots of (u64 owner, then
64 devices x (held, unused, taken, managed) u64).
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
import threading
import time

from trace_job_result import result_fields

SLOTS, DEVICES = 256, 64
SLOT_BYTES = 8 + DEVICES * 32
MIB = 1 << 20


def exited(pid):
    """Whether `pid` has exited and awaits its parent (a zombie): its memory is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rpartition(")")[2].split()
    except OSError:
        return False
    return bool(state) and state[0] in ("Z", "X")


def device_used(board_path):
    """Device 0's memory held by every live slot, as a driver on the board would count it."""
    try:
        with open(board_path, "rb") as f:
            data = f.read()
    except OSError:
        return 0
    used = 0
    for slot in range(SLOTS):
        base = 8 + slot * SLOT_BYTES
        if base + SLOT_BYTES > len(data):
            break
        owner, held, _unused, taken = struct.unpack_from("<4Q", data, base)
        if owner == 0:
            continue
        pid = owner >> 24
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        except PermissionError:
            pass
        if exited(pid):
            continue
        used += max(held - taken, 0)
    return used


class Sampler(threading.Thread):
    def __init__(self, board_path):
        super().__init__(daemon=True)
        self.board_path, self.peak, self.stop = board_path, 0, threading.Event()

    def run(self):
        while not self.stop.is_set():
            self.peak = max(self.peak, device_used(self.board_path))
            time.sleep(0.005)


def peak_bytes(build, trace, scale):
    """The trace's peak of allocated bytes at `scale`, from a run with no budget and no daemon."""
    env = dict(os.environ, ZICO_BACKEND="sim", ZICO_SOCKET="off")
    run = subprocess.run([os.path.join(build, "bin", "zico-run"), "--backend", "sim", "--mode", "um", "--",
                          os.path.join(build, "bin", "trace_job"), "--ops", "--trace", trace, "--iterations", "2",
                          "--memory-scale", scale], env=env, capture_output=True, text=True, timeout=300)
    if run.returncode != 0:
        raise SystemExit(f"physical_memory: the sizing run failed (exit {run.returncode}):\n{run.stderr}")
    return int(result_fields(run.stdout, "physical_memory")["peak_allocated_bytes"])


def run_once(build, args, um_budget, um_peak_bytes, beside):
    with tempfile.TemporaryDirectory() as tmp:
        board = os.path.join(tmp, "device.board")
        socket = os.path.join(tmp, "umd.sock")
        env = dict(os.environ, ZICO_BACKEND="sim", ZICO_SIM_DEVICE_BOARD=board,
                   ZICO_SIM_CAPACITY=f"{args.capacity}MiB")
        daemon_log = open(os.path.join(tmp, "umd.log"), "w+")
        daemon = subprocess.Popen([os.path.join(build, "bin", "zico-umd"), "--socket", socket, "--budget",
                                   f"{args.budget}MiB"], env=env, stdout=subprocess.DEVNULL, stderr=daemon_log)
        sampler = Sampler(board)
        um = None
        holds = []
        try:
            for _ in range(200):
                if os.path.exists(socket):
                    break
                if daemon.poll() is not None:
                    daemon_log.seek(0)
                    raise SystemExit("physical_memory: zico-umd did not start:\n" + daemon_log.read())
                time.sleep(0.02)
            else:
                raise SystemExit("physical_memory: zico-umd did not create its socket")
            sampler.start()
            job_env = dict(env, ZICO_SOCKET=socket, ZICO_BUDGET=str(um_budget), ZICO_LOG="info",
                           ZICO_UM_MEMORY=args.memory)
            um = subprocess.Popen([os.path.join(build, "bin", "zico-run"), "--backend", "sim", "--mode", "um", "--",
                                   os.path.join(build, "bin", "trace_job"), "--ops", "--trace", args.trace,
                                   "--iterations", str(args.iterations), "--memory-scale", args.scale,
                                   "--time-scale", "10"],
                                  env=job_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            hold_ok = None
            if beside:
                # Once the UM job holds what it will hold in its steady state: managed, its
                # high-water mark of the device (the pages it sent to the host keep their memory);
                # swapped, its cap.
                steady = um_peak_bytes if args.memory == "managed" else um_budget
                while um.poll() is None and device_used(board) < steady:
                    time.sleep(0.005)
                if um.poll() is not None:
                    raise SystemExit("physical_memory: the UM job ended before it held what it holds in its "
                                     "steady state: raise --iterations")
                # The rest of the budget, split between the VMM jobs in whole chunks.
                rest = args.budget * MIB - um_budget
                shares = [rest // args.vmm_jobs // (2 * MIB) * (2 * MIB)] * args.vmm_jobs
                shares[-1] += rest - sum(shares)
                holds = [subprocess.Popen([os.path.join(build, "bin", "hold_memory"), str(share)],
                                          env=dict(env, ZICO_SOCKET=socket), stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                         for share in shares]
                hold_ok = True
                for hold in holds:
                    line = hold.stdout.readline()
                    while line and line.strip() != "ready":
                        line = hold.stdout.readline()
                    hold_ok = hold_ok and line.strip() == "ready"
            out, err = um.communicate(timeout=600)
            if um.returncode != 0:
                raise SystemExit(f"physical_memory: the UM job failed (exit {um.returncode}):\n{err}")
            fields = result_fields(out, "physical_memory: the UM job")
            hold_error = ""
            if holds:
                if hold_ok:
                    for hold in holds:
                        hold.stdin.close()
                    hold_ok = all(hold.wait(timeout=30) == 0 for hold in holds)
                if not hold_ok:
                    for hold in holds:
                        if hold.poll() is None:
                            hold.kill()
                    daemon_log.seek(0)
                    hold_error = ("\n".join(hold.communicate(timeout=30)[1].strip()[-1000:] for hold in holds) +
                                  "\nzico-umd: " + daemon_log.read().strip()[-2000:])
            return {
                "beside_vmm_job": beside,
                "um_iter_s": float(fields["mean_iter_s"]),
                "um_peak_allocated_bytes": int(fields["peak_allocated_bytes"]),
                "um_budget_bytes": um_budget,
                "device_peak_used_bytes": sampler.peak,
                "node_budget_bytes": args.budget * MIB,
                "capacity_bytes": args.capacity * MIB,
                "vmm_jobs": len(holds),
                "vmm_job_ok": hold_ok,
                "vmm_job_error": hold_error,
            }
        finally:
            sampler.stop.set()
            for process in holds + [um]:
                if process is not None and process.poll() is None:
                    process.kill()
                    process.wait()
            daemon.terminate()
            daemon.wait(timeout=10)
            daemon_log.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("build")
    parser.add_argument("--memory", choices=("managed", "swap"), default="managed",
                        help="the UM job's arena (ZICO_UM_MEMORY; default managed)")
    parser.add_argument("--trace", default=None, help="default: tools/traces/bert_base.ztrace.gz")
    parser.add_argument("--scale", default="1/64", help="the trace's memory scale (default 1/64)")
    parser.add_argument("--capacity", type=int, default=256, help="the simulated device, MiB (default 256)")
    parser.add_argument("--budget", type=int, default=256, help="zico-umd's node budget, MiB (default 256)")
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--vmm-jobs", type=int, default=1, help="VMM jobs that share the rest of the budget")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--check", action="store_true", help="exit 1 unless the model's promises hold")
    args = parser.parse_args()
    if args.trace is None:
        args.trace = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "traces",
                                  "bert_base.ztrace.gz")
    for name in ("capacity", "budget", "iterations", "vmm_jobs"):
        if getattr(args, name) <= 0:
            raise SystemExit(f"physical_memory: --{name.replace('_', '-')} {getattr(args, name)}: expected a positive "
                             "integer")
    if args.budget > args.capacity:
        raise SystemExit(f"physical_memory: --budget {args.budget} is more than --capacity {args.capacity}")
    peak = peak_bytes(args.build, args.trace, args.scale)
    um_budget = peak // 2 // (2 * MIB) * (2 * MIB)
    if um_budget >= args.budget * MIB:
        raise SystemExit(f"physical_memory: half the UM job's peak ({um_budget} bytes) leaves nothing of --budget "
                         f"{args.budget} MiB for the VMM job: raise --budget or lower --scale")
    runs = [run_once(args.build, args, um_budget, peak, beside) for beside in (False, True)]
    runs[1]["um_slowdown"] = round(runs[1]["um_iter_s"] / runs[0]["um_iter_s"], 3)
    for r in runs:
        r["um_memory"] = args.memory
    failures = []
    if args.memory == "managed" and runs[0]["device_peak_used_bytes"] < runs[0]["um_peak_allocated_bytes"]:
        failures.append(f"alone, the device's peak use ({runs[0]['device_peak_used_bytes']}) is below the UM job's "
                        f"peak ({runs[0]['um_peak_allocated_bytes']}): evicted pages lost their memory")
    if not runs[1]["vmm_job_ok"]:
        failures.append("the VMM job did not get the memory the budget leaves it: " + runs[1]["vmm_job_error"])
    for r in runs:
        where = "beside the VMM job" if r["beside_vmm_job"] else "alone"
        if r["device_peak_used_bytes"] > r["capacity_bytes"]:
            failures.append(f"{where}, the device held {r['device_peak_used_bytes']} bytes, above its capacity "
                            f"{r['capacity_bytes']}")
        if args.memory == "swap" and r["device_peak_used_bytes"] > r["node_budget_bytes"]:
            failures.append(f"{where}, the device held {r['device_peak_used_bytes']} bytes, above the node budget "
                            f"{r['node_budget_bytes']}")
    if args.memory == "swap" and not 0.9 <= runs[1]["um_slowdown"] <= 1.1:
        failures.append(f"the UM job beside the VMM job took {runs[1]['um_slowdown']}x its time alone "
                        "(accepted: within 10 %)")
    if args.json:
        print(json.dumps(runs))
    else:
        for r in runs:
            print(f"{'beside VMM jobs' if r['beside_vmm_job'] else 'alone':15s} UM iteration "
                  f"{r['um_iter_s'] * 1e3:7.1f} ms, device peak {r['device_peak_used_bytes'] / MIB:6.1f} MiB (node budget "
                  f"{args.budget} MiB, capacity {args.capacity} MiB; the UM job's cap {um_budget / MIB:.0f} MiB of its "
                  f"{r['um_peak_allocated_bytes'] / MIB:.0f} MiB peak)"
                  + (f", {r['vmm_jobs']} VMM job(s) {'got' if r['vmm_job_ok'] else 'did NOT get'} "
                     f"{(args.budget * MIB - um_budget) / MIB:.0f} MiB" if r["beside_vmm_job"] else ""))
        print(f"UM job beside the VMM job(s): {runs[1]['um_slowdown']:.3f}x its time alone")
    for failure in failures:
        print(f"FAIL: {failure}", file=sys.stderr)
    return 1 if args.check and failures else 0


if __name__ == "__main__":
    sys.exit(main())
