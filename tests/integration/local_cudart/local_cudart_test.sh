#!/usr/bin/env bash
# The real CUDA functions behind zicoum's interposed ones are found when
# libcudart arrives with a library opened RTLD_LOCAL (not in the global
# scope that dlsym(RTLD_NEXT) searches): every call gives what it gives when
# the library is opened RTLD_GLOBAL.
#   local_cudart_test.sh PROBE SHIM LIBZICOUM
set -u
probe=$1 shim=$2 library=$3
export ZICO_BACKEND=sim ZICO_SOCKET=off
global=$(LD_PRELOAD=$library "$probe" "$shim" global) || { echo "FAIL: global run: $global"; exit 1; }
local_=$(LD_PRELOAD=$library "$probe" "$shim" local) || { echo "FAIL: local run: $local_"; exit 1; }
echo "global: $global"
echo "local:  $local_"
# 400 (invalid resource handle) and 1 (invalid value) are what zicoum answers
# when it cannot find the real function; the real cudart answers otherwise.
if grep -qE '=400|_foreign=1 ' <<<"$global"; then
  echo "FAIL: even RTLD_GLOBAL does not reach the real cudart"
  exit 1
fi
[[ $local_ == "$global" ]] || { echo "FAIL: RTLD_LOCAL answers differ from RTLD_GLOBAL"; exit 1; }
echo OK
