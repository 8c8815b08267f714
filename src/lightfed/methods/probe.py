"""A federated linear probe in closed form: the head of a frozen model from one round of class
statistics (shared-variance Gaussian discriminant with an isotropic covariance). It is the "LP" of
LP-then-FT: a zeroth-order run (`--set init=<this run>`) then starts its body above chance.

    client k   features f = the input of model.head (frozen forward, no gradient), per class c:
               s_kc = sum f,   q_kc = sum ||f||^2,   n_kc = count          (C x d + 2C floats up)
    server     mu_c = sum_k s_kc / n_c,   mu = sum_c n_c mu_c / n,
               sigma^2 = (sum_c (q_c - n_c ||mu_c||^2)) / (n d)               (within-class variance per dim)
               W_c = (mu_c - mu) / sigma^2,   b_c = -(mu_c - mu).mu / sigma^2 - ||mu_c - mu||^2 / (2 sigma^2)
The logits W f + b equal the Gaussian discriminant's log-posteriors up to a per-example constant (equal
priors), so they are calibrated for the cross-entropy that ZO then descends. Sums add up across
clients, so any partition gives the pooled estimate. Cost: one forward per example, once; its bytes and
FLOPs are this run's, and a run started from it reports them (setup.json: init).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from lightfed.config import ConfigError
from lightfed.data.tensors import batches, size
from lightfed.methods.base import Method
from lightfed.wire import Spec


class Probe(Method):
    name = "probe"
    dp = ""                  # sufficient statistics, not an update: no clip to apply
    lr = 0.0                 # closed form: no step (a run that sets an lr is refused)
    optimizer = ""
    optimizer_why = "a closed form from class statistics, no step"

    def lrs(self):
        return {}

    def prepare(self, model):
        head = getattr(model, "head", None)
        if not isinstance(head, nn.Linear):
            raise ConfigError(f"probe: the model has no linear `head` (got {type(head).__name__}); use a classification task")
        model.requires_grad_(False)
        head.requires_grad_(True)            # "trainable" = what the server sets and sends
        self.C, self.d = head.out_features, head.in_features
        return super().prepare(model)

    def up_schema(self):
        return {"sum": Spec("tensor", (self.C, self.d), "fp32"), "sq": Spec("tensor", (self.C,), "fp32"),
                "count": Spec("tensor", (self.C,), "fp32", finite=True)}

    @torch.no_grad()
    def client_update(self, model, down, data, ctx):
        from torch.utils.flop_counter import FlopCounterMode
        self.load(model, down)
        feats = []
        hook = model.head.register_forward_pre_hook(lambda mod, args: feats.append(args[0].detach().double()))
        was = model.training
        model.eval()
        try:
            with FlopCounterMode(display=False) as fc:
                for b in batches(data, ctx.cfg.batch_size):
                    ctx.loss(model, b)
        finally:
            hook.remove()
            model.train(was)
        f = torch.cat(feats)                                        # (n, d)
        y = data["labels"].to(f.device)
        onehot = torch.nn.functional.one_hot(y, self.C).double()    # (n, C)
        up = {"sum": (onehot.T @ f).float(), "sq": (onehot.T @ (f * f).sum(1)).float(), "count": onehot.sum(0).float()}
        return up, {"steps": 0, "samples": size(data), "flops": fc.get_total_flops(), "loss": 0.0}

    def validate(self, state, fields, rnd):
        from lightfed.methods.base import Rejected
        c = fields["count"]
        if (c < 0).any() or (c != c.round()).any() or c.sum() > fields["_n"]:
            raise Rejected("field 'count': class counts must be whole, >= 0 and sum to at most `_n`")

    def aggregate(self, state, updates, rnd):
        s = sum(f["sum"].double() for f, _ in updates)              # (C, d)
        q = sum(f["sq"].double() for f, _ in updates)               # (C,)
        n = sum(f["count"].double() for f, _ in updates)            # (C,)
        seen = n > 0
        if not seen.any():
            return state
        mu_c = s / n.clamp_min(1).unsqueeze(1)
        mu = (n.unsqueeze(1) * mu_c).sum(0) / n.sum()
        var = ((q - n * (mu_c * mu_c).sum(1)).sum() / (n.sum() * self.d)).clamp_min(1e-12)
        dc = (mu_c - mu) * seen.unsqueeze(1)                       # a class no client holds gets a zero row
        w = dc / var
        b = -(dc @ mu) / var - (dc * dc).sum(1) / (2 * var)
        b = torch.where(seen, b, torch.full_like(b, -1e4))           # ... and is never predicted
        return {"head.weight": w.float(), "head.bias": b.float()}
