#!/usr/bin/env python3
"""The dashboard, the alerting rules and docs/operations.md name only metrics
zico-umd serves, and the docs list every one it serves.

Starts a zico-umd on the simulated backend with --metrics on a free loopback
port, reads the metric families from its own exposition (HELP and TYPE are
written for every family, series or not), then checks:
  - tools/grafana/zicoum-node.json is valid JSON (python3 -m json.tool), a
    dashboard with panels, each with a title and PromQL targets, and uses the
    metrics a node's dashboard needs;
  - every zicoum_* name in the dashboard and tools/prometheus/alerts.yml is
    served (a histogram as NAME_bucket, NAME_sum, NAME_count);
  - docs/operations.md's metric tables list exactly the families served.
Usage: observability_names_test.py ZICO_UMD DASHBOARD_JSON ALERTS_YML OPERATIONS_MD
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

NAME = re.compile(r"\bzicoum_[a-z0-9_]+\b")
# What a node's dashboard must show: budget against held per job, waits,
# time-shift delays, parks.
DASHBOARD_NEEDS = ["zicoum_gpu_budget_bytes", "zicoum_job_held_bytes", "zicoum_job_wait_seconds_total",
                   "zicoum_gpu_grant_wait_seconds_bucket", "zicoum_gate_delay_seconds_bucket",
                   "zicoum_gpu_parks_total", "zicoum_gpu_deadlocks_total"]


def served_families(umd):
    """{family: type} from a fresh zico-umd's /metrics."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ZICO_")}
        env["ZICO_BACKEND"] = "sim"
        log_path = os.path.join(tmp, "umd.log")
        with open(log_path, "w") as log:
            daemon = subprocess.Popen([umd, "--socket", os.path.join(tmp, "s.sock"), "--budget", "64MiB",
                                       "--metrics", "127.0.0.1:0"], stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            port = None
            for _ in range(100):
                found = re.search(r"metrics on port (\d+)", open(log_path).read())
                if found:
                    port = int(found.group(1))
                    break
                if daemon.poll() is not None:
                    break
                time.sleep(0.1)
            if port is None:
                sys.exit("FAIL: zico-umd did not say its metrics port:\n" + open(log_path).read())
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        finally:
            daemon.terminate()
            daemon.wait(timeout=10)
    families = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            families[name] = kind
    return families


def series_names(families):
    names = set()
    for name, kind in families.items():
        names |= {name + suffix for suffix in ("_bucket", "_sum", "_count")} if kind == "histogram" else {name}
    return names


def dashboard_problems(path):
    problems = []
    tool = subprocess.run([sys.executable, "-m", "json.tool", path], capture_output=True, text=True)
    if tool.returncode != 0:
        return [f"{path} is not valid JSON: {tool.stderr.strip()}"]
    with open(path) as f:
        dashboard = json.load(f)
    for key in ("title", "uid", "panels", "templating", "schemaVersion"):
        if key not in dashboard:
            problems.append(f"{path}: no '{key}'")
    exprs = []
    for panel in dashboard.get("panels", []):
        if panel.get("type") == "row":
            continue
        if not panel.get("title"):
            problems.append(f"{path}: panel {panel.get('id')} has no title")
        targets = panel.get("targets") or []
        if not targets or not all(t.get("expr") for t in targets):
            problems.append(f"{path}: panel '{panel.get('title')}' has no PromQL target")
        exprs += [t.get("expr", "") for t in targets]
    used = set(NAME.findall("\n".join(exprs)))
    for needed in DASHBOARD_NEEDS:
        if needed not in used:
            problems.append(f"{path}: no panel shows {needed}")
    return problems


def documented(path):
    """The metric names in the tables of operations.md's Metrics section."""
    text = open(path).read()
    start = text.find("\n## Metrics")
    if start < 0:
        sys.exit(f"FAIL: {path} has no '## Metrics' section")
    end = text.find("\n## ", start + 1)
    section = text[start:end if end > 0 else len(text)]
    return {m for line in section.splitlines() if line.startswith("| `zicoum_")
            for m in NAME.findall(line.split("|")[1])}


def main(argv):
    if len(argv) != 5:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    umd, dashboard, alerts, operations = argv[1:]
    families = served_families(umd)
    if len(families) < 20:
        print(f"FAIL: zico-umd serves only {len(families)} families: {sorted(families)}")
        return 1
    served = series_names(families)
    problems = dashboard_problems(dashboard)
    for path in (dashboard, alerts):
        for name in sorted(set(NAME.findall(open(path).read()))):
            if name not in served:
                problems.append(f"{path} uses {name}, which zico-umd does not serve")
    docs = documented(operations)
    for name in sorted(set(families) - docs):
        problems.append(f"{operations}: zico-umd serves {name}, which the Metrics tables do not list")
    for name in sorted(docs - set(families)):
        problems.append(f"{operations}: the Metrics tables list {name}, which zico-umd does not serve")
    for problem in problems:
        print("FAIL:", problem)
    if problems:
        return 1
    print(f"OK: {len(families)} families served; the dashboard, the rules and the docs agree with them")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
