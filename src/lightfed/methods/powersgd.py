"""PowerSGD-compressed FedAvg updates (Vogels et al., 2019), rank r, warm start, error feedback.

Each trainable matrix's update M (rows x cols; conv kernels as out x rest) is sent as two thin
factors from one step of subspace (power) iteration, warm-started from the client's last Q:
    M = (w_k - w) + E_k               E_k: the client's residual (error feedback)
    P = orth(M Q)        (rows x r)   Q: cols x r, last round's Q on this client (random at first)
    Q = M^T P            (cols x r)
    send P, Q;   E_k <- M - P Q^T
Vectors (biases, norms) and matrices too small to gain are sent dense.
Server:  w <- w + sum_k (n_k / n) P_k Q_k^T.       Downlink: the dense weights (fp32).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from lightfed.config import ConfigError
from lightfed.methods import fedavg
from lightfed.methods.base import combine
from lightfed.wire import Spec


@dataclass
class Options(fedavg.Options):
    rank: int = 4
    error_feedback: bool = True

    def check(self):
        super().check()
        if self.rank < 1:
            raise ConfigError(f"rank = {self.rank}: must be >= 1")


class PowerSGD(fedavg.FedAvg):
    name = "powersgd"
    dp = ""                  # compresses before sending: DP would need the clip first
    Options = Options

    def prepare(self, model):
        model = super().prepare(model)
        r = self.opts.rank
        # matrices that gain from rank-r factors (r * (rows + cols) < rows * cols); the rest travel dense
        self.mats = {k: (s[0], math.prod(s[1:])) for k, s in self.shapes.items()
                     if len(s) >= 2 and r * (s[0] + math.prod(s[1:])) < s[0] * math.prod(s[1:])}
        return model

    def up_schema(self):
        r = self.opts.rank
        sch = {}
        for k, s in self.shapes.items():
            if k in self.mats:
                rows, cols = self.mats[k]
                sch[k + ".P"] = Spec("tensor", (rows, r))
                sch[k + ".Q"] = Spec("tensor", (cols, r))
            else:
                sch[k] = Spec("tensor", s)
        return sch

    def client_update(self, model, down, data, ctx):
        w_local, stats = super().client_update(model, down, data, ctx)
        out, g = {}, ctx.generator(1)
        for k, s in self.shapes.items():
            delta = w_local[k] - down[k]
            if k not in self.mats:
                out[k] = delta
                continue
            M = delta.reshape(self.mats[k])                                     # (rows, cols)
            if self.opts.error_feedback and k + ".E" in ctx.state:
                M = M + ctx.state[k + ".E"]
            Q = ctx.state.get(k + ".Q")
            if Q is None:
                Q = torch.randn(M.shape[1], self.opts.rank, generator=g)       # (cols, r)
            P = torch.linalg.qr(M @ Q).Q                                        # (rows, r), orthonormal
            Q = M.T @ P                                                         # (cols, r)
            out[k + ".P"], out[k + ".Q"] = P, Q
            ctx.state[k + ".Q"] = Q.clone()                                     # warm start next round
            if self.opts.error_feedback:
                ctx.state[k + ".E"] = M - P @ Q.T
        return out, stats

    def aggregate(self, state, updates, rnd):
        if self.cfg.robust != "mean":      # robust rules work on each client's dense update
            dense = [({k: (f[k + ".P"] @ f[k + ".Q"].T).view(s) if k in self.mats else f[k] for k, s in self.shapes.items()}, w)
                     for f, w in updates]
            return {k: state[k] + v for k, v in combine(dense, list(self.shapes), self.cfg.robust).items()}
        total = sum(w for _, w in updates)
        new = {}
        for k, s in self.shapes.items():
            acc = torch.zeros(s)
            for f, w in updates:
                d = (f[k + ".P"] @ f[k + ".Q"].T).view(s) if k in self.mats else f[k]
                acc.add_(d, alpha=w / total)
            new[k] = state[k] + acc
        return new
