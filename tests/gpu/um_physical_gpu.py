#!/usr/bin/env python3
"""What a UM job's budget leaves to other processes on a real GPU (the GPU suite's um_physical step).

    um_physical_gpu.py BIN_DIR NATIVE_LOG BUDGET_BYTES OUTDIR

Starts zico-umd holding BUDGET_BYTES (about half the MLP's native peak, so that the job pages at
about half its peak), then runs torch_training.py's MLP under zico-run --mode um twice, as many
iterations as NATIVE_LOG's run: alone, then beside a plain process (plain_process_probe.py:
PyTorch, not under zicoum) that, once the job starts iteration 2 (its steady state), reads
cudaMemGetInfo and cudaMallocs what the budget leaves to it, the device's total less the budget
and the contexts' memory, and holds it until the job ends (it exits then). NVML's memory in use on the device
(nvml_poll.py) is polled all along.

The contexts' memory (contexts_bytes) is NVML's memory in use once the plain process has its
context (the daemon's, any other process's and the driver's own included), plus the job's own
memory as NVML counts it per process at iteration 2 (its context and loaded kernels: NVML's
per-process figure leaves unified memory out); where NVML lists no processes (a PID namespace),
one bare context, the plain process's, stands in for the job's. The free memory expected
(expected_free_bytes) is cudaMemGetInfo's total less the budget, less what cudaMemGetInfo counted
in use once the plain process had its context, less the job's own memory. NVML's peak
(nvml_peak_bytes) is over the run beside the plain process, without the samples taken while its
allocation was under way, and less its allocation while it held it.

Passes when the plain process saw that much free (other_free_bytes >= expected_free_bytes), got
it (other_alloc_ok), the job ran at most 1.10x its iteration time alone beside it (um_slowdown),
the device never held more than the budget and the contexts (nvml_peak_bytes <= node_budget_bytes
+ contexts_bytes), and both runs' losses are bitwise equal to NATIVE_LOG's (losses_equal).
Prints one JSON line: those figures, each run's iteration time and pager counts, and `why`,
naming every check that failed. Exit 0 when it passed, 1 when not, 2 for a usage error. Every
process it starts has a time limit and is ended on every way out. Logs land in OUTDIR
(umd_physical.log, um_physical_alone.log, um_physical_beside.log, um_physical_other.log).

With ZICO_UM_MEMORY=swap in its environment the job's pages are swapped explicitly (device memory
given back as pages leave) instead of managed, and every log is named um_physical_swap_* (the
daemon's umd_physical_swap.log): the GPU suite's um_physical_swap step.
"""
import json
import os
import select
import signal
import subprocess
import sys
import time
import traceback

import nvml_poll
from um_node_gpu import last_json, start_daemon, stop_daemon, um_job

HERE = os.path.dirname(os.path.abspath(__file__))
BLOCK = 2 << 20
STEADY_ITERATION = 2     # iterations 0 and 1 done: the pager has seen the iteration, every page has been in use
MAX_SLOWDOWN = 1.10
DEADLINE_S = 150         # the whole script, its way out aside: the suite's step limit is 180 s
JOB_LIMIT_S = 75         # one UM run of the MLP takes about 25 s on an H100
READY_LIMIT_S = 60       # PyTorch's import and a context
REPLY_LIMIT_S = 30       # one cudaMalloc, which may have to take memory back from unified memory
# The step's name, and its logs': the job's pages swapped (ZICO_UM_MEMORY=swap, passed on to the
# jobs with the rest of the environment) or managed.
STEP = "um_physical_swap" if os.environ.get("ZICO_UM_MEMORY") == "swap" else "um_physical"


class Failed(Exception):
    """Ends the measurement early: its text is the figures' `why`."""


class Clock:
    def __init__(self, seconds):
        self._end = time.monotonic() + seconds

    def limit(self, seconds):
        """`seconds`, or what is left of the whole script's time if less."""
        return max(0.0, min(seconds, self._end - time.monotonic()))


