#!/usr/bin/env bash
# NvmeStore throughput against the same file system's raw O_DIRECT sequential
# throughput, measured by fio in the same run (docs/benchmarks.md; not CI).
#
#   tests/bench/nvme_vs_fio.sh DIR [path/to/nvme_store_bench]
#
# fio gets what the store gets: one file of TOTAL_MIB in DIR, O_DIRECT,
# io_uring, requests of IO_KIB, QD requests in flight. Each round runs fio
# write, fio read and one repetition of the store benchmark, so drift of a
# shared disk hits both alike; the medians over ROUNDS rounds are compared.
# FIO_ALT lists more fio shapes ("BS:QD ...", default "128k:32 2m:8"), run
# in every round too, so the store is also held against the best raw figure
# fio finds, not only against its own request shape.
# Environment: TOTAL_MIB (512), CHUNK_MIB (2), IO_KIB (512), QD (32),
# STAGING (4), BATCH (32), ROUNDS (7), FIO_ALT. Exit 77: fio is not installed.
set -euo pipefail

dir=${1:?usage: nvme_vs_fio.sh DIR [nvme_store_bench]}
here=$(cd "$(dirname "$0")" && pwd)
bench=${2:-$here/../../build/bin/nvme_store_bench}
total=${TOTAL_MIB:-512} chunk=${CHUNK_MIB:-2} io=${IO_KIB:-512} qd=${QD:-32}
staging=${STAGING:-4} batch=${BATCH:-32} rounds=${ROUNDS:-7}
read -r -a alt <<<"${FIO_ALT-128k:32 2m:8}"

command -v fio >/dev/null || { echo "fio is not installed; skipping" >&2; exit 77; }
[[ -x $bench ]] || { echo "no benchmark binary at $bench (build target nvme_store_bench)" >&2; exit 1; }
mkdir -p "$dir"
fio_file="$dir/fio-baseline.$$"
trap 'rm -f "$fio_file"' EXIT

# fio's terse v3 line: field 7 is read bandwidth, field 48 write bandwidth, in KiB/s.
run_fio() {  # rw field [bs qd]
  fio --name=baseline --filename="$fio_file" --rw="$1" --bs="${3:-${io}k}" --iodepth="${4:-$qd}" --direct=1 \
      --ioengine=io_uring --size="${total}m" --numjobs=1 --output-format=terse --terse-version=3 2>/dev/null |
    awk -F';' -v f="$2" '{ printf "%.0f\n", $f * 1024 / 1e6 }'
}
median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

fio_w=() fio_r=() store_w=() store_r=()
declare -A alt_w alt_r
for ((round = 1; round <= rounds; round++)); do
  rm -f "$fio_file"
  fio_w+=("$(run_fio write 48)")
  fio_r+=("$(run_fio read 7)")
  for shape in "${alt[@]}"; do
    rm -f "$fio_file"
    alt_w[$shape]+=" $(run_fio write 48 "${shape%%:*}" "${shape##*:}")"
    alt_r[$shape]+=" $(run_fio read 7 "${shape%%:*}" "${shape##*:}")"
  done
  rm -f "$fio_file"
  out=$("$bench" --dir "$dir" --total-mib "$total" --chunk-mib "$chunk" --batch "$batch" \
        --queue-depth "$qd" --staging "$staging" --io-kib "$io" --repeat 1)
  store_w+=("$(sed -n 's/^write_MBps=//p' <<<"$out")")
  store_r+=("$(sed -n 's/^read_MBps=//p' <<<"$out")")
  echo "round $round: fio write ${fio_w[-1]} read ${fio_r[-1]} MB/s; store write ${store_w[-1]} read ${store_r[-1]} MB/s" >&2
done

fw=$(printf '%s\n' "${fio_w[@]}" | median) fr=$(printf '%s\n' "${fio_r[@]}" | median)
sw=$(printf '%s\n' "${store_w[@]}" | median) sr=$(printf '%s\n' "${store_r[@]}" | median)
echo "config: ${total} MiB, ${chunk} MiB chunks, ${io} KiB requests, queue depth ${qd}, ${staging} staging buffers, batches of ${batch}"
echo "fio   write ${fw} MB/s  read ${fr} MB/s   (median of ${rounds})"
echo "store write ${sw} MB/s  read ${sr} MB/s   (median of ${rounds})"
awk -v sw="$sw" -v fw="$fw" -v sr="$sr" -v fr="$fr" \
  'BEGIN { printf "ratio store/fio (same shape): write %.2f  read %.2f  (target >= 0.90)\n", sw / fw, sr / fr }'
bw=$fw br=$fr
for shape in "${alt[@]}"; do
  aw=$(tr ' ' '\n' <<<"${alt_w[$shape]}" | sed '/^$/d' | median)
  ar=$(tr ' ' '\n' <<<"${alt_r[$shape]}" | sed '/^$/d' | median)
  echo "fio ${shape%%:*} requests, queue depth ${shape##*:}: write ${aw} MB/s  read ${ar} MB/s"
  ((aw > bw)) && bw=$aw
  ((ar > br)) && br=$ar
done
if ((${#alt[@]})); then
  awk -v sw="$sw" -v bw="$bw" -v sr="$sr" -v br="$br" \
    'BEGIN { printf "ratio store/best fio shape: write %.2f  read %.2f\n", sw / bw, sr / br }'
fi
