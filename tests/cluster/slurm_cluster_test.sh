#!/usr/bin/env bash
# Slurm places jobs by the GPU memory they ask for, zico-umd time-shifts
# them: a one-node Slurm cluster on this machine (munged, slurmctld, slurmd,
# all with their files in a temporary folder), the SPANK plugin in its plug
# stack, zico-umd on the simulated backend with a budget that the node's
# `gpumem` GRES over-commits 1.45x, and jobs replaying committed traces
# through trace_job. Checks: the plugin's budget, name, socket and preload
# reach the tasks (the default from the GRES, --zico-budget, a bad value
# refused at submission, a budget too small failing the job); every job
# completes; the daemon never lends beyond its budget; the jobs co-run; a
# cancelled job's memory is back in the daemon's pool within a second.
# Skips (77) where Slurm cannot run: not root, packages missing, or a
# daemon that does not start (its log's tail is printed).
# Usage: slurm_cluster_test.sh ZICO_UMD ZICO_UMCTL TRACE_JOB LIBZICOUM SPANK_PLUGIN TRACES_DIR
set -u
umd=$1 umctl=$2 trace_job=$3 libzicoum=$4 plugin=$5 traces=$6
export PATH=$PATH:/usr/sbin:/sbin

skip() { echo "SKIP: $*"; exit 77; }
[[ $(id -u) == 0 ]] || skip "needs root: munged, slurmctld and slurmd run as root here"
for program in munged slurmctld slurmd sbatch srun squeue scontrol scancel; do
  command -v "$program" >/dev/null || skip "$program is missing (apt-get install slurm-wlm munge)"
done
[[ -f $plugin ]] || skip "the SPANK plugin was not built (slurm/spank.h missing: apt-get install libslurm-dev)"

tmp=$(mktemp -d /tmp/zico-slurm.XXXXXX)
chmod 0700 "$tmp"
failures=0
pids=()  # daemons, in start order; stopped in reverse
sampler_pid=

