"""FedAvg (McMahan et al., 2017): clients train every weight and send them back; the server
takes the sample-weighted mean.   w <- sum_k (n_k / n) w_k

Every first-order method trains `param_groups(model)` (one group at the run's lr unless it splits them).
`codec` sets how weights travel (both directions): fp32 (the baseline), bf16, int8, or int4
(absolute weights quantised per tensor, as FLITE's paper does to show that it collapses).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lightfed.methods.base import Method, combine
from lightfed.optim.first_order import local_train
from lightfed.wire import CODECS, tensor_schema
from lightfed.config import ConfigError, round_lr_scale


@dataclass
class Options:
    codec: str = "fp32"

    def check(self):
        if self.codec not in CODECS:
            raise ConfigError(f"codec = {self.codec!r}: use one of {', '.join(CODECS)}")


class FedAvg(Method):
    name = "fedavg"
    Options = Options
    lr_decays = True

    def down_schema(self):
        return tensor_schema({n: torch.empty(s) for n, s in self.shapes.items()}, self.opts.codec)

    def regularizer(self, params, down):
        return None

    def client_update(self, model, down, data, ctx):
        self.load(model, down)
        params = self.trainable(model)
        c, s = ctx.cfg, round_lr_scale(ctx.cfg, ctx.round)
        groups = [{**g, "lr": g["lr"] * s} for g in self.param_groups(model)]
        stats = local_train(model, groups, data, ctx.loss, epochs=c.local_epochs, steps=c.local_steps,
                            batch_size=c.batch_size, lr=c.lr * s, optimizer=c.optimizer, weight_decay=c.weight_decay,
                            generator=ctx.generator(), regularizer=self.regularizer(params, down))
        stats["lr_scale"] = s
        return {n: p.detach() for n, p in params.items()}, stats

    def aggregate(self, state, updates, rnd):
        return combine(updates, state.keys(), self.cfg.robust, ref=state)
