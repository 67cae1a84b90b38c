#!/usr/bin/env bash
# zico-umctl simulate from the outside: every bad argument is refused with
# exit 2 and a message that names the value; runs over the committed traces
# keep the budget and write their plots.
# Usage: simulate_cli_test.sh ZICO_UMCTL TRACES_DIR
set -u

umctl=$1
traces=$2
bert=$traces/bert_base.ztrace.gz
vit=$traces/vit_b_16.ztrace.gz
command=simulate
source "$(dirname "$0")/../lib/umctl_cli_checks.sh"

check_json() {
  local what=$1 code=$2
  python3 -c "import json, sys
d = json.load(open(sys.argv[1]))
$code" "$out" || fail "$what"
}

run --help
[ "$status" -eq 0 ] && grep -q "Usage: zico-umctl simulate" "$out" && grep -q -- "--budget-schedule" "$out" ||
  fail "--help"
"$umctl" --help | grep -q "simulate" || fail "zico-umctl --help lists simulate"

refuses "$bert" "needs --budget SIZE"
refuses --budget 12XB "$bert" "'12XB' is not a size above 0; expected a number"
refuses --budget 1KiB "$bert" "'1KiB' is below one chunk"
refuses --budget 12GiB --policy best "$bert" "'best' is not a policy; expected zico, fcfs, static"
refuses --budget 12GiB --iterations 0 "$bert" "'0' is not a whole number from 1 to 100000"
refuses --budget 12GiB --iterations 100001 "$bert" "'100001'"
refuses --budget 12GiB --iterations ten "$bert" "'ten'"
refuses --budget 12GiB --utilization 0 "$bert" "'0' is not in (0, 1]"
refuses --budget 12GiB --utilization 1.5 "$bert" "'1.5' is not in (0, 1]"
refuses --budget 12GiB --utilization half "$bert" "'half'"
refuses --budget 12GiB --host-bandwidth fast "$bert" "'fast' is not a rate; expected a size per second"
refuses --budget 12GiB --host-bandwidth 0GB/s "$bert" "'0GB/s'"
refuses --budget 12GiB --launch sometimes "$bert" "--launch 'sometimes' is not a launch; expected best or together"
refuses --budget-schedule 1s:4GiB "$bert" "must start at 0s, not at '1s'"
refuses --budget-schedule 0s:4GiB,0s:8GiB "$bert" "times must increase: '0s'"
refuses --budget-schedule 0s:4GiB,5x:8GiB "$bert" "time '5x' is not a duration; expected an integer with a unit"
refuses --budget-schedule 0s:4GiB,nocolon "$bert" "entry 'nocolon' is not TIME:SIZE"
refuses --budget-schedule 0s:4GiB,5s:lots "$bert" "size 'lots' is not a size"
refuses --budget 8GiB --budget-schedule 0s:8GiB "$bert" "not both"
refuses --budget 8GiB "$tmp/missing.ztrace.gz" "$tmp/missing.ztrace.gz"
printf 'not a trace' | gzip >"$tmp/bad.ztrace.gz"
refuses --budget 8GiB "$tmp/bad.ztrace.gz" "bad.ztrace.gz:1"
refuses --budget 8GiB --frobnicate "$bert" "unknown option '--frobnicate'"
refuses --budget 8GiB "no trace given"
refuses --budget 8GiB --plot out.png "$bert" "'out.png' must name an .svg file"
refuses "$bert" --budget "needs a value"
refuses --find-budget 0 "$bert" "--find-budget '0' is not in (0, 1]"
refuses --find-budget 1.5 "$bert" "'1.5' is not in (0, 1]"
refuses --find-budget most "$bert" "'most' is not in (0, 1]; expected a share of unlimited's throughput"
refuses --find-budget 0.9 --budget 8GiB "$bert" "without --budget or --budget-schedule"
refuses --find-budget 0.9 --budget-schedule 0s:8GiB "$bert" "without --budget or --budget-schedule"
refuses --find-budget 0.9 --policy fcfs "$bert" "without --policy"
refuses --budget 8GiB --mode paged "$bert" "--mode 'paged' is not a mode; expected vmm or um"
refuses --find-budget 0.9 --mode um "$bert" "give it without --mode um"
# UM needs the trace's access records; a version 1 trace without ops has none.
printf 'zicoum-trace 1\nmeta model noops\nmeta command test\nmeta source meta\nmeta batch 1\nmeta iterations 3\nmeta timing test\na 0 1048576 0 param -1\ni 0 0\na 1 1024 1 act -1\nf 1 5\ni 1 10\na 2 1024 11 act -1\nf 2 15\ni 2 20\na 3 1024 21 act -1\nf 3 25\nend 10\n' |
  gzip >"$tmp/noops.ztrace.gz"
