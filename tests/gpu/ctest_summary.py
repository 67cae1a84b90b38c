"""The gpu-labelled tests a ctest log names, as JSON: {"passed": [...], "failed": [...], "skipped": [...]}.
    ctest_summary.py CTEST_LOG"""
import json
import re
import sys

result = {"passed": [], "failed": [], "skipped": []}
with open(sys.argv[1], errors="replace") as log:
    for line in log:
        found = re.search(r"Test +#\d+: (\S+) \.*\s*\**(Passed|Failed|Skipped|Not Run|Timeout)", line)
        if found:
            verdict = {"Passed": "passed", "Skipped": "skipped"}.get(found.group(2), "failed")
            result[verdict].append(found.group(1))
result.update({f"{verdict}_count": len(names) for verdict, names in list(result.items())})
print(json.dumps(result))
