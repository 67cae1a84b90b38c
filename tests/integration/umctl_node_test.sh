#!/usr/bin/env bash
# zico-umctl's node commands (status, jobs, budget, top, suspend, resume)
# against a real zico-umd on the sim backend, with one job (hold_memory)
# borrowing memory from it; and the failures a user meets: bad arguments, no
# daemon, a daemon that refuses or does not answer.
# Usage: umctl_node_test.sh ZICO_UMCTL ZICO_UMD HOLD_MEMORY
set -u

umctl=$1
umd=$2
hold_memory=$3
failures=0
tmp=$(mktemp -d)
out=$tmp/out
err=$tmp/err
umd_pid=
hold_pid=
fake_pids=()

cleanup() {
  exec 3>&-
  for pid in $hold_pid $umd_pid "${fake_pids[@]}"; do kill "$pid" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*"
  echo "--- stdout"; cat "$out"
  echo "--- stderr"; cat "$err"
  failures=$((failures + 1))
}

# Runs zico-umctl with the given arguments; sets $status.
run() {
  "$umctl" "$@" >"$out" 2>"$err"
  status=$?
}

# Runs a Python check on $out as JSON: `d` is the document, sys.argv[1:] the
# extra arguments. Prints what failed.
check_json() {
  local what=$1 code=$2
  shift 2
  python3 -c "import json, sys
d = json.load(open(sys.argv[1]))
args = sys.argv[2:]
$code" "$out" "$@" || fail "$what"
}

# Waits up to 10 s for a condition (a command).
wait_for() {
  for _ in $(seq 100); do
    "$@" && return 0
    sleep 0.1
  done
  return 1
}

# An inherited ZICO_* variable would change what these cases test.
for name in $(env | sed -n 's/^\(ZICO_[A-Z_]*\)=.*/\1/p'); do unset "$name"; done

# zico-umd's own usage errors for --turns: exit 2, the message names the value.
for args in "--turns maybe|--turns 'maybe' is not valid; expected on or off" \
            "--turns on --schedule fcfs|--turns on needs --schedule zico"; do
  IFS='|' read -r flags expect <<<"$args"
  # shellcheck disable=SC2086
  ZICO_BACKEND=sim timeout 5 "$umd" --socket "$tmp/unused.sock" --budget 64MiB $flags >"$out" 2>"$err"
  status=$?
  if [ "$status" -ne 2 ]; then fail "zico-umd $flags: exit $status, expected 2"; continue; fi
  grep -qF -- "$expect" "$err" || fail "zico-umd $flags: stderr lacks '$expect'"
done

socket=$tmp/s.sock
ZICO_BACKEND=sim "$umd" --socket "$socket" --budget 64MiB >"$tmp/umd.log" 2>&1 &
umd_pid=$!
if ! wait_for test -S "$socket"; then
  echo "FAIL: zico-umd did not create $socket"; cat "$tmp/umd.log"; exit 1
fi

# The job: its standard input is a FIFO held open on descriptor 3; closing
# that ends it.
mkfifo "$tmp/hold.in"
ZICO_BACKEND=sim ZICO_SOCKET=$socket ZICO_SWAP_DIR=$tmp "$hold_memory" 8MiB <"$tmp/hold.in" >"$tmp/hold.out" \
  2>"$tmp/hold.err" &
hold_pid=$!
exec 3>"$tmp/hold.in"
if ! wait_for grep -q '^ready$' "$tmp/hold.out"; then
  echo "FAIL: hold_memory did not get ready"; cat "$tmp/hold.err" "$tmp/umd.log"; exit 1
fi

# --- status -----------------------------------------------------------------------
run status --json --socket "$socket"
[[ $status == 0 ]] || fail "status --json: exit $status"
check_json "status --json: shape and values" '
gpu_keys = {"index", "uuid", "chunk_bytes", "budget_bytes", "granted_bytes", "pool_bytes", "waiting_bytes",
            "grants", "returns", "deadlocks", "parks", "denials", "timeouts"}
job_keys = {"id", "pid", "uid", "name", "gpu", "granted_bytes", "min_bytes", "max_bytes", "allocated_bytes",
            "persistent_bytes", "waiting_bytes", "wait_s", "iterations", "state", "mode"}
