#!/usr/bin/env bash
# zicoum's GPU suite: what only a real GPU can settle, in one run of a few
# minutes, from the repository root of a machine with a GPU and no network:
#
#   bash tests/gpu/run.sh OUTDIR
#
# It writes OUTDIR/report.json and OUTDIR/report.md (GPU, driver, CUDA and
# PyTorch versions, commit, each step's verdict and figures, every figure
# beside its baseline from the same run) and each step's log beside them.
# The first step after the build, `calibration`, measures what unified
# memory's primitives cost on this GPU (tests/gpu/um_calibration_probe.cu, in
# under 5 minutes) and writes OUTDIR/calibration.json (tests/gpu/calibration.py;
# ZICO_GPU_CALIBRATION reads it), which the GPT-2 and ResNet-50 steps then
# plan with and bound their runs by.
# Without a GPU it still writes the report ("gpu": null, every step skipped
# with its reason) and exits 77; CI runs that path (tests/gpu/run_sh_test.sh).
# Exit: 0 when every step that ran passed, 1 otherwise, 77 without a GPU.
#
# The build (only what the steps run) needs libnuma, liburing, libxxhash,
# zlib, pkg-config, GoogleTest and Google Benchmark, which a GPU image may
# lack. Fetch Debian's packages where a
# registry is reachable, into a folder the suite can see:
#   mkdir -p .debs && (cd .debs && apt-get download libnuma1 libnuma-dev liburing2 liburing-dev \
#     libxxhash0 libxxhash-dev libgtest-dev libgmock-dev googletest libbenchmark1debian libbenchmark-dev \
#     zlib1g-dev pkgconf pkgconf-bin libpkgconf3 pkg-config)
# The suite unpacks them (dpkg -x, no root needed) when the build cannot find
# the libraries; ZICO_GPU_DEBS names another folder. ZICO_GPU_BUDGET sets the
# budget the jobs run under (default 8GiB, far below any card it targets);
# ZICO_GPU_BUILD a build folder to use (default OUTDIR/build); ZICO_GPU_ONLY
# the steps to run (default all, e.g. "calibration um_gpt2"; the others are
# recorded as skipped).
set -u
out=${1:?usage: tests/gpu/run.sh OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo" || exit 1
steps="$out/steps.jsonl"
: >"$steps"
budget=${ZICO_GPU_BUDGET:-8GiB}
build=${ZICO_GPU_BUILD:-$out/build}  # an existing build folder is built on, not afresh
only=${ZICO_GPU_ONLY:-}
debs=${ZICO_GPU_DEBS:-$repo/.debs}
# Read: out of the jobs' environment, where libzicoum would warn of ZICO_*
# variables it does not know.
unset ZICO_GPU_BUDGET ZICO_GPU_BUILD ZICO_GPU_ONLY ZICO_GPU_DEBS

# record NAME VERDICT REASON [FIGURES_JSON]
record() {
  local figures=${4:-}
  [[ -n $figures ]] || figures='{}'
  python3 - "$steps" "$1" "$2" "$3" "$figures" "${step_seconds:-0}" <<'PY'
import json, sys
path, name, verdict, reason, figures, seconds = sys.argv[1:]
with open(path, "a") as out:
    out.write(json.dumps({"step": name, "verdict": verdict, "reason": reason,
                          "figures": json.loads(figures), "seconds": float(seconds)}) + "\n")
PY
  step_seconds=0  # the next step's own, once it runs
}

# run_step NAME TIMEOUT COMMAND...: its output in OUTDIR/NAME.log; pass on exit 0.
run_step() {
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >"$out/$name.log" 2>&1
  local status=$?
  step_seconds=$((SECONDS - start))
  return $status
}

skip_all() {
  local reason=$1
  for name in build calibration gpu_tests preload_kernels torch_training node_manager suspend_resume um_transfer um_mode um_node um_physical um_physical_swap um_gpt2 um_resnet50 um_unseen; do
    record "$name" skipped "$reason"
  done
}

# Steps to run: all, or those ZICO_GPU_ONLY names (e.g. "um_mode suspend_resume";
# um_mode brings um_node, suspend_resume reads torch_training's native run, um_physical
# reads um_mode's native MLP run or, where um_mode did not run, makes its own).
selected() {
  [[ -z $only || " $only " == *" $1 "* ]]
}

finish() {
  python3 "$repo/tests/gpu/report.py" "$out" "$steps" "$1"
  exit "$2"
}

gpu_name=""
if command -v nvidia-smi >/dev/null 2>&1; then
  gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
fi
if [[ -z $gpu_name ]]; then
  skip_all "no GPU: nvidia-smi lists none"
  finish "" 77
fi

# --- build ----------------------------------------------------------------------
if ! pkg-config --exists numa liburing libxxhash 2>/dev/null; then
  if compgen -G "$debs/*.deb" >/dev/null; then
    prefix="$out/deps"
    for deb in "$debs"/*.deb; do dpkg -x "$deb" "$prefix"; done
    libdir="$prefix/usr/lib/x86_64-linux-gnu"
    # A development link that names the system's library by its absolute
    # path (zlib's) dangles here: point it at this machine's copy instead.
    for link in "$libdir"/*.so; do
      [[ -e $link ]] && continue
      name=$(basename "$link")
      system=$(ldconfig -p | awk -v n="$name." 'index($1, n) == 1 && /x86-64/ {print $NF; exit}')
      if [[ -n $system ]]; then ln -sf "$system" "$link"; else rm -f "$link"; fi
    done
    export PATH="$prefix/usr/bin:$PATH"
    # The packages' .pc files say /usr: the sysroot puts their -I and -L under the prefix.
    export PKG_CONFIG_LIBDIR="$libdir/pkgconfig:$prefix/usr/share/pkgconfig"
    export PKG_CONFIG_SYSROOT_DIR="$prefix"
    export CMAKE_PREFIX_PATH="$prefix/usr:${CMAKE_PREFIX_PATH:-}"
    export LD_LIBRARY_PATH="$libdir:${LD_LIBRARY_PATH:-}"
  fi
fi
generator=() keep_going="-k"
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja) keep_going="-k 0"
# What the steps below run, not the unit tests (CI runs those).
targets="zicoum zico-run zico-umd zico-umctl zico-demo trace_job cuda_driver_contract_test grant_bench"
if run_step build 300 bash -c "cmake -S '$repo' -B '$build' ${generator[*]} -DZICO_WERROR=OFF && cmake --build '$build' -j \$(nproc) --target $targets -- $keep_going"; then
  record build passed "" "{\"seconds\": $step_seconds}"
else
  record build failed "the build failed: see build.log (missing libraries? see the header of this script)"
  for name in calibration gpu_tests preload_kernels torch_training node_manager suspend_resume um_transfer um_mode um_node um_physical um_physical_swap um_gpt2 um_resnet50 um_unseen; do
    record "$name" skipped "the build failed"
  done
  finish "$gpu_name" 1
fi
bin="$build/bin"

# --- 0. calibration: what unified memory's primitives cost here (P1-P9 of the UM cost review) --
# First, while the GPU is fresh and the suite's time is not spent; under 5 minutes with the
# build of the probe. OUTDIR/calibration.json is written from whatever probes ran.
calibration=""
if selected calibration; then
  if ! command -v nvcc >/dev/null 2>&1; then
    record calibration skipped "no nvcc to build tests/gpu/um_calibration_probe.cu"
  elif ! timeout 120 nvcc -cudart shared -o "$out/um_calibration_probe" tests/gpu/um_calibration_probe.cu \
      >"$out/calibration.build.log" 2>&1; then
    record calibration failed "nvcc failed: see calibration.build.log"
  else
    run_step calibration 170 "$out/um_calibration_probe"
    status=$?
    figures=$(python3 "$repo/tests/gpu/calibration.py" "$out/calibration.log" "$out/calibration.json" \
      --meta device="$gpu_name")
    derived=$?
    python3 -c 'import json,sys; json.loads(sys.argv[1])' "$figures" 2>/dev/null || figures='{}'
    [[ -s $out/calibration.json ]] && calibration="$out/calibration.json"
    if ((status == 0 && derived == 0)); then
      record calibration passed "" "$figures"
    else
      record calibration failed "see calibration.log (a probe's line holds its error; calibration.json has the rest)" \
        "$figures"
    fi
  fi
else
  record calibration skipped "not selected: ZICO_GPU_ONLY=$only"
fi

# --- 1. the gpu-labelled tests (driver contract on CudaDriver, torch_enable, ...) --
if selected gpu_tests; then
  run_step gpu_tests 150 ctest --test-dir "$build" -L gpu --output-on-failure
  gpu_status=$?
  summary=$(python3 "$repo/tests/gpu/ctest_summary.py" "$out/gpu_tests.log")
  if ((gpu_status != 0)); then
    record gpu_tests failed "see gpu_tests.log" "$summary"
  elif python3 -c 'import json,sys; sys.exit(0 if json.loads(sys.argv[1])["passed_count"] > 0 else 1)' "$summary"; then
    record gpu_tests passed "" "$summary"
  else
    record gpu_tests failed "every gpu test skipped although nvidia-smi lists a GPU: see gpu_tests.log" "$summary"
  fi
else
  record gpu_tests skipped "not selected: ZICO_GPU_ONLY=$only"
fi

# --- 2. a cudart-shared program with kernels, under zico-run --------------------------
if selected preload_kernels; then
  if ! command -v nvcc >/dev/null 2>&1; then
    record preload_kernels skipped "no nvcc to build tests/gpu/preload_kernels.cu"
  elif ! timeout 180 nvcc -cudart shared -o "$out/preload_kernels" tests/gpu/preload_kernels.cu >"$out/preload_kernels.build.log" 2>&1; then
    record preload_kernels failed "nvcc failed: see preload_kernels.build.log"
  elif run_step preload_kernels 90 env ZICO_SOCKET=off "$bin/zico-run" --backend cuda --budget 1GiB -- "$out/preload_kernels"; then
    record preload_kernels passed ""
  else
    record preload_kernels failed "see preload_kernels.log"
  fi
else
  record preload_kernels skipped "not selected: ZICO_GPU_ONLY=$only"
fi

# --- 3. PyTorch: native, zicoum.torch.enable, zico-run; losses bitwise equal --------
export PYTHONPATH="$build/python:${PYTHONPATH:-}"
torch_ok=1
python3 -c 'import torch' >/dev/null 2>&1 || torch_ok=-1
if ! selected torch_training; then
  record torch_training skipped "not selected: ZICO_GPU_ONLY=$only"
elif ((torch_ok < 0)); then
  record torch_training skipped "python3 has no PyTorch"
else
  for mode in native enable zico_run; do
    case $mode in
      native) command=(python3 tests/gpu/torch_training.py native) ;;
      enable) command=(env ZICO_SOCKET=off python3 tests/gpu/torch_training.py enable --budget "$budget") ;;
      zico_run) command=(env ZICO_SOCKET=off "$bin/zico-run" --backend cuda --budget "$budget" -- python3 tests/gpu/torch_training.py native) ;;
    esac
    run_step "torch_$mode" 120 "${command[@]}" || torch_ok=0
  done
  figures=$(python3 "$repo/tests/gpu/compare_training.py" "$out/torch_native.log" "$out/torch_enable.log" "$out/torch_zico_run.log")
  if ((torch_ok)) && python3 -c 'import json,sys; sys.exit(0 if json.loads(sys.argv[1]).get("all_equal") and json.loads(sys.argv[1]).get("graph_capture") == "refused" and json.loads(sys.argv[1]).get("record_stream") == "kept" else 1)' "$figures"; then
    record torch_training passed "" "$figures"
  else
    record torch_training failed "see torch_*.log (losses must be bitwise equal; a graph capture must be refused; a record_stream'ed tensor kept)" "$figures"
  fi
fi

# --- 4. two processes through zico-umd on the GPU ------------------------------------
if selected node_manager; then
  if run_step node_manager 120 "$bin/zico-demo" --backend cuda; then
    record node_manager passed "" "{\"demo\": \"see node_manager.log\"}"
  else
    record node_manager failed "zico-demo --backend cuda failed: see node_manager.log"
  fi
else
  record node_manager skipped "not selected: ZICO_GPU_ONLY=$only"
fi

# --- 5. suspend to host and resume in the middle of training: losses bitwise equal ----
if selected suspend_resume; then
  if ((torch_ok < 0)); then
    record suspend_resume skipped "python3 has no PyTorch"
  else
    run_step suspend_resume 120 env ZICO_SOCKET=off python3 tests/gpu/torch_training.py enable --budget "$budget" \
      --suspend-at 12 --zico-stats
    status=$?
    figures=$(python3 "$repo/tests/gpu/compare_training.py" --against "$out/torch_native.log" "$out/suspend_resume.log")
    if ((status == 0)) && python3 -c 'import json,sys; sys.exit(0 if json.loads(sys.argv[1])["equal"] else 1)' "$figures"; then
      record suspend_resume passed "" "$figures"
    else
      record suspend_resume failed "see suspend_resume.log (losses must be bitwise equal to native's)" "$figures"
    fi
  fi
else
  record suspend_resume skipped "not selected: ZICO_GPU_ONLY=$only"
fi

# --- 5b. what unified memory does on this GPU: prefetch and fault bandwidth, whether evictions
# give device memory back, whether accessed-by pages are read in place (tests/gpu/um_transfer_probe.cu)
if selected um_transfer; then
  if ! command -v nvcc >/dev/null 2>&1; then
    record um_transfer skipped "no nvcc to build tests/gpu/um_transfer_probe.cu"
  elif ! timeout 180 nvcc -cudart shared -o "$out/um_transfer_probe" tests/gpu/um_transfer_probe.cu \
      >"$out/um_transfer.build.log" 2>&1; then
    record um_transfer failed "nvcc failed: see um_transfer.build.log"
  else
    run_step um_transfer 120 "$out/um_transfer_probe" 1024
    status=$?
    figures=$(grep '^{' "$out/um_transfer.log" | tail -n 1)
    python3 -c 'import json,sys; json.loads(sys.argv[1])' "$figures" 2>/dev/null || figures='{}'
    if ((status == 0)); then record um_transfer passed "" "$figures"; else record um_transfer failed "see um_transfer.log" "$figures"; fi
  fi
else
  record um_transfer skipped "not selected: ZICO_GPU_ONLY=$only"
fi

# --- 6. UM mode: an MLP bigger than its budget trains, bitwise equal, within it ------------
# Its budget is half what it reserves natively; a second run with the whole
# native peak as the budget measures what UM mode costs when nothing pages;
# a third, under half, has cuBLAS's own runtime go through zicoum too.
# Its arena is 16 GiB: never more managed memory than the GPU has free.
mlp=(python3 tests/gpu/torch_training.py native --model mlp --iterations 10 --sample-gpu-memory)
peak_of='import json,sys; print(json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])["peak_reserved_bytes"])'
peak=""  # the native MLP's, once um_mode has run it
if selected um_mode; then
  if ((torch_ok < 0)); then
    record um_mode skipped "python3 has no PyTorch"
    record um_node skipped "python3 has no PyTorch"
  else
    run_step um_native 90 "${mlp[@]}"
    peak=$(python3 -c "$peak_of" "$out/um_native.log" 2>/dev/null)
    if [[ -z $peak ]]; then
      record um_mode failed "the native MLP run failed: see um_native.log"
      record um_node skipped "the native MLP run failed"
    else
      half=$(((peak / 2) >> 21 << 21))
      um_ok=1
      # half_static: cuBLAS's and cuDNN's own runtimes through zicoum too (ZICO_STATIC_RUNTIMES);
      # half_reports: CUPTI's fault reports on (ZICO_FAULT_REPORTS), what they cost against half.
      for run in half whole half_static half_reports; do
        [[ $run == whole ]] && limit=$(((peak + (2 << 20) - 1) >> 21 << 21)) || limit=$half
        [[ $run == half_static ]] && static=on || static=off
        [[ $run == half_reports ]] && reports=on || reports=off
        run_step "um_$run" 120 env ZICO_SOCKET=off ZICO_LOG=info ZICO_ARENA_SIZE=16GiB ZICO_STATIC_RUNTIMES=$static \
          ZICO_FAULT_REPORTS=$reports \
          "$bin/zico-run" --backend cuda --mode um --budget "$limit" -- "${mlp[@]}" --mark-iterations --zico-stats || um_ok=0
        python3 "$repo/tests/gpu/compare_training.py" --against "$out/um_native.log" "$out/um_$run.log" "$limit" \
          >"$out/um_$run.json"
      done
      figures=$(python3 - "$out/um_half.json" "$out/um_whole.json" "$out/um_half_static.json" "$out/um_half_reports.json" <<'PY'
import json, sys
half, whole, static, reports = (json.load(open(path)) for path in sys.argv[1:5])
print(json.dumps({"half_budget": half, "whole_budget": whole, "half_budget_static_runtimes": static,
                  "half_budget_fault_reports": reports}))
PY
  )
      # Under half its peak the pager must have seen the kernels and sent pages away.
      if ((um_ok)) && python3 -c 'import json,sys; f=json.loads(sys.argv[1]); sys.exit(0 if all(f[k]["equal"] and f[k].get("within_budget") for k in f) and f["half_budget"].get("kernels") and f["half_budget"].get("evicted_pages") else 1)' "$figures"; then
        record um_mode passed "" "$figures"
      else
        record um_mode failed "see um_half.log, um_whole.log, um_half_static.log, um_half_reports.log (losses bitwise equal to um_native.log's; pages on the GPU within the budget)" "$figures"
      fi
      # --- 7. two such UM jobs under zico-umd, 1.25 x one's peak between them -------------
      run_step um_node 180 python3 tests/gpu/um_node_gpu.py "$bin" "$out/um_native.log" $((peak * 5 / 4 >> 21 << 21)) "$out"
      status=$?
      figures=$(tail -n 1 "$out/um_node.log")
      python3 -c 'import json,sys; json.loads(sys.argv[1])' "$figures" 2>/dev/null || figures='{}'
      if ((status == 0)); then record um_node passed "" "$figures"; else record um_node failed "see um_node.log, umd.log, um_node_job*.log" "$figures"; fi
    fi
  fi
else
  record um_mode skipped "not selected: ZICO_GPU_ONLY=$only"
  record um_node skipped "not selected: ZICO_GPU_ONLY=$only"
fi

# --- 7b. what a UM job's budget leaves to a plain process beside it --------------------------
# tests/gpu/um_physical_gpu.py: the MLP under zico-umd at half its native peak, alone, then beside
# a process not under zicoum that cudaMallocs the rest of the device once the job is in its steady
# state; NVML polled all along. It passes when that process saw and got the rest, the job ran at
# most 1.10x slower beside it, NVML never counted more than the budget and the contexts for the job,
# and the losses are bitwise equal to native's.
#   um_physical: the job's pages managed (unified memory keeps an evicted block's chunk with its
#     job, so NVML and cudaMemGetInfo are expected to count the native peak: that is what it measures);
#   um_physical_swap: swapped (ZICO_UM_MEMORY=swap: a page that leaves gives its device memory back).
um_physical_step() {
  local step=$1 memory=$2
  if ! selected "$step"; then
    record "$step" skipped "not selected: ZICO_GPU_ONLY=$only"
    return
  elif ((torch_ok < 0)); then
    record "$step" skipped "python3 has no PyTorch"
    return
  fi
  local native_log="$out/um_native.log"
  if [[ -z $peak ]]; then
    native_log="$out/um_physical_native.log"
    run_step um_physical_native 90 "${mlp[@]}"
    peak=$(python3 -c "$peak_of" "$native_log" 2>/dev/null)
  fi
  if [[ -z $peak ]]; then
    record "$step" failed "the native MLP run failed: see ${native_log##*/}"
    return
  fi
  ZICO_UM_MEMORY=$memory run_step "$step" 180 python3 tests/gpu/um_physical_gpu.py "$bin" "$native_log" \
    $(((peak / 2) >> 21 << 21)) "$out"
  local status=$? figures why
  figures=$(grep '^{' "$out/$step.log" | tail -n 1)
  python3 -c 'import json,sys; json.loads(sys.argv[1])' "$figures" 2>/dev/null || figures='{}'
  if ((status == 0)); then
    record "$step" passed "" "$figures"
  else
    why=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1]).get("why", ""))' "$figures")
    record "$step" failed "${why:-um_physical_gpu.py exited $status}: see $step.log, umd_${step#um_}.log, ${step}_alone.log, ${step}_beside.log, ${step}_other.log" "$figures"
  fi
}
um_physical_step um_physical managed
um_physical_step um_physical_swap swap

