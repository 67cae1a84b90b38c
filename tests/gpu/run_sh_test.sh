#!/usr/bin/env bash
# The GPU suite's path without a GPU, so that it cannot rot where CI runs:
#   run_sh_test.sh [ZICO_UMCTL TRACES_DIR]
# First the calibration step as far as it goes without one: calibration.py
# turns canned probe lines (testdata/calibration_probe.log) into a calibration
# file with every model key derived as documented, which zico-umctl page
# (where given) accepts; with nvcc here, the probe itself compiles and, with
# no GPU to probe, still prints its environment line and fails the rest.
# Then tests/gpu/run.sh must exit 77 and still write its report, every step
# skipped with a reason. Where a GPU is, that part skips: run the suite itself.
set -u
here=$(cd "$(dirname "$0")" && pwd)
umctl=${1:-}
traces=${2:-}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

python3 "$here/calibration.py" "$here/testdata/calibration_probe.log" "$out/calibration.json" --meta device=H100 \
  driver=580.159.04 cuda=13.0 commit=abc1234 date=2026-12-01 >"$out/figures.json" ||
  { echo "FAIL: calibration.py on the canned probe lines exited $?"; exit 1; }
python3 - "$out/calibration.json" "$out/figures.json" <<'PY' || exit 1
import json, sys
calibration, figures = (json.load(open(path)) for path in sys.argv[1:])
assert {k: calibration[k] for k in ("device", "driver", "cuda", "commit", "date")} == {
    "device": "H100", "driver": "580.159.04", "cuda": "13.0", "commit": "abc1234", "date": "2026-12-01"}, calibration
# The canned lines were made from these figures (testdata/calibration_probe.log).
expected = {"h2d_bytes_per_s": 52e9, "d2h_bytes_per_s": 50e9, "duplex_factor": 0.9, "fault_bytes_per_s": 8e9,
            "fault_block_ns": 100000, "call_ns": 30000, "range_ns": 10000, "block_ns": 10000, "to_host_sync": 1,
            "cpu_map_block_ns": 30000, "discard_call_ns": 15000, "launch_ns": 2500, "ordered_call_waits": 1}
model = calibration["model"]
assert list(model) == list(expected), list(model)
for key, value in expected.items():
    assert abs(model[key] - value) <= 1e-6 * value, (key, model[key], value)
assert sorted(calibration["sources"]) == sorted(expected), calibration["sources"]
assert all(calibration["sources"][key].startswith("P") for key in expected), calibration["sources"]
assert figures["model"] == model and figures["missing_probes"] == [], figures
assert figures["p6_discard_revoked_by_move_to_host"] is True and figures["p6_discarded_to_host_copies"] is False
PY
# A probe that failed: the file holds what the others gave, the exit says so.
grep -v '"probe": "P5"' "$here/testdata/calibration_probe.log" >"$out/partial.log"
echo '{"probe": "P5", "error": "cudaLaunchKernel at line 1: cudaErrorLaunchTimeout"}' >>"$out/partial.log"
python3 "$here/calibration.py" "$out/partial.log" "$out/partial.json" >"$out/partial-figures.json"
status=$?
[[ $status == 1 ]] || { echo "FAIL: calibration.py with P5 failed exited $status, want 1"; exit 1; }
python3 - "$out/partial.json" "$out/partial-figures.json" <<'PY' || exit 1
import json, sys
calibration, figures = (json.load(open(path)) for path in sys.argv[1:])
assert "fault_bytes_per_s" not in calibration["model"] and "h2d_bytes_per_s" in calibration["model"], calibration
assert figures["missing_probes"] == ["P5"] and "cudaErrorLaunchTimeout" in figures["errors"]["P5"], figures
PY
if [[ -n $umctl ]]; then
  "$umctl" page --oversubscription 2 --policy zico --calibration "$out/calibration.json" \
    "$traces/resnet110.ztrace.gz" >"$out/page.txt" 2>&1 ||
    { echo "FAIL: zico-umctl page refuses the calibration file calibration.py wrote:"; cat "$out/page.txt"; exit 1; }
fi
# A model step's figures (compare_training.py --model-step) from canned runs: the names the report
# promises, the transfer bound from the calibration's rates.
echo '{"losses": ["0x1.2p+1"], "iteration_ms": 100, "peak_reserved_bytes": 8000000000}' >"$out/m_native.log"
echo '{"losses": ["0x1.2p+1"], "iteration_ms": 150, "peak_reserved_bytes": 5000000000}' >"$out/m_save_on_cpu.log"
echo '{"losses": ["0x1.2p+1"], "iteration_ms": 130, "peak_reserved_bytes": 4000000000}' >"$out/m_checkpoint.log"
# 0.52 GB in per iteration at 52 GB/s and 1.0 GB out at 50 GB/s: 20 ms, the bound 20 / 100 ms x native.
echo '{"equal": true, "iteration_x_native": 19.0, "iterations": 10, "prefetched_pages": 2000, "faulted_pages": 480,
  "evicted_pages": 23842, "within_budget": true}' >"$out/m_zico.json"