class Plain:
    """plain_process_probe.py, its JSON lines read with a time limit and echoed to its log."""

    def __init__(self, log):
        env = {key: value for key, value in os.environ.items()
               if not key.startswith("ZICO_") and key not in ("LD_PRELOAD", "PYTORCH_CUDA_ALLOC_CONF")}
        self._log = log
        self._pending = b""
        self.process = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "plain_process_probe.py"), "--deadline", str(DEADLINE_S)],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, bufsize=0)

    def send(self, command):
        try:
            self.process.stdin.write(command.encode() + b"\n")
        except OSError as error:
            raise Failed(f"the plain process took no command ({error}): see {STEP}_other.log") from error

    def reply(self, seconds):
        """Its next JSON line, or Failed once `seconds` pass or it exits."""
        end = time.monotonic() + seconds
        while b"\n" not in self._pending:
            left = end - time.monotonic()
            ready = select.select([self.process.stdout], [], [], left)[0] if left > 0 else []
            if not ready:
                raise Failed(f"the plain process said nothing for {seconds:.0f} s: see {STEP}_other.log")
            chunk = os.read(self.process.stdout.fileno(), 4096)
            if not chunk:
                raise Failed(f"the plain process exited ({self.process.wait()}): see {STEP}_other.log")
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        self._log.write(line + b"\n")
        self._log.flush()
        try:
            return json.loads(line)
        except ValueError as error:
            raise Failed(f"the plain process printed '{line[:100]!r}': see {STEP}_other.log") from error

    def end(self):
        if self.process.poll() is None:
            try:
                self.process.stdin.close()
                self.process.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()


def run_job(bin_dir, socket, iterations, out, run, clock, on_line=None):
    """One UM run of the MLP under the daemon, its output in OUTDIR/STEP_RUN.log:
    (result line, began, ended), or Failed. `on_line` is called with each new line of its output
    while it runs."""
    name = f"{STEP}_{run}.log"
    log_path = os.path.join(out, name)
    command, env = um_job(bin_dir, socket, iterations, "--announce-iterations")
    job = None
    try:
        with open(log_path, "wb") as log:
            job = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        began, seen = time.monotonic(), 0
        limit = clock.limit(JOB_LIMIT_S)
        while job.poll() is None:
            if time.monotonic() - began > limit:
                raise Failed(f"the job {run} ran past {limit:.0f} s: see {name}")
            if on_line is not None:
                with open(log_path, "rb") as log:
                    log.seek(seen)
                    text = log.read()
                complete = text.rfind(b"\n") + 1
                seen += complete
                for line in text[:complete].decode(errors="replace").splitlines():
                    on_line(line)
            time.sleep(0.02)
    finally:
        if job is not None and job.poll() is None:
            job.kill()
            job.wait()
    ended = time.monotonic()
    with open(log_path, errors="replace") as log:
        result = last_json(log.read())
    if job.returncode != 0 or result is None:
        raise Failed(f"the job {run} failed (exit {job.returncode}): see {name}")
    return result, began, ended


# The step's verdict: (check, the figures it reads, whether they pass it).
CHECKS = (
    ("other_free_bytes >= expected_free_bytes", ("other_free_bytes", "expected_free_bytes"),
     lambda f: f["other_free_bytes"] >= f["expected_free_bytes"]),
    ("other_alloc_ok", ("other_alloc_ok",), lambda f: f["other_alloc_ok"] is True),
    (f"um_slowdown <= {MAX_SLOWDOWN:.2f}", ("um_slowdown",), lambda f: f["um_slowdown"] <= MAX_SLOWDOWN),
    ("nvml_peak_bytes <= node_budget_bytes + contexts_bytes",
     ("nvml_peak_bytes", "node_budget_bytes", "contexts_bytes"),
     lambda f: f["nvml_peak_bytes"] <= f["node_budget_bytes"] + f["contexts_bytes"]),
    ("losses_equal", ("losses_equal",), lambda f: f["losses_equal"] is True),
)


def verdict(figures):
    """Sets figures' `passed`, and `why`: what ended the measurement early, if anything, then
    every check that failed with the figures it read (a figure never measured fails its check)."""
    reasons = [figures["why"]] if "why" in figures else []
    for check, names, passes in CHECKS:
        missing = [name for name in names if figures.get(name) is None]
        if missing:
            reasons.append(f"{check} failed (not measured: {', '.join(missing)})")
        elif not passes(figures):
            shown = ", ".join(f"{name} {figures[name]}" for name in names)
            if "other_error" in figures and check == "other_alloc_ok":
                shown += f", other_error {figures['other_error']}"
            reasons.append(f"{check} failed ({shown})")
    figures["passed"] = not reasons
    if reasons:
        figures["why"] = "; ".join(reasons)
    return figures


