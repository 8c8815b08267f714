"""FedZO (Fang et al., 2022), as published: the expensive-uplink zeroth-order FL baseline.

Client: H local ZO-SGD steps (H = cfg.local_steps, or ceil(local_epochs x n / batch_size) like the
other methods), each on a fresh mini-batch, with b2 random directions u_j drawn uniformly on the
unit sphere of all d trainable weights (u_j = z_j / ||z_j||, z_j ~ N(0, I) regenerated from a seed
that the CLIENT draws from its own generator, ctx.generator(1)), and the forward-difference estimate

    g = d / (b2 mu) * sum_j [L(theta + mu u_j) - L(theta)] u_j,      theta <- theta - lr g

so a step costs b2 + 1 forwards (one unperturbed). The perturbed forwards use
zeroth_order.perturbed (stored weights untouched); the step is applied as b2 updates
theta <- theta - c_j z_j with c_j = lr d (L_j - L_0) / (b2 mu ||z_j||) through
zeroth_order.apply_update (the same arithmetic as every ZO method here; no accumulator of d
floats). Plain ZO-SGD: no momentum, no weight decay (a run that sets optimizer or weight_decay is refused).
Forwards only, under no_grad, in eval mode (dropout off).

Wire.  Up: the client's FULL trainable weights, d fp32 floats (the server recovers FedZO's update
Delta = w_k - w from them; the same d floats either way), + `_n` (sample count). Down: the trainable
weights (fp32). No seeds cross the wire: the directions are the client's own, so the server
cannot replay them. (A "seeded" FedZO that uploads seeds + scalars is a different baseline;
this is not it.)
Server: the sample-weighted mean of the uploaded weights (= w + mean Delta), as FedAvg.

stats: steps, samples, loss / train_loss (mean unperturbed loss L_0 over the steps), flops (forward
FLOPs per sample from FlopCounterMode x (b2 + 1) forwards x samples, counted like MeZO / FedSPZO),
forwards_per_step, memory_accounted (params, activations of one forward, z = the largest
perturbed tensor + one float64 draw chunk).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.utils.flop_counter import FlopCounterMode

from lightfed.config import ConfigError
from lightfed.data.tensors import size
from lightfed.methods.base import Method, combine
from lightfed import measure
from lightfed.methods.zo_server import select_trainable
from lightfed.optim import zeroth_order as zo


@dataclass
class Options:
    b2: int = 4                 # directions per local step
    mu: float = 1e-3            # smoothing radius (forward-difference step on the unit sphere)
    trainable: str = "all"      # "all", or comma-separated substrings of parameter names (as MeZO)
    z: str = "portable"         # portable | fast | counter (see optim/zeroth_order.direction)

    def check(self):
        if self.b2 < 1:
            raise ConfigError(f"b2 = {self.b2}: need at least one direction per step")
        if not self.mu > 0:
            raise ConfigError(f"mu = {self.mu}: must be > 0")
        if self.z not in zo.DRAWS:
            raise ConfigError(f"z = {self.z!r}: use one of {', '.join(zo.DRAWS)}")


@torch.no_grad()
def direction_norm(params: zo.Params, seed: int, draw: str = "portable") -> float:
    """||z|| over all tensors of the block, z = zeroth_order.direction(seed, i, ...) (as perturbed draws it)."""
    sq = 0.0
    for i, p in enumerate(params.values()):
        z = zo.direction(seed, i, p.shape, draw, p.device)
        sq += float(torch.linalg.vector_norm(z.to(p.dtype), dtype=torch.float64) ** 2)
    return math.sqrt(sq)


@torch.no_grad()
def forward_difference(loss, model, params: zo.Params, seeds: list[int], mu: float, owner_map=None,
                       draw: str = "portable") -> tuple[float, list[tuple[int, float, float]]]:
    """FedZO's estimate at the current weights, as coefficients on the raw Gaussian directions:
    g = d / (b2 mu) sum_j (L(theta + mu u_j) - L0) u_j = sum_j c_j z_j,  u_j = z_j / ||z_j||,
    c_j = d (L_j - L0) / (b2 mu ||z_j||).   Returns (L0, [(seed_j, c_j, L_j)])."""
    d = sum(p.numel() for p in params.values())
    L0 = loss().double().item()
    out = []
    for s in seeds:
        nz = direction_norm(params, s, draw)
        with zo.perturbed(model, params, s, mu / nz, owner_map, draw):
            Lj = loss().double().item()
        out.append((s, d * (Lj - L0) / (len(seeds) * mu * nz), Lj))
    return L0, out


class FedZO(Method):
    name = "fedzo"
    Options = Options
    zeroth_order = True
    optimizer = ""
    optimizer_why = "plain zeroth-order SGD on its two-point estimates, as its paper"
    lr = 1e-5                   # DeComFL's (the same expectation of the step; benchmarks/zoflite_claims.py)

    @property
    def draw(self) -> str:
        return self.opts.z

    # 1. parameterization: the chosen trainable weights, sent in full both ways (Method's schemas)
    def prepare(self, model):
        self.names = select_trainable(model, self.opts.trainable, self.name)
        return super().prepare(model)

    # 2. local optimizer
    def measure(self, model, batch, loss) -> dict:
        exclude = measure.storage_ptrs(list(model.parameters()), list(model.buffers()), batch)
        with FlopCounterMode(display=False) as fc:
            _, act = measure.peak_live_bytes(lambda: loss(model, batch), exclude)
        return {"fwd": fc.get_total_flops() / size(batch), "activations": act}

    def client_update(self, model, down, data, ctx):
        self.load(model, down)
        o, c = self.opts, ctx.cfg
        params = self.trainable(model)
        owner_map = zo.owners(model)
        lr = c.lr
        K = zo.num_steps(size(data), c.batch_size, c.local_steps, c.local_epochs)
        seeds = ctx.generator(1)                      # the client's own directions (stream 0: batches)
        was = model.training
        model.eval()
        meas, samples, loss_sum = None, 0, 0.0
        try:
            with torch.no_grad():
                for b in zo.step_batches(data, c.batch_size, K, ctx.generator()):
                    if meas is None:
                        meas = self.measure(model, b, ctx.loss)
                    step_seeds = [int(s) for s in torch.randint(0, 2**62, (o.b2,), generator=seeds)]
                    L0, coefs = forward_difference(lambda: ctx.loss(model, b), model, params, step_seeds, o.mu,
                                                   owner_map, self.draw)
                    for s, cj, _ in coefs:               # theta <- theta - lr g, g = sum_j c_j z_j
                        zo.apply_update(params, s, lr * cj, self.draw)
                    loss_sum += L0
                    samples += size(b)
        finally:
            model.train(was)
        stats = {"steps": K, "samples": samples, "train_loss": loss_sum / K, "loss": loss_sum / K,
                 "flops": meas["fwd"] * (o.b2 + 1) * samples, "forwards_per_step": {"fwd": o.b2 + 1},
                 "memory_accounted": {"params": measure.tensor_bytes(list(model.parameters()), list(model.buffers())),
                                      "activations": meas["activations"], "z": measure.z_bytes(params)}}
        return {n: p.detach() for n, p in params.items()}, stats

    # 4. aggregator
    def aggregate(self, state, updates, rnd):
        return combine(updates, state.keys(), self.cfg.robust, ref=state)
