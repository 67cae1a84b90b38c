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
            "cpu_map_block_ns": 30000, "discard_call_ns": 15000, "launch_ns": 2500, "ordered_call_waits": 1,
            "chunk_create_ns": 30000, "chunk_map_ns": 20000, "chunk_access_ns": 60000, "chunk_unmap_ns": 45000,
            "chunk_release_ns": 25000}
model = calibration["model"]
assert list(model) == list(expected), list(model)
for key, value in expected.items():
    assert abs(model[key] - value) <= 1e-6 * value, (key, model[key], value)
assert sorted(calibration["sources"]) == sorted(expected), calibration["sources"]
assert all(calibration["sources"][key].startswith("P") for key in expected), calibration["sources"]
assert figures["model"] == model and figures["missing_probes"] == [], figures
assert figures["p6_discard_revoked_by_move_to_host"] is True and figures["p6_discarded_to_host_copies"] is False
# P8: freeing the allocation beyond free memory left 3/4 of the 1 GiB arena free, and so the owner saw
# it too; bringing the arena back took twice what P2's rate says (41.3 ms for 1 GiB at 52 GB/s: 20.6 ms).
assert figures["p8_free_after_beyond_bytes"] == 84805306368 and figures["p8_squeeze_gain_mib"] == 768, figures
assert figures["p8_free_after_second_bytes"] == 85305306368 and figures["p8_owner_free_gain_mib"] == 768, figures
assert figures["p8_back_to_gpu_ms"] == 41.2978 and figures["p8_back_to_gpu_x_p2_rate"] == 2.0, figures
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

# The um_physical step's verdict (tests/gpu/um_physical_gpu.py) from canned figures, and its usage errors.
python3 - "$here" <<'PY' || { echo "FAIL: um_physical_gpu.py's verdict"; exit 1; }
import sys
sys.path.insert(0, sys.argv[1])
from um_physical_gpu import verdict
# What an H100 is expected to show today: unified memory keeps the evicted blocks' chunks with the job,
# so the plain process sees less free than the budget leaves and NVML counts the job's native peak.
today = {"other_free_bytes": 79_700_000_000, "expected_free_bytes": 81_600_000_000, "other_alloc_ok": True,
         "um_slowdown": 1.04, "nvml_peak_bytes": 5_300_000_000, "node_budget_bytes": 1_918_894_080,
         "contexts_bytes": 1_468_006_400, "losses_equal": True}
f = verdict(dict(today))
assert f["passed"] is False, f
assert f["why"] == ("other_free_bytes >= expected_free_bytes failed (other_free_bytes 79700000000, expected_free_bytes "
                    "81600000000); nvml_peak_bytes <= node_budget_bytes + contexts_bytes failed (nvml_peak_bytes "
                    "5300000000, node_budget_bytes 1918894080, contexts_bytes 1468006400)"), f["why"]
within = dict(today, other_free_bytes=81_700_000_000, nvml_peak_bytes=3_380_000_000)
f = verdict(dict(within))
assert f["passed"] is True and "why" not in f, f
f = verdict(dict(within, um_slowdown=1.2, other_alloc_ok=False, other_error="CUDA out of memory"))
assert f["why"] == ("other_alloc_ok failed (other_alloc_ok False, other_error CUDA out of memory); "
                    "um_slowdown <= 1.10 failed (um_slowdown 1.2)"), f["why"]
# A run that ended early: its cause first, then every check it left unmeasured.
f = verdict({"why": "the job alone failed (exit 3): see um_physical_alone.log", "node_budget_bytes": 1})
assert f["passed"] is False and f["why"].startswith("the job alone failed (exit 3)"), f
assert "losses_equal failed (not measured: losses_equal)" in f["why"], f["why"]
PY
mkdir -p "$out/bin" && touch "$out/bin/zico-umd" "$out/bin/zico-run" && chmod +x "$out/bin/zico-umd" "$out/bin/zico-run"
echo '{"losses": ["0x1p+0", "0x1p+0", "0x1p+0", "0x1p+0", "0x1p+0"], "iteration_ms": 190}' >"$out/native.log"
for bad in "$out/none|$out/native.log|1000|$out|BIN_DIR '$out/none' holds no executable zico-umd" \
    "$out/bin|$out/native.log|12GiB|$out|BUDGET_BYTES '12GiB' is not a whole number of bytes" \
    "$out/bin|$out/native.log|0|$out|BUDGET_BYTES 0 is not above 0" \
    "$out/bin|$out/nothing.log|1000|$out|NATIVE_LOG '$out/nothing.log'"; do
  IFS='|' read -r bin_dir native budget outdir want <<<"$bad"
  line=$(python3 "$here/um_physical_gpu.py" "$bin_dir" "$native" "$budget" "$outdir" 2>/dev/null)
  status=$?
  [[ $status == 2 && $line == *"$want"* ]] ||
    { echo "FAIL: um_physical_gpu.py $bin_dir $native $budget $outdir exited $status, printed: $line"; exit 1; }
done

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
                 "suspend_resume", "um_transfer", "um_mode", "um_node", "um_physical", "um_physical_swap",
                 "um_gpt2", "um_resnet50", "um_unseen"], names
for step in report["steps"]:
    assert step["verdict"] == "skipped" and step["reason"], step
physical = report["steps"][names.index("um_physical")]
assert physical["reason"] == "no GPU: nvidia-smi lists none", physical
markdown = open(sys.argv[2]).read()
assert "| build | skipped |" in markdown and "| um_physical | skipped | 0 | no GPU: nvidia-smi lists none |" in markdown
PY
# A step's figures in the report: a um_physical line as run.sh records it on a GPU.
mkdir -p "$out/report"
echo '{"step": "um_physical", "verdict": "failed", "reason": "nvml_peak_bytes <= node_budget_bytes + contexts_bytes failed",
  "figures": {"other_free_bytes": 79700000000, "other_alloc_ok": true, "um_slowdown": 1.04}, "seconds": 61}' |
  tr -d '\n' >"$out/report/steps.jsonl"
python3 "$here/report.py" "$out/report" "$out/report/steps.jsonl" "NVIDIA H100 80GB HBM3" ||
  { echo "FAIL: report.py on a um_physical line"; exit 1; }
row="| um_physical | failed | 61 | nvml_peak_bytes <= node_budget_bytes + contexts_bytes failed |"
row+=" other_free_bytes: 79700000000, other_alloc_ok: True, um_slowdown: 1.04 |"
grep -qF "$row" "$out/report/report.md" ||
  { echo "FAIL: report.md shows no um_physical row with its figures:"; cat "$out/report/report.md"; exit 1; }
echo OK
