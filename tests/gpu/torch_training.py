"""A deterministic PyTorch training loop for the GPU suite (tests/gpu/run.sh).

    torch_training.py native|enable [--budget SIZE] [--iterations N] [--model conv|mlp|gpt2|resnet50]
                      [--suspend-at K] [--mark-iterations] [--zico-stats]
                      [--activations default|save_on_cpu|checkpoint] [--announce-iterations]

native: PyTorch's own allocator (also what runs under zico-run, which
preloads libzicoum). enable: zicoum.torch.enable(budget=SIZE) first. Prints
one JSON line: the losses (as float.hex, so equal means bitwise equal), the
median iteration time, the peak memory reserved, and in enable mode what a
CUDA graph capture does (zicoum refuses it rather than corrupt) and whether a
tensor another stream still reads after record_stream keeps its memory.

--model mlp: a 13-layer MLP of width 4096 on a batch of 8192 whose weights,
gradients, momentum and activations peak at several GiB, for UM mode under a
budget below that (run under zico-run --mode um). --model gpt2: GPT-2 small
from a transformers config (random weights, no dropout, eager attention so
that every kernel is deterministic) on 8 sequences of 512 random tokens.
--model resnet50: torchvision's ResNet-50 (random weights, 10 classes) on a
batch of 64 random 224x224 images. --suspend-at K: before iteration K, zicoum.suspend(to="host") and
zicoum.resume() (the tensors must come back bitwise). --mark-iterations: calls
zicoum.mark_iteration() at each iteration's start. --zico-stats: adds
zicoum.stats() (the pager's resident peak, faults, prefetches, and how many
kernels of one cuBLAS matrix product zicoum saw launched) to the line.
--sample-gpu-memory: the GPU's memory in use (NVML, every process's) before
the model is built and at its peak while training, sampled every 2 ms.
--activations: what users reach for when a model does not fit, as baselines
for UM mode: save_on_cpu keeps the tensors autograd saves in pinned host
memory (torch.autograd.graph.save_on_cpu(pin_memory=True)); checkpoint
recomputes them in the backward pass (torch.utils.checkpoint: GPT-2 per
transformer block through transformers' gradient checkpointing, ResNet-50 per
stage, a Sequential in 4 segments). The line's peak_reserved_bytes and
peak_allocated_bytes are then theirs. --announce-iterations: prints
"iteration K" as iteration K starts, at once, for a process that acts at a
given iteration (tests/gpu/um_physical_gpu.py).
"""
import argparse
import json
import os
import statistics
import threading
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def record_stream_probe(torch, device):
    """A side stream reads x after a long wait; x is record_stream'ed and freed
    on the default stream, which at once allocates and fills a tensor of the
    same size: with the side stream's use ignored, that one gets x's memory
    and the side stream reads its -1s."""
    elements = 1 << 22  # 16 MiB of ones: their float32 sum is exact
    x = torch.ones(elements, device=device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # cycles: ~0.1 s of the side stream still busy
        total = x.sum()
    x.record_stream(side)
    del x
    y = torch.full((elements,), -1.0, device=device)
    torch.cuda.synchronize()
    del y
    return "kept" if total.item() == float(elements) else f"reused under the side stream (sum {total.item()})"


class GpuMemorySampler:
    """The most memory in use on GPU 0 (NVML) while running."""

    def __init__(self):
        import pynvml
        pynvml.nvmlInit()
        self._nvml = pynvml
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        self.before = self.peak = self.used()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def used(self):
        return self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used

    def _run(self):
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, self.used())

    def stop(self):
        self._stop.set()
        self._thread.join()
        return {"gpu_used_before_bytes": self.before, "gpu_used_peak_bytes": self.peak}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("native", "enable"))
    parser.add_argument("--budget", default="8GiB")
    parser.add_argument("--iterations", type=int, default=36)
    parser.add_argument("--model", choices=("conv", "mlp", "gpt2", "resnet50"), default="conv")
    parser.add_argument("--suspend-at", type=int, default=None)
    parser.add_argument("--mark-iterations", action="store_true")
    parser.add_argument("--zico-stats", action="store_true")
    parser.add_argument("--sample-gpu-memory", action="store_true")
    parser.add_argument("--activations", choices=("default", "save_on_cpu", "checkpoint"), default="default")
    parser.add_argument("--announce-iterations", action="store_true")
    args = parser.parse_args()
    zicoum = None
    if args.suspend_at is not None or args.mark_iterations or args.zico_stats:
        import zicoum
    if args.mode == "enable":
        import zicoum.torch
        zicoum.torch.enable(budget=args.budget)
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True)
    device = torch.device("cuda")
    torch.cuda.init()
    sampler = None
    if args.sample_gpu_memory:
        try:
            sampler = GpuMemorySampler()
        except ImportError:  # no nvidia-ml-py: the run goes on without the figures
            print("torch_training: no pynvml, so no GPU memory figures", flush=True)
    generator = torch.Generator(device="cpu").manual_seed(1)
    if args.model == "conv":
        model = nn.Sequential(
            nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2), nn.Conv2d(128, 128, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
            nn.Linear(128, 10)).to(device)
        inputs = torch.randn(64, 3, 64, 64, generator=generator).to(device)
    elif args.model == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        config = GPT2Config(n_positions=512, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                            attn_implementation="eager")
        model = GPT2LMHeadModel(config).to(device)
        inputs = torch.randint(0, config.vocab_size, (8, 512), generator=generator).to(device)
    elif args.model == "resnet50":
        import torchvision
        model = torchvision.models.resnet50(num_classes=10).to(device)
        inputs = torch.randn(64, 3, 224, 224, generator=generator).to(device)
    else:
        # 12 x (4096x4096 weights: 64 MiB, with gradient and momentum 192 MiB) and a batch of 8192
        # (128 MiB per saved activation): about 2.3 GiB of state and 3 GiB of activations at the peak.
        width, layers = 4096, []
        for _ in range(12):
            layers += [nn.Linear(width, width), nn.ReLU()]
        model = nn.Sequential(*layers, nn.Linear(width, 10)).to(device)
        inputs = torch.randn(8192, width, generator=generator).to(device)
    gemm_kernels_seen = None
    if args.zico_stats:
        # Whether cuBLAS's launches reach zicoum (they come from its own copy of the runtime).
        square = torch.ones(512, 512, device=device)
        torch.cuda.synchronize()
        before = zicoum.stats()["kernels"]
        torch.mm(square, square)
        torch.cuda.synchronize()
        gemm_kernels_seen = zicoum.stats()["kernels"] - before
        del square
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    labels = torch.randint(0, 10, (inputs.shape[0],), generator=generator).to(device)

    forward = model
    if args.activations == "checkpoint":
        from torch.utils.checkpoint import checkpoint, checkpoint_sequential
        if args.model == "gpt2":
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        elif args.model == "resnet50":
            stages = [nn.Sequential(model.conv1, model.bn1, model.relu, model.maxpool), model.layer1, model.layer2,
                      model.layer3, model.layer4]

            def forward(x):
                for stage in stages:
                    x = checkpoint(stage, x, use_reentrant=False)
                return model.fc(torch.flatten(model.avgpool(x), 1))
        else:
            def forward(x):
                return checkpoint_sequential(model, 4, x, use_reentrant=False)

    def loss_of():
        if args.model == "gpt2":
            return model(inputs, labels=inputs).loss  # next-token prediction
        return nn.functional.cross_entropy(forward(inputs), labels)

    losses, times = [], []
    for iteration in range(args.iterations):
        torch.cuda.synchronize()
        if iteration == args.suspend_at:
            zicoum.suspend(to="host")
            zicoum.resume()
        if args.mark_iterations:
            zicoum.mark_iteration()
        if args.announce_iterations:
            print(f"iteration {iteration}", flush=True)
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        if args.activations == "save_on_cpu":
            with torch.autograd.graph.save_on_cpu(pin_memory=True):
                loss = loss_of()
        else:
            loss = loss_of()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        times.append(time.perf_counter() - start)
    result = {
        "mode": args.mode,
        "losses": [float(x).hex() for x in losses],
        "iteration_ms": statistics.median(times[len(times) // 3:]) * 1e3,
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
        "activations": args.activations,
    }
    if sampler is not None:
        result.update(sampler.stop())
    if args.zico_stats:
        result["zico"] = zicoum.stats()
        result["zico"]["gemm_kernels_seen"] = gemm_kernels_seen
    if args.mode == "enable":
        result["record_stream"] = record_stream_probe(torch, device)
        graph = torch.cuda.CUDAGraph()
        static = torch.zeros(1024, device=device)
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side), torch.cuda.graph(graph):
                static = static * 2 + 1
            result["graph_capture"] = "served (zicoum should have refused)"
        except RuntimeError as error:
            result["graph_capture"] = "refused" if "CUDA graph" in str(error) else f"other error: {error}"
    print(json.dumps(result))


if __name__ == "__main__":
    main()
