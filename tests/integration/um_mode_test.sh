#!/usr/bin/env bash
# UM mode end to end on the simulated backend: a job replaying BERT-base's
# memory and kernels (trace_job --ops) completes with half its peak as the
# budget, every block's contents intact, the GPU's share never above the
# budget; at a slower ZICO_HOST_BANDWIDTH, or a calibration file
# (ZICO_GPU_CALIBRATION) of a slower link, it runs slower, and an explicit
# ZICO_HOST_BANDWIDTH wins over the file's link; the same job in VMM mode
# fails with out-of-memory; bad values of ZICO_MODE, ZICO_PAGING_POLICY,
# ZICO_HOST_BANDWIDTH and ZICO_GPU_CALIBRATION are named.
# Usage: um_mode_test.sh ZICO_RUN TRACE_JOB TRACE
set -euo pipefail
zico_run=$1 trace_job=$2 trace=$3
export ZICO_SOCKET=off
budget=4831838208  # 4.5 GiB: half of the 9.4 GB the job allocates at its peak
fail() { echo "FAIL: $*" >&2; exit 1; }

for policy in zico deepum um; do
  out=$(ZICO_PAGING_POLICY=$policy "$zico_run" --backend sim --mode um --budget $budget -- \
        "$trace_job" --ops --trace "$trace" --iterations 3) || fail "UM mode, policy $policy: the job failed"
  echo "$policy: $out"
  resident=$(sed -n 's/.* peak_resident_bytes=\([0-9]*\).*/\1/p' <<<"$out")
  allocated=$(sed -n 's/.* peak_allocated_bytes=\([0-9]*\).*/\1/p' <<<"$out")
  [[ -n $resident && $resident -le $budget ]] || fail "policy $policy: $resident bytes on the GPU, budget $budget"
  [[ $allocated -gt $((budget * 2 - budget / 10)) ]] || fail "policy $policy: the job allocated only $allocated bytes"
  grep -q 'clock=modelled' <<<"$out" || fail "policy $policy: no modelled clock"
done

# A slower host link (PCIe Gen4's, against the default Gen5) makes the same job slower on the modelled clock.
mean_at() {
  ZICO_HOST_BANDWIDTH=$1 "$zico_run" --backend sim --mode um --budget $budget -- "$trace_job" --ops --trace "$trace" \
    --iterations 3 | sed -n 's/.* mean_iter_s=\([0-9.]*\).*/\1/p'
}
gen5=$(mean_at 55GB/s) gen4=$(mean_at 25GB/s)
python3 -c 'import sys; sys.exit(0 if float(sys.argv[2]) > 1.5 * float(sys.argv[1]) else 1)' "$gen5" "$gen4" ||
  fail "at 25GB/s the job ran $gen4 s an iteration, at 55GB/s $gen5 s: the link did not slow it"
result=$(mktemp) calibration=$(mktemp)
trap 'rm -f "$result" "$calibration"' EXIT
# The same slower link from a calibration file: the pager plans on it and the device moves at it;
# ZICO_HOST_BANDWIDTH, also set, moves the link back.
echo '{"model": {"h2d_bytes_per_s": 2.5e10, "d2h_bytes_per_s": 2.5e10, "fault_bytes_per_s": 9.090909e9}}' >"$calibration"
calibrated=$(ZICO_GPU_CALIBRATION=$calibration mean_at 55GB/s)
python3 -c 'import sys; sys.exit(0 if abs(float(sys.argv[1]) / float(sys.argv[2]) - 1) < 0.02 else 1)' "$gen5" \
  "$calibrated" || fail "ZICO_HOST_BANDWIDTH=55GB/s with a 25 GB/s calibration ran $calibrated s, at 55GB/s $gen5 s"
calibrated=$(ZICO_GPU_CALIBRATION=$calibration "$zico_run" --backend sim --mode um --budget $budget -- "$trace_job" \
  --ops --trace "$trace" --iterations 3 | sed -n 's/.* mean_iter_s=\([0-9.]*\).*/\1/p')
python3 -c 'import sys; sys.exit(0 if abs(float(sys.argv[1]) / float(sys.argv[2]) - 1) < 0.02 else 1)' "$gen4" \
  "$calibrated" || fail "a 25 GB/s calibration ran $calibrated s an iteration, ZICO_HOST_BANDWIDTH=25GB/s $gen4 s"
log=$(ZICO_LOG=info ZICO_GPU_CALIBRATION=$calibration "$zico_run" --backend sim --mode um --budget $budget -- \
      "$trace_job" --ops --trace "$trace" --iterations 1 2>&1 >/dev/null)
grep -q "planned on a 25.0 GB/s host link" <<<"$log" || fail "the pager does not plan on the calibration's link: $log"
echo '{"model": {"h2d_bytes_per_s": "fast"}}' >"$calibration"
err=$(ZICO_BACKEND=sim ZICO_MODE=um ZICO_GPU_CALIBRATION=$calibration "$trace_job" --ops --trace "$trace" \
      --iterations 1 2>&1) && fail "a calibration file with h2d_bytes_per_s \"fast\" accepted"
grep -q "ZICO_GPU_CALIBRATION='$calibration' is not valid: model key \"h2d_bytes_per_s\" is \"fast\"" <<<"$err" ||
  fail "unclear error: $err"
log=$(ZICO_LOG=info ZICO_HOST_BANDWIDTH=25GB/s "$zico_run" --backend sim --mode um --budget $budget -- "$trace_job" \
      --ops --trace "$trace" --iterations 1 2>&1 >"$result")
grep -q "planned on a 25.0 GB/s host link" <<<"$log" || fail "the pager does not plan on the link it was given: $log"
# The job's result and the library's exit log count the same evictions.
logged=$(sed -n 's/.* on the way), \([0-9]*\) evicted, .*/\1/p' <<<"$log")
reported=$(sed -n 's/.* evicted_pages=\([0-9]*\).*/\1/p' "$result")
[[ -n $logged && $logged == "$reported" ]] || fail "the exit log says $logged pages evicted, the result line $reported"
err=$(ZICO_BACKEND=sim ZICO_MODE=um ZICO_HOST_BANDWIDTH=fast "$trace_job" --ops --trace "$trace" --iterations 1 2>&1) &&
  fail "ZICO_HOST_BANDWIDTH=fast accepted"
grep -q "ZICO_HOST_BANDWIDTH='fast' is not valid" <<<"$err" || fail "unclear error: $err"

if err=$("$zico_run" --backend sim --mode vmm --budget $budget -- "$trace_job" --ops --trace "$trace" \
         --iterations 3 2>&1); then
  fail "VMM mode ran a job twice the budget: $err"
fi
grep -q 'out of memory' <<<"$err" || fail "VMM mode failed, but not for memory: $err"

err=$(ZICO_BACKEND=sim ZICO_MODE=unified "$trace_job" --ops --trace "$trace" --iterations 1 2>&1) && fail "ZICO_MODE=unified accepted"
grep -q "ZICO_MODE='unified' is not valid; expected vmm or um" <<<"$err" || fail "unclear error: $err"
err=$(ZICO_BACKEND=sim ZICO_MODE=um ZICO_PAGING_POLICY=lru "$trace_job" --ops --trace "$trace" --iterations 1 2>&1) &&
  fail "ZICO_PAGING_POLICY=lru accepted"
grep -q "ZICO_PAGING_POLICY='lru' is not valid" <<<"$err" || fail "unclear error: $err"
echo OK
