"""PowerSGD-compressed FedAvg updates (Vogels et al., NeurIPS 2019), rank r, warm start, error feedback.

Each trainable matrix's update M_k (rows x cols; conv kernels as out x rest) on client k, with its residual:
    M_k = (w_k - w) + E_k                                   E_k: the client's error feedback (kept on the client)

factors = "shared" (default; the published scheme: every client uses the SAME factors, so the sum of the
clients' messages is the message of the summed update, and the server's mean is one power step on M = mean M_k)
    down    w, P^ (rows x r, orthonormal), Q~ (cols x r: last round's mean Q, the warm start)
    client  Q_k = M_k^T P^          the right factor of M_k in the shared subspace
            P_k = M_k Q~            the next left factor's share
            E_k <- M_k - P^ Q_k^T   (Vogels' local error: what its own compression lost)
    server  Q~ <- sum_k (n_k/n) Q_k
            w  <- w + P^ Q~^T       (= P^ P^T M: the mean update projected on the shared subspace)
            P^ <- orth(sum_k (n_k/n) P_k)  (= orth(M Q~_old): the power step, for next round)
    Vogels et al. run both halves of a step in one iteration with two all-reduces (P, then Q). A federated
    round has one exchange, so the two halves are pipelined across rounds: the left factor a round uses was
    orthogonalised from the previous round's P shares, M_{t-1} Q~_{t-2}. While M stays put this is the paper's
    power iteration P^ <- orth(M M^T P^), run as two interleaved chains (each advances every other round) with the
    same fixed point, M's top-r left subspace; when M moves, the subspace lags one round. P^ starts as seeded
    random orthonormal columns, Q~ as seeded normals.

factors = "own" (a labelled FL variant, not the paper's): each client runs one power step on its own M_k with
    its own warm start and sends its factors; the server averages the clients' rank-r products:
            P_k = orth(M_k Q_k_old),  Q_k = M_k^T P_k,  E_k <- M_k - P_k Q_k^T,   w <- w + sum_k (n_k/n) P_k Q_k^T
    (the mean of rank-r products is not a rank-r power step on the mean update.)

Vectors (biases, norms) and matrices too small to gain are sent dense. Downlink: the dense weights (fp32),
plus the shared factors in "shared" mode.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from lightfed import seeds
from lightfed.config import ConfigError
from lightfed.methods import fedavg
from lightfed.methods.base import combine
from lightfed.wire import Spec

FACTORS = ("shared", "own")


@dataclass
class Options(fedavg.Options):
    rank: int = 4
    error_feedback: bool = True
    factors: str = "shared"

    def check(self):
        super().check()
        if self.rank < 1:
            raise ConfigError(f"rank = {self.rank}: must be >= 1")
        if self.factors not in FACTORS:
            raise ConfigError(f"factors = {self.factors!r}: use one of {', '.join(FACTORS)}")


class PowerSGD(fedavg.FedAvg):
    name = "powersgd"
    dp = ""                  # compresses before sending: DP would need the clip first
    Options = Options
    TAG = 0x50535344         # its own seed stream (shared factors)

    def prepare(self, model):
        model = super().prepare(model)
        r = self.opts.rank
        # matrices that gain from rank-r factors (r * (rows + cols) < rows * cols); the rest travel dense
        self.mats = {k: (s[0], math.prod(s[1:])) for k, s in self.shapes.items()
                     if len(s) >= 2 and r * (s[0] + math.prod(s[1:])) < s[0] * math.prod(s[1:])}
        self.shared = self.opts.factors == "shared"
        return model

    def _factor_specs(self, pre=""):
        r = self.opts.rank
        return {pre + k + f: Spec("tensor", (self.mats[k][i], r)) for k in self.mats for i, f in enumerate((".P", ".Q"))}

    # server state = the weights (+ the shared factors P^, Q~ per compressed matrix: "_<name>.P", "_<name>.Q")
    def init_state(self, model):
        state = super().init_state(model)
        if self.shared:
            r = self.opts.rank
            for i, (k, (rows, cols)) in enumerate(self.mats.items()):
                state["_" + k + ".P"] = seeds.orthogonal((rows, r), seeds.derive(self.TAG, self.cfg.seed, i, 0))
                state["_" + k + ".Q"] = seeds.normal((cols, r), seeds.derive(self.TAG, self.cfg.seed, i, 1))
        return state

    def down_schema(self):
        sch = super().down_schema()
        return {**sch, **self._factor_specs("_")} if self.shared else sch

    def up_schema(self):
        sch = {k: Spec("tensor", s) for k, s in self.shapes.items() if k not in self.mats}
        return {**sch, **self._factor_specs()}

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
            if self.shared:
                P = down["_" + k + ".P"]                                        # (rows, r) shared, orthonormal
                Q = M.T @ P                                                     # (cols, r)
                out[k + ".P"], out[k + ".Q"] = M @ down["_" + k + ".Q"], Q      # next round's share, this round's
            else:
                Q = ctx.state.get(k + ".Q")
                if Q is None:
                    Q = torch.randn(M.shape[1], self.opts.rank, generator=g).to(M.device)   # (cols, r), drawn on the CPU
                P = torch.linalg.qr(M @ Q).Q                                    # (rows, r), orthonormal
                Q = M.T @ P                                                     # (cols, r)
                out[k + ".P"], out[k + ".Q"] = P, Q
                ctx.state[k + ".Q"] = Q.clone()                                 # warm start next round
            if self.opts.error_feedback:
                ctx.state[k + ".E"] = M - P @ Q.T
        return out, stats

    def aggregate(self, state, updates, rnd):
        if self.shared:      # linear: mean the factors (robust rules per coordinate of Q_k, P_k), one power step
            keys = list(self.up_schema())
            mean = combine(updates, keys, self.cfg.robust)
            new = dict(state)
            for k, s in self.shapes.items():
                if k in self.mats:
                    new[k] = state[k] + (state["_" + k + ".P"] @ mean[k + ".Q"].T).view(s)
                    new["_" + k + ".Q"] = mean[k + ".Q"]
                    new["_" + k + ".P"] = torch.linalg.qr(mean[k + ".P"].double()).Q.float()
                else:
                    new[k] = state[k] + mean[k]
            return new
        dense = [({k: (f[k + ".P"] @ f[k + ".Q"].T).view(s) if k in self.mats else f[k] for k, s in self.shapes.items()}, w)
                 for f, w in updates]
        return {k: state[k] + v for k, v in combine(dense, list(self.shapes), self.cfg.robust).items()}
