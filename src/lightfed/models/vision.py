"""GroupNorm ResNets for lightfed's own vision bases (no ImageNet weights exist offline), and their pretraining.

BatchNorm statistics would not travel with federated weights (nor be generated from FLITE's z): every norm
is a GroupNorm, whose affine weights are ordinary parameters.

    GNResNet     28x28x1 -> stem -> 3 stages of 1 basic block (stride 1, 2, 2) -> pool -> head   ~0.2M weights
    GNResNet18   32x32xC -> 3x3 stem -> 4 stages of 2 basic blocks, widths 64-128-256-512 (stride 1, 2, 2, 2)
                 -> pool -> head: ResNet-18's CIFAR form (no max-pool), 20 convolutions, ~11.2M weights

`pretrain` trains one on a labelled image set with AdamW, a cosine schedule and random shifts, and reports
its held-out accuracy: lightfed's bases are built this way on a split the federated task never uses.
"""
from __future__ import annotations

import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    """A basic residual block: conv3x3 -> GN -> ReLU -> conv3x3 -> GN, + skip (1x1 conv + GN when the shape changes)."""

    def __init__(self, cin: int, cout: int, stride: int, groups: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.norm1 = nn.GroupNorm(min(groups, cout), cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.norm2 = nn.GroupNorm(min(groups, cout), cout)
        self.skip = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.GroupNorm(min(groups, cout), cout))
                     if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x):
        y = F.relu(self.norm1(self.conv1(x)))
        return F.relu(self.norm2(self.conv2(y)) + self.skip(x))


class GNResNet(nn.Module):
    """28x28x1 -> stem -> 3 stages (stride 1, 2, 2) -> global average pool -> head.  logits: (B, C)"""

    def __init__(self, widths=(32, 64, 128), num_classes: int = 10, groups: int = 8):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, widths[0], 3, 1, 1, bias=False), nn.GroupNorm(groups, widths[0]), nn.ReLU())
        stages, cin = [], widths[0]
        for i, w in enumerate(widths):
            stages.append(Block(cin, w, 1 if i == 0 else 2, groups))
            cin = w
        self.stages = nn.Sequential(*stages)
        self.head = nn.Linear(cin, num_classes)

    def forward(self, x):                      # x: (B, 1, 28, 28)
        h = self.stages(self.stem(x))          # (B, C, 7, 7)
        return self.head(h.mean((2, 3)))       # (B, num_classes)


class GNResNet18(nn.Module):
    """ResNet-18 (CIFAR form) with GroupNorm.  x: (B, C_in, 32, 32) -> logits (B, num_classes)"""

    def __init__(self, num_classes: int = 10, in_channels: int = 1, widths=(64, 128, 256, 512), groups: int = 32):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, widths[0], 3, 1, 1, bias=False),
                                  nn.GroupNorm(min(groups, widths[0]), widths[0]), nn.ReLU())
        blocks, cin = [], widths[0]
        for i, w in enumerate(widths):
            for j in range(2):
                blocks.append(Block(cin, w, 2 if (i > 0 and j == 0) else 1, groups))
                cin = w
        self.stages = nn.Sequential(*blocks)
        self.head = nn.Linear(cin, num_classes)

    def forward(self, x):                      # (B, C_in, 32, 32)
        h = self.stages(self.stem(x))          # (B, 512, 4, 4)
        return self.head(h.mean((2, 3)))       # (B, num_classes)


def shift(x: torch.Tensor, pad: int, g: torch.Generator) -> torch.Tensor:
    """Random translations by up to `pad` pixels (zero padding, then a random crop per image).  (B, C, H, W)"""
    B, _, H, W = x.shape
    xp = F.pad(x, (pad, pad, pad, pad))
    dy = torch.randint(0, 2 * pad + 1, (B,), generator=g)
    dx = torch.randint(0, 2 * pad + 1, (B,), generator=g)
    rows = (dy[:, None] + torch.arange(H))[:, None, :, None]            # (B, 1, H, 1)
    cols = (dx[:, None] + torch.arange(W))[:, None, None, :]            # (B, 1, 1, W)
    return xp[torch.arange(B)[:, None, None, None], torch.arange(x.shape[1])[None, :, None, None], rows, cols]


@torch.no_grad()
def accuracy(net: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 256) -> float:
    was = net.training
    net.eval()
    hits = sum(int((net(x[i:i + batch]).argmax(-1) == y[i:i + batch]).sum()) for i in range(0, len(x), batch))
    net.train(was)
    return hits / len(x)


def pretrain(net: nn.Module, x: torch.Tensor, y: torch.Tensor, x_val: torch.Tensor | None = None,
             y_val: torch.Tensor | None = None, *, epochs: int, seed: int, lr: float = 2e-3, weight_decay: float = 1e-4,
             schedule: str = "constant", batch: int = 128, shift_px: int = 0, bf16: bool = False, progress=None) -> dict:
    """Train `net` in place on (x, y) with AdamW; -> what it reached (accuracy on (x_val, y_val) if given) and how long
    it took. schedule: constant | onecycle (warm-up then cosine decay). bf16: autocast the forward to bfloat16 (CPUs
    with AMX / AVX512-BF16 run it ~2x faster); the weights stay fp32."""
    from lightfed.data.tensors import batches
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=weight_decay)
    per_epoch = math.ceil(len(x) / batch)
    steps = epochs * per_epoch
    sched = (torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.15)
             if schedule == "onecycle" else None)
    t0, done, losses = time.perf_counter(), 0, []
    net.train()
    for _ in range(epochs):
        for b in batches({"x": x, "y": y}, batch, g):
            xb = shift(b["x"], shift_px, g) if shift_px else b["x"]
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = F.cross_entropy(net(xb), b["y"])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if sched is not None:
                sched.step()
            losses.append(float(loss))
            done += 1
            if progress is not None:
                progress(done, steps, float(loss))
    return {"epochs": epochs, "steps": steps, "images": len(x), "batch": batch, "lr": lr, "weight_decay": weight_decay,
            "schedule": schedule, "bf16": bf16, "shift_px": shift_px,
            "train_loss_last_epoch": sum(losses[-per_epoch:]) / per_epoch,
            "heldout_images": len(x_val) if x_val is not None else 0,
            "heldout_accuracy": accuracy(net, x_val, y_val) if x_val is not None else None,
            "seconds": time.perf_counter() - t0, "params": sum(p.numel() for p in net.parameters())}
