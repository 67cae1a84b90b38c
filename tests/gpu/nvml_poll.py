"""GPU 0's memory in use as NVML counts it, polled in a thread (the GPU suite's um_physical step).

NvmlPoll reads the device's memory in use through pynvml where it is installed (its v2 figure, which
leaves out the driver's reserved memory as nvidia-smi does, where the binding has it) and through
nvidia-smi otherwise; each sample carries the monotonic times its query began and ended, so that
a caller can leave out those that overlap something it did. It also keeps each compute process's
own memory at its largest (NVML's per-process figure, which leaves unified memory out: a CUDA
context and its cudaMalloc'ed memory).
"""
import subprocess
import threading
import time

MIB = 1 << 20


class NvmlUnavailable(Exception):
    pass


class _Pynvml:
    def __init__(self):
        import pynvml
        try:
            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        except pynvml.NVMLError as error:
            raise NvmlUnavailable(f"pynvml: {error}") from error
        self._nvml = pynvml
        self.source = "pynvml v1"
        version = getattr(pynvml, "nvmlMemory_v2", None)
        if version is not None:
            try:
                pynvml.nvmlDeviceGetMemoryInfo(self._handle, version=version)
                self.source = "pynvml v2"
            except (TypeError, pynvml.NVMLError):
                pass

    def used(self):
        try:
            if self.source == "pynvml v2":
                return self._nvml.nvmlDeviceGetMemoryInfo(self._handle, version=self._nvml.nvmlMemory_v2).used
            return self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used
        except self._nvml.NVMLError as error:
            raise NvmlUnavailable(f"pynvml: {error}") from error

    def processes(self):
        try:
            listed = self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle)
        except self._nvml.NVMLError as error:
            raise NvmlUnavailable(f"pynvml: {error}") from error
        return {p.pid: p.usedGpuMemory for p in listed}


class _NvidiaSmi:
    source = "nvidia-smi"

    @staticmethod
    def _query(*arguments):
        result = subprocess.run(["nvidia-smi", *arguments, "--format=csv,noheader,nounits", "-i", "0"],
                                capture_output=True, text=True, timeout=20)
        if result.returncode != 0:
            raise NvmlUnavailable(f"nvidia-smi {arguments[0]} exited {result.returncode}: "
                                  f"{(result.stderr or result.stdout).strip()[:200]}")
        return result.stdout

    def used(self):
        text = self._query("--query-gpu=memory.used").strip()
        try:
            return int(text.splitlines()[0]) * MIB
        except (ValueError, IndexError) as error:
            raise NvmlUnavailable(f"nvidia-smi --query-gpu=memory.used printed '{text[:100]}'") from error

    def processes(self):
        found = {}
        for line in self._query("--query-compute-apps=pid,used_memory").splitlines():
            fields = [field.strip() for field in line.split(",")]
            if len(fields) != 2 or not fields[0].isdigit():
                continue
            found[int(fields[0])] = int(fields[1]) * MIB if fields[1].isdigit() else None
        return found


class NvmlPoll:
    """start() polls until stop(): `samples` is [(began, ended, used_bytes)], `process_peaks`
    {pid: largest own bytes} (None where NVML gives no per-process figure)."""

    def __init__(self, interval_s=0.02, processes_every=10):
        try:
            self._source = _Pynvml()
        except ImportError:
            self._source = _NvidiaSmi()
        self.source = self._source.source
        self.used_now()  # fails here, not in the thread, where NVML cannot be read
        self._interval_s = interval_s
        self._processes_every = processes_every
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        self.samples = []
        self.process_peaks = {}
        self.errors = 0
        self.last_error = None

    def used_now(self):
        try:
            return self._source.used()
        except (OSError, subprocess.SubprocessError) as error:
            raise NvmlUnavailable(f"{self.source}: {error}") from error

    def processes_now(self):
        """{pid: own bytes or None} of the compute processes NVML lists now; {} where it cannot say."""
        try:
            return self._source.processes()
        except (OSError, subprocess.SubprocessError, NvmlUnavailable) as error:
            self.last_error = str(error)
            return {}

    def start(self):
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def window(self, began, ended):
        """The samples whose queries began and ended within [began, ended]."""
        with self._lock:
            return [sample for sample in self.samples if sample[0] >= began and sample[1] <= ended]

    def _run(self):
        count = 0
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                used = self._source.used()
                with self._lock:
                    self.samples.append((began, time.monotonic(), used))
                if count % self._processes_every == 0:
                    for pid, own in self._source.processes().items():
                        with self._lock:
                            before = self.process_peaks.get(pid)
                            self.process_peaks[pid] = own if before is None else max(before, own or 0)
            except (OSError, subprocess.SubprocessError, NvmlUnavailable) as error:
                # A query that failed once (nvidia-smi timing out under load) leaves a gap, not the end.
                self.errors += 1
                self.last_error = str(error)
            count += 1
            self._stop.wait(self._interval_s)
