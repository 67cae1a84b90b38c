#!/usr/bin/env bash
# zico-umctl page from the outside: every bad argument or trace is refused
# with exit 2 and a message that names the value; a run over a committed
# trace keeps the budget, has the JSON keys scripts rely on, and writes its
# plot.
# Usage: page_cli_test.sh ZICO_UMCTL TRACES_DIR
set -u

umctl=$1
traces=$2
resnet=$traces/resnet110.ztrace.gz
command=page
source "$(dirname "$0")/../lib/umctl_cli_checks.sh"

# One line of error (two where the argument reader adds its hint).
refuses_briefly() {
  refuses "$@"
  [ "$(wc -l <"$err")" -le 2 ] || fail "page ${*:1:$#-1}: more than a line or two of error"
}

run --help
[ "$status" -eq 0 ] && grep -q "Usage: zico-umctl page" "$out" || fail "--help"
"$umctl" --help | grep -q "page" || fail "zico-umctl --help lists page"

refuses_briefly "$resnet" "give exactly one of --budget SIZE and --oversubscription R"
refuses_briefly --budget 1GiB --oversubscription 2 "$resnet" "give exactly one of"
refuses_briefly --oversubscription 1 "$resnet" "'1' is not a ratio above 1"
refuses_briefly --oversubscription 0.5 "$resnet" "'0.5' is not a ratio above 1"
refuses_briefly --oversubscription two "$resnet" "'two'"
refuses_briefly --budget 12XB "$resnet" "'12XB' is not a size above 0"
refuses_briefly --budget 0 "$resnet" "'0' is not a size above 0"
refuses_briefly --oversubscription 2 --policy lru "$resnet" "'lru' is not a policy; expected um, deepum, autoswap, zico or all"
refuses_briefly --oversubscription 2 --page-size 3MiB "$resnet" "'3MiB' is not a power of two from 4KiB to 1GiB"
refuses_briefly --oversubscription 2 --page-size 2KiB "$resnet" "'2KiB'"
refuses_briefly --oversubscription 2 --iterations 1 "$resnet" "'1' is not a whole number from 2"
refuses_briefly --oversubscription 2 --iterations 9 "$resnet" "--iterations 9 is more than the 5 iterations"
refuses_briefly --oversubscription 2 --plot out.png "$resnet" "'out.png' must name an .svg file"
refuses_briefly --oversubscription 2 --frobnicate "$resnet" "unknown option '--frobnicate'"
refuses_briefly --oversubscription 2 "$resnet" "$resnet" "one trace at a time"
refuses_briefly --oversubscription 2 "no trace given"
refuses_briefly --oversubscription 2 "$tmp/missing.ztrace.gz" "missing.ztrace.gz"
# A budget below the largest op's pages: the values in the message, and the least budget (or the
# largest ratio) that holds them, which then runs.
refuses_briefly --budget 8MiB "$resnet" \
  "below the 17 pages the largest op uses at once; the least budget that holds them is --budget 34MiB"
run --budget 34MiB --policy zico "$resnet"
[ "$status" -eq 0 ] || fail "the least budget named does not run: exit $status ($(cat "$err"))"
refuses_briefly --oversubscription 200 "$resnet" "--oversubscription 200 (budget 5.25 MiB): the budget holds 2 pages"
ratio=$(sed -n 's/.*the largest ratio that holds them is --oversubscription \([0-9.]*\) (budget .*/\1/p' "$err")
[ -n "$ratio" ] || fail "--oversubscription 200: no largest ratio named: $(cat "$err")"
run --oversubscription "$ratio" --policy zico "$resnet"
[ "$status" -eq 0 ] || fail "the largest ratio named, $ratio, does not run: exit $status"
refuses --oversubscription "$(python3 -c "print(round($ratio + 0.01, 2))")" "$resnet" "below the 17 pages"
refuses_briefly --oversubscription 2 --host-bandwidth fast "$resnet" "'fast' is not a rate; expected a size per second"
refuses_briefly --oversubscription 2 --host-bandwidth 0GB/s "$resnet" "'0GB/s'"
# A trace without op records (a version 1 trace written without accesses).
python3 - "$tmp/noops.ztrace.gz" <<'PY'
import gzip, sys
lines = ["zicoum-trace 1", "meta model noops", "meta command test", "meta source meta", "meta batch 1",
         "meta iterations 2", "meta timing none", "a 0 4096 0 param -1", "i 0 0", "i 1 10", "end 3"]
with gzip.open(sys.argv[1], "wt") as f:
    f.write("\n".join(lines) + "\n")
PY
refuses_briefly --oversubscription 2 "$tmp/noops.ztrace.gz" "has no op records"

# A run of every policy: JSON keyed by policy, with the keys scripts use;
# never above the budget; zico faster than plain UM.
run --json --policy all --oversubscription 2 "$resnet"
[ "$status" -eq 0 ] || fail "page --json: exit $status"
python3 - "$out" <<'PY' || fail "page --json content"
import json, sys
d = json.load(open(sys.argv[1]))
assert sorted(d) == ["autoswap", "deepum", "um", "zico"], sorted(d)
keys = ["iteration_s", "in_memory_iteration_s", "lower_bound_iteration_s", "budget_bytes", "peak_resident_bytes",
        "faults", "h2d_bytes", "d2h_bytes", "stall_s"]
for policy, r in d.items():
    for k in keys:
        assert k in r, (policy, k)
    assert r["peak_resident_bytes"] <= r["budget_bytes"], policy
    assert r["iteration_s"] >= r["in_memory_iteration_s"] > 0, policy
    assert r["lower_bound_iteration_s"] >= r["in_memory_iteration_s"], policy