run --budget 8GiB --iterations 3 "$tmp/noops.ztrace.gz"
[ "$status" -eq 0 ] || fail "the trace without ops runs in vmm mode: exit $status ($(cat "$err"))"
refuses --budget 8GiB --mode um "$tmp/noops.ztrace.gz" "--mode um: "

# unlimited needs no budget; one policy's JSON is that policy's object.
run --policy unlimited --iterations 3 --json "$bert"
[ "$status" -eq 0 ] || fail "unlimited without a budget: exit $status"
check_json "unlimited json" '
assert d["policy"] == "unlimited" and d["budget_bytes"] is None, d
j = d["jobs"][0]
assert j["iterations"] == 3 and j["failed"] is False and j["failure"] is None, j
assert abs(j["mean_iter_s"] - j["solo_iter_s"]) / j["solo_iter_s"] < 0.2, j'

# Every policy over two real traces: the ledger policies keep the budget.
run --policy all --budget 16GiB --json --plot "$tmp/plot.svg" "$bert" "$vit"
[ "$status" -eq 0 ] || fail "policy all: exit $status"
check_json "policy all json" '
budget = 16 << 30
assert set(d) == {"unlimited", "sequential", "static", "fcfs", "zico"}, list(d)
for name, r in d.items():
    for key in ("peak_bytes", "aggregate_iters_per_s", "makespan_s", "budget_exceeded", "over_budget_s",
                "longest_over_budget_s", "vs_unlimited"):
        assert key in r, (name, key)
    assert len(r["jobs"]) == 2, name
    for j in r["jobs"]:
        for key in ("mean_iter_s", "delay_s", "solo_iter_s", "iterations", "peak_bytes", "yields"):
            assert key in j, (name, key)
        assert j["iterations"] == 20 and not j["failed"], (name, j)
for name in ("fcfs", "zico", "static", "sequential"):
    assert d[name]["budget_exceeded"] is False, name
    assert d[name]["peak_bytes"] <= budget, (name, d[name]["peak_bytes"])
assert d["unlimited"]["peak_bytes"] > budget
z = d["zico"]
assert {"vs_sequential", "vs_static", "vs_fcfs"} <= set(z), list(z)
assert len(z["exhaustive"]["offsets_s"]) == 2 and z["exhaustive"]["peak_bytes"] > 0, z["exhaustive"]
assert "exhaustive" not in d["fcfs"]
assert "stretched" not in z["exhaustive"], "16 GiB is above the bound"
for name in ("static", "zico"):
    plan = d[name]["launch_plan"]
    assert sorted(plan["order"]) == ["bert_base", "vit_b_16"] and plan["max_running"] in (None, 1), (name, plan)
assert "launch_plan" not in d["sequential"] and "launched_together" not in d["static"]
t = z["launched_together"]
assert 0 < t["aggregate_iters_per_s"] <= z["aggregate_iters_per_s"] and t["failed_jobs"] == 0, t
assert abs(t["vs_static"] * d["static"]["aggregate_iters_per_s"] / t["aggregate_iters_per_s"] - 1) < 1e-4, t'
for policy in unlimited sequential static fcfs zico; do
  f=$tmp/plot-$policy.svg
  { [ -s "$f" ] && head -c 4 "$f" | grep -q "<svg" && tail -n 1 "$f" | grep -q "</svg>"; } || fail "plot $f"
