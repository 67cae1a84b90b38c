#!/usr/bin/env python3
"""Mutation check: would the tests catch a real defect in what they claim to test?

Each mutant below is one small change to the production code that breaks a
behaviour the tests claim to cover. For each: apply it, rebuild, run the tests
named for it, revert. A mutant is killed when a test fails (or the rebuild
fails, which is reported apart: a mutant that does not compile proves nothing).
The tests named are those expected to kill it; `--suite` runs the whole ctest
suite instead (slow: minutes a mutant).

  python3 tests/mutation/mutants.py BUILD_DIR [--only M04,M10] [--suite] [--json] [--check]

Prints one line a mutant and the score; exits 1 if any mutant survived. The
source tree must be clean where mutants apply: each is reverted even when
interrupted, from a copy kept beside it (FILE.mutation-orig).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (id, behaviour, [(file, old, new), ...], ctest -R regex of the tests that should kill it)
MUTANTS = [
    ("M01", "the zico planner never evicts the running op's pages",
     [("prefetch/zico_policy.cpp", "pinned_[page] != stamp_ && prefetched_", "prefetched_")],
     r"PagingPolicies|UmPager"),
    ("M02", "the MIN bound keeps within its slots",
     [("prefetch/min_replacement.cpp", "cache.size() + held >= slots", "cache.size() + held > slots")],
     r"MinReplacement|IterationPlan|PagingPolicies"),
    ("M03", "occupied pages never exceed the budget",
     [("prefetch/residency.h", "return budget_pages_ - occupied_; }", "return budget_pages_ + 1 - occupied_; }")],
     r"Residency|PagingPolicies|UmPager"),
    ("M04", "the period detector finds iterations whose ids recur inside them",
     [("prefetch/period_detector.cpp", "? c.run + 1 : 0;", "? c.run + 1 : c.run;")],
     r"PeriodDetector"),
    ("M05", "the UM pager never prefetches past the budget",
     [("prefetch/um_pager.cpp",
       "  if (residency_.free_pages() == 0) {\n    ++stats_.refused_prefetches;\n    return;\n  }\n", "")],
     r"UmPager"),
    ("M07", "a page live again is not discarded when its hold ends",
     [("prefetch/um_pager.cpp", "if (!residency_.live(page) && residency_.has_data(page)) discard_now(page);",
       "if (residency_.has_data(page)) discard_now(page);")],
     r"PagerDiscards"),
    ("M08", "record_stream: the pages of a block other streams use are held",
     [("prefetch/um_pager.cpp", "  for (const StreamHandle stream : also_used_on) wait_for(stream, false);\n",
       "  (void)also_used_on;\n")],
     r"PagerDiscards"),
    ("M09", "physical memory never passes between uids",
     [("sharing/daemon_lending.cpp", "chunk.last_uid != kFreshChunk && chunk.last_uid != uid) {",
       "chunk.last_uid != kFreshChunk && chunk.last_uid == uid) {")],
     r"^multi_tenant$"),
    ("M10", "the audit charges look-alike memory no more than the job could ask for",
     [("sharing/daemon_holdings.cpp", "std::max<uint64_t>(kept, std::min(excess, most > lent ? most - lent : 0))",
       "std::max<uint64_t>(kept, excess + 0 * most)")],
     r"^multi_tenant$"),
    ("M11", "a zico-umctl connection gets 16 answers, a job 4 MiB",
     [("sharing/daemon_connections.cpp", "job ? Outbox::kJobLimits : Outbox::kAdminLimits",
       "job ? Outbox::kJobLimits : Outbox::kJobLimits")],
     r"^multi_tenant$"),
    ("M12", "an owner may restore its maximum up to an admin's cap",
     [("sharing/daemon_messages.cpp", "if (!admin && max > allowed.admin_max) {", "if (!admin && max > view.max) {")],
     r"^multi_tenant$"),
    ("M13", "a hard-linked state file stops the daemon",
     [("sharing/state_file.cpp", " || st.st_nlink != 1 ||", " ||")],
     r"^multi_tenant$"),
    ("M14", "an idle holder hides a jam until it has given nothing twice",
     [("sharing/ledger_rules.cpp", "use.empty_replies >= 2", "use.empty_replies >= 1")],
     r"LedgerDeadlock"),
    ("M15", "the banker's check finds the finishing order of jobs still climbing",
     [("sharing/ledger_rules.cpp", "return a.need + (b.settle - b.held) > b.need + (a.settle - a.held);",
       "return a.need + (b.settle - b.held) < b.need + (a.settle - a.held);")],
     r"LedgerClaims"),
    ("M16", "a per-thread lookup older than its twin gets the driver's function",
     [("libzicoum/driver_entry_points.cpp", "s.per_thread != nullptr && version >= s.per_thread_since",
       "s.per_thread != nullptr && version >= 0")],
     r"proc_address|launch_observer"),
    ("M17", "launches captured into a graph are not announced",
     [("libzicoum/launch_observer.cpp", "if (runtime == nullptr || capturing(stream)) return;",
       "if (runtime == nullptr) return;")],
     r"launch_observer|graph_capture"),
    ("M18", "a _ptds/_ptsz copy's stream 0 is the per-thread stream",
     [("libzicoum/copy_interpose.cpp", "if (per_thread && observed == nullptr) observed = CU_STREAM_PER_THREAD;",
       "(void)per_thread;")],
     r"copy_observer"),
    ("M19", "the tighter of the machine's and the cgroup's memory counts",
     [("umm/host_memory.cpp", "memory.known ? std::min(memory.available_bytes, left) : left", "left")],
     r"HostMemory"),
    ("M20", "a UM job's claim counts at what it holds or its floor",
     [("sharing/ledger_rules.cpp",
       "  if (use.page_floor != 0) claim_peak = std::min(claim_peak, std::max(use.page_floor, use.held));\n",
       "  (void)use;\n")],
     r"LedgerClaims"),
    ("M21", "a copy's source block comes to the GPU too",
     [("libzicoum/launch_observer.cpp", "    if (src_is_zicoum) used[count++] = src;\n", "")],
     r"copy_observer"),
    ("M22", "the sim host guard counts written memory, not untouched mappings",
     [("umm/sim_driver.cpp", "      if (!host.known) return false;  // unknown: do not guess\n",
       "      if (!host.known) return false;  // unknown: do not guess\n"
       "      host.available_bytes -= std::min<uint64_t>(host.available_bytes, mutant_created);\n"
       "      mutant_created = 0;\n"),
      ("umm/sim_driver.cpp", "    host.available_bytes -= bytes;\n    return false;",
       "    host.available_bytes -= bytes;\n    mutant_created += bytes;\n    return false;"),
      ("umm/sim_driver.cpp", "  bool host_refusal_said = false;\n",
       "  bool host_refusal_said = false;\n  uint64_t mutant_created = 0;\n")],
     r"SimDriverHost"),
    ("M23", "UM mode's managed arena meets the host guard",
     [("umm/managed_arena_driver.cpp", "  ZICO_RETURN_IF_ERROR(inner_.host_room(device, bytes));\n", "  (void)device;\n")],
     r"SimDriverHost|host_guard_um"),
    ("M24", "a returned chunk its process still maps stays out of the pool",
     [("sharing/daemon_holdings.cpp", "Status status = job.peer.pid == ::getpid() || process_exited(job.pidfd)",
       "Status status = true || process_exited(job.pidfd)")],
     r"^multi_tenant$"),
    ("M25", "a UM job's claim books only what the budget has free",
     [("sharing/daemon_messages.cpp", "held = open->pageable ? std::min(held, budget - std::min(budget, granted))",
       "held = open->pageable ? held + 0 * granted")],
     r"^multi_tenant$"),
    ("M26", "a UM kernel larger than the job's share waits for the rest",
     [("libzicoum/api_calls.cpp", "      runtime->make_room_for_kernel(allocator->device(), needs);\n",
       "      (void)runtime;\n")],
     r"^um_share$"),
]


def run(command, **kwargs):
    return subprocess.run(command, capture_output=True, text=True, **kwargs)


def apply(changes):
    """Applies every change, keeping each touched file's original beside it."""
    for path, old, new in changes:
        full = os.path.join(ROOT, path)
        keep = full + ".mutation-orig"
        if not os.path.exists(keep):
            shutil.copy2(full, keep)
        with open(full) as f:
            text = f.read()
        if text.count(old) != 1:
            raise SystemExit(f"{path}: the mutated text occurs {text.count(old)} times, not once:\n{old}")
        with open(full, "w") as f:
            f.write(text.replace(old, new))


