"""FedALA (Zhang et al., AAAI 2023): FedAvg on the server; each client, instead of overwriting its
local model with the global one, starts local training from an adaptive local aggregation (ALA):

    top layers:      theta_init = theta_loc + W * (theta_glob - theta_loc),  W element-wise in [0, 1], init 1
    lower layers:    theta_init = theta_glob
    W <- clip_[0,1](W - eta * dL/dtheta_init * (theta_glob - theta_loc))    (theta_loc, theta_glob fixed)

W is learned on a random s% of the client's data (batches of cfg.batch_size): to convergence the
first time ALA runs (std of the last k losses < threshold, at most max_steps steps), one pass over
that sample later on. Then ordinary local training (as FedAvg) runs from theta_init and uploads the
trained tensors. A client's first participation has no local model: it starts from the global one
(ALA starts from its second participation, as in the paper).

Choices: the trainable tensors are LoRA's (this subclasses lora.LoRA). A "layer" is the group of
trainable tensors whose name shares the prefix up to its first numeric component (Llama's
`model.layers.N.`, BERT's `layer.N.`, the ResNet's `stages.N.`); tensors after the last numbered
layer (a task head) belong to the top layer; a model without numbered layers counts each trainable
tensor as a layer, in order. ALA's FLOPs are added to `flops`; `steps`/`samples` are local training's.
ctx.state keeps the local tensors after training ("own.<name>") and W ("ala_w.<name>").
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch
from torch.utils.flop_counter import FlopCounterMode

from lightfed.config import ConfigError
from lightfed.data.tensors import batches, size, subset
from lightfed.methods import lora

OWN, WEIGHT = "own.", "ala_w."


def _spread(xs: list[float]) -> float:
    """Population std; nan when a loss is not finite (then ALA runs to its step budget)."""
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs)) if math.isfinite(m) else math.nan


@dataclass
class Options(lora.Options):
    s: float = 80.0          # percent of the local data that W is learned on
    eta: float = 1.0         # step size of W
    top: int = 1             # top layers that are aggregated adaptively (the paper's p); 0: every layer
    k: int = 10              # losses in the convergence window (first ALA)
    threshold: float = 0.1   # first ALA stops when the std of the last k losses is below this
    max_steps: int = 50      # ... or after this many steps

    def check(self):
        super().check()
        if not 0 < self.s <= 100:
            raise ConfigError(f"s = {self.s}: a percent of the local data, must be in (0, 100]")
        if self.eta <= 0:
            raise ConfigError(f"eta = {self.eta}: must be > 0")
        if self.top < 0:
            raise ConfigError(f"top = {self.top}: must be >= 1 layer, or 0 for every layer")
        if self.k < 2:
            raise ConfigError(f"k = {self.k}: the convergence window needs >= 2 losses")
        if self.threshold < 0:
            raise ConfigError(f"threshold = {self.threshold}: must be >= 0")
        if self.max_steps < 1:
            raise ConfigError(f"max_steps = {self.max_steps}: must be >= 1")


def top_layers(names: list[str], p: int) -> set[str]:
    """The tensors (names in model order) of the top p layers (p = 0: every layer); see the module docstring."""
    if p == 0:
        return set(names)
    keys = []
    for n in names:
        m = re.search(r"(?:^|\.)\d+\.", n)
        keys.append(n[:m.end()] if m else None)
    numbered = list(dict.fromkeys(k for k in keys if k is not None))
    if not numbered:
        return set(names[-p:])
    top, last = set(numbered[-p:]), max(i for i, k in enumerate(keys) if k is not None)
    return {n for i, (n, k) in enumerate(zip(names, keys)) if k in top or (k is None and i > last)}


class FedALA(lora.LoRA):
    name = "fedala"
    Options = Options
    personalised = True

    def prepare(self, model):
        model = super().prepare(model)
        self.adaptive = top_layers(list(self.shapes), self.opts.top)
        return model

    def personal(self, model, state, client_state):
        self.load(model, {n: client_state.get(OWN + n, state[n]) for n in state})

    def adapt(self, model, down, data, ctx) -> tuple[dict, dict]:
        """theta_init from the broadcast and what the client keeps (learns and stores W); ALA's stats."""
        names = list(self.shapes)
        if not all(OWN + n in ctx.state for n in names):       # first participation: the global model
            return dict(down), {"ala_steps": 0, "flops": 0.0, "ala_one_minus_w": 0.0}
        o, local = self.opts, {n: ctx.state[OWN + n] for n in names}
        top = [n for n in names if n in self.adaptive]
        first = not all(WEIGHT + n in ctx.state for n in top)
        w = {n: ctx.state[WEIGHT + n].clone() if not first else torch.ones_like(local[n]) for n in top}
        diff = {n: down[n] - local[n] for n in top}
        self.load(model, down)
        params = self.trainable(model)
        g = ctx.generator(1)
        n_all = size(data)
        sample = subset(data, torch.randperm(n_all, generator=g)[:max(1, round(o.s / 100 * n_all))])
        budget = o.max_steps if first else math.ceil(size(sample) / ctx.cfg.batch_size)
        losses, per_sample, samples = [], 0.0, 0
        model.train()

        def step(b):
            loss = ctx.loss(model, b)
            grads = torch.autograd.grad(loss, [params[n] for n in top], allow_unused=True)
            return loss, grads

        while len(losses) < budget:
            for b in batches(sample, ctx.cfg.batch_size, g):
                with torch.no_grad():
                    for n in top:
                        params[n].copy_(local[n] + w[n] * diff[n])
                if not losses:
                    with FlopCounterMode(display=False) as fc:
                        loss, grads = step(b)
                    per_sample = fc.get_total_flops() / size(b)
                else:
                    loss, grads = step(b)
                with torch.no_grad():
                    for n, gr in zip(top, grads):
                        if gr is not None:
                            w[n].sub_(o.eta * gr * diff[n]).clamp_(0.0, 1.0)
                losses.append(loss.item())
                samples += size(b)
                if len(losses) >= budget or (first and len(losses) >= o.k
                                             and _spread(losses[-o.k:]) < o.threshold):
                    budget = len(losses)
                    break
        ctx.state.update({WEIGHT + n: w[n] for n in top})
        start = dict(down)
        start.update({n: local[n] + w[n] * diff[n] for n in top})
        one_minus_w = sum((1 - w[n]).sum().item() for n in top) / sum(w[n].numel() for n in top)
        return start, {"ala_steps": len(losses), "ala_loss": sum(losses) / len(losses), "flops": per_sample * samples,
                       "ala_one_minus_w": one_minus_w}   # 0: the global model taken whole; 1: the local kept

    def client_update(self, model, down, data, ctx):
        start, ala = self.adapt(model, down, data, ctx)
        upload, stats = super().client_update(model, start, data, ctx)
        ctx.state.update({OWN + n: t.detach().clone() for n, t in upload.items()})
        stats["flops"] += ala.pop("flops")
        stats.update(ala)
        stats["memory_accounted"]["method_state"] = sum(t.numel() * t.element_size() for t in ctx.state.values())
        return upload, stats
