#!/usr/bin/env python3
"""Fails when a file includes a header of a layer above its own.

The layers are the CMake targets of umm/, prefetch/, sharing/, libzicoum/ and
tools/ (docs/architecture.md draws them). Every include path is flat (a target
exports its folder), so the compiler alone would let a file in umm/ include
sharing/node_client.h as soon as some target put both folders on its path;
this check reads the includes themselves.

Usage: check_includes.py ROOT     check the tree at ROOT
       check_includes.py --self-test
Exit 0: every include points down (or within its layer); 1: violations,
each printed as FILE:LINE with the two layers; 2: bad usage.
"""
import fnmatch
import os
import re
import sys
import tempfile

# Layer -> the file patterns it owns (relative to the root; first match wins,
# so a folder's catch-all comes after the files it sets apart).
LAYER_FILES = [
    ("base", ["umm/status.*", "umm/sizes.*", "umm/log.*", "umm/types.h"]),
    ("umm", ["umm/*"]),
    ("pager", ["prefetch/um_pager.*", "prefetch/pager_thread.*", "prefetch/pointer_table.*"]),
    ("prefetch", ["prefetch/*"]),
    ("demand", ["sharing/demand_curve.*", "sharing/paging_cost.*", "sharing/usage_tracker.*"]),
    ("scheduling", ["sharing/ledger.*", "sharing/ledger_*", "sharing/time_shift_scheduler.*", "sharing/iteration_gates.*",
                    "sharing/job_id.h"]),
    ("protocol", ["sharing/protocol.*", "sharing/wire.*"]),
    ("client", ["sharing/node_client.*", "sharing/node_client_*"]),
    ("daemon", ["sharing/daemon.*", "sharing/daemon_*", "sharing/metrics.*", "sharing/metrics_server.*",
                "sharing/latency_histogram.h", "sharing/outbox.*", "sharing/state_file.*"]),
    ("libzicoum", ["libzicoum/*"]),
    ("tools", ["tools/*"]),
]

# Layer -> the layers it links directly (as in the CMakeLists.txt files).
# A layer may include its own headers and those of every layer it reaches.
LINKS = {
    "base": [],
    "umm": ["base"],
    "prefetch": [],  # pure: no CUDA, no sockets, no other zicoum library
    "pager": ["prefetch", "umm"],
    "demand": [],  # pure
    "scheduling": ["demand", "base"],  # pure
    "protocol": ["demand", "base"],
    "client": ["protocol", "demand", "umm"],
    "daemon": ["scheduling", "protocol", "umm"],
    "libzicoum": ["client", "pager", "umm"],
    "tools": ["libzicoum", "daemon", "client", "scheduling", "pager", "prefetch", "umm"],
}

SOURCE_SUFFIXES = (".h", ".hpp", ".c", ".cc", ".cpp")
LAYERED_FOLDERS = ("umm", "prefetch", "sharing", "libzicoum", "tools")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def reachable(layer):
    seen, todo = {layer}, [layer]
    while todo:
        for below in LINKS[todo.pop()]:
            if below not in seen:
                seen.add(below)
                todo.append(below)
    return seen


def layer_of(path):
    for layer, patterns in LAYER_FILES:
        if any(fnmatch.fnmatch(path, pattern) for pattern in patterns):
            return layer
    return None


def sources(root):
    for folder in LAYERED_FOLDERS:
        for directory, _, names in os.walk(os.path.join(root, folder)):
            for name in sorted(names):
                if name.endswith(SOURCE_SUFFIXES):
                    yield os.path.relpath(os.path.join(directory, name), root)


def check(root):
    """The violations in the tree at root, as lines of text."""
    files = sorted(sources(root))
    by_suffix = {}
    for path in files:
        parts = path.split("/")
        for start in range(1, len(parts)):
            by_suffix.setdefault("/".join(parts[start:]), []).append(path)
    problems = []
    for path in files:
        layer = layer_of(path)
        if layer is None:
            problems.append(f"{path}: in no layer; add it to LAYER_FILES in {sys.argv[0]}")
            continue
        allowed = reachable(layer)
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as source:
            for number, line in enumerate(source, 1):
                match = INCLUDE.match(line)
                if not match:
                    continue
                name = match.group(1)
                beside = os.path.normpath(os.path.join(os.path.dirname(path), name))
                if beside in files:
                    target = beside  # the compiler looks beside the includer first
                else:
                    candidates = by_suffix.get(os.path.normpath(name), [])
                    if not candidates:
                        continue  # not ours (toolkit, system)
                    if len(candidates) > 1:
                        problems.append(f"{path}:{number}: \"{name}\" is ambiguous on a flat include path "
                                        f"({', '.join(candidates)}); give the headers distinct names")
                        continue
                    target = candidates[0]
                target_layer = layer_of(target)
                if target_layer not in allowed:
                    problems.append(f"{path}:{number}: layer '{layer}' includes \"{name}\" ({target}) of layer "
                                    f"'{target_layer}', which it does not link (it may use: "
                                    f"{', '.join(sorted(allowed))})")
    return problems


def self_test():
    """The check must catch an upward include, an ambiguous name and a file in no layer."""
    with tempfile.TemporaryDirectory() as root:
        def write(path, text):
            os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
            with open(os.path.join(root, path), "w") as out:
                out.write(text)
        write("umm/driver.h", "#pragma once\n")
        write("sharing/node_client.h", '#include "driver.h"\n')
        write("libzicoum/runtime.cpp", '#include "node_client.h"\n#include <vector>\n#include "cuda.h"\n')
        if check(root):
            print("self-test: a clean tree was reported:", check(root))
            return 1
        write("umm/runtime.cpp", '#include "node_client.h"\n')
        write("prefetch/driver.h", "#pragma once\n")
        write("tools/page/x.cpp", '#include "driver.h"\n')
        write("sharing/new_policy.cpp", "\n")
        found = "\n".join(check(root))
        expected = ["umm/runtime.cpp:1: layer 'umm' includes \"node_client.h\"", "is ambiguous",
                    "sharing/new_policy.cpp: in no layer"]
        missing = [text for text in expected if text not in found]
        if missing:
            print("self-test: not reported:", missing, "\nreported:\n" + found)
            return 1
    print("self-test: upward include, ambiguous name and unplaced file all reported")
    return 0


def main(argv):
    if len(argv) == 2 and argv[1] == "--self-test":
        return self_test()
    if len(argv) != 2 or not os.path.isdir(os.path.join(argv[1], "umm")):
        print(f"usage: {argv[0]} ROOT (the repository, holding umm/) | --self-test", file=sys.stderr)
        return 2
    problems = check(argv[1])
    for problem in problems:
        print(problem)
    if problems:
        print(f"{len(problems)} include(s) break the layering (docs/architecture.md, 'Layers')")
        return 1
    print(f"includes point down in {sum(1 for _ in sources(argv[1]))} files")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