def revert(changes):
    for path in {path for path, _, _ in changes}:
        full = os.path.join(ROOT, path)
        keep = full + ".mutation-orig"
        if os.path.exists(keep):
            os.replace(keep, full)
            os.utime(full)  # newer than the mutant's objects: the next build recompiles it


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("build_dir")
    parser.add_argument("--only", help="comma-separated mutant ids")
    parser.add_argument("--suite", action="store_true", help="run the whole ctest suite for each mutant")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--check", action="store_true", help="only check that every mutant still applies")
    args = parser.parse_args()
    chosen = MUTANTS
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {m[0] for m in MUTANTS}
        if unknown:
            parser.error(f"unknown mutant(s) {', '.join(sorted(unknown))}; known: M01 .. {MUTANTS[-1][0]}")
        chosen = [m for m in MUTANTS if m[0] in wanted]
    if args.check:
        for mutant_id, _, changes, _ in chosen:
            for path, old, _ in changes:
                with open(os.path.join(ROOT, path)) as f:
                    count = f.read().count(old)
                if count != 1:
                    sys.exit(f"{mutant_id}: {path}: the mutated text occurs {count} times, not once")
        print(f"all {len(chosen)} mutants apply")
        return
    results = []
    for mutant_id, behaviour, changes, tests in chosen:
        started = time.monotonic()
        try:
            apply(changes)
            build = run(["cmake", "--build", args.build_dir])
            if build.returncode != 0:
                outcome, detail = "no-compile", build.stdout[-2000:]
            else:
                command = ["ctest", "--test-dir", args.build_dir, "-j2", "--timeout", "600"]
                if not args.suite:
                    command += ["-R", tests]
                test = run(command)
                failed = [line.split(" - ", 1)[1].split(" (")[0] for line in test.stdout.splitlines()
                          if " - " in line and any(tag in line for tag in ("(Failed)", "(Timeout)", "(SEGFAULT)",
                                                                             "(Subprocess aborted)"))]
                if test.returncode != 0:
                    outcome, detail = "killed", ", ".join(failed) or test.stdout[-500:]
                elif "No tests were found" in test.stdout + test.stderr:
                    outcome, detail = "no-tests", tests
                else:
                    outcome, detail = "survived", tests
        finally:
            revert(changes)
        results.append({"id": mutant_id, "behaviour": behaviour, "outcome": outcome, "detail": detail,
                         "minutes": round((time.monotonic() - started) / 60, 1)})
        if not args.json:
            print(f"{mutant_id} {outcome:10} {behaviour}: {detail}", flush=True)
    run(["cmake", "--build", args.build_dir])  # back to the tree as it is
    killed = sum(r["outcome"] == "killed" for r in results)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(f"{killed} of {len(results)} mutants killed")
    sys.exit(0 if killed == len(results) else 1)


if __name__ == "__main__":
    main()
