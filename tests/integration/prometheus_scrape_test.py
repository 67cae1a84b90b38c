#!/usr/bin/env python3
"""zico-umd's metrics as a real Prometheus sees them.

On the simulated backend: a zico-umd with --metrics on a free loopback port,
two jobs that hold memory (hold_memory, one with a name that needs escaping)
and one that asks for more than the budget (refused). Then:
  1. `promtool check metrics` on what /metrics serves: no parse error, no
     lint problem (names, units, _total, HELP and TYPE);
  2. a real Prometheus (config and storage in a temporary folder, loopback
     only, scraping every second, with tools/prometheus/alerts.yml loaded)
     scrapes it, and its HTTP API (/api/v1/query) answers with each job's
     held bytes labelled by GPU index and UUID, job id, name and uid, the
     node budget, the counters and histograms; every rule evaluates
     without error;
  3. a budget cut (zico-umctl budget set) shows in the budget series and
     raises the ZicoumBudgetCut alert;
  4. a request that times out, a suspension and a resumption are counted.
Skips (77) where the prometheus or promtool binaries are missing.
Usage: prometheus_scrape_test.py ZICO_UMD ZICO_UMCTL HOLD_MEMORY ALERTS_YML
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

MiB = 1 << 20
BUDGET = 64 * MiB
ODD_NAME = 'bert "large" \\ run'  # a quote and a backslash: both must be escaped in the exposition
UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")

processes = []  # everything started, stopped by pid at the end whatever happens


def stop_all():
    for process in reversed(processes):
        if process.poll() is None:
            process.terminate()
    for process in reversed(processes):
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def on_signal(number, _frame):
    raise SystemExit(f"FAIL: stopped by signal {number}")


def wait_for(what, probe, seconds=15):
    """Polls probe() until it returns something true; fails naming `what`."""
    deadline = time.monotonic() + seconds
    last = None
    while time.monotonic() < deadline:
        try:
            last = probe()
            if last:
                return last
        except (OSError, ValueError, KeyError, AttributeError) as error:
            last = error
        time.sleep(0.2)
    raise SystemExit(f"FAIL: {what} (after {seconds} s; last: {last!r})")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url):
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read().decode()


def query(prometheus, promql):
    """The result vector of an instant query."""
    answer = json.loads(get(f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": promql})))
    if answer.get("status") != "success":
        raise SystemExit(f"FAIL: query {promql!r}: {answer}")
    return answer["data"]["result"]


def start(command, log_path, env, stdin=None, stdout=None):
    log = open(log_path, "w")
    process = subprocess.Popen(command, stdin=stdin, stdout=stdout or log, stderr=log, env=env, text=True)
    processes.append(process)
    return process


def main(argv):
    if len(argv) != 5:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    umd, umctl, hold_memory, alerts = argv[1:]
    missing = [tool for tool in ("prometheus", "promtool") if shutil.which(tool) is None]
    if missing:
        print(f"SKIP: {' and '.join(missing)} not found on PATH "
              "(Debian: apt-get install --no-install-recommends prometheus)")
        return 77
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            return run(tmp, umd, umctl, hold_memory, alerts)
        finally:
            stop_all()


def run(tmp, umd, umctl, hold_memory, alerts):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZICO_")}
    sock = os.path.join(tmp, "umd.sock")
    env.update(ZICO_BACKEND="sim", ZICO_SOCKET=sock, ZICO_SWAP_DIR=tmp, ZICO_WAIT_TIMEOUT="5s")
    umd_log = os.path.join(tmp, "umd.log")
    start([umd, "--socket", sock, "--budget", f"{BUDGET // MiB}MiB", "--metrics", "127.0.0.1:0"], umd_log, env)
    port = int(wait_for("zico-umd says its metrics port",
                        lambda: re.search(r"metrics on port (\d+)", open(umd_log).read()).group(1)))
    wait_for("zico-umd's socket", lambda: os.path.exists(sock))
    target = f"127.0.0.1:{port}"

    # The jobs: each holds its memory until its standard input closes.
    jobs = {}
    for size, name in ((8, None), (16, ODD_NAME)):
        job_env = dict(env)
        if name is not None:
            job_env["ZICO_JOB_NAME"] = name
        job = start([hold_memory, f"{size}MiB"], os.path.join(tmp, f"hold{size}.log"), job_env,
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        if job.stdout.readline().strip() != "ready":
            raise SystemExit(f"FAIL: hold_memory {size}MiB did not get ready: " +
                             open(os.path.join(tmp, f"hold{size}.log")).read())
        jobs[name or f"hold_memory {size}MiB"] = (job, size * MiB)
    # More than the budget: refused at once, and counted.
    refused = subprocess.run([hold_memory, "128MiB"], env=env, capture_output=True, text=True, timeout=20)
    if refused.returncode != 1 or "denied" not in refused.stderr:
        raise SystemExit(f"FAIL: hold_memory 128MiB under a 64MiB budget: exit {refused.returncode}, "
                         f"stderr {refused.stderr!r}; expected exit 1 and a denial")

    # 1. promtool on the exposition, once the jobs show in it.
    exposition = wait_for("both jobs in /metrics",
                          lambda: (lambda text: text if text.count("zicoum_job_held_bytes{") == 2 else None)(
                              get(f"http://{target}/metrics")))
    with open(os.path.join(tmp, "metrics.txt"), "w") as f:
        f.write(exposition)
    lint = subprocess.run(["promtool", "check", "metrics"], input=exposition, capture_output=True, text=True)
    if lint.returncode != 0 or lint.stdout.strip() or lint.stderr.strip():
        raise SystemExit(f"FAIL: promtool check metrics (exit {lint.returncode}):\n{lint.stdout}{lint.stderr}")
    print(f"promtool check metrics: clean ({len(exposition.splitlines())} lines)")

    # 2. A real Prometheus scrapes it.
    web = free_port()
    config = os.path.join(tmp, "prometheus.yml")
    shutil.copy(alerts, os.path.join(tmp, "alerts.yml"))
    with open(config, "w") as f:
        f.write(f"""global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [alerts.yml]
