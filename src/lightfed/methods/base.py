"""The method contract. A method is four pieces; the engine calls nothing else.

    1. parameterization  prepare(model) -> model      what is trainable, how weights come from it
                         init_state / load            the server's state <-> the model's weights
    2. local optimizer   client_update(...)           how a client turns the broadcast into an update
    3. codec             down_schema / up_schema      what crosses the wire, field by field
                         broadcast(state) -> fields
                         (optional: downlink / down_kinds / after_round: a per-client downlink)
    4. aggregator        aggregate(state, updates)    how the server combines the updates

Messages are plain dicts of fields (tensors, ints, floats, bytes); the engine encodes them with
the method's schema (lightfed.wire) and decodes+validates them on the other side, so a method
only ever sees validated fields. A method never learns which engine runs it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn as nn

from lightfed import seeds
from lightfed.config import RunConfig
from lightfed.data.tensors import Data
from lightfed.wire import Schema, tensor_schema

State = dict[str, torch.Tensor]
Fields = dict


@dataclass
class ClientContext:
    """What a client knows in one round besides the broadcast and its data."""
    cid: int
    round: int
    seed: int                                   # derived from (run seed, round, client): every RNG starts here
    cfg: RunConfig
    loss: Callable[[nn.Module, Data], torch.Tensor]
    state: dict[str, torch.Tensor] = field(default_factory=dict)   # persists across rounds on this client
    step_noise: Callable | None = None          # with DP on a "scalars" method: K -> a per-step clip + noise of the
                                                # scalars (privacy.StepNoise), set by the engine's protocol

    def generator(self, stream: int = 0) -> torch.Generator:
        return seeds.generator(self.seed, stream)


EXAMPLES = "_n"     # the engine's field on every upload: the examples the client holds (its aggregation weight)


class Rejected(ValueError):
    """An upload that decoded fine but fails the method's own checks; the round goes on without it."""


@dataclass
class NoOptions:
    pass


class Method:
    name = "base"
    Options = NoOptions
    personalised = False     # True: a client's model is its own (kept in ctx.state): evaluate per client too
    federated = True         # False: the server state never moves (local-only training, a baseline)
    dp = "delta"             # how privacy.py clips + noises its upload: "delta" (upload - received), "scalars"
                             # (ZO, per step, in the client loop) or "" (compressed before sending: unsupported)
    lr_decays = False        # True: client_update scales its lrs by config.round_lr_scale (cfg.lr_decay works)
    lr_decay = "none"        # the recommended lr decay over the rounds: what a run that sets none ("") uses
    optimizer = "adamw"      # the recommended local optimizer (a run that sets none uses it); "": the method has none
    optimizer_why = ""       # why it has none (said when a run sets one)
    zeroth_order = False     # True: losses at theta +- eps z estimate the gradient (refuses bf16 forwards)
    lr = 5e-5                # the recommended lr: what a run that sets no lr (lr = 0) trains at. A run's lr always
                             # wins; config.json records the lr used and summary.json each parameter group's

    def __init__(self, opts, cfg: RunConfig):
        self.opts, self.cfg = opts, cfg

    # 1. parameterization ------------------------------------------------------------------------
    def prepare(self, model: nn.Module) -> nn.Module:
        """Wrap / freeze the model; remember the trainable shapes for the schemas."""
        self.shapes = {n: tuple(p.shape) for n, p in self.trainable(model).items()}
        return model

    def trainable(self, model: nn.Module) -> dict[str, nn.Parameter]:
        return {n: p for n, p in model.named_parameters() if p.requires_grad}

    def init_state(self, model: nn.Module) -> State:
        return {n: p.detach().cpu().clone() for n, p in self.trainable(model).items()}   # the server's state: CPU

    def dp_reference(self, received: State) -> State:
        """What privacy.py measures a dense upload's change from: what the client received (an upload that is
        already a change, e.g. FLITE's delta, is measured from zero)."""
        return received

    @torch.no_grad()
    def load(self, model: nn.Module, state: State) -> None:
        for n, p in self.trainable(model).items():
            p.copy_(state[n])

    def personal(self, model: nn.Module, state: State, client_state: dict[str, torch.Tensor]) -> None:
        """Load the model that a client itself uses, from the global state and what it keeps
        (ctx.state). Default: the global model. Personalised methods override it."""
        self.load(model, state)

    def lrs(self) -> dict[str, float]:
        """The lr that trains each parameter group (recorded in setup.json and summary.json)."""
        return {"trainable": self.cfg.lr}

    def param_groups(self, model: nn.Module) -> list[dict]:
        """The optimizer's parameter groups (first order): one group at the run's lr unless a method splits it."""
        return [{"params": list(self.trainable(model).values()), "lr": self.cfg.lr}]

    # 3. codec -----------------------------------------------------------------------------------
    def down_schema(self) -> Schema:
        return tensor_schema({n: torch.empty(s) for n, s in self.shapes.items()}, "fp32")

    def up_schema(self) -> Schema:
        return self.down_schema()

    def broadcast(self, state: State, rnd: int) -> Fields:
        return dict(state)

    # 3b. per-client downlink (optional; the defaults send every client the broadcast) -------------
    def downlink(self, state: State, rnd: int, cid: int | None) -> tuple[str, Fields, Schema]:
        """Server: what client `cid` gets this round, as (kind, fields, schema)."""
        return "down", self.broadcast(state, rnd), self.down_schema()

    def down_kinds(self, ctx: "ClientContext") -> dict[str, Schema]:
        """Client: the kinds of downlink it can take this round (from what ctx.state holds)."""
        return {"down": self.down_schema()}

    def after_round(self, state: State, rnd: int, accepted: list[int], sampled: list[int]) -> State:
        """Server, after aggregating (or keeping the state when too few replies were valid): which
        sampled clients' uploads were accepted. Default: nothing to remember."""
        return state

    # 2. local optimizer -------------------------------------------------------------------------
    def client_update(self, model: nn.Module, down: Fields, data: Data, ctx: ClientContext) -> tuple[Fields, dict]:
        raise NotImplementedError

    # 4. aggregator ------------------------------------------------------------------------------
    def validate(self, state: State, fields: Fields, rnd: int) -> None:
        """Raise Rejected if a decoded upload must not be aggregated (default: wire checks suffice).
        fields[EXAMPLES] is the client's claimed example count, already bounded by cfg.max_examples."""

    def steps_allowed(self, examples: int) -> int:
        """The most local steps a client holding `examples` examples can take under this run's config
        (a bound on what an upload may claim, e.g. before replaying it)."""
        c = self.cfg
        return c.local_steps if c.local_steps > 0 else max(1, math.ceil(c.local_epochs * examples / c.batch_size))

    def aggregate(self, state: State, updates: list[tuple[Fields, float]], rnd: int) -> State:
        raise NotImplementedError


