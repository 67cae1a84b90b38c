#!/usr/bin/env bash
# Builds the node-protocol decoder with clang's libFuzzer, ASan and UBSan and
# fuzzes it for SECONDS (default 60), starting from one valid message of every
# type. Needs clang and libclang-rt-*-dev (Debian).
set -euo pipefail
seconds=${1:-60}
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${FUZZ_DIR:-/tmp/zicoum-protocol-fuzz}
mkdir -p "$out/corpus"
flags=(-std=c++20 -g -O1 -I"$root/sharing")
clang++ "${flags[@]}" -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  "$root/tests/fuzz/protocol_fuzz.cpp" "$root/sharing/protocol.cpp" -o "$out/protocol_fuzz"
# Seeds: the same source built as a program that writes encoded messages, so
# the fuzzer starts past the header checks of every message type.
clang++ "${flags[@]}" -DZICO_PROTOCOL_SEEDS \
  "$root/tests/fuzz/protocol_fuzz.cpp" "$root/sharing/protocol.cpp" -o "$out/protocol_seeds"
"$out/protocol_seeds" "$out/corpus"
# One datagram is at most 16 + kMaxPayload bytes, plus the descriptor-count byte.
"$out/protocol_fuzz" -max_total_time="$seconds" -max_len=61457 "$out/corpus" 2>&1 | tail -n 5