assert isinstance(d["daemon_pid"], int) and d["daemon_pid"] > 0, d
assert isinstance(d["uptime_s"], float), d
g = d["gpus"][0]
assert gpu_keys <= g.keys(), g.keys()
assert g["index"] == 0 and len(g["uuid"]) == 32, g
assert g["budget_bytes"] == 67108864, g
assert g["granted_bytes"] > 0 and g["chunk_bytes"] > 0, g
jobs = [j for j in d["jobs"] if j["pid"] == int(args[0])]
assert len(jobs) == 1, d["jobs"]
j = jobs[0]
assert job_keys <= j.keys(), j.keys()
assert j["name"] == "hold_memory 8MiB" and j["gpu"] == 0, j  # program and first argument
assert j["granted_bytes"] >= 8 << 20, j
assert j["max_bytes"] is None and j["state"] == "running" and j["mode"] == "vmm", j
assert g["parks"] == 0 and g["denials"] == 0 and g["timeouts"] == 0, g
' "$hold_pid"
job_id=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["jobs"][0]["id"])' "$out" 2>/dev/null)
[[ $job_id =~ ^[0-9]+$ ]] || { fail "no job id in status --json"; job_id=1; }

run status --socket "$socket"
[[ $status == 0 ]] || fail "status: exit $status"
grep -q "^zico-umd pid [0-9]*, up .*, 1 job$" "$out" || fail "status: no daemon line with 1 job"
grep -Eq '^ +0 +64 MiB +8 MiB ' "$out" || fail "status: no line for GPU 0 with budget and granted"
head -n 2 "$out" | tail -n 1 | grep -Eq 'YIELDS +PARKS +DENIED +TIMEOUTS +DEVICE USED$' || fail "status: no PARKS, DENIED, TIMEOUTS, DEVICE USED"
# What the device reports: the daemon's 8 MiB lent of the simulated device's memory.
grep -Eq '^ +0 +64 MiB .* [0-9.]+ [KMG]iB of [0-9.]+ [KMG]iB$' "$out" || fail "status: no DEVICE USED of the device's total"

# The socket from the environment, as jobs find it.
ZICO_SOCKET=$socket run status
[[ $status == 0 ]] || fail "status with \$ZICO_SOCKET: exit $status"

# --- jobs ------------------------------------------------------------------------
run jobs --socket "$socket"
[[ $status == 0 ]] || fail "jobs: exit $status"
head -n 1 "$out" | grep -Eq '^ *ID +PID +USER +NAME +GPU +HELD +PERSISTENT\* +TRANSIENT\* +WAITING +WAIT +STATE +MODE +MIN +MAX$' ||
  fail "jobs: header"
# The reported columns lag HELD and need not add up to it: the table says so.
grep -qx "\* as of the job's last usage report (every 0.5 s), HELD as of now: they can add up to more" "$out" ||
  fail "jobs: no note on the reported columns"
grep -Eq "^ *$job_id +$hold_pid +[^ ]+ +hold_memory 8MiB +0 +8 MiB .* running +vmm +0 B +unlimited$" "$out" ||
  fail "jobs: no line for the job"

run jobs --json --socket "$socket"
[[ $status == 0 ]] || fail "jobs --json: exit $status"
check_json "jobs --json" '
assert list(d.keys()) == ["job_rows", "jobs"] and d["job_rows"] == 1, d.keys()
assert [j["pid"] for j in d["jobs"]] == [int(args[0])], d
assert d["jobs"][0]["transient_bytes"] == max(0, d["jobs"][0]["allocated_bytes"] - d["jobs"][0]["persistent_bytes"])
' "$hold_pid"

# --- budget ----------------------------------------------------------------------
run budget get --socket "$socket"
[[ $status == 0 ]] || fail "budget get: exit $status"
grep -Eq '^ +0 +64 MiB +8 MiB ' "$out" || fail "budget get: no line for GPU 0"
run budget get --gpu 0 --json --socket "$socket"
[[ $status == 0 ]] || fail "budget get --json: exit $status"
check_json "budget get --json" 'assert d["gpus"][0]["budget_bytes"] == 67108864 and len(d["gpus"]) == 1, d'
run budget get --gpu 7 --socket "$socket"
[[ $status == 1 ]] || fail "budget get --gpu 7: exit $status, want 1"
grep -q 'no GPU 7' "$err" || fail "budget get --gpu 7: message"