done
grep -q 'id="budget"' "$tmp/plot-zico.svg" || fail "zico's plot has a budget line"

# Launch plans. bert_base x 2 + nasnetalarge at u = 0.5 with room for all
# three: holding one back keeps the longest at full speed, under every policy
# but sequential; --launch together is the scheduler alone, as --policy all
# reports it beside the best plan.
nasnet=$traces/nasnetalarge.ztrace.gz
triple=(--utilization 0.5 --iterations 40 "$bert" "$bert" "$nasnet")
run --policy all --budget 26GiB --json "${triple[@]}"
cp "$out" "$tmp/best.json"
check_json "best launch plans" '
for name in ("unlimited", "static", "fcfs", "zico"):
    assert d[name]["launch_plan"]["max_running"] == 2, (name, d[name]["launch_plan"])
assert "launch_plan" not in d["sequential"]
z = d["zico"]
t = z["launched_together"]
assert t["aggregate_iters_per_s"] < 0.95 * z["aggregate_iters_per_s"], (t, z["aggregate_iters_per_s"])
assert t["budget_exceeded"] is False and t["failed_jobs"] == 0 and t["peak_bytes"] <= 26 << 30, t
for name in ("unlimited", "sequential", "static", "fcfs"):
    assert abs(t["vs_" + name] * d[name]["aggregate_iters_per_s"] / t["aggregate_iters_per_s"] - 1) < 1e-4, (name, t)'
run --budget 26GiB --json --launch together "${triple[@]}"
python3 -c "import json, sys
best, together = json.load(open(sys.argv[1]))['zico'], json.load(open(sys.argv[2]))
assert together['launch_plan']['max_running'] is None, together['launch_plan']
assert together['aggregate_iters_per_s'] == best['launched_together']['aggregate_iters_per_s'], (together, best)" \
  "$tmp/best.json" "$out" || fail "--launch together runs what --policy all reports as launched together"
run --budget 16GiB --iterations 3 --launch together "$vit" "$bert"
[ "$status" -eq 0 ] && grep -q "plan: launched in the order vit_b_16, bert_base; no cap on jobs at once" "$out" ||
  fail "--launch together: the plan line"
# A plan that would launch nasnetalarge into a budget cut below its peak
# fails it (and stops the clock early): the search keeps one that fails none.
run --budget-schedule 0s:30GiB,300ms:12GiB,700ms:30GiB --utilization 0.5 "$bert" "$bert" "$nasnet"
[ "$status" -eq 0 ] && ! grep -q "failed:" "$out" || fail "the best plan failed a job that launching together completes"

# Below the bound's peak (10.58 GiB): at 10.4 GiB fixed offsets fit on a
# longer cycle; at 9.5 GiB bert_base's peak and vit_b_16's least do not fit.
run --budget 10.4GiB --iterations 3 --json "$bert" "$vit"
check_json "stretched cycle" '
s = d["exhaustive"]["stretched"]
assert s["found"] is True and s["stretch"] > 1 and s["peak_bytes"] <= int(10.4 * 2**30), s
assert abs(s["iters_per_s"] * s["cycle_s"] / 2 - 1) < 1e-4 and len(s["offsets_s"]) == 2, s'
run --budget 9.5GiB --iterations 3 --json "$bert" "$vit"
check_json "no stretched cycle" '
s = d["exhaustive"]["stretched"]
assert s == {"found": False, "shortfall_bytes": s["shortfall_bytes"]} and s["shortfall_bytes"] > 0, s'
run --budget 9.5GiB --iterations 3 "$bert" "$vit"
grep -q "a job's peak and the others' least exceed the budget by" "$out" || fail "no stretched cycle, text"

