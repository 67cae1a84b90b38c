#!/usr/bin/env python3
"""The README's sample outputs are what their commands print today.

    readme_samples_test.py BUILD_DIR [README]

A sample is a fenced block right after a comment naming the command that
printed it:

    <!-- sample: build/bin/zico-umctl page --oversubscription 2 tools/traces/resnet50.ztrace.gz -->
    ```
    resnet50: peak live 5.46 GiB, ...
    ```

Each command runs through bash as a reader would type it, from a folder in
which build/ is BUILD_DIR and everything else is the repository's, with no
ZICO_* variable set (the README's figures are the defaults'). The block must
be the command's standard output line for line (trailing blanks aside); a
line of just "..." stands for any number of output lines. Only commands whose
output is deterministic are marked: times on a virtual or modelled clock and
counts, never a wall-clock demo. Exit 0 when every sample matches, 1 when one
does not or the README has none.
"""
import os
import re
import subprocess
import sys
import tempfile

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
MARKER = re.compile(r"^<!-- sample: (.+?) -->\s*$")
ELLIPSIS = "..."
TIMEOUT_S = 300


def samples(readme):
    """(where the marker is, command, the block's lines) for each marked block."""
    with open(readme, encoding="utf-8") as f:
        lines = f.read().splitlines()
    found = []
    for i, line in enumerate(lines):
        marker = MARKER.match(line)
        if marker is None:
            continue
        # The block must follow at once: a sample separated from its command is not checked.
        if i + 1 >= len(lines) or not lines[i + 1].startswith("```"):
            sys.exit(f"FAIL: {readme}:{i + 1}: a sample marker not followed by a fenced block")
        end = next((j for j in range(i + 2, len(lines)) if lines[j].startswith("```")), None)
        if end is None:
            sys.exit(f"FAIL: {readme}:{i + 2}: the sample's block is never closed")
        found.append((f"{os.path.basename(readme)}:{i + 1}", marker.group(1), [l.rstrip() for l in lines[i + 2:end]]))
    return found


def matches(expected, output):
    pattern = "".join(r"(?:[^\n]*\n)*?" if line == ELLIPSIS else re.escape(line) + r"\n" for line in expected)
    return re.fullmatch(pattern, output) is not None


def first_missing(expected, output_lines):
    """The first line of the block not found, in order, in the output: where to look."""
    at = 0
    for line in expected:
        if line == ELLIPSIS:
            continue
        while at < len(output_lines) and output_lines[at] != line:
            at += 1
        if at == len(output_lines):
            return line
        at += 1
    return None


def make_workspace(folder, build_dir):
    """Makes FOLDER the repository with build/ replaced by BUILD_DIR."""
    for name in os.listdir(REPO):
        if name != "build":
            os.symlink(os.path.join(REPO, name), os.path.join(folder, name))
    os.symlink(os.path.abspath(build_dir), os.path.join(folder, "build"))


def check(folder, where, command, expected):
    """True when COMMAND, run in FOLDER, prints EXPECTED; otherwise says why."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("ZICO_")}
    try:
        done = subprocess.run(["bash", "-c", command], cwd=folder, env=environment, capture_output=True, text=True,
                              timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        print(f"FAIL: {where}: `{command}` ran past {TIMEOUT_S} s")
        return False
    output_lines = [l.rstrip() for l in done.stdout.splitlines()]
    output = "".join(l + "\n" for l in output_lines)
    if done.returncode != 0:
        print(f"FAIL: {where}: `{command}` exited {done.returncode}\n{done.stderr.strip()}")
        return False
    if not matches(expected, output):
        missing = first_missing(expected, output_lines)
        why = (f"this line of the sample is not in the output, in order:\n  {missing}" if missing is not None
               else "the output has lines the sample does not (mark elided lines with ...)")
        print(f"FAIL: {where}: `{command}` no longer prints its sample; {why}\n"
              f"It prints:\n{output}")
        return False
    print(f"ok: {where}: {command}")
    return True


def main():
    if not 2 <= len(sys.argv) <= 3:
        sys.exit(__doc__.split("\n\n")[1])
    build_dir = sys.argv[1]
    readme = sys.argv[2] if len(sys.argv) == 3 else os.path.join(REPO, "README.md")
    found = samples(readme)
    if not found:
        sys.exit(f"FAIL: {readme} marks no sample (<!-- sample: COMMAND --> before a fenced block)")
    with tempfile.TemporaryDirectory(prefix="readme-samples-") as folder:
        make_workspace(folder, build_dir)
        failures = sum(not check(folder, *sample) for sample in found)
    if failures:
        sys.exit(f"FAIL: {failures} of {len(found)} samples differ from what their commands print")
    print(f"OK: {len(found)} samples")


if __name__ == "__main__":
    main()
