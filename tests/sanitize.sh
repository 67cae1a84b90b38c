#!/usr/bin/env bash
# Builds the unit tests with AddressSanitizer and UndefinedBehaviorSanitizer
# and runs them (CTest label `unit`); the first report fails the run.
# Usage: tests/sanitize.sh [BUILD_DIR]   (default: build-sanitize)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build-sanitize}"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DZICO_SANITIZE=ON -DZICO_WERROR=ON \
  -DCMAKE_CXX_FLAGS=-O1 >/dev/null
cmake --build "$build" --target zicoum_unit_tests zicoum_sharing_tests zicoum_tool_tests zicoum_paging_tests \
  static_runtime_probe
# detect_leaks: the runtime is never destroyed by design (docs/architecture.md), but the unit tests
# own every object they make, so a leak there is a real one.
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
ctest --test-dir "$build" -L unit --output-on-failure -j2
# An instrumented program that links libzicoum: the sanitizer's start asks libzicoum's dlsym for its
# interceptors before anything is set up (libzicoum/dlsym_interpose.cpp). Without leak checks: the
# runtime such a program starts lives until the process ends, by design.
ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:halt_on_error=1" \
  ctest --test-dir "$build" -R '^static_runtime_(on|off)$' --output-on-failure