# Text output, with a budget schedule that shrinks below what the jobs hold.
run --policy fcfs --iterations 40 --utilization 0.5 --budget-schedule 0s:24GiB,500ms:14GiB "$bert" "$vit"
[ "$status" -eq 0 ] || fail "schedule: exit $status"
grep -q "^fcfs: 2 jobs x 40 iterations, budget 24 GiB at 0 s, then 14 GiB at 0.5 s" "$out" || fail "schedule header"
grep -q "budget kept" "$out" || fail "schedule keeps the budget"
grep -qE "^  bert_base +40 " "$out" || fail "bert_base row"

# The least budget for 0.9 x unlimited: between the larger job's own peak
# and unlimited's, met there, missed within the resolution below (or it is
# the lowest searched), with zico's run there and the bound for scale.
run --find-budget 0.9 --utilization 0.5 --iterations 40 --json --plot "$tmp/found.svg" "$bert" "$vit"
[ "$status" -eq 0 ] || fail "find-budget: exit $status"
check_json "find-budget json" '
assert d["found"] is True and d["target_vs_unlimited"] == 0.9, d["found"]
b, u, z = d["budget_bytes"], d["unlimited"], d["zico"]
assert d["largest_job_peak_bytes"] <= b < u["peak_bytes"], (b, d["largest_job_peak_bytes"], u["peak_bytes"])
assert z["policy"] == "zico" and z["budget_bytes"] == b and z["budget_exceeded"] is False, z["budget_bytes"]
assert z["peak_bytes"] <= b and z["aggregate_iters_per_s"] >= 0.9 * u["aggregate_iters_per_s"], z
assert z["exhaustive"]["peak_bytes"] > 0
trials = d["trials"]
assert any(t["budget_bytes"] == b and t["met"] for t in trials), trials
assert all(not t["met"] for t in trials if t["budget_bytes"] < b), trials
assert b == min(t["budget_bytes"] for t in trials) or any(
    not t["met"] and b - t["budget_bytes"] <= d["resolution_bytes"] for t in trials), trials'
{ [ -s "$tmp/found.svg" ] && grep -q 'id="budget"' "$tmp/found.svg"; } || fail "find-budget plot"
run --find-budget 0.9 --utilization 0.5 --iterations 40 "$bert" "$vit"
[ "$status" -eq 0 ] || fail "find-budget text: exit $status"
grep -qE "^least budget found for zico at >= 0.9x unlimited: [0-9.]+ GiB \(2 jobs x 40 iterations\)" "$out" ||
  fail "find-budget headline"
grep -q "exhaustive fixed-offset bound" "$out" && grep -q "budgets tried, in order" "$out" || fail "find-budget detail"

# Unified Memory: gpt2_medium (peak 17 GiB) under 16 GiB fails as an ordinary
# job and runs paged in um mode, within the budget, slower.
gpt2m=$traces/gpt2_medium.ztrace.gz
run --budget 16GiB --iterations 5 "$gpt2m"
[ "$status" -eq 1 ] || fail "gpt2_medium under 16 GiB in vmm mode: exit $status, expected 1"
run --budget 16GiB --iterations 5 --mode um --json "$gpt2m"
[ "$status" -eq 0 ] || fail "gpt2_medium under 16 GiB in um mode: exit $status ($(cat "$err"))"
check_json "um json" '
j = d["jobs"][0]
assert j["um"] is True and j["iterations"] == 5 and not j["failed"], j
assert j["capped_iterations"] >= 4 and j["paging_s"] > 0 and j["mean_iter_s"] > j["solo_iter_s"], j
assert j["peak_bytes"] <= 16 << 30 and d["budget_exceeded"] is False, (j["peak_bytes"], d["budget_exceeded"])
c = j["paging_cost"]
caps = [p[0] for p in c["points"]]
assert c["floor_bytes"] > 0 and caps[0] == c["floor_bytes"] and caps == sorted(set(caps)), c
assert c["points"][0][1] > 1 and c["points"][-1][1] == 1, c'
run --budget 16GiB --iterations 5 --mode um "$gpt2m"
grep -qE "gpt2_medium \(um\): [45] of 5 iterations ran with part of its memory paged out, which added" "$out" || fail "um text line"
# Against policies that failed a job, zico's line says so instead of a ratio.
run --budget 16GiB --iterations 5 --mode um --policy all "$gpt2m" "$bert"
grep -q "zico's throughput: sequential failed a job, static failed a job, [0-9.]*x fcfs" "$out" || fail "failed policies"
# So does the comparison table: a policy that did less work has no ratio to unlimited.
for policy in sequential static; do
  grep -qE "^  $policy +[0-9.]+ m?s +[0-9.]+ +failed +[0-9.]+ [KMG]iB +kept +[0-9]+ +1\$" "$out" ||
    fail "the comparison gives $policy, which failed a job, a ratio: $(grep "^  $policy " "$out")"
