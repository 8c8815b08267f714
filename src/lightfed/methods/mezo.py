"""MeZO-style federated zeroth-order fine-tuning (Malladi et al., 2023; seeds + scalars as in DeComFL / FedKSeed):
the uniform single-block baseline and ablation of FedSPZO. The shared server (codec, replay, aggregation) is
methods/zo_server.py; MeZO chooses its client step and blocks:

    step    TwoPoint(P): P two-sided estimates on all trainable weights per step,
            g_p = (L(theta + eps z_p) - L(theta - eps z_p)) / (2 eps),  theta <- theta - (lr / P) g_p z_p
    blocks  "all": the weights that `trainable` names (all, or comma-separated substrings of names)
    server  the mean of the replayed client models (down = model), or the replay of the mean scalars (down = seeds)
"""
from __future__ import annotations

from dataclasses import dataclass

from lightfed.config import ConfigError
from lightfed.methods import zo_server
from lightfed.methods.zo_server import SeedReplay, TwoPoint


@dataclass
class Options:
    P: int = 1                  # directions per step
    eps: float = 1e-3           # perturbation scale
    trainable: str = "all"      # "all", or comma-separated substrings of parameter names
    max_steps: int = 100_000    # the server refuses uploads claiming more local steps (replay cost)
    z: str = "portable"         # portable: same z on any CPU; fast: ~4x faster, like CPUs only; counter: on the device, the same everywhere
    down: str = "model"         # model | seeds (records of mean scalars for clients holding an earlier model)

    def check(self):
        zo_server.check_common(self)
        if self.P < 1:
            raise ConfigError(f"P = {self.P}: need at least one direction per step")


class MeZO(SeedReplay):
    name = "mezo"
    Options = Options
    TAG = 0x4D655A4F            # its own directions

    def prepare(self, model):
        self.names = zo_server.select_trainable(model, self.opts.trainable, self.name)
        self.layout = {"all": self.names}
        return super().prepare(model)

    def make_step(self):
        return TwoPoint(self.opts.P, self.opts.eps, self.cfg.lr)