def pager_figures(figures, run, result, native):
    figures[f"{run}_iteration_ms"] = round(result["iteration_ms"], 3)
    figures[f"{run}_iteration_x_native"] = round(result["iteration_ms"] / native["iteration_ms"], 3)
    zico = result.get("zico") or {}
    for name in ("peak_resident_bytes", "faulted_pages", "prefetched_pages", "evicted_pages", "kernels"):
        figures[f"{run}_{name}"] = zico.get(name)


def measure(bin_dir, native, budget, out, figures, clock, started):
    """Fills `figures`; raises Failed where a run could not be measured. `started` collects what
    to end on the way out."""
    iterations = len(native["losses"])
    poll = nvml_poll.NvmlPoll()
    started.append(poll)
    poll.start()
    figures["nvml_source"] = poll.source
    socket = os.path.join(out, f"umd_{STEP[3:]}.sock")
    daemon, why = start_daemon(bin_dir, socket, budget, os.path.join(out, f"umd_{STEP[3:]}.log"))
    started.append(daemon)
    if why is not None:
        raise Failed(why)
    figures["nvml_idle_bytes"] = poll.used_now()

    # Alone.
    alone, began, ended = run_job(bin_dir, socket, iterations, out, "alone", clock)
    pager_figures(figures, "alone", alone, native)
    inside = [used for _, _, used in poll.window(began, ended)]
    figures["nvml_peak_alone_bytes"] = max(inside) if inside else None

    # Beside the plain process.
    other_log = open(os.path.join(out, f"{STEP}_other.log"), "wb")
    started.append(other_log)
    plain = Plain(other_log)
    started.append(plain)
    ready = plain.reply(clock.limit(READY_LIMIT_S))
    if not ready.get("ready") or not isinstance(ready.get("total_bytes"), int) \
            or not isinstance(ready.get("free_bytes"), int):
        raise Failed(f"the plain process did not start as expected: {ready}")
    figures["total_bytes"] = ready["total_bytes"]
    figures["cuda_used_at_ready_bytes"] = ready["total_bytes"] - ready["free_bytes"]
    figures["nvml_used_at_ready_bytes"] = poll.used_now()
    at_ready = poll.processes_now()
    asked = {}

    def on_line(line):
        if line.strip() != f"iteration {STEADY_ITERATION}" or asked:
            return
        job = {pid: own for pid, own in poll.processes_now().items() if pid not in at_ready and own is not None}
        asked["job_pids"] = list(job)
        if job:
            figures["job_own_bytes"], figures["contexts_from"] = sum(job.values()), "NVML per process"
        else:
            figures["job_own_bytes"] = figures["nvml_used_at_ready_bytes"] - figures["nvml_idle_bytes"]
            figures["contexts_from"] = "NVML lists no process of the job: the plain process's bare context"
        figures["contexts_bytes"] = figures["nvml_used_at_ready_bytes"] + figures["job_own_bytes"]
        figures["expected_free_bytes"] = (figures["total_bytes"] - budget - figures["cuda_used_at_ready_bytes"]
                                          - figures["job_own_bytes"])
        size = figures["expected_free_bytes"] // BLOCK * BLOCK
        asked["began"] = time.monotonic()
        if size <= 0:
            asked["reply"] = {"alloc_ok": False, "error": f"nothing to ask for: {size} bytes"}
        else:
            plain.send(f"alloc {size}")
            asked["reply"] = plain.reply(clock.limit(REPLY_LIMIT_S))
        asked["ended"] = time.monotonic()

    beside, began, ended = run_job(bin_dir, socket, iterations, out, "beside", clock, on_line)
    pager_figures(figures, "beside", beside, native)
    if not asked:
        raise Failed(f"the job ended before announcing iteration {STEADY_ITERATION}: see {STEP}_beside.log")
    reply = asked["reply"]
    for name in ("free_bytes", "alloc_bytes", "alloc_ok", "alloc_ms", "free_after_alloc_bytes", "error"):
        if name in reply:
            figures[f"other_{name}"] = reply[name]
    held = reply["alloc_bytes"] if reply.get("alloc_ok") else 0
    peaks = [poll.process_peaks.get(pid) for pid in asked["job_pids"]]
    figures["job_own_peak_bytes"] = sum(peak for peak in peaks if peak is not None) if peaks else None

    # NVML's peak beside it: what the job and the contexts held, the plain process's allocation aside.
    before, while_held = [], []
    for start, end, used in poll.window(began, ended):
        if end < asked["began"]:
            before.append(used)
        elif start > asked["ended"]:
            while_held.append(used - held)
    figures["nvml_peak_before_alloc_bytes"] = max(before) if before else None
    figures["nvml_peak_while_held_bytes"] = max(while_held) if while_held else None
    peaks = before + while_held
    figures["nvml_peak_bytes"] = max(peaks) if peaks else None
    figures["nvml_samples"] = len(peaks)
    if poll.errors:
        figures["nvml_errors"] = f"{poll.errors}, the last: {poll.last_error}"

    figures["um_slowdown"] = round(beside["iteration_ms"] / alone["iteration_ms"], 3)
    figures["losses_equal"] = alone["losses"] == native["losses"] and beside["losses"] == native["losses"]


