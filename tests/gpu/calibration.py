"""The GPU suite's calibration file, from the probe's lines (tests/gpu/um_calibration_probe.cu):
    calibration.py PROBE_LOG OUT_JSON [--meta KEY=VALUE ...]
OUT_JSON: the calibration file umm/gpu_calibration.h reads (ZICO_GPU_CALIBRATION,
zico-umctl page/simulate --calibration): device, driver, cuda, commit, date
(from nvidia-smi, nvcc and git unless --meta gives them), "model" (every key
the probes measured) and "sources" (how each was derived, one line a key).
Prints one JSON object on stdout: the step's figures for the suite's report
(the model keys and what each probe settled). Exit 0 when every probe's line
was there without an error, 1 otherwise (the file then holds what could be
derived), 2 for a usage error."""
import datetime
import json
import re
import subprocess
import sys

PROBES = ("P1", "P2", "P3", "P4", "P5", "P6", "P7", "P8", "P9")
# The model keys in the order of the file's format (umm/gpu_calibration.h, kCalibrationKeys).
MODEL_KEYS = ("h2d_bytes_per_s", "d2h_bytes_per_s", "duplex_factor", "fault_bytes_per_s", "fault_block_ns", "call_ns",
              "range_ns", "block_ns", "to_host_sync", "cpu_map_block_ns", "discard_call_ns", "launch_ns",
              "ordered_call_waits", "chunk_create_ns", "chunk_map_ns", "chunk_access_ns", "chunk_unmap_ns",
              "chunk_release_ns")


def command_output(*command):
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=30).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def probe_lines(path):
    lines = {}
    with open(path, errors="replace") as log:
        for line in log:
            if not line.startswith("{"):
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and "probe" in record:
                lines[record["probe"]] = record
    return lines


def fit(xs, ys):
    """Least-squares line through (xs, ys): (intercept, slope)."""
    n = len(xs)
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    spread = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / spread if spread else 0.0
    return mean_y - slope * mean_x, slope


