"""`fmnist`: Fashion-MNIST, all 10 classes, on a GroupNorm ResNet that lightfed pretrains itself (no ImageNet weights
exist offline) on classes 0-4 of training images 0-29,999; the federated task draws its training images from
30,000-59,999 (never seen in pretraining) and gets a fresh 10-way head.

    arch = "resnet18"   ResNet-18's CIFAR form with GroupNorm (models/vision.GNResNet18), images padded to 32x32:
                        11.2M weights, 20 convolutions (FLITE's paper scale); pretrained 10 epochs (bf16 autocast)
    arch = "small"      a 3-stage GNResNet of ~0.2M weights on 28x28 images; pretrained 2 epochs
    tiny = true         a random twin of the arch (the same layer layout, widths of 4-16)

`validation = true` draws the test set from training images 30,000-59,999 too (disjoint from the training
images): the set on which a benchmark chooses its settings, never the official test set.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from lightfed import assets, seeds
from lightfed.config import ConfigError
from lightfed.data import datasets
from lightfed.models import vision
from lightfed.models.backbones import seeded
from lightfed.seeds import derive
from lightfed.tasks.base import Task, accuracy, eval_mode

ARCHS = {   # arch -> (full-size constructor kwargs, tiny twin's, input side, default pretraining epochs)
    "resnet18": ({}, {"widths": (4, 8, 8, 16), "groups": 4}, 32, 10),
    "small": ({"widths": (16, 32, 64)}, {"widths": (8, 16, 16)}, 28, 2),
}
PRETRAIN_VAL = 1000      # pretraining images held out to report the base's accuracy (classes 0-4, images 0-29,999)
HEADS = ("trained", "orthogonal")


class FirstClasses(torch.nn.Module):
    """A 10-way network read on its first k classes: the base pretrained under a 10-row head uses rows 0..k-1."""

    def __init__(self, net: torch.nn.Module, k: int):
        super().__init__()
        self.net, self.k = net, k

    def forward(self, x):
        return self.net(x)[:, : self.k]                                 # (B, k)


@dataclass
class Options:
    tiny: bool = False
    arch: str = "resnet18"     # resnet18 | small
    train_size: int = 6000     # from training images 30,000-59,999 (never seen in pretraining)
    test_size: int = 2000      # from the official test set (or, with validation, from 30,000-59,999)
    validation: bool = False   # test on held-out training images instead of the official test set
    pretrained: bool = True    # False: the same architecture from random weights (FLITE's "from scratch")
    pretrain_epochs: int = 0   # 0: the arch's default (ARCHS)
    base_head: str = "trained"  # "orthogonal": the base pretrained under a frozen orthogonal 10-way head (its rows for
                                # classes 0-4 in pretraining), which the run's model starts with (FLITE: --opt head=keep)
    data_seed: int = 0

    def check(self):
        if self.arch not in ARCHS:
            raise ConfigError(f"fmnist: arch = {self.arch!r}: use one of {', '.join(ARCHS)}")
        if not 10 <= self.train_size <= 30000 or not 10 <= self.test_size <= 10000:
            raise ConfigError("fmnist: train_size in [10, 30000], test_size in [10, 10000]")
        if self.validation and self.train_size + self.test_size > 30000:
            raise ConfigError("fmnist: with validation, train_size + test_size must be <= 30000 (both from images 30,000-59,999)")
        if self.pretrain_epochs < 0:
            raise ConfigError(f"fmnist: pretrain_epochs = {self.pretrain_epochs}: must be >= 0 (0: the arch's default)")
        if self.base_head not in HEADS:
            raise ConfigError(f"fmnist: base_head = {self.base_head!r}: use one of {', '.join(HEADS)}")


def images(x: torch.Tensor, side: int) -> torch.Tensor:
    """uint8 (N, 28, 28) -> float (N, 1, side, side), standardised (zero-padded to 32x32 for ResNet-18)."""
    x = ((x.float() / 255.0 - 0.2860) / 0.3530).unsqueeze(1)
    p = (side - 28) // 2
    return F.pad(x, (p, p, p, p), value=(0 - 0.2860) / 0.3530) if p else x


def network(arch: str, tiny: bool, num_classes: int) -> torch.nn.Module:
    full, twin, _, _ = ARCHS[arch]
    kw = twin if tiny else full
    return vision.GNResNet18(num_classes, **kw) if arch == "resnet18" else vision.GNResNet(num_classes=num_classes, **kw)


def pretrained_base(arch: str, epochs: int, seed: int = 0, head: str = "trained") -> dict[str, torch.Tensor]:
    """lightfed's own base: the arch trained on classes 0-4 of training images 0-29,999 (PRETRAIN_VAL of them held
    out). Cached by (arch, epochs, seed, head) under the lightfed cache, with a JSON report beside it; returns the
    backbone's state dict. head "trained": a 5-way head trained with the body (not returned); "orthogonal": a 10-way
    head with orthonormal rows, frozen, read on its rows 0-4 while the body trains under it (returned with the body:
    the geometry FLITE's paper keeps frozen, now the one the features grew to fit)."""
    from safetensors.torch import load_file, save_file
    from tqdm import tqdm

    path = base_path(arch, epochs, seed, head)
    if path.exists():
        return load_file(path)
    d = datasets.load_fmnist()
    side, big = ARCHS[arch][2], arch == "resnet18"
    keep = np.flatnonzero(d["train_y"][:30000].numpy() < 5)
    x, y = images(d["train_x"][keep], side), d["train_y"][keep]
    val = (np.sort(np.random.default_rng([seed, 15]).choice(len(keep), PRETRAIN_VAL, replace=False)) if big
           else np.array([], dtype=np.int64))          # the small base: all of them, as it was first built
    tr = np.setdiff1d(np.arange(len(keep)), val)
    with seeded(seed):
        net = network(arch, False, 5 if head == "trained" else 10)
    trained = net
    if head == "orthogonal":
        with torch.no_grad():
            net.head.weight.copy_(seeds.orthogonal(tuple(net.head.weight.shape), derive(seed, 0x0E4D)))   # (10, d)
            net.head.bias.zero_()
        net.head.requires_grad_(False)
        trained = FirstClasses(net, 5)
    print(f"lightfed: pretraining the fmnist {arch} base ({head} head) on {len(tr)} images of classes 0-4, {epochs} "
          f"epoch(s); cached at {path}", file=sys.stderr)
    bar = tqdm(total=1, desc=f"pretrain fmnist {arch}", file=sys.stderr, leave=False)

    def progress(done, total, loss):
        bar.total = total
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.3f}")

    hold = (x[val], y[val]) if big else (None, None)
    report = vision.pretrain(trained, x[tr], y[tr], *hold, epochs=epochs, seed=seed, lr=2e-3, batch=128,
                             **({"weight_decay": 5e-4, "schedule": "onecycle", "shift_px": 2, "bf16": True} if big else {}),
                             progress=progress)
    bar.close()
    state = {k: v.contiguous() for k, v in net.state_dict().items() if head == "orthogonal" or not k.startswith("head.")}
    report.update(arch=arch, head=head, classes=[0, 1, 2, 3, 4], source="Fashion-MNIST training images 0-29,999",
                  bytes_fp32=sum(v.numel() * 4 for v in state.values()), torch_threads=torch.get_num_threads())
    print(f"lightfed: fmnist {arch} base: held-out accuracy {report['heldout_accuracy']} on {report['heldout_images']} "
          f"images, {report['seconds'] / 60:.1f} min", file=sys.stderr)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")        # one per process: two may build the same base at once
    tmp.write_text(json.dumps(report, indent=1))
    tmp.replace(path.with_suffix(".json"))
    save_file(state, tmp)
    tmp.replace(path)
    return state


