#!/usr/bin/env python3
"""Prints why each test of the last ctest run was skipped.

CTest lists a skipped test as "(Skipped)" and keeps its output only in
Testing/Temporary/LastTest.log; ctest runs this script after the tests
(CTEST_CUSTOM_POST_TEST, written by tests/CMakeLists.txt into the build
tree's CTestCustom.cmake), so the reasons follow the results. At that point
the run's log is still LastTest.log.tmp, and it records a skipped test as
passed: a test counts as skipped here by what it printed, GoogleTest's
"[  SKIPPED ]" (which is how CTest tells too) or a line beginning "SKIP:" or
"skipped:", the form of every test here that exits 77.

Usage: skip_reasons.py BUILD_DIR      print the reasons of the last run there
       skip_reasons.py --self-test
Always exits 0 after printing (a missing log means nothing to say), except
1 when the self-test fails.
"""
import os
import re
import sys
import tempfile

MAX_REASON = 200
BLOCK = re.compile(r"^\d+/\d+ Test: (?P<name>.+?)\n.*?^Output:\n-+\n(?P<output>.*?)^<end of output>", re.M | re.S)
SCRIPT_SKIP = re.compile(r"^(SKIP|skipped):", re.I)


def reason(output):
    """Why the test skipped, from what it printed; None when it did not skip."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    if any(line.startswith("[  SKIPPED ]") for line in lines):
        for i, line in enumerate(lines):
            if line.endswith(": Skipped"):
                message = []
                for after in lines[i + 1:]:
                    if after.startswith("[  SKIPPED ]"):
                        break
                    message.append(after)
                return " ".join(message) or "(GoogleTest skipped it without a message)"
        return "(GoogleTest skipped it without a message)"
    for i, line in enumerate(lines):
        if SCRIPT_SKIP.match(line):
            return " ".join(lines[i:])
    return None


def skipped_reasons(build):
    temporary = os.path.join(build, "Testing", "Temporary")
    log = None
    for name in ("LastTest.log.tmp", "LastTest.log"):  # the running ctest's, else the last one's
        try:
            with open(os.path.join(temporary, name), encoding="utf-8", errors="replace") as f:
                log = f.read()
            break
        except OSError:
            continue
    if log is None:
        return []
    result = []
    for match in BLOCK.finditer(log):
        text = reason(match["output"])
        if text is not None:
            result.append((match["name"], text if len(text) <= MAX_REASON else text[:MAX_REASON - 3] + "..."))
    return result


def report(build, out):
    reasons = skipped_reasons(build)
    if reasons:
        out.write("Why the skipped tests were skipped:\n")
        for name, text in reasons:
            out.write(f"  {name}: {text}\n")


def self_test():
    log = """Start testing: Nov 26 07:26 UTC
----------------------------------------------------------
1/3 Testing: Cuda.Maps
1/3 Test: Cuda.Maps
Command: "/b/tests/cuda_driver_contract_test" "--gtest_filter=Cuda.Maps"
Output:
----------------------------------------------------------
Running main() from gtest_main.cc
[ RUN      ] Cuda.Maps
/src/tests/umm/cuda_driver_test.cpp:20: Skipped
no CUDA driver: dlopen(libcuda.so.1) failed
[  SKIPPED ] Cuda.Maps (0 ms)
[  SKIPPED ] 1 test, listed below:
<end of output>
Test time =   0.05 sec
2/3 Test: torch_enable
Output:
----------------------------------------------------------
SKIP: python3 has no PyTorch:
No module named 'torch'
<end of output>
3/3 Test: passes
Output:
----------------------------------------------------------
fine
<end of output>
End testing: Nov 26 07:26 UTC
"""
    with tempfile.TemporaryDirectory() as build:
        temporary = os.path.join(build, "Testing", "Temporary")
        os.makedirs(temporary)
        with open(os.path.join(temporary, "LastTest.log.tmp"), "w") as f:
            f.write(log)
        with open(os.path.join(temporary, "LastTest.log"), "w") as f:
            f.write("an older run's log, not read while the current one is open\n")
        got = skipped_reasons(build)
    want = [("Cuda.Maps", "no CUDA driver: dlopen(libcuda.so.1) failed"),
            ("torch_enable", "SKIP: python3 has no PyTorch: No module named 'torch'")]
    if got != want:
        print(f"FAIL: {got} != {want}")
        return 1
    with tempfile.TemporaryDirectory() as empty:
        if skipped_reasons(empty) != []:
            print("FAIL: a build without logs has reasons")
            return 1
    print("OK")
    return 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 0
    report(argv[1], sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