def usage(message):
    print(f"um_physical_gpu.py: {message}\n{__doc__.splitlines()[2].strip()}", file=sys.stderr)
    print(json.dumps({"passed": False, "why": f"usage: {message}"}))
    return 2


def main(argv):
    if len(argv) != 5:
        return usage(f"4 arguments wanted, {len(argv) - 1} given")
    bin_dir, native_log, budget_text, out = argv[1:]
    for tool in ("zico-umd", "zico-run"):
        if not os.access(os.path.join(bin_dir, tool), os.X_OK):
            return usage(f"BIN_DIR '{bin_dir}' holds no executable {tool}")
    try:
        budget = int(budget_text)
    except ValueError:
        return usage(f"BUDGET_BYTES '{budget_text}' is not a whole number of bytes")
    if budget <= 0:
        return usage(f"BUDGET_BYTES {budget} is not above 0")
    if not os.path.isdir(out):
        return usage(f"OUTDIR '{out}' is not a folder")
    try:
        with open(native_log, errors="replace") as log:
            native = last_json(log.read())
    except (OSError, ValueError) as error:
        return usage(f"NATIVE_LOG '{native_log}': {error}")
    if not native or not native.get("losses") or not native.get("iteration_ms"):
        return usage(f"NATIVE_LOG '{native_log}' holds no result line with losses and iteration_ms")
    if len(native["losses"]) < STEADY_ITERATION + 3:
        return usage(f"NATIVE_LOG '{native_log}' ran {len(native['losses'])} iterations: "
                     f"at least {STEADY_ITERATION + 3} wanted")

    # Stopped by the suite's step limit: end what runs too (the finally below), and say so.
    def stopped(*_):
        raise Failed("stopped by SIGTERM (the suite's step limit)")

    signal.signal(signal.SIGTERM, stopped)
    figures = {"node_budget_bytes": budget, "iterations": len(native["losses"]),
               "native_iteration_ms": round(native["iteration_ms"], 3)}
    started = []
    try:
        measure(bin_dir, native, budget, out, figures, Clock(DEADLINE_S), started)
    except Failed as error:
        figures["why"] = str(error)
    except nvml_poll.NvmlUnavailable as error:
        figures["why"] = f"NVML cannot be read: {error}"
    except Exception as error:  # noqa: BLE001 - a figure's line still comes out, the cause named
        traceback.print_exc()
        figures["why"] = f"um_physical_gpu.py failed: {type(error).__name__}: {error}"
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the way out runs to its end (the suite kills after 10 s)
        for thing in reversed(started):
            if isinstance(thing, Plain):
                thing.end()
            elif isinstance(thing, subprocess.Popen):
                stop_daemon(thing)
            elif isinstance(thing, nvml_poll.NvmlPoll):
                thing.stop()
            else:
                thing.close()
    print(json.dumps(verdict(figures)))
    return 0 if figures["passed"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
