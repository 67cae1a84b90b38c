"""Writes the GPU suite's report (tests/gpu/run.sh) from its steps:
    report.py OUTDIR STEPS_JSONL GPU_NAME     ("" for no GPU)
OUTDIR/report.json: {"gpu", "driver", "cuda", "pytorch", "commit", "date", "steps": [...]};
OUTDIR/report.md: the same as a table, for docs/gpu-report.md."""
import datetime
import json
import subprocess
import sys


def command_output(*command):
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=30).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def pytorch_version():
    text = command_output(sys.executable, "-c", "import torch; print(torch.__version__, torch.version.cuda)")
    return text


def flat(figures, prefix=""):
    """(name, value) of every figure, a nested one named outer.inner; lists left out."""
    for key, value in figures.items():
        if isinstance(value, dict):
            yield from flat(value, f"{prefix}{key}.")
        elif not isinstance(value, list):
            yield f"{prefix}{key}", value


def main():
    out, steps_path, gpu = sys.argv[1], sys.argv[2], sys.argv[3] or None
    with open(steps_path) as lines:
        steps = [json.loads(line) for line in lines if line.strip()]
    report = {
        "gpu": gpu,
        "driver": command_output("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader") if gpu else None,
        "cuda": command_output("nvcc", "--version").splitlines()[-1] if gpu and command_output("nvcc", "--version") else None,
        "pytorch": pytorch_version() if gpu else None,
        # "-dirty": the working tree ran with changes not committed.
        "commit": command_output("git", "describe", "--always", "--dirty", "--abbrev=7"),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "steps": steps,
    }
    with open(f"{out}/report.json", "w") as out_json:
        json.dump(report, out_json, indent=2)
        out_json.write("\n")
    rows = [f"# GPU suite report\n",
            f"GPU: {gpu or 'none'} · driver {report['driver'] or '-'} · {report['cuda'] or 'CUDA -'} · "
            f"PyTorch {report['pytorch'] or '-'} · commit {report['commit'] or '-'} · {report['date']}\n",
            "Reproduce: `bash tests/gpu/run.sh OUTDIR` from the repository root.\n",
            "| step | verdict | seconds | reason | figures |", "|---|---|---|---|---|"]
    for step in steps:
        figures = ", ".join(f"{key}: {value}" for key, value in flat(step["figures"]))
        rows.append(f"| {step['step']} | {step['verdict']} | {step['seconds']:.0f} | {step['reason'] or ''} | "
                    f"{figures} |")
    with open(f"{out}/report.md", "w") as out_md:
        out_md.write("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
