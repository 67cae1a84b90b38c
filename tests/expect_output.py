#!/usr/bin/env python3
"""Runs a test's program; passes if it exits as expected and prints what it should.

    expect_output.py [--status N] PATTERN -- COMMAND [ARG...]

CTest's PASS_REGULAR_EXPRESSION ignores the exit status (only a signal fails
the test), so a program that printed OK and then failed on its way out (an
error at exit, a sanitizer's report) would pass. This runs COMMAND, passes
its output on as it comes (stdout and stderr together), and exits 0 only if
COMMAND exited with status N (default 0) and its output matches PATTERN, a
Python regular expression in which ^ and $ match at every line and . matches
a newline too ("^OK$": a line that is just OK). Otherwise it says why and
exits with COMMAND's status where that is not 0 (so that 77 still skips a
test with SKIP_RETURN_CODE 77), dies of COMMAND's signal, or exits 1.
"""
import os
import re
import signal
import subprocess
import sys


def usage():
    sys.exit("usage: expect_output.py [--status N] PATTERN -- COMMAND [ARG...]")


def main(argv):
    expected = 0
    if argv[:1] == ["--status"]:
        if len(argv) < 2 or not argv[1].isdigit():
            usage()
        expected = int(argv[1])
        argv = argv[2:]
    if len(argv) < 3 or argv[1] != "--":
        usage()
    pattern, command = re.compile(argv[0], re.MULTILINE | re.DOTALL), argv[2:]
    try:
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    except OSError as e:
        print(f"expect_output.py: cannot run {command[0]}: {e}", flush=True)
        return 1
    output = bytearray()
    while chunk := child.stdout.read1(1 << 16):
        output += chunk
        sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.flush()
    status = child.wait()
    if status < 0:
        print(f"expect_output.py: {command[0]} died of signal {-status}", flush=True)
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
        return 128 - status
    if status != expected:
        print(f"expect_output.py: {command[0]} exited with status {status}, not {expected}", flush=True)
        return status if status != 0 else 1
    if not pattern.search(output.decode(errors="replace")):
        print(f"expect_output.py: the output does not match {argv[0]!r}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