budget_is() {
  run status --json --socket "$socket"
  check_json "$1" 'assert d["gpus"][0]["budget_bytes"] == int(args[0]), d["gpus"][0]' "$2"
}

grep -q '^total 67108864$' "$tmp/hold.out" || fail "the job's cudaMemGetInfo total is not the node's 64 MiB budget"
run budget set 48MiB --socket "$socket"
[[ $status == 0 ]] || fail "budget set 48MiB: exit $status"
grep -q '48 MiB' "$out" || fail "budget set 48MiB: the daemon's answer is not printed"
budget_is "budget set 48MiB: budget" 50331648
wait_for grep -q '^total 50331648$' "$tmp/hold.out" || fail "the job's cudaMemGetInfo total did not follow the budget"

# More than the device: refused by the daemon, with both sizes.
run budget set 1TiB --socket "$socket"
[[ $status == 1 ]] || fail "budget set 1TiB: exit $status, want 1"
grep -q "1 TiB.*80 GiB" "$err" || fail "budget set 1TiB: the refusal lacks the budget and the device's size"
budget_is "budget set 1TiB: budget changed" 50331648

run budget set 48MB0 --socket "$socket"
[[ $status == 2 ]] || fail "budget set 48MB0: exit $status, want 2"
grep -q "'48MB0'" "$err" || fail "budget set 48MB0: message does not name the value"
grep -q "MiB" "$err" || fail "budget set 48MB0: message does not give the accepted form"
[[ ! -s $out ]] || fail "budget set 48MB0: wrote to stdout"
budget_is "budget set 48MB0: budget changed" 50331648

run budget set --job 999 --max 1GiB --socket "$socket"
[[ $status == 1 ]] || fail "budget set --job 999: exit $status, want 1"
grep -q 'no job 999' "$err" || fail "budget set --job 999: message"

run budget set --gpu 7 1GiB --socket "$socket"
[[ $status == 1 ]] || fail "budget set --gpu 7: exit $status, want 1"
grep -q 'GPU 7' "$err" || fail "budget set --gpu 7: message"

run budget set --job "$job_id" --min 2MiB --max 32MiB --socket "$socket"
[[ $status == 0 ]] || fail "budget set --job --min --max: exit $status"
run jobs --json --socket "$socket"
check_json "budget set --job: limits" '
j = d["jobs"][0]
assert (j["min_bytes"], j["max_bytes"]) == (2 << 20, 32 << 20), j'
# Both limits move past each other: each message alone must be acceptable.
limits_are() {
  run jobs --json --socket "$socket"
  check_json "$1" 'j = d["jobs"][0]; assert (j["min_bytes"], j["max_bytes"]) == (int(args[0]), int(args[1])), j' "$2" "$3"
}
run budget set --job "$job_id" --min 40MiB --max 48MiB --socket "$socket"
[[ $status == 0 ]] || fail "budget set --job: raising both limits: exit $status"
limits_are "raising both limits" $((40 << 20)) $((48 << 20))
run budget set --job "$job_id" --min 2MiB --max 16MiB --socket "$socket"
[[ $status == 0 ]] || fail "budget set --job: lowering both limits: exit $status"
limits_are "lowering both limits" $((2 << 20)) $((16 << 20))
run budget set --job "$job_id" --max unlimited --socket "$socket"
[[ $status == 0 ]] || fail "budget set --job --max unlimited: exit $status"
run budget set --job "$job_id" --min 0 --socket "$socket"
[[ $status == 0 ]] || fail "budget set --job --min 0: exit $status"

# Bad usage: nothing is sent, exit 2, the message names the value.
for args in "set" "set 1GiB 2GiB" "set --min 1GiB" "set --job $job_id 1GiB" "set --job $job_id" \
            "set --job abc --max 1GiB" "set --job 0 --max 1GiB" "set --job $job_id --max 12XB" \
            "set --job $job_id --min 2GiB --max 1GiB" "set --gpu x 1GiB" "set 0" "set --frob 1GiB" \
            "set --socket" "get --job 1" "get extra" "frob" ""; do
  # shellcheck disable=SC2086  # word splitting wanted
  run budget $args --socket "$socket"
  [[ $status == 2 ]] || fail "budget $args: exit $status, want 2"
  [[ ! -s $out ]] || fail "budget $args: wrote to stdout"
