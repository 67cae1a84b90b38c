#!/usr/bin/env bash
# A malformed ZICO_* value: exactly one stderr line naming the variable and
# value, the calls fail with cudaErrorInitializationError (3), nothing on the
# program's stdout comes from zicoum, and the process does not crash.
set -u
probe=$1
failures=0

expect_rejected() {  # VAR VALUE
  local out err
  out=$(env -u ZICO_BACKEND -u ZICO_BUDGET ZICO_BACKEND=sim "$1=$2" "$probe" 2>/tmp/zico_bad_config.$$)
  local rc=$?
  err=$(cat /tmp/zico_bad_config.$$)
  rm -f /tmp/zico_bad_config.$$
  local lines
  lines=$(printf '%s\n' "$err" | grep -c .)
  if [[ $rc -ne 0 || $out != "cudaMalloc=3 cudaMemGetInfo=3 "* || $lines -ne 1 || $err != *"$1='$2'"* ]]; then
    echo "FAIL $1=$2: rc=$rc stdout=[$out] stderr=[$err]"
    failures=$((failures + 1))
  else
    echo "ok   $1=$2 -> $err"
  fi
}

expect_rejected ZICO_BUDGET 12XB
expect_rejected ZICO_BUDGET 0
expect_rejected ZICO_BUDGET -1
expect_rejected ZICO_BACKEND bogus
expect_rejected ZICO_LOG loud
expect_rejected ZICO_SIM_GRANULARITY 3MiB

# Well-formed values the device cannot use: the line names the setting at
# fault (not another one) and ends as a malformed value's does.
expect_device_refuses() {  # VAR VALUE WANTED UNWANTED
  local err
  err=$(env -u ZICO_BACKEND -u ZICO_BUDGET -u ZICO_CHUNK_SIZE ZICO_BACKEND=sim "$1=$2" "$probe" 2>&1 >/dev/null)
  if [[ $err != *"$3"* || $err != *"allocations will fail until it is fixed"* || ( -n $4 && $err == *"$4"* ) ]]; then
    echo "FAIL $1=$2: stderr=[$err]"
    failures=$((failures + 1))
  else
    echo "ok   $1=$2 -> $err"
  fi
}
expect_device_refuses ZICO_CHUNK_SIZE 3MiB "ZICO_CHUNK_SIZE (3 MiB) is not valid" ""
expect_device_refuses ZICO_BUDGET 1B "ZICO_BUDGET" "ZICO_CHUNK_SIZE"

# Control: a good configuration works and is silent.
out=$(ZICO_BACKEND=sim ZICO_BUDGET=64MiB "$probe" 2>/tmp/zico_good_config.$$)
err=$(cat /tmp/zico_good_config.$$)
rm -f /tmp/zico_good_config.$$
if [[ $out != "cudaMalloc=0 cudaMemGetInfo=0 total=67108864 "* || -n $err ]]; then
  echo "FAIL good configuration: stdout=[$out] stderr=[$err]"
  failures=$((failures + 1))
fi

# UM mode's settings under VMM mode: one warning that they are ignored; the calls still work.
out=$(env -u ZICO_MODE ZICO_BACKEND=sim ZICO_BUDGET=64MiB ZICO_UM_MEMORY=swap "$probe" 2>/tmp/zico_um_in_vmm.$$)
err=$(cat /tmp/zico_um_in_vmm.$$)
rm -f /tmp/zico_um_in_vmm.$$
if [[ $out != "cudaMalloc=0 "* || $err != *"ZICO_UM_MEMORY=swap applies to ZICO_MODE=um only"* ]]; then
  echo "FAIL ZICO_UM_MEMORY under vmm: stdout=[$out] stderr=[$err]"
  failures=$((failures + 1))
fi

# A budget above the device: one warning with both sizes, and cudaMemGetInfo
# reports the device's 80 GiB, what can really be had, not the budget.
out=$(env -u ZICO_CHUNK_SIZE ZICO_BACKEND=sim ZICO_BUDGET=100GiB "$probe" 2>/tmp/zico_big_budget.$$)
err=$(cat /tmp/zico_big_budget.$$)
rm -f /tmp/zico_big_budget.$$
if [[ $out != "cudaMalloc=0 cudaMemGetInfo=0 total=85899345920 "* || $err != *"100 GiB is more than device 0 has (80 GiB)"* ]]; then
  echo "FAIL budget above the device: stdout=[$out] stderr=[$err]"
  failures=$((failures + 1))
fi

echo "$((6 + 2 + 1 + 1 + 1 - failures)) passed, $failures failed"
exit $((failures > 0))
