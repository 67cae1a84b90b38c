#!/usr/bin/env bash
# What every command-line tool does alike, checked across them: sizes in
# Kubernetes form, one wording for a size that is not one, -h and help,
# output paths that cannot be written, and arguments that are not what the
# tool expects (a folder as a trace, a trace that is missing or not one: a
# usage error, exit 2, in every tool; a command not on PATH).
# Usage: cli_conventions_test.sh ZICO_RUN ZICO_UMCTL ZICO_UMD ZICO_DEMO BUDGET_DEMO TRACES_DIR TRACE_JOB
set -u

zico_run=$(readlink -f "$1")
umctl=$2
umd=$3
demo=$4
budget_demo=$5
traces=$6
trace_job=$7
bert=$traces/bert_base.ztrace.gz
source "$(dirname "$0")/../lib/cli_checks.sh"

# Runs a command; output in $out and $err, exit status in $status.
run() {
  "$@" >"$out" 2>"$err"
  status=$?
}

# expect STATUS TEXT WHAT: the last run exited STATUS and stderr holds TEXT.
expect() {
  [[ $status == "$1" ]] || fail "$3: exit $status, want $1"
  grep -qF -- "$2" "$err" || fail "$3: stderr lacks '$2'"
}

# An inherited ZICO_* variable would change what these cases test.
for name in $(env | sed -n 's/^\(ZICO_[A-Z_]*\)=.*/\1/p'); do unset "$name"; done
export ZICO_BACKEND=sim

# --- sizes in Kubernetes form are binary, everywhere -----------------------------
run "$zico_run" --budget 64Mi -- printenv ZICO_BUDGET
[[ $status == 0 && $(cat "$out") == 64Mi ]] || fail "zico-run --budget 64Mi"
ZICO_BUDGET=64Mi run "$budget_demo"
[[ $status == 0 ]] || fail "ZICO_BUDGET=64Mi budget_demo: exit $status"
grep -q "total 64 MiB" "$out" || fail "ZICO_BUDGET=64Mi is not 64 MiB"
run timeout 2 "$umd" --socket "$tmp/k8s.sock" --budget 64Mi
grep -q "GPU 0: budget 64 MiB" "$err" || fail "zico-umd --budget 64Mi"
run "$umctl" budget set 1Gi --socket "$tmp/none.sock"
expect 3 "no zico-umd is running" "zico-umctl budget set 1Gi (parsed, then no daemon)"

# --- one wording for a size that is not one ---------------------------------------
wording="'0' is not a size above 0; expected a number with an optional unit"
run "$zico_run" --budget 0 -- true
expect 2 "--budget $wording" "zico-run --budget 0"
run "$umd" --socket "$tmp/zero.sock" --budget 0
expect 2 "--budget $wording" "zico-umd --budget 0"
run "$umctl" budget set 0 --socket "$tmp/none.sock"
expect 2 "budget $wording" "zico-umctl budget set 0"
run "$umctl" simulate --budget 0 "$bert"
expect 2 "--budget $wording" "zico-umctl simulate --budget 0"
run "$demo" --budget 0
expect 2 "--budget $wording" "zico-demo --budget 0"
run "$umctl" budget set -5GiB --socket "$tmp/none.sock"
expect 2 "budget '-5GiB' is not a size above 0" "zico-umctl budget set -5GiB"
grep -q "unknown option" "$err" && fail "zico-umctl budget set -5GiB: called an option"
# A number and its unit apart: the space is named, in every tool.
spaced="'6 GB' is not a size: no space between number and unit (6GB)"
run "$zico_run" --budget "6 GB" -- true
expect 2 "--budget $spaced" "zico-run --budget '6 GB'"
run "$umctl" simulate --budget "6 GB" "$bert"
expect 2 "--budget $spaced" "zico-umctl simulate --budget '6 GB'"
run "$umctl" page --budget "6 GB" "$bert"
expect 2 "--budget $spaced" "zico-umctl page --budget '6 GB'"
run "$umctl" budget set "6 GB" --socket "$tmp/none.sock"
expect 2 "budget $spaced" "zico-umctl budget set '6 GB'"
ZICO_BUDGET="6 GB" run "$budget_demo"  # the library refuses its allocations: the program fails
expect 1 "ZICO_BUDGET=$spaced" "ZICO_BUDGET='6 GB'"

# --- budgets against the device ----------------------------------------------------
run timeout 5 "$umd" --socket "$tmp/big.sock" --budget 1TiB
expect 1 "budget 1 TiB of GPU 0 is more than its 80 GiB of memory" "zico-umd --budget 1TiB"