def derive(probes):
    """(model, sources, figures): the calibration's model keys, a line for each, and the report's figures."""
    model, sources, figures = {}, {}, {}

    p1 = probes.get("P1")
    if p1 and "error" not in p1:
        # A call that waited for the 20 ms kernel ahead of it in its stream returned after half of it.
        model["ordered_call_waits"] = 1 if p1["to_host_blocks"] or p1["to_gpu_blocks"] else 0
        sources["ordered_call_waits"] = (
            f"P1: prefetches of 1 block behind a {p1['spin_us'] / 1e3:.0f} ms kernel in their stream took "
            f"{p1['to_host_call_us']:.0f} us (to the host) and {p1['to_gpu_call_us']:.0f} us (to the GPU) of host time, "
            "median of 5")
        for key in ("to_host_blocks", "to_gpu_blocks", "discard_blocks", "to_host_call_us", "to_gpu_call_us",
                    "discard_call_us"):
            figures[f"p1_{key}"] = p1[key]

    p2 = probes.get("P2")
    block = 2 << 20
    if p2 and "error" not in p2:
        block = p2["block_bytes"]
        counts = p2["blocks"]
        most = counts[-1]
        to_host_done, to_gpu_done = p2["one_call_done_us"][-1]
        model["d2h_bytes_per_s"] = most * block / (to_host_done * 1e-6)
        model["h2d_bytes_per_s"] = most * block / (to_gpu_done * 1e-6)
        # A move to the host is synchronous when its call returns no sooner than its copy ends.
        to_host_host = p2["one_call_host_us"][-1][0]
        model["to_host_sync"] = 1 if to_host_host >= 0.9 * to_host_done else 0
        sources["to_host_sync"] = (f"P2: one prefetch of {most} blocks to the host held its caller {to_host_host:.0f} us; "
                                   f"its copies ended after {to_host_done:.0f} us, median of 5")
        for key, way in (("d2h_bytes_per_s", "to the host"), ("h2d_bytes_per_s", "to the GPU")):
            sources[key] = f"P2: one prefetch of {most} contiguous 2 MiB blocks {way}, idle link, to completion, median of 5"
        # One call of n blocks to the GPU costs its caller call + n x block: the line through the medians.
        intercept, slope = fit(counts, [pair[1] for pair in p2["one_call_host_us"]])
        model["block_ns"] = max(0.0, slope * 1e3)
        model["call_ns"] = max(0.0, intercept * 1e3)
        sources["block_ns"] = (f"P2: slope of the host time of one prefetch to the GPU against its block count "
                               f"({', '.join(map(str, counts))}), medians of 5")
        sources["call_ns"] = "P2: intercept of that line (N = 0)"
        # To the host: the same line's slope beyond block_ns, less the copy where the call waits for it.
        _, host_slope = fit(counts, [pair[0] for pair in p2["one_call_host_us"]])
        copy_ns = block / model["d2h_bytes_per_s"] * 1e9 if model.get("to_host_sync") else 0.0
        model["cpu_map_block_ns"] = max(0.0, host_slope * 1e3 - model["block_ns"] - copy_ns)
        sources["cpu_map_block_ns"] = ("P2: slope of the host time of one prefetch to the host against its block count, "
                                       "less block_ns" + (" and the block's copy at d2h_bytes_per_s (to_host_sync)"
                                                          if copy_ns else ""))
        figures["p2_blocks"] = counts
        figures["p2_one_call_host_us"] = p2["one_call_host_us"]
        figures["p2_per_block_calls_host_us"] = p2["per_block_calls_host_us"]

    p3 = probes.get("P3")
    if p3 and "error" not in p3 and "to_gpu_batch_host_us" in p3 and "call_ns" in model:
        # A batch of R non-adjacent blocks: call + R x (range + block); P2 gave the intercept as call + one range.
        ranges = p3["ranges"]
        batch_ns = p3["to_gpu_batch_host_us"] * 1e3
        per_call = model["call_ns"]
        range_ns = max(0.0, (batch_ns - per_call - ranges * model["block_ns"]) / max(1, ranges - 1))
        model["range_ns"] = range_ns
        model["call_ns"] = max(0.0, per_call - range_ns)
        sources["range_ns"] = (f"P3: host time of one cudaMemPrefetchBatchAsync of {ranges:.0f} non-adjacent blocks "
                               "to the GPU, less call_ns and block_ns per block, per range beyond the first, median of 5")
        sources["call_ns"] = "P2: intercept of the host time against the block count (N = 0), less range_ns (P3)"
    if p3 and "error" not in p3:
        for key in ("to_gpu_batch_host_us", "to_gpu_loop_host_us", "to_gpu_batch_done_us", "to_gpu_loop_done_us",
                    "to_host_batch_host_us", "to_host_loop_host_us", "to_gpu_batch_error", "to_host_batch_error"):
            if key in p3:
                figures[f"p3_{key}"] = p3[key]

    p4 = probes.get("P4")
    if p4 and "error" not in p4 and "h2d_bytes_per_s" in model:
        # Both directions at once from two threads and streams: each at f x its own rate, done when the slower is.
        alone_s = max(p4["bytes_each_way"] / model["h2d_bytes_per_s"], p4["bytes_each_way"] / model["d2h_bytes_per_s"])
        model["duplex_factor"] = min(1.0, max(0.01, alone_s / (p4["two_streams_us"] * 1e-6)))
        sources["duplex_factor"] = (f"P4: {p4['bytes_each_way'] / 2**20:.0f} MiB each way at once (two threads, two "
                                    "streams) against each direction's P2 rate, median of 5")
        figures["p4_two_streams_us"] = p4["two_streams_us"]
        figures["p4_one_stream_us"] = p4["one_stream_us"]

    p5 = probes.get("P5")
    if p5 and "error" not in p5:
        # A block touched once costs its stall (fault rounds and a small copy); a block streamed costs that
        # stall plus its 2 MiB at the fault path's rate.
        blocks, every_us = p5["blocks"], p5["every_byte_us"]
        stall_us = p5["word_per_block_us"] / blocks
        copy_us = every_us - blocks * stall_us
        if copy_us > 0.1 * every_us:
            model["fault_block_ns"] = stall_us * 1e3
            model["fault_bytes_per_s"] = p5["bytes"] / (copy_us * 1e-6)
            sources["fault_block_ns"] = (f"P5c: a kernel touching one word of each of {blocks:.0f} host-resident blocks, "
                                         "kernel time per block, median of 5")
            sources["fault_bytes_per_s"] = ("P5a: a kernel reading every byte of the same blocks, kernel time less "
                                            "fault_block_ns per block, median of 5")
        else:
            model["fault_block_ns"] = 0.0
            model["fault_bytes_per_s"] = p5["bytes"] / (every_us * 1e-6)
            sources["fault_block_ns"] = "P5: a block touched once cost most of a block streamed: not told apart, 0"
            sources["fault_bytes_per_s"] = (f"P5a: a kernel reading every byte of {blocks:.0f} host-resident blocks, "
                                            "kernel time, median of 5")
        for key in ("every_byte_us", "word_per_64k_us", "word_per_block_us"):
            figures[f"p5_{key}"] = p5[key]

    p6 = probes.get("P6")
    if p6 and "error" not in p6:
        model["discard_call_ns"] = p6["discard_call_us"] * 1e3
        sources["discard_call_ns"] = (f"P6: host time of one cudaMemDiscardBatchAsync of {p6['blocks']:.0f} contiguous "
                                      "GPU-resident blocks (one range), median of 5")
        # Half the plain copy's time or less: no copy was made.
        figures["p6_discarded_to_host_copies"] = p6["discarded_to_host_us"] > 0.5 * p6["to_host_plain_us"]
        figures["p6_discard_revoked_by_move_to_host"] = p6["then_to_gpu_us"] > 0.5 * p6["to_gpu_plain_us"]
        figures["p6_discard_and_prefetch_copies"] = p6["discard_and_prefetch_from_host_us"] > 0.5 * p6["to_gpu_plain_us"]
        figures["p6_write_after_discard_reads_back"] = p6["write_after_discard_reads_back"]

    p7 = probes.get("P7")
    if p7 and "error" not in p7:
        model["launch_ns"] = p7["launch_us"] * 1e3
        sources["launch_ns"] = "P7: host time of one launch of an empty kernel on an idle stream, 1000 launches, median of 5"
        figures["p7_today_x_ideal"] = round(p7["today_us"] / p7["ideal_us"], 3)
        figures["p7_pager_thread_x_ideal"] = round(p7["pager_thread_us"] / p7["ideal_us"], 3)
        figures["p7_today_launch_thread_us"] = p7["today_launch_thread_us"]
        figures["p7_pager_thread_launch_thread_us"] = p7["pager_thread_launch_thread_us"]

    p8 = probes.get("P8")
    if p8 and "error" not in p8:
        figures["p8_freed_by_eviction_mib"] = round(p8["freed_by_eviction_bytes"] / 2**20)
        for key in ("create_us", "map_us", "set_access_us", "unmap_us", "release_us"):
            if key in p8:
                figures[f"p8_{key}"] = p8[key]
        # A swapped page's trip (ZICO_UM_MEMORY=swap): each VMM call on one 2 MiB chunk.
        for key, probe, call in (("chunk_create_ns", "create_us", "cuMemCreate"), ("chunk_map_ns", "map_us", "cuMemMap"),
                                 ("chunk_access_ns", "set_access_us", "cuMemSetAccess"),
                                 ("chunk_unmap_ns", "unmap_us", "cuMemUnmap"),
                                 ("chunk_release_ns", "release_us", "cuMemRelease")):
            if probe in p8:
                model[key] = p8[probe] * 1e3
                sources[key] = f"P8: {call} of one 2 MiB chunk, median of 5"
        figures["p8_second_process"] = p8["second_process"]
        second = p8["second_process"] if isinstance(p8["second_process"], dict) else {}
        if "free_after_beyond_bytes" in second and "error" not in second:
            figures["p8_free_after_beyond_bytes"] = second["free_after_beyond_bytes"]
            # What freeing the allocation beyond free memory left to the device: the first
            # process's retained chunks it took (up to 3/4 of the arena) when they stay free.
            figures["p8_squeeze_gain_mib"] = round((second["free_after_beyond_bytes"] - second["free_bytes"]) / 2**20)
        if "free_after_second_bytes" in p8:
            figures["p8_free_after_second_bytes"] = p8["free_after_second_bytes"]
            if "free_after_eviction_bytes" in p8:
                # What the owner itself now sees free beyond what it saw with its blocks on the host.
                figures["p8_owner_free_gain_mib"] = round(
                    (p8["free_after_second_bytes"] - p8["free_after_eviction_bytes"]) / 2**20)
        if "back_to_gpu_ms" in p8:
            figures["p8_back_to_gpu_ms"] = p8["back_to_gpu_ms"]
            if model.get("h2d_bytes_per_s"):
                # Above 1: bringing the arena back cost more than P2's moves, which reused retained chunks.
                at_p2_rate_ms = p8["arena_bytes"] / model["h2d_bytes_per_s"] * 1e3
                figures["p8_back_to_gpu_x_p2_rate"] = round(p8["back_to_gpu_ms"] / at_p2_rate_ms, 3)

    p9 = probes.get("P9")
    if p9 and "error" not in p9:
        figures["p9_product"] = p9["product"]
        figures["p9_link"] = p9["link"]
        figures["p9_uvm_parameters"] = p9["uvm_parameters"]

    # Nanoseconds as the reader rounds them.
    for key, value in model.items():
        if key.endswith("_ns"):
            model[key] = round(value)
    model = {key: model[key] for key in MODEL_KEYS if key in model}
    sources = {key: sources[key] for key in MODEL_KEYS if key in sources}
    return model, sources, figures