assert d["zico"]["iteration_s"] < d["um"]["iteration_s"]
PY

# The header's oversubscription by pages: the pages that hold the live bytes at their peak, the least
# budget at which Belady's replacement fetches nothing.
footprint() {
  python3 -c "import json, sys; d = json.load(open(sys.argv[1]))['zico']; print(d[sys.argv[2]])" "$out" "$1"
}
run --json --policy zico --budget 200GiB "$resnet"
pages=$(footprint peak_live_page_bytes) live=$(footprint peak_live_bytes) range=$(footprint range_bytes)
[ "$live" -lt "$pages" ] && [ "$pages" -lt "$range" ] || fail "live $live, their pages $pages, all pages $range"
run --json --policy zico --budget "$pages" "$resnet"
[ "$(footprint belady_fetch_bytes)" = 0 ] || fail "Belady fetches at a budget of the live pages ($pages bytes)"
run --json --policy zico --budget $((pages - 2097152)) "$resnet"
[ "$(footprint belady_fetch_bytes)" -gt 0 ] || fail "Belady fetches nothing a page below the live pages"
run --policy zico --budget "$pages" "$resnet"
grep -qE "^resnet110: peak live [0-9.]+ GiB, on 1.03 GiB of 2 MiB pages, of 1.05 GiB the blocks ever use; budget \
1.03 GiB: oversubscribed 0.99x by the live bytes, 1.00x by their pages, 1.02x by all pages; largest op 34 MiB$" "$out" ||
  fail "page header: $(head -n 1 "$out")"

# One host link by default, as zico-umctl simulate and the library (PCIe Gen5): a slower one lengthens
# the bound.
for link in default 55GB/s 25GB/s; do
  if [ "$link" = default ]; then run --json --oversubscription 2 "$resnet"; else
    run --json --oversubscription 2 --host-bandwidth "$link" "$resnet"; fi
  cp "$out" "$tmp/link-${link%/s}.json"
done
cmp -s "$tmp/link-default.json" "$tmp/link-55GB.json" || fail "page's default link is not 55GB/s"
python3 - "$tmp/link-55GB.json" "$tmp/link-25GB.json" <<'PY' || fail "page --host-bandwidth"
import json, sys
gen5, gen4 = (json.load(open(path))["zico"] for path in sys.argv[1:])
assert gen5["host_bytes_per_s"] == 55e9 and gen4["host_bytes_per_s"] == 25e9, (gen5, gen4)
assert gen4["lower_bound_iteration_s"] > 1.5 * gen5["lower_bound_iteration_s"], (gen4, gen5)
PY

# A calibration file (the GPU suite's calibration.json): its link sets the model; --host-bandwidth, also
# given, wins over its link rates; a bad file is refused naming the key.
echo '{"model": {"h2d_bytes_per_s": 2.5e10, "d2h_bytes_per_s": 2.5e10}, "sources": {}}' >"$tmp/slow.json"
echo '{"model": {"h2d_gbps": 25}}' >"$tmp/typo.json"
refuses_briefly --oversubscription 2 --calibration "$tmp/missing.json" "$resnet" \
  "--calibration '$tmp/missing.json': cannot read '$tmp/missing.json'; expected a readable calibration file"
refuses_briefly --oversubscription 2 --calibration "$tmp/typo.json" "$resnet" "unknown model key \"h2d_gbps\""
run --json --oversubscription 2 --calibration "$tmp/slow.json" "$resnet"
cp "$out" "$tmp/calibrated.json"
run --json --oversubscription 2 --calibration "$tmp/slow.json" --host-bandwidth 55GB/s "$resnet"
cp "$out" "$tmp/calibrated-55GB.json"
python3 - "$tmp/calibrated.json" "$tmp/calibrated-55GB.json" "$tmp/link-25GB.json" "$tmp/link-55GB.json" <<'PY' ||
import json, sys
calibrated, flag_wins, gen4, gen5 = (json.load(open(path))["zico"] for path in sys.argv[1:])
assert calibrated["host_bytes_per_s"] == 25e9 and flag_wins["host_bytes_per_s"] == 55e9, (calibrated, flag_wins)
assert calibrated["lower_bound_iteration_s"] > 1.5 * gen5["lower_bound_iteration_s"], (calibrated, gen5)
assert abs(calibrated["lower_bound_iteration_s"] / gen4["lower_bound_iteration_s"] - 1) < 0.01, (calibrated, gen4)
assert abs(flag_wins["lower_bound_iteration_s"] / gen5["lower_bound_iteration_s"] - 1) < 0.01, (flag_wins, gen5)
PY
  fail "page --calibration"
run --help
grep -q -- "--calibration FILE" "$out" || fail "page --help lacks --calibration"

run --policy zico --page-size 64KiB --iterations 3 --budget 600MiB --plot "$tmp/page.svg" "$resnet"
[ "$status" -eq 0 ] || fail "page --plot: exit $status"
grep -q "zico" "$out" && grep -q "plot: $tmp/page.svg" "$out" || fail "page text output"
grep -q "<svg" "$tmp/page.svg" && grep -q "zico" "$tmp/page.svg" || fail "page plot"
run --oversubscription 2 --plot /nonexistent/dir/p.svg "$resnet"
[ "$status" -eq 1 ] && grep -q "cannot write the plot to '/nonexistent/dir/p.svg'" "$err" || fail "unwritable plot: exit $status"

finish