done
grep -qE "^  fcfs +[0-9.]+ m?s +[0-9.]+ +0\.[0-9]{3} " "$out" || fail "fcfs, which failed none, has no ratio"

# One host link by default, as zico-umctl page and the library (PCIe Gen5): the same run as at 55GB/s,
# not as at 25GB/s (Gen4).
# link_run NAME ARGS...: gpt2_medium paged under 16 GiB, its JSON in $tmp/link-NAME.json.
link_run() {
  local name=$1
  shift
  run --budget 16GiB --iterations 5 --mode um --json "$@" "$gpt2m"
  cp "$out" "$tmp/link-$name.json"
}
link_run default
link_run gen5 --host-bandwidth 55GB/s
link_run gen4 --host-bandwidth 25GB/s
cmp -s "$tmp/link-default.json" "$tmp/link-gen5.json" || fail "the default link is not 55GB/s"
cmp -s "$tmp/link-default.json" "$tmp/link-gen4.json" && fail "the link makes no difference here"
run --help
grep -q "(default 55GB/s, PCIe Gen5" "$out" || fail "--help names another default link"
grep -q -- "--calibration FILE" "$out" || fail "simulate --help lacks --calibration"

# A calibration file sets paging's model and the swaps' link; --host-bandwidth, also given, wins over
# its link rates (the run is then the default link's); a bad file is refused naming the key.
echo '{"model": {"h2d_bytes_per_s": 2.5e10, "d2h_bytes_per_s": 2.5e10, "fault_bytes_per_s": 9.090909e9}}' \
  >"$tmp/gen4.json"
echo '{"model": {"call_ns": "fast"}}' >"$tmp/bad.json"
refuses --budget 16GiB --calibration "$tmp/missing.json" "$gpt2m" "--calibration '$tmp/missing.json': cannot read"
refuses --budget 16GiB --calibration "$tmp/bad.json" "$gpt2m" "model key \"call_ns\" is \"fast\"; expected a number"
link_run calibrated --calibration "$tmp/gen4.json"
link_run calibrated_gen5 --calibration "$tmp/gen4.json" --host-bandwidth 55GB/s
python3 - "$tmp"/link-{calibrated,calibrated_gen5,gen4,default}.json <<'PY' || fail "simulate --calibration"
import json, sys
calibrated, flag_wins, gen4, default = (json.load(open(path)) for path in sys.argv[1:])
def rate(d): return d["aggregate_iters_per_s"]
assert abs(rate(calibrated) / rate(gen4) - 1) < 0.01, (rate(calibrated), rate(gen4))
assert abs(rate(flag_wins) / rate(default) - 1) < 0.01, (rate(flag_wins), rate(default))
assert rate(default) > rate(calibrated), (rate(default), rate(calibrated))
PY

