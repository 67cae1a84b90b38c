#!/usr/bin/env python3
"""Prints why each test of the last ctest run was skipped.

CTest lists a skipped test as "(Skipped)" and keeps its output only in
Testing/Temporary/LastTest.log; ctest runs this script after the tests
(CTEST_CUSTOM_POST_TEST, written by tests/CMakeLists.txt into the build
tree's CTestCustom.cmake), so the reasons follow the results.

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


def reason(output):
    """The reason a skipped test gave: GoogleTest's message after 'Skipped', else its last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for i, line in enumerate(lines):
        if line.endswith(": Skipped"):
            message = []
            for after in lines[i + 1:]:
                if after.startswith("[  SKIPPED ]"):
                    break
                message.append(after)
            if message:
                return " ".join(message)
    plain = [line for line in lines if not line.startswith("[")]
    return plain[-1] if plain else "(it printed no reason)"


def skipped_reasons(build):
    temporary = os.path.join(build, "Testing", "Temporary")
    try:
        with open(os.path.join(temporary, "LastTestsDisabled.log"), encoding="utf-8", errors="replace") as f:
            names = [line.split(":", 1)[1].strip() for line in f if ":" in line]
        with open(os.path.join(temporary, "LastTest.log"), encoding="utf-8", errors="replace") as f:
            log = f.read()
    except OSError:
        return []
    outputs = {match["name"]: match["output"] for match in BLOCK.finditer(log)}
    # Tests disabled in CMake never ran: they have no output.
    result = []
    for name in names:
        if name in outputs:
            text = reason(outputs[name])
            result.append((name, text if len(text) <= MAX_REASON else text[:MAX_REASON - 3] + "..."))
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
skipped: no torch (No module named 'torch')
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
        with open(os.path.join(temporary, "LastTest.log"), "w") as f:
            f.write(log)
        with open(os.path.join(temporary, "LastTestsDisabled.log"), "w") as f:
            f.write("1:Cuda.Maps\n2:torch_enable\n7:never_built\n")
        got = skipped_reasons(build)
    want = [("Cuda.Maps", "no CUDA driver: dlopen(libcuda.so.1) failed"),
            ("torch_enable", "skipped: no torch (No module named 'torch')")]
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