def metadata(given, probes):
    nvcc = command_output("nvcc", "--version") or ""
    release = re.search(r"release ([0-9.]+)", nvcc)
    p9 = probes.get("P9") or {}
    found = {
        "device": p9.get("product") or command_output("nvidia-smi", "--query-gpu=name", "--format=csv,noheader"),
        "driver": command_output("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"),
        "cuda": release.group(1) if release else None,
        "commit": command_output("git", "describe", "--always", "--dirty", "--abbrev=7"),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
    }
    found.update(given)
    return {key: value.splitlines()[0] if value else "unknown" for key, value in found.items()}


def main(argv):
    if len(argv) < 3 or (len(argv) > 3 and argv[3] != "--meta"):
        print(__doc__, file=sys.stderr)
        return 2
    given = {}
    for item in argv[4:]:
        key, _, value = item.partition("=")
        if key not in ("device", "driver", "cuda", "commit", "date") or not value:
            print(f"calibration.py: --meta '{item}' is not KEY=VALUE with KEY device, driver, cuda, commit or date",
                  file=sys.stderr)
            return 2
        given[key] = value
    try:
        probes = probe_lines(argv[1])
    except OSError as error:
        print(f"calibration.py: cannot read {argv[1]}: {error}", file=sys.stderr)
        probes = {}
    model, sources, figures = derive(probes)
    calibration = dict(metadata(given, probes), model=model, sources=sources)
    with open(argv[2], "w") as out:
        json.dump(calibration, out, indent=2)
        out.write("\n")
    failed = [name for name in PROBES if name not in probes or "error" in probes[name]]
    errors = {name: probes[name]["error"] for name in failed if name in probes}
    if "setup" in probes and "error" in probes["setup"]:
        errors["setup"] = probes["setup"]["error"]
    print(json.dumps(dict(model=model, missing_probes=failed, errors=errors, **figures)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
