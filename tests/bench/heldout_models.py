"""Models outside the committed traces, for checking the paging planner on jobs it was not tuned on.

    cd tools/traces
    PYTHONPATH=../../tests/bench python3 capture.py --model heldout_models:mlp --batch 8192 --iterations 5 \
        --out /tmp/heldout/mlp.ztrace.gz
    PYTHONPATH=../../tests/bench python3 capture.py --model heldout_models:unet_like --batch 16 --image-size 256 \
        --iterations 5 --out /tmp/heldout/unet.ztrace.gz

then `python3 tests/bench/paging_sweep.py --trace /tmp/heldout/mlp.ztrace.gz ... build/bin/zico-umctl`
(docs/benchmarks.md, "Models the planner was not tuned on"). Needs torch (capture.py's contract:
tools/traces/example_model.py).
"""
import torch
import torch.nn as nn


def mlp(batch):
    """The GPU suite's MLP (tests/gpu/torch_training.py --model mlp): 12 x (Linear 4096 + ReLU), a
    10-class head. Large layers and an optimizer step whose foreach ops touch every parameter, gradient
    and moment at once."""
    layers = []
    for _ in range(12):
        layers += [nn.Linear(4096, 4096), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(4096, 10))
    return model, (torch.randn(batch, 4096), torch.randint(0, 10, (batch,)))


class _UNetLike(nn.Module):
    """An encoder-decoder CNN with skip connections: activations of many sizes kept across the pass."""

    def __init__(self):
        super().__init__()
        c = [3, 64, 128, 256, 512]
        self.down = nn.ModuleList(
            nn.Sequential(nn.Conv2d(c[i], c[i + 1], 3, padding=1), nn.BatchNorm2d(c[i + 1]), nn.ReLU(),
                          nn.Conv2d(c[i + 1], c[i + 1], 3, padding=1), nn.ReLU())
            for i in range(4))
        self.up = nn.ModuleList(nn.ConvTranspose2d(c[i + 1], c[i], 2, stride=2) for i in range(1, 4))
        self.fuse = nn.ModuleList(nn.Conv2d(2 * c[i], c[i], 3, padding=1) for i in range(1, 4))
        self.head = nn.Conv2d(64, 10, 1)

    def forward(self, x):
        skips = []
        for i, block in enumerate(self.down):
            x = block(x)
            if i < 3:
                skips.append(x)
                x = nn.functional.max_pool2d(x, 2)
        for i in reversed(range(3)):
            x = self.fuse[i](torch.cat([self.up[i](x), skips[i]], 1))
        return self.head(x).mean((2, 3))


def unet_like(batch, image_size=None):
    size = image_size or 256
    return _UNetLike(), (torch.randn(batch, 3, size, size), torch.randint(0, 10, (batch,)))