# --- 8. GPT-2 small and ResNet-50: zico's paging against demand paging and what users reach for ---
# um_model_step STEP MODEL PREFIX ARENA: one training run (same seed, same 6 iterations) as
#   native: PyTorch alone: the losses and the time to match, and its peak;
#   save_on_cpu, checkpoint: the activations in pinned host memory
#     (torch.autograd.graph.save_on_cpu) or recomputed (torch.utils.checkpoint), their peaks;
#   zico, um: UM mode under half the native peak, zicoum's planner and plain demand paging;
#   zico_at_save_on_cpu_budget: zico under save_on_cpu's peak;
#   zico_tuned: zico planned on this run's calibration (ZICO_GPU_CALIBRATION), or where the
#     calibration step did not run, on the link um_transfer measured (ZICO_HOST_BANDWIDTH).
# Its figures: each against native, the transfer bound from the calibration's link rates
# (compare_training.py --model-step), and whether every UM run's losses equal native's.
um_model_step() {
  local step=$1 model=$2 prefix=$3 arena=$4
  if ((torch_ok < 0)); then
    record "$step" skipped "python3 has no PyTorch"
    return
  fi
  if [[ $model == gpt2 ]] && ! python3 -c 'import transformers' >/dev/null 2>&1; then
    record "$step" skipped "python3 has no transformers"
    return
  fi
  if [[ $model == resnet50 ]] && ! python3 -c 'import torchvision' >/dev/null 2>&1; then
    record "$step" skipped "python3 has no torchvision"
    return
  fi
  local train=(python3 tests/gpu/torch_training.py native --model "$model" --iterations 6 --sample-gpu-memory)
  local ok=1 run peak_of
  peak_of='import json,sys; print(json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])["peak_reserved_bytes"])'
  for run in native save_on_cpu checkpoint; do
    run_step "${prefix}_$run" 90 "${train[@]}" --activations "${run/native/default}" || ok=0
  done
  local peak saved
  peak=$(python3 -c "$peak_of" "$out/${prefix}_native.log" 2>/dev/null)
  if [[ -z $peak ]]; then
    record "$step" failed "the native run failed: see ${prefix}_native.log"
    return
  fi
  saved=$(python3 -c "$peak_of" "$out/${prefix}_save_on_cpu.log" 2>/dev/null)
  local half=$(((peak / 2) >> 21 << 21)) link tuned=()
  link=$(python3 -c 'import json,sys; f=json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1]); r=min(f["h2d_gbps"], f["d2h_gbps"]); print(f"{r:.2f}GB/s" if r > 0 else "")' \
    "$out/um_transfer.log" 2>/dev/null)
  if [[ -n $calibration ]]; then
    tuned=(ZICO_GPU_CALIBRATION="$calibration")
  elif [[ -n $link ]]; then
    tuned=(ZICO_HOST_BANDWIDTH="$link")
  fi
  local runs=(zico um)
  [[ -n $saved ]] && runs+=(zico_at_save_on_cpu_budget) || ok=0
  ((${#tuned[@]})) && runs+=(zico_tuned)
  rm -f "$out/${prefix}"_{zico,um,zico_at_save_on_cpu_budget,zico_tuned}.json
  for run in "${runs[@]}"; do
    local policy=zico limit=$half extra=()
    [[ $run == um ]] && policy=um
    [[ $run == zico_at_save_on_cpu_budget ]] && limit=$((saved >> 21 << 21))
    [[ $run == zico_tuned ]] && extra=("${tuned[@]}")
    run_step "${prefix}_$run" 100 env ZICO_SOCKET=off ZICO_LOG=info ZICO_ARENA_SIZE="$arena" ZICO_PAGING_POLICY=$policy \
      "${extra[@]}" "$bin/zico-run" --backend cuda --mode um --budget "$limit" -- "${train[@]}" --mark-iterations \
      --zico-stats || ok=0
    python3 "$repo/tests/gpu/compare_training.py" --against "$out/${prefix}_native.log" "$out/${prefix}_$run.log" "$limit" \
      >"$out/${prefix}_$run.json"
  done
  local figures
  figures=$(python3 "$repo/tests/gpu/compare_training.py" --model-step "$out" "$prefix" "${calibration:-$link}")
  python3 -c 'import json,sys; json.loads(sys.argv[1])' "$figures" 2>/dev/null || figures='{}'
  # Every UM run bitwise equal to native and within its budget; under half its peak zico's pager
  # must have seen the kernels and sent pages away.
  if ((ok)) && python3 -c 'import json,sys; f=json.loads(sys.argv[1]); runs=[f[k] for k in ("zico_policy", "demand_paging", "zico_at_save_on_cpu_budget", "zico_policy_tuned") if k in f]; sys.exit(0 if f["losses_equal"] and all(r.get("within_budget") for r in runs) and f["zico_policy"].get("kernels") and f["zico_policy"].get("evicted_pages") else 1)' "$figures"; then
    record "$step" passed "" "$figures"
  else
    record "$step" failed "see ${prefix}_*.log (losses bitwise equal to ${prefix}_native.log's; pages on the GPU within the budget; the baselines ran)" "$figures"
  fi
}
for step in um_gpt2 um_resnet50; do
  if ! selected $step; then
    record $step skipped "not selected: ZICO_GPU_ONLY=$only"
  elif [[ $step == um_gpt2 ]]; then
    um_model_step um_gpt2 gpt2 gpt2 24GiB
  else
    um_model_step um_resnet50 resnet50 resnet50 16GiB
  fi
done

# --- 9. a kernel that reaches blocks through a pointer table, in UM mode -----------------
# Its parameters name only the table: the blocks are learnt from CUPTI's
# fault reports (ZICO_FAULT_REPORTS), then fetched ahead and counted within
# the budget. 512 MiB of blocks under a 384 MiB budget; every sum is checked.
# tests/gpu/cupti_um_probe.cu first asks whether this platform's CUPTI reports
# a kernel's faults at all (fault records, or the transfers faults caused):
# where it reports neither, the step is skipped with that reason.
if selected um_unseen; then
  if ! command -v nvcc >/dev/null 2>&1; then
    record um_unseen skipped "no nvcc to build tests/gpu/um_unseen_uses.cu"
  elif ! timeout 180 nvcc -cudart shared -I"$repo/libzicoum/include" -o "$out/um_unseen_uses" \
      tests/gpu/um_unseen_uses.cu >"$out/um_unseen.build.log" 2>&1; then
    record um_unseen failed "nvcc failed: see um_unseen.build.log"
  else
    # libcupti where the toolkit or PyTorch's wheels keep it (the program itself loads no PyTorch).
    cupti=$( (ls /usr/local/cuda/extras/CUPTI/lib64/libcupti.so* /usr/local/cuda/lib64/libcupti.so* /usr/local/cuda/lib/libcupti.so* \
      /usr/local/cuda/targets/*/lib/libcupti.so*; python3 -c 'import glob, site
for d in site.getsitepackages(): print("\n".join(glob.glob(d + "/nvidia/**/libcupti.so*", recursive=True)))') \
      2>/dev/null | head -n 1)
    [[ -n $cupti ]] && cupti_dir=$(dirname "$cupti") || cupti_dir=""
    probe='{"probe": "not built: see cupti_probe.log"}' probe_status=2
    if [[ -n $cupti_dir ]] && timeout 180 nvcc -cudart shared -I/usr/local/cuda/include -I/usr/local/cuda/extras/CUPTI/include \
        -L"$cupti_dir" -Xlinker -rpath="$cupti_dir" -l:"$(basename "$cupti")" -o "$out/cupti_um_probe" tests/gpu/cupti_um_probe.cu \
        >"$out/cupti_probe.log" 2>&1; then
      timeout 60 "$out/cupti_um_probe" late >>"$out/cupti_probe.log" 2>&1
      probe_status=$?
      probe=$(grep '^{' "$out/cupti_probe.log" | tail -n 1)
      python3 -c 'import json,sys; json.loads(sys.argv[1])' "$probe" 2>/dev/null || probe='{}'
    fi
    run_step um_unseen 90 env ZICO_SOCKET=off ZICO_LOG=info ZICO_ARENA_SIZE=4GiB ZICO_FAULT_REPORTS=on \
      LD_LIBRARY_PATH="$cupti_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$bin/zico-run" --backend cuda \
      --mode um --budget 384MiB -- "$out/um_unseen_uses" $((384 << 20))
    status=$?
    figures=$(grep '^{' "$out/um_unseen.log" | tail -n 1)
    python3 -c 'import json,sys; json.loads(sys.argv[1])' "$figures" 2>/dev/null || figures='{}'
    figures=$(python3 -c 'import json,sys; f=json.loads(sys.argv[1]); f["cupti_probe"]=json.loads(sys.argv[2]); print(json.dumps(f))' \
      "$figures" "$probe")
    if ((status == 0)); then
      record um_unseen passed "" "$figures"
    elif ((probe_status == 1 && status != 124 && status != 137)); then  # not for a step that ran out of time
      record um_unseen skipped "this platform's CUPTI reports neither GPU page faults nor the transfers they cause (cupti_probe.log)" "$figures"
    else
      record um_unseen failed "see um_unseen.log (ZICO_LOG=info says whether CUPTI's fault reports started and what they held)" "$figures"
    fi
  fi
else
  record um_unseen skipped "not selected: ZICO_GPU_ONLY=$only"
fi

verdicts=$(python3 -c 'import json,sys; print(" ".join(json.loads(l)["verdict"] for l in open(sys.argv[1])))' "$steps")
[[ $verdicts == *failed* ]] && finish "$gpu_name" 1
finish "$gpu_name" 0