done
run budget set --job "$job_id" --max 12XB --socket "$socket"
grep -q "'12XB'" "$err" || fail "--max 12XB: message does not name the value"
budget_is "bad usage changed the budget" 50331648

# --- top -------------------------------------------------------------------------
run top --iterations 2 --interval 0.2 --socket "$socket"
[[ $status == 0 ]] || fail "top: exit $status"
[[ $(grep -c '^zico-umd pid' "$out") == 2 ]] || fail "top --iterations 2: not 2 frames"
grep -Eq "^ +$job_id +hold_memory 8MiB +8 MiB .* running +[▁▂▃▄▅▆▇█]+$" "$out" || fail "top: no line for the job"
grep -q '^GPU 0  budget 48 MiB' "$out" || fail "top: no GPU header"
[[ $(grep -c "^\* as of the job's last usage report" "$out") == 2 ]] || fail "top: no note on the reported columns"
! grep -q $'\x1b' "$out" || fail "top: escape sequences when stdout is not a terminal"
run top --json --iterations 2 --interval 0.2 --socket "$socket"
[[ $status == 0 ]] || fail "top --json: exit $status"
python3 -c '
import json, sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == 2, lines
for line in lines:
    d = json.loads(line)
    assert d["gpus"][0]["budget_bytes"] == 48 << 20, d["gpus"]
    assert [j["name"] for j in d["jobs"]] == ["hold_memory 8MiB"] and d["jobs"][0]["id"] == int(sys.argv[2]), d["jobs"]
' "$out" "$job_id" || fail "top --json: not one status object per refresh"
run top --interval 0 --socket "$socket"
[[ $status == 2 ]] || fail "top --interval 0: exit $status, want 2"
run top --iterations 0 --socket "$socket"
[[ $status == 2 ]] || fail "top --iterations 0: exit $status, want 2"

# --- suspend and resume ---------------------------------------------------------------
run suspend
[[ $status == 2 ]] || fail "suspend without JOB: exit $status, want 2"
run resume --socket "$socket"
[[ $status == 2 ]] || fail "resume without JOB: exit $status, want 2"
run suspend "$job_id" --to disk --socket "$socket"
[[ $status == 2 ]] || fail "suspend --to disk: exit $status, want 2"
grep -q "'disk'" "$err" || fail "suspend --to disk: message does not name the value"
run resume "$job_id" --to host --socket "$socket"
[[ $status == 2 ]] || fail "resume --to: exit $status, want 2"
run suspend "$job_id" --wait soon --socket "$socket"
[[ $status == 2 ]] || fail "suspend --wait soon: exit $status, want 2"
run suspend 999 --socket "$socket"
[[ $status == 1 ]] || fail "suspend 999: exit $status, want 1"
grep -q 'no job 999' "$err" || fail "suspend 999: message"

state_is() {
  run jobs --json --socket "$socket"
  check_json "$1" 'j = d["jobs"][0]; assert (j["state"], j["granted_bytes"] > 0) == (args[0], args[1] == "held"), j' "$2" "$3"
}
for store in host nvme; do
  run suspend "$job_id" --to "$store" --wait 10 --socket "$socket"
  [[ $status == 0 ]] || fail "suspend --to $store: exit $status"
  grep -q "job $job_id is suspended" "$out" || fail "suspend --to $store: no confirmation"
  state_is "suspend --to $store: state" suspended none
  run suspend "$job_id" --socket "$socket"
  [[ $status == 1 ]] || fail "suspend of a suspended job: exit $status, want 1"
  run resume "$job_id" --socket "$socket"
  [[ $status == 0 ]] || fail "resume after suspend --to $store: exit $status"
  grep -q "job $job_id is running" "$out" || fail "resume: no confirmation"
  state_is "resume after suspend --to $store: state" running held
done
run resume "$job_id" --socket "$socket"
[[ $status == 1 ]] || fail "resume of a running job: exit $status, want 1"