# UM jobs that once got stuck (a capped job left short of its worth floor waited while the ledger
# counted it as paging); every job completes (summed peaks / 1.45). Where the gate still caps one,
# it waits below its worth floor as an ordinary job does.
mobilenet=$traces/mobilenet_v2.ztrace.gz
run --budget 19831826361 --iterations 50 --utilization 0.5 --mode um --json "$bert" "$mobilenet" "$vit"
[ "$status" -eq 0 ] || fail "bert_base+mobilenet_v2+vit_b_16 in um mode: exit $status ($(cat "$err"))"
check_json "um triple" 'assert d["failed_jobs"] == 0 and d["budget_exceeded"] is False, d["jobs"]'

# Below the fixed-offset bound (bert_base's rest at its gate and gpt2_medium's peak exceed the budget),
# UM jobs on an H100's link page bert_base's rest out at its gate instead of taking turns: both
# faster than the same jobs in vmm mode, within the budget (summed peaks / 1.45).
# vmm_then_um WHAT ARGS...: the jobs as vmm jobs (kept in $tmp/vmm.json), then as UM jobs ($out).
vmm_then_um() {
  local what=$1
  shift
  run "$@"
  cp "$out" "$tmp/vmm.json"
  run "$@" --mode um
  [ "$status" -eq 0 ] || fail "$what in um mode: exit $status ($(cat "$err"))"
}
vmm_then_um bert_base+gpt2_medium --budget 17.78GiB --iterations 30 --utilization 0.5 --host-bandwidth 55GB/s \
  --json "$bert" "$gpt2m"
check_json "um gate paging" '
vmm = json.load(open("'"$tmp"'/vmm.json"))
assert d["failed_jobs"] == 0 and d["budget_exceeded"] is False, d
assert d["jobs"][0]["gate_page_outs"] > 0 and d["jobs"][1]["gate_page_outs"] == 0, d["jobs"]
assert d["aggregate_iters_per_s"] > 1.1 * vmm["aggregate_iters_per_s"], (d["aggregate_iters_per_s"], vmm["aggregate_iters_per_s"])'

# Where every job's peak fits beside the others' least levels (three gpt2_medium at summed peaks / 1.6,
# which time shift co-runs), UM jobs page at their gates only while they learn: paging there would add
# a round trip to each start (it ran at 0.68x the vmm jobs when the gates paged throughout).
vmm_then_um "gpt2_medium x 3" --budget 31.88GiB --iterations 30 --utilization 0.5 --host-bandwidth 55GB/s \
  --json "$gpt2m" "$gpt2m" "$gpt2m"
check_json "um gates page only where needed" '
vmm = json.load(open("'"$tmp"'/vmm.json"))
assert d["failed_jobs"] == 0 and d["budget_exceeded"] is False, d
assert sum(j["gate_page_outs"] for j in d["jobs"]) < 10, d["jobs"]
assert d["aggregate_iters_per_s"] >= 0.98 * vmm["aggregate_iters_per_s"], (d["aggregate_iters_per_s"], vmm["aggregate_iters_per_s"])'

# A job that cannot run under the budget fails the run: exit 1, the output complete and naming it.
run --budget 1GiB "$traces/gpt2.ztrace.gz"
[ "$status" -eq 1 ] || fail "a failed job: exit $status, expected 1"
grep -q "failed: needs" "$out" || fail "a failed job is not named"
# A run whose every job failed kept the budget by doing nothing: its line says they failed.
grep -qE "^  makespan .*; the job failed; 0 yields" "$out" || fail "the job failed: $(grep makespan "$out")"
grep -q "budget kept" "$out" && fail "a run where every job failed says the budget was kept"
# resnet50 needs one chunk more than 5 GiB: both sizes read apart.
run --budget 5GiB --iterations 2 "$traces/resnet50.ztrace.gz" "$traces/resnet110.ztrace.gz"
grep -q "resnet50 (.*) failed: needs 5.002 GiB in iteration 0, more than the budget 5 GiB lets it hold" "$out" ||
  fail "the sizes in a failure read alike: $(grep 'failed:' "$out")"
grep -qE "^  makespan .*; 1 of 2 jobs failed; budget kept" "$out" || fail "one of two failed: $(grep makespan "$out")"

finish
