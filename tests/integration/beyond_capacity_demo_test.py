#!/usr/bin/env python3
"""The README's beyond-capacity demo, a few iterations: it exits 0 (every run
completed within its budget) and says zicoum's planner beat plain UM on a GPU
of the budget's size and demand paging in zicoum's budget, each by a ratio
above 1.

    beyond_capacity_demo_test.py DEMO BIN_DIR
"""
import re
import subprocess
import sys

VERDICT = re.compile(r"^  zicoum's planner: (\d+\.\d+)x faster than plain UM, (\d+\.\d+)x faster than demand paging "
                     r"in its budget; the budget was (\w+)$", re.MULTILINE)


def main():
    demo, bin_dir = sys.argv[1:3]
    done = subprocess.run([sys.executable, demo, "--iterations", "4", "--bin", bin_dir], capture_output=True,
                          text=True)
    print(done.stdout + done.stderr, end="")
    if done.returncode != 0:
        sys.exit(f"FAIL: the demo exited with status {done.returncode}")
    verdict = VERDICT.search(done.stdout)
    if verdict is None:
        sys.exit("FAIL: the demo printed no verdict line")
    over_plain, over_um, budget = float(verdict.group(1)), float(verdict.group(2)), verdict.group(3)
    if budget != "kept":
        sys.exit(f"FAIL: the budget was {budget}")
    for ratio, baseline in ((over_plain, "plain UM"), (over_um, "demand paging in its budget")):
        if not ratio > 1:
            sys.exit(f"FAIL: the planner was {ratio}x as fast as {baseline}, not faster")
    print("OK")


if __name__ == "__main__":
    main()
