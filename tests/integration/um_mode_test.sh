#!/usr/bin/env bash
# UM mode end to end on the simulated backend: a job replaying BERT-base's
# memory and kernels (trace_job --ops) completes with half its peak as the
# budget, every block's contents intact, the GPU's share never above the
# budget; the same job in VMM mode fails with out-of-memory; bad values of
# ZICO_MODE and ZICO_PAGING_POLICY are named.
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
