#!/usr/bin/env bash
# GPU mode of the trace capture, end to end on a real GPU: captures CIFAR ResNet-110 at batch 8 for 3
# iterations with `capture.py --device cuda`, checks the trace against every rule of the format, and
# compares its sizes with a meta-mode capture of the same settings (compare_devices.py).
# Usage: gpu_capture_test.sh PYTHON TRACES_DIR
#   PYTHON      a Python with PyTorch built for CUDA (ResNet-110 needs nothing else)
#   TRACES_DIR  tools/traces of the source tree
# Exits 77 (CTest: skipped), saying why, when PYTHON has no PyTorch or sees no CUDA device, or when
# capture.py refuses the GPU because too little of its memory is free (it never oversubscribes a
# shared GPU). ResNet-110 at batch 8 peaks near 85 MiB of tensors, so the capture asks for about 2.1 GiB
# free (see gpu_memory_plan in capture.py).
set -u

if (($# != 2)); then
  echo "usage: $0 PYTHON TRACES_DIR" >&2
  exit 2
fi
python=$1
traces=$2
exit_no_gpu=3   # capture.py's EXIT_NO_GPU

if ! probe=$("$python" -c "import torch; assert torch.cuda.is_available(), 'torch.cuda.is_available() is False'" 2>&1); then
  echo "SKIP: $python has no PyTorch with a usable CUDA device:"
  printf '%s\n' "$probe" | tail -n 2
  exit 77
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
settings=(--model resnet110 --batch 8 --iterations 3)
cuda_trace=$tmp/resnet110-cuda.ztrace.gz
meta_trace=$tmp/resnet110-meta.ztrace.gz

fail() {
  echo "FAIL: $*"
  exit 1
}

echo "--- capture on cuda"
"$python" "$traces/capture.py" --device cuda "${settings[@]}" --out "$cuda_trace"
status=$?
if ((status == exit_no_gpu)); then
  echo "SKIP: capture.py refused the GPU (the reason is above)"
  exit 77
fi
((status == 0)) || fail "capture.py --device cuda exited with $status"

echo "--- check the cuda trace"
"$python" "$traces/check_trace.py" "$cuda_trace" || fail "the cuda trace breaks the format"
header=$(gzip -dc "$cuda_trace" | sed -n '/^meta /p')
printf '%s\n' "$header" | grep -qx 'meta source cuda' || fail "no 'meta source cuda' line"
printf '%s\n' "$header" | grep -q '^meta timing CUDA events per op' || fail "meta timing does not name CUDA events"
for key in gpu nvidia_driver cuda_driver_api cuda_runtime cudnn footprint allocator_max_allocated; do
  printf '%s\n' "$header" | grep -q "^meta $key " || fail "no meta $key line"
done
# A block first seen as an op's input means the recorder missed the op that made it (for instance
# backward, which autograd runs on its CUDA thread).
printf '%s\n' "$header" | grep -qx 'meta untracked_blocks 0' ||
  fail "the recorder found blocks made where it could not see: $(printf '%s\n' "$header" | grep '^meta untracked_blocks')"
# Measured times: some op took time, and not every op the same (a stuck clock would).
distinct=$(gzip -dc "$cuda_trace" | awk '$1 == "o" && $4 > 0 && !($4 in d) { d[$4] = 1; n++ } END { print n + 0 }')
((distinct > 10)) || fail "only $distinct distinct nonzero op durations: are the CUDA events read?"

echo "--- capture on meta, the same settings"
"$python" "$traces/capture.py" "${settings[@]}" --out "$meta_trace" || fail "the meta capture failed"
"$python" "$traces/check_trace.py" "$meta_trace" || fail "the meta trace breaks the format"

echo "--- compare"
# Tolerance 1 % of the meta peak (about 0.9 MB of ~88 MB). The same kernels make tensors of the same
# sizes on both devices, and capture.py records storage nbytes on both, so the expected difference is
# zero; what a GPU may add is small per-layer state, such as a reserve-space output of cuDNN's batch
# norm (the meta device runs native_batch_norm), which over 109 layers stays far below 1 %. Anything
# structural is far above it: one class of saved tensors missing or extra (109 layers x 128 to 512 KiB
# each) is 15 % or more. compare_devices.py also requires the bytes live at the end (parameters,
# gradients, Adam state) to be exactly the same, which catches a leak that survives the iterations.
"$python" "$traces/compare_devices.py" --tolerance 0.01 "$meta_trace" "$cuda_trace" ||
  fail "the cuda trace's sizes differ from the meta trace's (the differences are listed above)"

echo "gpu capture checks passed"
