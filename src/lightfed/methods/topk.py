"""Top-k sparsified FedAvg with error feedback (Stich et al., 2018; Aji & Heafield, 2017).

Client k trains from the global weights w, forms its update plus what it failed to send before,
and sends only the largest `ratio` share of entries (indices + values):
    d = (w_k - w) + e_k          e_k: the client's residual (kept on the device between rounds)
    s = top_k(|d|)               k = ceil(ratio * D) over all D trainable weights, flattened
    e_k <- d - s                 error feedback
Server:  w <- w + sum_k (n_k / n) s_k.     Downlink: the dense weights (fp32).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from lightfed.config import ConfigError
from lightfed.methods import fedavg
from lightfed.methods.base import Rejected, combine
from lightfed.wire import Spec


@dataclass
class Options(fedavg.Options):
    ratio: float = 0.01          # share of entries sent
    error_feedback: bool = True

    def check(self):
        super().check()
        if not 0 < self.ratio <= 1:
            raise ConfigError(f"ratio = {self.ratio}: must be in (0, 1]")


def flatten(tensors: dict, keys) -> torch.Tensor:
    return torch.cat([tensors[k].reshape(-1).float() for k in keys])


def unflatten(vec: torch.Tensor, shapes: dict) -> dict:
    out, i = {}, 0
    for k, s in shapes.items():
        n = math.prod(s)
        out[k] = vec[i:i + n].view(s)
        i += n
    return out


class TopK(fedavg.FedAvg):
    name = "topk"
    dp = ""                  # compresses before sending: DP would need the clip first
    Options = Options

    def prepare(self, model):
        model = super().prepare(model)
        self.D = sum(math.prod(s) for s in self.shapes.values())
        self.k = max(1, math.ceil(self.opts.ratio * self.D))
        return model

    def up_schema(self):
        return {"idx": Spec("tensor", (self.k,), "i32" if self.D < 2**31 else "i64", lo=0, hi=self.D - 1),
                "val": Spec("tensor", (self.k,), "fp32")}

    def client_update(self, model, down, data, ctx):
        w_local, stats = super().client_update(model, down, data, ctx)
        d = flatten(w_local, self.shapes) - flatten(down, self.shapes)          # (D,)
        if self.opts.error_feedback and "residual" in ctx.state:
            d += ctx.state["residual"]
        idx = d.abs().topk(self.k, sorted=False).indices.sort().values             # (k,) ascending
        val = d[idx]
        if self.opts.error_feedback:
            d[idx] = 0
            ctx.state["residual"] = d
        return {"idx": idx.to(torch.int32 if self.D < 2**31 else torch.int64), "val": val}, stats

    def validate(self, state, fields, rnd):
        idx = fields["idx"]
        if self.k > 1 and not bool((idx[1:] > idx[:-1]).all()):
            raise Rejected("field 'idx': indices must be strictly increasing (no duplicates)")

    def aggregate(self, state, updates, rnd):
        if self.cfg.robust != "mean":      # robust rules work on each client's dense update
            dense = [(unflatten(torch.zeros(self.D).index_add_(0, f["idx"].long(), f["val"]), self.shapes), w) for f, w in updates]
            return {k: state[k] + v for k, v in combine(dense, list(self.shapes), self.cfg.robust).items()}
        total = sum(w for _, w in updates)
        delta = torch.zeros(self.D)
        for f, w in updates:
            delta.index_add_(0, f["idx"].long(), f["val"], alpha=w / total)
        return {k: state[k] + v for k, v in unflatten(delta, self.shapes).items()}