echo '{"equal": true, "iteration_x_native": 25.0, "within_budget": true}' >"$out/m_um.json"
echo '{"equal": true, "iteration_x_native": 3.0, "within_budget": true}' >"$out/m_zico_at_save_on_cpu_budget.json"
python3 "$here/compare_training.py" --model-step "$out" m "$out/calibration.json" >"$out/m.json"
python3 - "$out/m.json" <<'PY' || { echo "FAIL: compare_training.py --model-step"; cat "$out/m.json"; exit 1; }
import json, sys
f = json.load(open(sys.argv[1]))
want = {"zico_x_native": 19.0, "um_x_native": 25.0, "save_on_cpu_x_native": 1.5, "save_on_cpu_peak_bytes": 5000000000,
        "zico_at_save_on_cpu_budget_x_native": 3.0, "checkpoint_x_native": 1.3, "losses_equal": True}
assert {k: f[k] for k in want} == want, f
assert abs(f["bound_x_native"] - 1.0) < 1e-9, f  # compute-bound: the link needs less than native's 100 ms
PY
sed -i 's/"evicted_pages": 23842/"evicted_pages": 238418/' "$out/m_zico.json"  # 50 GB out: 1 s at 50 GB/s
sed -i 's/"equal": true, "iteration_x_native": 3.0/"equal": false, "iteration_x_native": 3.0/' \
  "$out/m_zico_at_save_on_cpu_budget.json"
python3 "$here/compare_training.py" --model-step "$out" m "$out/calibration.json" >"$out/m.json"
python3 - "$out/m.json" <<'PY' || { echo "FAIL: compare_training.py --model-step, link-bound"; cat "$out/m.json"; exit 1; }
import json, sys
f = json.load(open(sys.argv[1]))
assert abs(f["bound_x_native"] - 10.0) < 0.01, f["bound_x_native"]  # 238418 x 2 MiB / 10 at 50 GB/s: 1.0 s
assert f["losses_equal"] is False, f
PY

if command -v nvcc >/dev/null 2>&1; then
  nvcc -cudart shared -o "$out/um_calibration_probe" "$here/um_calibration_probe.cu" >"$out/nvcc.log" 2>&1 ||
    { echo "FAIL: tests/gpu/um_calibration_probe.cu does not compile:"; cat "$out/nvcc.log"; exit 1; }
fi

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "a GPU is here: run tests/gpu/run.sh OUTDIR itself"
  exit 77
fi
if [[ -x $out/um_calibration_probe ]]; then
  "$out/um_calibration_probe" >"$out/probe.log" 2>&1
  status=$?
  [[ $status == 2 ]] || { echo "FAIL: the probe without a GPU exited $status, want 2"; cat "$out/probe.log"; exit 1; }
  python3 "$here/calibration.py" "$out/probe.log" "$out/none.json" >"$out/none-figures.json"
  python3 - "$out/none.json" "$out/none-figures.json" <<'PY' || { cat "$out/probe.log"; exit 1; }
import json, sys
calibration, figures = (json.load(open(path)) for path in sys.argv[1:])
assert calibration["model"] == {} and figures["missing_probes"] == [f"P{i}" for i in range(1, 9)], figures
assert "setup" in figures["errors"], figures
PY
fi
bash "$here/run.sh" "$out/suite" >"$out/stdout" 2>&1
status=$?
[[ $status == 77 ]] || { echo "FAIL: run.sh exited $status, want 77"; cat "$out/stdout"; exit 1; }
python3 - "$out/suite/report.json" "$out/suite/report.md" <<'PY' || exit 1
import json, sys
report = json.load(open(sys.argv[1]))
assert report["gpu"] is None, report
names = [step["step"] for step in report["steps"]]
assert names == ["build", "calibration", "gpu_tests", "preload_kernels", "torch_training", "node_manager",
                 "suspend_resume", "um_transfer", "um_mode", "um_node", "um_gpt2", "um_resnet50", "um_unseen"], names
for step in report["steps"]:
    assert step["verdict"] == "skipped" and step["reason"], step
assert "| build | skipped |" in open(sys.argv[2]).read()
print("OK")
PY
