#!/usr/bin/env bash
# The GPU suite's path without a GPU, so that it cannot rot where CI runs:
# tests/gpu/run.sh must exit 77 and still write its report, every step
# skipped with a reason. Where a GPU is, this skips: run the suite itself.
set -u
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "a GPU is here: run tests/gpu/run.sh OUTDIR itself"
  exit 77
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
bash "$(dirname "$0")/run.sh" "$out" >"$out/stdout" 2>&1
status=$?
[[ $status == 77 ]] || { echo "FAIL: run.sh exited $status, want 77"; cat "$out/stdout"; exit 1; }
python3 - "$out/report.json" "$out/report.md" <<'PY' || exit 1
import json, sys
report = json.load(open(sys.argv[1]))
assert report["gpu"] is None, report
names = [step["step"] for step in report["steps"]]
assert names == ["build", "gpu_tests", "preload_kernels", "torch_training", "node_manager", "suspend_resume",
                 "um_transfer", "um_mode", "um_node", "um_gpt2", "um_resnet50", "um_unseen"], names
for step in report["steps"]:
    assert step["verdict"] == "skipped" and step["reason"], step
assert "| build | skipped |" in open(sys.argv[2]).read()
print("OK")
PY