# --- no daemon, and daemons that do not answer -------------------------------------------
run status --socket "$tmp/none.sock"
[[ $status == 3 ]] || fail "no daemon: exit $status, want 3"
grep -q "no zico-umd is running at $tmp/none.sock" "$err" || fail "no daemon: message"
for command in "jobs" "top" "budget get" "budget set 1GiB" "suspend 1" "resume 1"; do
  # shellcheck disable=SC2086
  run $command --socket "$tmp/none.sock"
  [[ $status == 3 ]] || fail "$command without a daemon: exit $status, want 3"
done
# A socket file nobody listens on (a daemon that died): refused, the same answer.
python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET).bind(sys.argv[1])' "$tmp/stale.sock"
run status --socket "$tmp/stale.sock"
[[ $status == 3 ]] || fail "stale socket: exit $status, want 3"

# A daemon that says Goodbye to every request, as one that does not know it,
# and one that never answers.
# The protocol version the tools speak (sharing/protocol.h), for the fake's Goodbye.
protocol_version=$(sed -n 's/^inline constexpr uint16_t kVersion = \([0-9]*\);.*/\1/p' \
  "$(dirname "$0")/../../sharing/protocol.h")
[[ -n $protocol_version ]] || fail "no kVersion in sharing/protocol.h"
fake_daemon() {
  python3 -c '
import socket, struct, sys
path, mode, version = sys.argv[1], sys.argv[2], int(sys.argv[3])
server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
server.bind(path)
server.listen(8)
kept = []
while True:
    connection, _ = server.accept()
    connection.recv(65536)
    if mode == "goodbye":
        reason = b"JobControl is not a zico-umctl request"
        payload = struct.pack("<H", len(reason)) + reason
        connection.send(struct.pack("<IHHII", 0x4F43495A, version, 96, len(payload), 0) + payload)
        connection.close()
    else:
        kept.append(connection)
' "$1" "$2" "$protocol_version" 3>&- &  # not holding the job's input open
  fake_pids+=($!)
  wait_for test -S "$1" || fail "fake daemon $2 did not start"
}
fake_daemon "$tmp/goodbye.sock" goodbye
run suspend 1 --socket "$tmp/goodbye.sock"
[[ $status == 1 ]] || fail "Goodbye: exit $status, want 1"
grep -q 'JobControl is not a zico-umctl request' "$err" || fail "Goodbye: the reason is not printed"
fake_daemon "$tmp/silent.sock" silent
start=$SECONDS
run status --socket "$tmp/silent.sock"
[[ $status == 1 ]] || fail "silent daemon: exit $status, want 1"
grep -q 'no answer from zico-umd' "$err" || fail "silent daemon: message"
((SECONDS - start <= 8)) || fail "silent daemon: waited $((SECONDS - start)) s"

# --- help and usage ----------------------------------------------------------------------
for command in "" status jobs top budget "budget get" "budget set" suspend resume replay; do
  # shellcheck disable=SC2086
  run $command --help
  [[ $status == 0 ]] || fail "$command --help: exit $status"
  grep -q '^Usage: zico-umctl' "$out" || fail "$command --help: no usage on stdout"
done
for command in status jobs top suspend resume; do
  run $command --frobnicate --socket "$socket"
  [[ $status == 2 ]] || fail "$command --frobnicate: exit $status, want 2"
  grep -q "'--frobnicate'" "$err" || fail "$command --frobnicate: message does not name the option"
done
run status --socket
[[ $status == 2 ]] || fail "status --socket without a path: exit $status, want 2"
run status extra --socket "$socket"
[[ $status == 2 ]] || fail "status extra: exit $status, want 2"

# --- the job ends ------------------------------------------------------------------------
exec 3>&-
wait "$hold_pid"
hold_status=$?
hold_pid=
[[ $hold_status == 0 ]] || { fail "hold_memory: exit $hold_status"; cat "$tmp/hold.err"; }
jobs_gone() { "$umctl" jobs --json --socket "$socket" | grep -q '"jobs":\[\]'; }
wait_for jobs_gone || fail "the job is still listed after it exited"

if ((failures > 0)); then
  echo "--- zico-umd's log"; cat "$tmp/umd.log"
  echo "$failures check(s) failed"
  exit 1
fi
echo "all zico-umctl node checks passed"
