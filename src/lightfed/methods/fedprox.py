"""FedProx (Li et al., 2020): FedAvg whose local objective adds a proximal term that keeps the
client near the global weights:   L_k(w) + (mu / 2) ||w - w_global||^2
"""
from __future__ import annotations

from dataclasses import dataclass

from lightfed.config import ConfigError
from lightfed.methods import fedavg


@dataclass
class Options(fedavg.Options):
    mu: float = 0.01

    def check(self):
        super().check()
        if self.mu < 0:
            raise ConfigError(f"mu = {self.mu}: must be >= 0")


class FedProx(fedavg.FedAvg):
    name = "fedprox"
    Options = Options

    def regularizer(self, params, down):
        return proximal(params, down, self.opts.mu)


def proximal(params, down, mu: float):
    """(mu / 2) ||w - w_global||^2 over the trainable tensors (w_global: the broadcast, fixed in the round)."""
    anchor = {n: down[n].detach().clone() for n in params}
    return lambda: 0.5 * mu * sum(((p - anchor[n]) ** 2).sum() for n, p in params.items())