# --- help ---------------------------------------------------------------------------
for flag in -h --help; do
  run "$zico_run" "$flag"
  [[ $status == 0 ]] && grep -q "^Usage: zico-run" "$out" || fail "zico-run $flag"
done
for command in status jobs budget simulate replay; do
  run "$umctl" "$command" --help
  cp "$out" "$tmp/direct"
  run "$umctl" help "$command"
  [[ $status == 0 ]] && cmp -s "$out" "$tmp/direct" || fail "zico-umctl help $command differs from $command --help"
done
run "$budget_demo" --help
[[ $status == 0 ]] && grep -q "^Usage: " "$out" || fail "budget_demo --help"
run "$budget_demo" --bogus
expect 2 "'--bogus'" "budget_demo --bogus"
# A usage error ends with the same hint in every tool.
for tool in "$zico_run" "$umd" "$demo" "$budget_demo"; do
  run "$tool" --bogus-option
  name=$(basename "$tool")
  last=$(tail -n 1 "$err")
  [[ $status == 2 && ( $last == "Try '$name --help'." || $last == "Try '$tool --help'." ) ]] ||
    fail "$name --bogus-option: exit $status, last line '$last', not the hint"
done
run "$umctl" status --bogus-option
tail -n 1 "$err" | grep -qxF "Try 'zico-umctl status --help'." || fail "zico-umctl status --bogus-option: no hint"
ZICO_BACKEND=cuda run "$budget_demo"
expect 2 "zico-run --backend sim --budget 64MiB -- $budget_demo" "budget_demo off the sim backend"
run timeout 5 "$umd" --socket "$tmp/no-such-folder/zicoum.sock"
expect 1 "create $tmp/no-such-folder" "zico-umd in a missing folder"
grep -qF -- "--socket" "$err" || fail "zico-umd in a missing folder: no hint at --socket"

# --- output paths -------------------------------------------------------------------
missing=$tmp/no-such-folder
run "$umctl" replay --plot-dir "$missing" "$bert"
expect 1 "cannot write $missing/bert_base.svg: No such file or directory" "replay --plot-dir missing"
run "$umctl" simulate --budget 20GiB --iterations 2 --plot "$missing/x.svg" "$bert"
expect 1 "cannot write $missing/x.svg: No such file or directory" "simulate --plot in a missing folder"
run "$demo" --out "$missing/deeper"
expect 2 "'$missing/deeper': cannot create it: No such file or directory" "zico-demo --out under a missing folder"
[[ ! -e $missing ]] || fail "zico-demo --out created the missing parent $missing"

# --- arguments that are not what the tool expects ----------------------------------
run "$umctl" replay "$traces"
expect 2 "$traces: is a directory" "replay given a folder"
mkdir -p "$tmp/sub" && echo "not a trace" >"$tmp/sub/notes.txt"
run "$umctl" replay "$tmp/sub/notes.txt"
expect 2 "$tmp/sub/notes.txt:1: not a zicoum trace" "replay given a file that is not a trace (named as given)"
# A trace that is missing, or not a trace: every tool that reads one exits 2.
for trace in "$tmp/missing.ztrace.gz" "$tmp/sub/notes.txt"; do
  for command in "page --oversubscription 2" "simulate --budget 8GiB" replay; do
    run "$umctl" $command "$trace"
    expect 2 "$trace" "zico-umctl $command $trace"
  done
  run "$demo" --traces "$trace"
  expect 2 "$trace" "zico-demo --traces $trace"
  run "$trace_job" --trace "$trace" --iterations 1
  expect 2 "$trace" "trace_job --trace $trace"
  run "$trace_job" --ops --trace "$trace" --iterations 1
  expect 2 "$trace" "trace_job --ops --trace $trace"
done
# One that reads but cannot be replayed as asked: a version 1 trace records no kernels for --ops.
printf 'zicoum-trace 1\nmeta model noops\nmeta command test\nmeta source meta\nmeta batch 1\nmeta iterations 2\nmeta timing test\na 0 1048576 0 param -1\ni 0 0\ni 1 10\nend 3\n' |
  gzip >"$tmp/noops.ztrace.gz"
run "$trace_job" --ops --trace "$tmp/noops.ztrace.gz" --iterations 1
expect 2 "the trace has no op records" "trace_job --ops on a trace without kernels"
echo 'not a program' >"$tmp/notes.txt"
(cd "$tmp" && "$zico_run" -- notes.txt >"$out" 2>"$err")
status=$?
expect 127 "'notes.txt': No such file or directory (not found on PATH; for the file here, write ./notes.txt)" \
  "zico-run -- a file here but not on PATH"

finish
