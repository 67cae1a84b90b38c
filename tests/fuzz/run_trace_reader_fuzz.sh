#!/usr/bin/env bash
# Builds the trace parser, the access-stream builder and the paging policies
# and simulator with clang's libFuzzer, ASan and UBSan and fuzzes them for
# SECONDS (default 60), starting from a valid trace. Needs clang and
# libclang-rt-*-dev (Debian).
set -euo pipefail
seconds=${1:-60}
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${FUZZ_DIR:-/tmp/zicoum-fuzz}
mkdir -p "$out/corpus"
clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I"$root/umm" -I"$root/tools/trace" -I"$root/prefetch" -I"$root/tools/page" -I"$root/tools/replay" \
  "$root/tests/fuzz/trace_reader_fuzz.cpp" "$root/tools/trace/trace_reader.cpp" "$root/umm/status.cpp" \
  "$root"/prefetch/*.cpp "$root/tools/page/trace_stream.cpp" "$root/tools/page/paging_simulator.cpp" \
  "$root/tools/replay/caching_model.cpp" \
  -lz -o "$out/trace_reader_fuzz"
# Seed: a small valid trace, so the fuzzer starts deep inside the grammar.
cat > "$out/corpus/seed" <<'SEED'
zicoum-trace 1
meta model tiny
meta command seed
meta source meta
meta batch 1
meta iterations 1
meta timing seed
a 1 4096 0 param -1
i 0 0
a 2 1024 0 input -1
a 3 8192 0 act 0
o 0 0 100 aten::mm 1,2 3
f 2 100
f 3 150
end 7
SEED
"$out/trace_reader_fuzz" -max_total_time="$seconds" -max_len=4096 "$out/corpus" 2>&1 | tail -n 5
