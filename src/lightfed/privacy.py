"""Client-level differential privacy on the uplink (DP-FedAvg, McMahan et al. 2018), its Gaussian noise
spread over the round's clients as in distributed DP with secure aggregation (Kairouz et al. 2021):

    dense updates (FedAvg, FedProx, LoRA, VeRA, FLITE's latent, FedNL, FedALA, FedSSI, FedZO):
        d = update - received                   one vector over the float tensors the method uploads
        d = d * min(1, C / ||d||_2)              clip: one client moves the round's sum by at most C
        d = d + N(0, (z C)^2 / m)                m = clients per round: the sum of m uploads carries N(0, (z C)^2)
        upload received + d                      (a lossy codec such as int4 rounds after the noise: post-processing)
    zeroth-order methods (MeZO, DeComFL, FedSPZO, ZO-FLITE): the same, per step, on the projected-gradient
        scalars before the client applies them (so the server's replay and the digest still match): each
        step's row is clipped to C / sqrt(K), so a client's K steps have norm <= C, and each scalar gets
        N(0, (z C)^2 / m).
    top-k and PowerSGD compress before they send; clipping must come first there: not supported (refused).

Accounting (Google's dp_accounting, RDP): each round is the Gaussian mechanism with noise multiplier z on
the sum, with Poisson subsampling at q = m / N (our sampling draws exactly m without replacement: the
Poisson accountant is the usual approximation of it). `epsilon` holds for whoever sees only the sum or the
model (secure aggregation, or a trusted server); `epsilon_message` for a server that sees each upload
alone, whose noise multiplier is z / sqrt(m).

The noise comes from the client's seed (dp_seeded = true: a reproducible simulation; anyone with the run's
seed could remove it) or from the OS (dp_seeded = false: on real devices).
"""
from __future__ import annotations

import math
import secrets

import torch

from lightfed.config import ConfigError, RunConfig
from lightfed.seeds import derive

DP_TAG = 0xD9


def clients_per_round(cfg: RunConfig) -> int:
    return max(cfg.min_clients, round(cfg.fraction * cfg.clients))


def check(cfg: RunConfig, method_cls) -> None:
    if cfg.dp_clip > 0 and not method_cls.dp:
        raise ConfigError(f"dp_clip: method {cfg.method!r} does not send a dense update (it compresses it first, or sends "
                          "statistics): differential privacy is not supported for it")


def generator(cfg: RunConfig, client_seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(derive(client_seed, DP_TAG) if cfg.dp_seeded else secrets.randbits(63))


def noise_std(cfg: RunConfig) -> float:
    """Per coordinate, per client: the round's sum of m uploads carries std z C."""
    return cfg.dp_noise * cfg.dp_clip / math.sqrt(clients_per_round(cfg))


def privatize(update: dict, received: dict, cfg: RunConfig, client_seed: int) -> tuple[dict, dict]:
    """Dense form: clip the update's change from what the client received, add noise. -> (update, stats)"""
    names = [k for k, v in update.items() if torch.is_tensor(v) and v.is_floating_point() and k in received]
    if not names:
        return update, {}
    d = {k: update[k].detach().double() - received[k].detach().double() for k in names}
    norm = math.sqrt(sum(float((x * x).sum()) for x in d.values()))
    scale = min(1.0, cfg.dp_clip / norm) if norm > 0 else 1.0
    g, std = generator(cfg, client_seed), noise_std(cfg)
    out = dict(update)
    for k in names:                 # the update's own key order: the same draws in every engine
        noise = torch.randn(d[k].shape, generator=g, dtype=torch.float64) * std if std > 0 else 0.0
        out[k] = (received[k].double() + d[k] * scale + noise).to(update[k].dtype)
    return out, {"dp_norm": norm, "dp_clipped": scale < 1.0}


class StepNoise:
    """ZO form: clip each step's scalars to C / sqrt(K) and add noise, before the client applies them."""

    def __init__(self, cfg: RunConfig, client_seed: int, steps: int):
        self.bound = cfg.dp_clip / math.sqrt(steps)
        self.std, self.g, self.clipped, self.norms = noise_std(cfg), generator(cfg, client_seed), 0, []

    def __call__(self, row: dict[str, list[float]]) -> dict[str, list[float]]:
        norm = math.sqrt(sum(x * x for v in row.values() for x in v))
        self.norms.append(norm)
        scale = min(1.0, self.bound / norm) if norm > 0 else 1.0
        self.clipped += scale < 1.0
        out = {}
        for f in row:
            noise = torch.randn(len(row[f]), generator=self.g, dtype=torch.float64) * self.std
            out[f] = [float(torch.tensor(x * scale + float(e), dtype=torch.float32)) for x, e in zip(row[f], noise)]
        return out


def epsilon(cfg: RunConfig, rounds: int) -> dict:
    """(epsilon, delta) after `rounds` rounds, for the sum and for one message; None where there is no noise."""
    if cfg.dp_clip <= 0:
        return {}
    if cfg.dp_noise <= 0:
        return {"epsilon": None, "epsilon_message": None, "delta": cfg.dp_delta, "note": "clipping only: no guarantee"}
    m = clients_per_round(cfg)
    q = m / cfg.clients
    return {"epsilon": gaussian_epsilon(cfg.dp_noise, q, rounds, cfg.dp_delta),
            "epsilon_message": gaussian_epsilon(cfg.dp_noise / math.sqrt(m), q, rounds, cfg.dp_delta),
            "delta": cfg.dp_delta, "noise_multiplier": cfg.dp_noise, "sampling_rate": q, "rounds": rounds}


def gaussian_epsilon(z: float, q: float, rounds: int, delta: float) -> float:
    """epsilon of `rounds` compositions of the (Poisson-subsampled at rate q) Gaussian mechanism with noise
    multiplier z, at delta, by the RDP accountant."""
    import logging

    import dp_accounting as dpa
    from dp_accounting.rdp import rdp_privacy_accountant as rdp
    logging.getLogger("absl").setLevel(logging.ERROR)     # it warns when an order fails to converge and skips it
    event = dpa.GaussianDpEvent(z) if q >= 1 else dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z))
    acc = rdp.RdpAccountant()
    acc.compose(dpa.SelfComposedDpEvent(event, rounds))
    return float(acc.get_epsilon(delta))
