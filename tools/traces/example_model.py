"""Your own model in capture.py: --model MODULE:CALLABLE. Three examples of the contract.

    cd tools/traces   # or anywhere, with this file in the current directory or on PYTHONPATH
    python3 capture.py --model example_model:build --batch 32 --image-size 64 --out /tmp/cnn.ztrace.gz

capture.py imports MODULE, calls CALLABLE with the options its signature names (batch, seq_len,
image_size, device: the values of --batch, --seq-len, --image-size, None where not given, and the
torch.device it captures on), inside `with torch.device(device)`, so tensors made without device= land
on the meta device (or the GPU with --device cuda). CALLABLE returns (model, batch) or
(model, batch, loss_fn); each iteration trains on a fresh copy of the batch.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class SmallCNN(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 64, 3, stride=2, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(64)
        self.fc = nn.Linear(64, classes)

    def forward(self, images):
        x = F.relu(self.bn1(self.conv1(images)))
        x = F.relu(self.bn2(self.conv2(x)))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def build(batch, image_size=None):
    """A tuple batch (inputs..., target): the loss is cross_entropy(model(*inputs), target)."""
    size = image_size or 32
    images = torch.randn(batch, 3, size, size)
    labels = torch.randint(0, 10, (batch,))
    return SmallCNN(), (images, labels)


def build_lm(batch, seq_len=None):
    """A dict batch: the loss is model(**batch).loss, as transformers' models compute it from labels."""
    from transformers import GPT2Config, GPT2LMHeadModel
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=256, n_head=4, use_cache=False))
    tokens = torch.randint(0, model.config.vocab_size, (batch, seq_len or 128))
    return model, {"input_ids": tokens, "labels": tokens}


def build_regression(batch, device):
    """Any other loss: a third item, loss_fn(model, batch) -> a scalar tensor."""
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 1))
    x = torch.randn(batch, 64, device=device)  # device= is optional: the default device is already it
    y = torch.randn(batch, 1, device=device)

    def loss_fn(model, batch):
        inputs, target = batch
        return F.mse_loss(model(inputs), target)

    return model, (x, y), loss_fn