def weighted_mean(updates: list[tuple[Fields, float]], keys) -> State:
    """sum_k (w_k / sum w) x_k per key, accumulated in float32 in the given (deterministic) order."""
    total = sum(w for _, w in updates)
    out = {}
    for k in keys:
        acc = torch.zeros_like(updates[0][0][k], dtype=torch.float32)
        for f, w in updates:
            acc.add_(f[k], alpha=w / total)
        out[k] = acc
    return out


def combine(updates: list[tuple[Fields, float]], keys, rule: str = "mean", ref: State | None = None) -> State:
    """The server's combination of client tensors, per `rule` (RunConfig.robust):
      mean      sum_k (n_k / n) x_k                        (FedAvg)
      median    coordinate-wise median over clients        (unweighted; the mean of the middle two for even counts)
      trim:F    coordinate-wise mean after dropping the floor(F x clients) largest and smallest values
      clip:C    each client's update x_k - ref scaled to L2 norm <= C (all keys together), then the mean
    `ref` is what updates are measured from (the global state; None: zeros, e.g. ZO scalars)."""
    from lightfed.config import parse_robust

    kind, val = parse_robust(rule)
    if kind == "mean":
        return weighted_mean(updates, keys)
    if kind == "clip":
        base = {k: (ref[k].float() if ref is not None else torch.zeros_like(updates[0][0][k], dtype=torch.float32)) for k in keys}
        clipped = []
        for f, w in updates:
            d = {k: f[k].float() - base[k] for k in keys}
            norm = math.sqrt(sum(float((v.double() ** 2).sum()) for v in d.values()))
            s = min(1.0, val / norm) if norm > 0 else 1.0
            clipped.append(({k: base[k] + s * d[k] for k in keys}, w))
        return weighted_mean(clipped, keys)
    out = {}
    for k in keys:
        X = torch.sort(torch.stack([f[k].float() for f, _ in updates]), dim=0).values     # (clients, ...)
        n = X.shape[0]
        if kind == "median":
            out[k] = X[(n - 1) // 2: n // 2 + 1].mean(0)
        else:
            t = int(val * n)
            out[k] = X[t: n - t].mean(0)
    return out
