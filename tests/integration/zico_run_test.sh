#!/usr/bin/env bash
# zico-run end to end: argument and environment validation, and what the
# child sees. Usage: zico_run_test.sh ZICO_RUN LIBZICOUM
# LIBZICOUM is the build-tree library zico-run must find beside itself.
set -u

zico_run=$1
library=$2
failures=0
out=$(mktemp)
err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT

fail() {
  echo "FAIL: $*"
  echo "--- stdout"; cat "$out"
  echo "--- stderr"; cat "$err"
  failures=$((failures + 1))
}

# Runs zico-run with the given arguments; sets $status.
run() {
  "$zico_run" "$@" >"$out" 2>"$err"
  status=$?
}

# An inherited ZICO_* variable would change what these cases test.
for name in $(env | sed -n 's/^\(ZICO_[A-Z_]*\)=.*/\1/p'); do unset "$name"; done

run --budget 12XB -- true
[[ $status == 2 ]] || fail "bad budget: exit $status, want 2"
grep -q "'12XB'" "$err" || fail "bad budget: message does not name the value"
grep -q "MiB" "$err" || fail "bad budget: message does not give the accepted form"
[[ ! -s $out ]] || fail "bad budget: wrote to stdout"

run --budget=0 -- true
[[ $status == 2 ]] || fail "zero budget: exit $status, want 2"
run --budget 1B -- true
[[ $status == 2 ]] && grep -q "smaller than one chunk (2 MiB)" "$err" || fail "budget below a chunk: exit $status"
run --mode um --backend sim --budget 1MiB -- true
[[ $status == 0 ]] || fail "a UM budget below a chunk (it caps pages): exit $status"

run --list-env
[[ $status == 0 ]] || fail "--list-env: exit $status"
grep -q '^ZICO_BUDGET$' "$out" || fail "--list-env does not list ZICO_BUDGET"
# It fits an 80-column terminal (a word longer than the line aside).
(( $(awk '{ if (length > 80 && $0 ~ / /) n++ } END { print n + 0 }' "$out") == 0 )) || fail "--list-env is wider than 80 columns"

run --version
[[ $status == 0 ]] || fail "--version: exit $status"
grep -q 'zicoum' "$out" || fail "--version does not name zicoum"

run -- zico-run-no-such-command
[[ $status == 127 ]] || fail "missing command: exit $status, want 127"
grep -q 'zico-run-no-such-command' "$err" || fail "missing command: message does not name it"

run --budget 64MiB
[[ $status == 2 ]] || fail "no command: exit $status, want 2"

run --frobnicate -- true
[[ $status == 2 ]] || fail "unknown option: exit $status, want 2"

run --backend gpu -- true
[[ $status == 2 ]] || fail "bad backend: exit $status, want 2"

run --library /nonexistent/libzicoum.so -- true
[[ $status == 2 ]] || fail "missing library: exit $status, want 2"
grep -q '/nonexistent/libzicoum.so' "$err" || fail "missing library: message does not name the path"

LD_PRELOAD='' run --backend sim --budget 64MiB -- env
[[ $status == 0 ]] || fail "env: exit $status"
grep -qx 'ZICO_BUDGET=64MiB' "$out" || fail "child does not see ZICO_BUDGET=64MiB"
grep -qx 'ZICO_BACKEND=sim' "$out" || fail "child does not see ZICO_BACKEND=sim"
preloaded=$(sed -n 's/^LD_PRELOAD=//p' "$out")
[[ $preloaded == /*libzicoum.so ]] || fail "LD_PRELOAD='$preloaded' is not an absolute path to libzicoum.so"
[[ $(readlink -f "$preloaded") == $(readlink -f "$library") ]] || fail "LD_PRELOAD='$preloaded', want $library"

# What was preloaded before is kept, after libzicoum (ld.so skips the missing
# file with a warning on stderr).
LD_PRELOAD=/nonexistent/kept.so run --backend sim -- printenv LD_PRELOAD
[[ $(cat "$out") == /*libzicoum.so:/nonexistent/kept.so ]] || fail "inherited LD_PRELOAD not kept"

# PyTorch's expandable segments would allocate outside the budget: turned off, with a word.
PYTORCH_CUDA_ALLOC_CONF='max_split_size_mb:128,expandable_segments:True' run --backend sim -- printenv PYTORCH_CUDA_ALLOC_CONF
[[ $status == 0 ]] || fail "expandable_segments: exit $status"
[[ $(cat "$out") == 'max_split_size_mb:128,expandable_segments:False' ]] || fail "expandable_segments not turned off: $(cat "$out")"
grep -q 'outside zicoum' "$err" || fail "expandable_segments: no word on stderr"
PYTORCH_CUDA_ALLOC_CONF='expandable_segments: True' run --backend sim -- printenv PYTORCH_CUDA_ALLOC_CONF
[[ $(cat "$out") == 'expandable_segments:False' ]] || fail "expandable_segments with a space not turned off: $(cat "$out")"
PYTORCH_CUDA_ALLOC_CONF='max_split_size_mb:64' run --backend sim -- printenv PYTORCH_CUDA_ALLOC_CONF
[[ $(cat "$out") == 'max_split_size_mb:64' ]] || fail "a setting without expandable_segments changed: $(cat "$out")"

ZICO_BACKEND=bogus run -- true
[[ $status == 2 ]] || fail "inherited ZICO_BACKEND=bogus: exit $status, want 2"
grep -q 'ZICO_BACKEND' "$err" || fail "inherited bad value: message does not name the variable"

if ((failures > 0)); then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all zico-run checks passed"
