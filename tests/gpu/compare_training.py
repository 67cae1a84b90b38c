"""Compares training runs of the GPU suite (tests/gpu/torch_training.py):
    compare_training.py NATIVE_LOG ENABLE_LOG ZICO_RUN_LOG
        whether every run's losses are bitwise equal to native's, the iteration
        time of each against native's (same run), the peak reserved of each
        against PyTorch's own, and what a graph capture did under
        zicoum.torch.enable;
    compare_training.py --against NATIVE_LOG RUN_LOG [BUDGET_BYTES]
        one run against native: losses bitwise equal, iteration time against
        native's, and where the run printed zicoum.stats() (--zico-stats), its
        pages on the GPU at the peak (within BUDGET_BYTES, if given), faults,
        prefetches and evictions.
Prints one JSON object."""
import json
import sys


def result_of(path):
    try:
        with open(path, errors="replace") as log:
            lines = [line for line in log if line.startswith("{")]
        return json.loads(lines[-1]) if lines else None
    except (OSError, ValueError):
        return None


def against(native, run, budget):
    figures = {"equal": False}
    if not (native and run):
        return figures
    figures["equal"] = native["losses"] == run["losses"]
    figures["iteration_x_native"] = round(run["iteration_ms"] / native["iteration_ms"], 3)
    figures["native_iteration_ms"] = round(native["iteration_ms"], 3)
    figures["native_peak_reserved_bytes"] = native["peak_reserved_bytes"]
    for name in ("gpu_used_before_bytes", "gpu_used_peak_bytes"):
        if name in run and name in native:
            figures[name] = run[name]
            figures["native_" + name] = native[name]
    zico = run.get("zico")
    if zico:
        for name in ("peak_resident_bytes", "faulted_pages", "prefetched_pages", "evicted_pages", "iterations",
                     "kernels", "kernels_without_blocks", "gemm_kernels_seen", "unnamed_faults", "learnt_pages",
                     "unasked_arrivals", "copies"):
            figures[name] = zico.get(name)
        if budget is not None:
            figures["budget_bytes"] = budget
            figures["within_budget"] = zico.get("peak_resident_bytes", budget + 1) <= budget
    return figures


def three(native, enable, zico_run):
    figures = {"all_equal": False}
    if native and enable and zico_run:
        figures["all_equal"] = native["losses"] == enable["losses"] == zico_run["losses"]
        for name, run in (("enable", enable), ("zico_run", zico_run)):
            figures[f"{name}_iteration_x_native"] = round(run["iteration_ms"] / native["iteration_ms"], 3)
            figures[f"{name}_peak_reserved_x_native"] = round(run["peak_reserved_bytes"] / native["peak_reserved_bytes"], 3)
        figures["native_iteration_ms"] = round(native["iteration_ms"], 3)
        figures["graph_capture"] = enable.get("graph_capture")
        figures["record_stream"] = enable.get("record_stream")
    return figures


if sys.argv[1] == "--against":
    budget = int(sys.argv[4]) if len(sys.argv) > 4 else None
    print(json.dumps(against(result_of(sys.argv[2]), result_of(sys.argv[3]), budget)))
else:
    print(json.dumps(three(*(result_of(path) for path in sys.argv[1:4]))))