def base_path(arch: str, epochs: int, seed: int = 0, head: str = "trained"):
    name = f"fmnist-gnresnet-16-32-64-e{epochs}-s{seed}" if arch == "small" else f"fmnist-{arch}-e{epochs}-s{seed}"
    return assets.cache_dir() / "models" / f"{name}{'' if head == 'trained' else '-' + head + '-head'}.safetensors"


def base_report(arch: str, epochs: int = 0, seed: int = 0, head: str = "trained") -> dict | None:
    """The pretraining report of a cached base (None if it was never built, or built before reports were kept)."""
    p = base_path(arch, epochs or ARCHS[arch][3], seed, head).with_suffix(".json")
    return json.loads(p.read_text()) if p.exists() else None


def build(o: Options, seed: int) -> Task:
    d = datasets.load_fmnist()
    rng = np.random.default_rng([o.data_seed, 13])
    side, epochs = ARCHS[o.arch][2], o.pretrain_epochs or ARCHS[o.arch][3]
    tr = 30000 + np.sort(rng.choice(30000, o.train_size, replace=False))
    with seeded(seed):
        model = network(o.arch, o.tiny, 10)
    # a fresh 10-way head from its own stream: drawn with the body's, at seed 0 its rows 0-4 were the pretraining's
    # first 5-way head, the one the base's features grew to fit (94-99% on classes 0-4 before any training)
    with seeded(derive(seed, 17)):
        model.head.reset_parameters()
    if o.pretrained and not o.tiny:       # base_head = orthogonal: the base's frozen 10-way head replaces the fresh one
        model.load_state_dict(pretrained_base(o.arch, epochs, head=o.base_head), strict=False)
    train = {"x": images(d["train_x"][tr], side), "labels": d["train_y"][tr]}
    if o.validation:          # from the training images the run does not train on
        rest = np.setdiff1d(np.arange(30000, 60000), tr)
        te = np.sort(np.random.default_rng([o.data_seed, 16]).choice(rest, o.test_size, replace=False))
        test = {"x": images(d["train_x"][te], side), "labels": d["train_y"][te]}
    else:
        te = np.sort(rng.choice(10000, o.test_size, replace=False))
        test = {"x": images(d["test_x"][te], side), "labels": d["test_y"][te]}

    def loss(m, b):
        return F.cross_entropy(m(b["x"]), b["labels"])

    @eval_mode
    def evaluate(m, data):
        return accuracy(lambda b: m(b["x"]), data, 256)

    name = f"GNResNet18{' (tiny twin)' if o.tiny else ''}" if o.arch == "resnet18" else f"GNResNet{ARCHS[o.arch][1 if o.tiny else 0]['widths']}"
    return Task("fmnist", "accuracy", True, model, train, test, train["labels"].numpy(), None, loss, evaluate,
                {"backbone": name, "test_set": "held-out training images (validation)" if o.validation else "official test set",
                 "pretrained": "random (tiny)" if o.tiny else (f"lightfed's own: classes 0-4 of train images 0-29,999, "
                                                              f"{epochs} epochs" if o.pretrained else "random"),
                 "base": base_report(o.arch, epochs, head=o.base_head) if o.pretrained and not o.tiny else None})