cleanup() {
  [[ -n $sampler_pid ]] && kill "$sampler_pid" 2>/dev/null
  # Jobs first, while slurmctld and slurmd can still end them.
  if [[ -f $tmp/slurm.conf ]] && [[ -n $(squeue -h -o %i 2>/dev/null) ]]; then
    scancel --full $(squeue -h -o %i) 2>/dev/null
    for _ in $(seq 50); do [[ -z $(squeue -h -o %i 2>/dev/null) ]] && break; sleep 0.1; done
  fi
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill "${pids[i]}" 2>/dev/null; done
  for pid in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null
  done
  wait 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

wait_for() {  # up to $1 tenths of a second for the command after it
  local tries=$1
  shift
  for _ in $(seq "$tries"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  return 1
}

# Two free TCP ports for slurmctld and slurmd.
read -r ctld_port slurmd_port < <(python3 -c 'import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')

# --- the memory plan ---------------------------------------------------------------
# Memory at 1/256 of the traces' (MiB-sized jobs: peaks of 22-59 MiB), time
# stretched 10x (a few seconds each). Each job asks Slurm for its peak under zicoum plus slack; the node's
# gpumem count is their sum, 1.45x what zico-umd lends.
chunk=8192
memory_scale=1/256
declare -A gres=([bert_base]=44 [gpt2]=72 [vit_b_16]=44 [resnet50]=28)  # MiB
node_gres=$((44 + 72 + 44 + 28))
budget=$(( (node_gres << 20) * 100 / 145 / chunk * chunk ))
export ZICO_BACKEND=sim ZICO_SIM_GRANULARITY=$chunk ZICO_WAIT_TIMEOUT=120s ZICO_LOG=warn

# --- munged, with its own key and socket ------------------------------------------------
mkdir -p "$tmp/munge" "$tmp/state" "$tmp/spool"
chmod 0700 "$tmp/munge"
dd if=/dev/urandom of="$tmp/munge/key" bs=1024 count=1 status=none
chmod 0400 "$tmp/munge/key"
munged --foreground --force --socket="$tmp/munge/socket" --key-file="$tmp/munge/key" \
  --pid-file="$tmp/munge/pid" --log-file="$tmp/munge/log" --seed-file="$tmp/munge/seed" 2>"$tmp/munge/stderr" &
pids+=($!)
if ! wait_for 50 test -S "$tmp/munge/socket"; then
  tail -n 20 "$tmp/munge/stderr" "$tmp/munge/log"
  skip "munged did not start"
fi

# --- zico-umd ---------------------------------------------------------------------------
socket=$tmp/umd.sock
"$umd" --socket "$socket" --budget "$budget" --chunk-size "$chunk" >"$tmp/umd.log" 2>&1 &
pids+=($!)
wait_for 50 test -S "$socket" || { cat "$tmp/umd.log"; fail "zico-umd did not start"; exit 1; }

# --- slurmctld and slurmd ---------------------------------------------------------------
cat >"$tmp/slurm.conf" <<CONF
ClusterName=zicotest
SlurmctldHost=localhost
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$tmp/munge/socket
CredType=cred/munge
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/slurmctld.log
SlurmdLogFile=$tmp/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
GresTypes=gpumem
SchedulerType=sched/builtin
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$tmp/jobcomp.txt
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=5
PlugStackConfig=$tmp/plugstack.conf
NodeName=zico1 NodeHostname=$(hostname -s) NodeAddr=127.0.0.1 CPUs=8 Gres=gpumem:${node_gres}M State=UNKNOWN
PartitionName=zico Nodes=zico1 Default=YES MaxTime=10 State=UP
CONF
echo "NodeName=zico1 Name=gpumem Count=${node_gres}M" >"$tmp/gres.conf"
echo "required $plugin socket=$socket library=$libzicoum" >"$tmp/plugstack.conf"
export SLURM_CONF=$tmp/slurm.conf

slurmctld -D -i -f "$tmp/slurm.conf" >"$tmp/slurmctld.stderr" 2>&1 &
pids+=($!)
if ! wait_for 100 scontrol ping; then
  tail -n 20 "$tmp/slurmctld.stderr" "$tmp/slurmctld.log" 2>/dev/null
  skip "slurmctld did not start"
fi
slurmd -D -f "$tmp/slurm.conf" -N zico1 >"$tmp/slurmd.stderr" 2>&1 &
pids+=($!)
node_idle() { [[ $(sinfo -h -n zico1 -o %t) == idle ]]; }
if ! wait_for 150 node_idle; then
  tail -n 20 "$tmp/slurmd.stderr" "$tmp/slurmd.log" 2>/dev/null
  skip "slurmd did not start (node state '$(sinfo -h -n zico1 -o %t 2>/dev/null)')"
fi
started=$SECONDS

# --- submission: a bad --zico-budget is refused, naming the value ---------------------------
if sbatch --zico-budget=12XB --wrap true >"$tmp/bad.out" 2>&1; then
  fail "sbatch --zico-budget=12XB was accepted"
elif ! grep -q "12XB" "$tmp/bad.out" || ! grep -q "e.g. 512MiB" "$tmp/bad.out"; then
  fail "sbatch --zico-budget=12XB: the message lacks the value or the accepted form:"; cat "$tmp/bad.out"
fi

# --- the daemon's view, sampled while the jobs run ------------------------------------------
(
  while :; do
    "$umctl" status --json --socket "$socket" 2>/dev/null | tr -d '\n'
    echo
    sleep 0.05
  done
) >"$tmp/samples.jsonl" &
sampler_pid=$!

# --- the jobs ---------------------------------------------------------------------------------
# Each prints what the plugin gave it, then becomes the replaying job.
submit() {  # NAME ITERATIONS [SBATCH OPTION]...
  local name=$1 iterations=$2
  shift 2
  sbatch --parsable --gres=gpumem:${gres[$name]}M -J "$name" -o "$tmp/%j.out" -e "$tmp/%j.err" "$@" \
    --wrap "echo ZICO_BUDGET=\$ZICO_BUDGET ZICO_SOCKET=\$ZICO_SOCKET ZICO_JOB_NAME=\$ZICO_JOB_NAME \
LD_PRELOAD=\$LD_PRELOAD; exec $trace_job --trace $traces/$name.ztrace.gz --iterations $iterations \
--time-scale 10 --memory-scale $memory_scale"
}
declare -A job_of
job_of[bert_base]=$(submit bert_base 12)
job_of[gpt2]=$(submit gpt2 10 --zico-budget=68MiB)
job_of[vit_b_16]=$(submit vit_b_16 12)
job_of[resnet50]=$(submit resnet50 1000)  # cancelled mid-run
for name in "${!job_of[@]}"; do
  [[ ${job_of[$name]} =~ ^[0-9]+$ ]] || { fail "sbatch of $name: '${job_of[$name]}'"; exit 1; }
done

# --- scancel: the job's memory is back within a second -----------------------------------------
victim=${job_of[resnet50]}
victim_holds() {
  "$umctl" status --json --socket "$socket" | python3 -c 'import json, sys
d = json.load(sys.stdin)
sys.exit(0 if any(j["name"] == sys.argv[1] and j["granted_bytes"] > 0 for j in d["jobs"]) else 1)' "slurm-$victim.batch"
}
if ! wait_for 200 victim_holds; then
  fail "job $victim (resnet50) never held memory in zico-umd under the name slurm-$victim.batch"
else
  sleep 2  # mid-run, beside the others
  # Its row leaves the daemon's status when its chunks are back in the pool.
  victim_listed() { "$umctl" status --json --socket "$socket" | grep -q "\"slurm-$victim.batch\""; }
  cancelled_at=$(date +%s%N)
  scancel "$victim"
  while victim_listed && (($(date +%s%N) - cancelled_at < 2000000000)); do sleep 0.01; done
  freed_ms=$((($(date +%s%N) - cancelled_at) / 1000000))
  if victim_listed; then
    fail "job $victim still holds memory 2 s after scancel"
  elif ((freed_ms > 1000)); then
    fail "job $victim's memory came back ${freed_ms} ms after scancel, more than a second"
  else
    echo "scancel: job $victim's memory back in zico-umd's pool after ${freed_ms} ms"
  fi
fi

# --- every other job completes ------------------------------------------------------------------
jobs_done() { [[ -z $(squeue -h -o %i) ]]; }
wait_for 900 jobs_done || fail "jobs still queued or running after 90 s: $(squeue -h -o '%i %j %T %r')"
kill "$sampler_pid" 2>/dev/null
wait "$sampler_pid" 2>/dev/null
sampler_pid=
echo "jobs ran for $((SECONDS - started)) s"

for name in bert_base gpt2 vit_b_16 resnet50; do
  id=${job_of[$name]}
  state=$(grep -o "JobId=$id .*" "$tmp/jobcomp.txt" | grep -o 'JobState=[A-Z_]*' | head -n 1)
  expected=JobState=COMPLETED
  [[ $name == resnet50 ]] && expected=JobState=CANCELLED
  [[ $state == "$expected" ]] || { fail "job $id ($name): '$state', expected $expected"; cat "$tmp/$id.err"; }
  [[ $name == resnet50 ]] && continue
  grep -q '^result name=' "$tmp/$id.out" || fail "job $id ($name) printed no result line"
  budget_expected=$((gres[$name] << 20))
  [[ $name == gpt2 ]] && budget_expected=$((68 << 20))  # --zico-budget wins over the GRES
  grep -q "^ZICO_BUDGET=$budget_expected ZICO_SOCKET=$socket ZICO_JOB_NAME=slurm-$id.batch LD_PRELOAD=$libzicoum" \
    "$tmp/$id.out" || { fail "job $id ($name): the plugin's environment is wrong:"; head -n 1 "$tmp/$id.out"; }
done

# --- the daemon's samples: within budget, jobs side by side, under their Slurm names ----------------
python3 - "$tmp/samples.jsonl" "$budget" "${job_of[@]}" <<'PY' || fail "the daemon's samples (above)"
import json, sys
path, budget, ids = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
samples = [json.loads(line) for line in open(path) if line.strip()]
assert len(samples) > 20, f"only {len(samples)} samples of zico-umctl status"
worst = max(g["granted_bytes"] for s in samples for g in s["gpus"])
assert all(g["budget_bytes"] == budget for s in samples for g in s["gpus"]), "budget changed"
assert worst <= budget, f"granted {worst} bytes > budget {budget}"
together = max(sum(1 for j in s["jobs"] if j["granted_bytes"] > 0) for s in samples)
assert together >= 2, f"at most {together} job(s) held memory at once"
names = {j["name"] for s in samples for j in s["jobs"]}
expected = {f"slurm-{i}.batch" for i in ids}
assert expected <= names, f"zico-umd saw {sorted(names)}, expected {sorted(expected)}"
print(f"{len(samples)} samples: at most {worst / 2**20:.1f} MiB of {budget / 2**20:.1f} MiB lent, "
      f"up to {together} jobs at once")
PY

# --- a budget too small for the job fails it: the option caps the task ---------------------------
if srun --gres=gpumem:1M --zico-budget=4MiB "$trace_job" --trace "$traces/bert_base.ztrace.gz" --iterations 1 \
     --memory-scale "$memory_scale" >"$tmp/small.out" 2>&1; then
  fail "a job with --zico-budget=4MiB replayed bert_base (~35 MiB at this scale)"
elif ! grep -q "allocating block" "$tmp/small.out"; then
  fail "the job with --zico-budget=4MiB failed, but not at an allocation:"; cat "$tmp/small.out"
fi

if ((failures)); then
  echo "--- zico-umd's log"; tail -n 30 "$tmp/umd.log"
  echo "--- slurmd's log"; tail -n 30 "$tmp/slurmd.log"
  echo "$failures failure(s)"
  exit 1
fi
echo "PASS"