scrape_configs:
  - job_name: zicoum
    static_configs:
      - targets: ['{target}']
""")
    start(["prometheus", f"--config.file={config}", f"--storage.tsdb.path={os.path.join(tmp, 'data')}",
           f"--web.listen-address=127.0.0.1:{web}", "--log.level=warn"], os.path.join(tmp, "prometheus.log"), env)
    prometheus = f"http://127.0.0.1:{web}"
    try:
        wait_for("Prometheus ready", lambda: get(f"{prometheus}/-/ready"))
        check_prometheus(prometheus, target, jobs, umctl, hold_memory, sock, env)
    except SystemExit:
        print("--- prometheus log\n" + open(os.path.join(tmp, "prometheus.log")).read())
        print("--- zico-umd log\n" + open(umd_log).read())
        raise
    print("OK")
    return 0


def check_prometheus(prometheus, target, jobs, umctl, hold_memory, sock, env):
    up = wait_for("up{job=\"zicoum\"} == 1", lambda: query(prometheus, f'up{{job="zicoum",instance="{target}"}} == 1'))
    print(f"scraped: {up[0]['metric']}")

    budget = wait_for("the node budget", lambda: query(prometheus, "zicoum_gpu_budget_bytes"))
    if len(budget) != 1:
        raise SystemExit(f"FAIL: one GPU's budget expected: {budget}")
    gpu = budget[0]["metric"]
    if gpu.get("gpu") != "0" or not UUID.match(gpu.get("uuid", "")) or gpu.get("job") != "zicoum":
        raise SystemExit(f"FAIL: budget labels {gpu}: expected gpu=\"0\", uuid=\"GPU-...\", job=\"zicoum\"")
    if float(budget[0]["value"][1]) != BUDGET:
        raise SystemExit(f"FAIL: budget {budget[0]['value'][1]}, expected {BUDGET}")

    held = wait_for("both jobs' held bytes", lambda: (lambda r: r if len(r) == 2 else None)(
        query(prometheus, "zicoum_job_held_bytes")))
    job_ids = set()
    for series in held:
        labels = series["metric"]
        name = labels.get("job_name")
        if name not in jobs:
            raise SystemExit(f"FAIL: job_name {name!r} is none of {sorted(jobs)}: {labels}")
        process, size = jobs[name]
        expected = {"gpu": "0", "uuid": gpu["uuid"], "uid": str(os.getuid()), "pid": str(process.pid),
                    "job": "zicoum", "instance": target}
        wrong = {k: (labels.get(k), v) for k, v in expected.items() if labels.get(k) != v}
        if wrong or not labels.get("job_id", "").isdigit():
            raise SystemExit(f"FAIL: {name}: labels {labels}; wrong (got, expected): {wrong}")
        if not size <= float(series["value"][1]) < size + 4 * MiB:
            raise SystemExit(f"FAIL: {name} holds {series['value'][1]} bytes, expected {size} (+ chunk rounding)")
        job_ids.add(labels["job_id"])
    if len(job_ids) != 2:
        raise SystemExit(f"FAIL: the jobs share a job_id: {held}")
    print("held per job: " + ", ".join(f"{s['metric']['job_name']}={s['value'][1]}" for s in held))

    # What the node lends is what the jobs hold; the events and histograms are there.
    checks = {
        "sum(zicoum_job_held_bytes) == on() sum(zicoum_gpu_granted_bytes)": "the jobs' held bytes add up to granted",
        "zicoum_gpu_denials_total >= 1": "the refused request counted",
        "zicoum_gpu_grants_total >= 2": "both jobs' grants counted",
        "zicoum_gpu_grant_wait_seconds_count >= 2": "grant waits observed",
        "histogram_quantile(0.5, zicoum_gpu_grant_wait_seconds_bucket) >= 0": "a grant wait quantile from the buckets",
        "zicoum_gate_delay_seconds_count >= 1": "iteration gates observed",
        "zicoum_jobs == 2": "two jobs",
        "zicoum_job_suspended == 0": "nobody suspended",
    }
    for promql, what in checks.items():
        wait_for(f"{what} ({promql})", lambda: query(prometheus, promql))

    # Every rule of alerts.yml evaluates against the real series.
    def rules_evaluated():
        groups = json.loads(get(f"{prometheus}/api/v1/rules"))["data"]["groups"]
        rules = [rule for group in groups for rule in group["rules"]]
        if not rules or any(rule.get("health") == "unknown" for rule in rules):
            return None
        return rules
    rules = wait_for("the alerting rules evaluated", rules_evaluated)
    broken = [(rule["name"], rule.get("lastError")) for rule in rules if rule.get("health") != "ok"]
    if broken:
        raise SystemExit(f"FAIL: rules that do not evaluate: {broken}")
    print(f"{len(rules)} alerting rules evaluate")

    # 3. A budget cut: the series follows, and the alert fires.
    cut = subprocess.run([umctl, "budget", "set", "48MiB", "--socket", sock], env=env, capture_output=True, text=True,
                         timeout=10)
    if cut.returncode != 0:
        raise SystemExit(f"FAIL: zico-umctl budget set 48MiB: exit {cut.returncode}: {cut.stderr}")
    wait_for("the budget series at 48 MiB", lambda: query(prometheus, f"zicoum_gpu_budget_bytes == {48 * MiB}"))

    def budget_cut_alert():
        alerts = json.loads(get(f"{prometheus}/api/v1/alerts"))["data"]["alerts"]
        return [a for a in alerts if a["labels"].get("alertname") == "ZicoumBudgetCut" and a["state"] == "firing"
                and a["labels"].get("gpu") == "0" and a["labels"].get("uuid") == gpu["uuid"]]
    wait_for("ZicoumBudgetCut firing for GPU 0", budget_cut_alert)
    print("budget cut: series and alert follow")

    # 4. The events operators alert on, from the daemon's own counting: a
    #    request that waits out its job's timeout (24 MiB held, 32 MiB more do
    #    not fit in 48 MiB and nothing is idle to reclaim), a suspension and a
    #    resumption.
    timeout_env = dict(env, ZICO_WAIT_TIMEOUT="1s")
    waited = subprocess.run([hold_memory, "32MiB"], env=timeout_env, capture_output=True, text=True, timeout=20)
    if waited.returncode != 1 or "waited" not in waited.stderr:
        raise SystemExit(f"FAIL: hold_memory 32MiB beside 24 MiB under 48 MiB: exit {waited.returncode}, "
                         f"stderr {waited.stderr!r}; expected exit 1 after waiting 1 s")
    wait_for("the timeout counted", lambda: query(prometheus, "zicoum_gpu_request_timeouts_total >= 1"))
    wait_for("the holders asked for idle memory", lambda: query(prometheus, "zicoum_gpu_reclaims_total >= 1"))
    victim = held[0]["metric"]["job_id"]
    for command in (["suspend", victim, "--to", "host"], ["resume", victim]):
        done = subprocess.run([umctl, *command, "--socket", sock], env=env, capture_output=True, text=True, timeout=20)
        if done.returncode != 0:
            raise SystemExit(f"FAIL: zico-umctl {' '.join(command)}: exit {done.returncode}: {done.stderr}")
        if command[0] == "suspend":
            wait_for("the suspended job shows", lambda: query(
                prometheus, f'zicoum_job_suspended{{job_id="{victim}"}} == 1 and on() zicoum_suspends_total == 1'))
    wait_for("the resumption counted", lambda: query(prometheus, "zicoum_resumes_total == 1"))
    wait_for("the job runs again", lambda: query(prometheus, f'zicoum_job_suspended{{job_id="{victim}"}} == 0'))
    print("timeout, reclaim, suspend and resume counted")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
