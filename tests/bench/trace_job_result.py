"""trace_job's result line (tools/demo/trace_job.cpp), as the benchmarks that run it read it."""
import sys


def result_fields(out, who):
    """The key=value fields of the last `result ` line in `out` (trace_job's stdout), as strings. Exits,
    naming `who` and showing `out`, if there is none."""
    lines = [line for line in out.splitlines() if line.startswith("result ")]
    if not lines:
        sys.exit(f"{who}: trace_job printed no result line:\n{out}")
    return dict(item.split("=", 1) for item in lines[-1].split()[1:] if "=" in item)
