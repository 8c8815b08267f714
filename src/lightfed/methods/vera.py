"""FedAvg + VeRA (Kopiczko et al., 2024, via PEFT), the closest prior art to FLITE: frozen random
low-rank matrices shared by seed, and tiny trainable scaling vectors per layer:
    W + diag(b) B diag(d) A       A (r x in), B (out x r): frozen, from PEFT's projection PRNG key
                                  d (r), b (out): trained and sent (+ the task head, if trainable)
Clients train d and b; the server averages them like FedAvg.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch.nn as nn

from lightfed.config import ConfigError
from lightfed.methods import fedavg
from lightfed.methods.lora import resolve_targets, train_only


@dataclass
class Options(fedavg.Options):
    r: int = 256
    targets: str = "auto"            # as for lora
    train_head: bool = True

    def check(self):
        super().check()
        if self.r < 1:
            raise ConfigError(f"r = {self.r}: must be >= 1")


class VeRA(fedavg.FedAvg):
    name = "vera"
    Options = Options
    lr = 5e-3                        # VeRA's vectors need a large step (its paper: 1e-2 .. 4e-3)

    def prepare(self, model):
        from peft import VeraConfig, get_peft_model

        o = self.opts
        targets = resolve_targets(model, o.targets)
        key = self.cfg.seed & 0x7FFFFFFF
        if not any(isinstance(m, nn.Linear) and n.rsplit(".", 1)[-1] in targets for n, m in model.named_modules()):
            raise ConfigError(f"vera: PEFT's VeRA adapts Linear layers only; {type(model).__name__} has no Linear "
                              f"layer named {targets} (use lora or flite for convolutions)")
        # VeRA's A, B are shared by all layers and live on PEFT's tuner: build it with get_peft_model, then
        # keep the underlying module (its layers hold the shared A, B), so names and calls stay the task's.
        model = get_peft_model(model, VeraConfig(r=o.r, target_modules=targets, projection_prng_key=key)).base_model.model
        train_only(model, "vera_lambda", o.train_head)
        return super().prepare(model)
