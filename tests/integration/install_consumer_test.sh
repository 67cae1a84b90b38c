#!/usr/bin/env bash
# cmake --install ships the library, header, tools, CMake package and
# pkg-config file, and a separate project can use each of them.
set -euo pipefail
build=$1 cmake=$2 consumer=$3
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT

"$cmake" --install "$build" --prefix "$prefix" >/dev/null
test -x "$prefix/bin/zico-run"
test -f "$prefix/include/zicoum/zicoum.h"

# find_package(zicoum)
"$cmake" -S "$consumer" -B "$prefix/consumer-build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
"$cmake" --build "$prefix/consumer-build" >/dev/null
ZICO_BACKEND=sim ZICO_BUDGET=8MiB "$prefix/consumer-build/consumer"

# pkg-config
export PKG_CONFIG_PATH=$(dirname "$(find "$prefix" -name zicoum.pc)")
cc "$consumer/consumer.c" $(pkg-config --cflags --libs zicoum) -o "$prefix/consumer-pc"
ZICO_BACKEND=sim ZICO_BUDGET=8MiB LD_LIBRARY_PATH=$(pkg-config --variable=libdir zicoum) "$prefix/consumer-pc"

# The installed zico-run finds the installed library by itself.
env -u ZICO_LIBRARY "$prefix/bin/zico-run" --backend sim -- env | grep -q "LD_PRELOAD=$prefix/.*libzicoum.so"
echo "install OK"
