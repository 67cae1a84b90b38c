"""Compares the three training runs of the GPU suite (tests/gpu/torch_training.py):
    compare_training.py NATIVE_LOG ENABLE_LOG ZICO_RUN_LOG
Prints JSON: whether every run's losses are bitwise equal to native's, the
iteration time of each against native's (same run), the peak reserved of each
against PyTorch's own, and what a graph capture did under zicoum.torch.enable."""
import json
import sys


def result_of(path):
    try:
        with open(path, errors="replace") as log:
            lines = [line for line in log if line.startswith("{")]
        return json.loads(lines[-1]) if lines else None
    except OSError:
        return None


native, enable, zico_run = (result_of(path) for path in sys.argv[1:4])
figures = {"all_equal": False}
if native and enable and zico_run:
    figures["all_equal"] = native["losses"] == enable["losses"] == zico_run["losses"]
    for name, run in (("enable", enable), ("zico_run", zico_run)):
        figures[f"{name}_iteration_x_native"] = round(run["iteration_ms"] / native["iteration_ms"], 3)
        figures[f"{name}_peak_reserved_x_native"] = round(run["peak_reserved_bytes"] / native["peak_reserved_bytes"], 3)
    figures["native_iteration_ms"] = round(native["iteration_ms"], 3)
    figures["graph_capture"] = enable.get("graph_capture")
    figures["record_stream"] = enable.get("record_stream")
print(json.dumps(figures))
