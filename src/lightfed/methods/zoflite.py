"""ZO-FLITE: FLITE's latent trained by zeroth order (a composition of FLITE and DeComFL).

    weights   theta(z) = theta_pre + A_l Z_l B_l^T per layer     (FLITE's map, methods/flite.py)
    client    K steps of ZO-SGD on z only: u_{k,p} = N(0, I_K) from derive(round seed, k, p),
              g_{k,p} = (L(z + eps u) - L(z - eps u)) / (2 eps),  z <- z - (lr / P) g_{k,p} u_{k,p}
    uplink    K x P scalars + an 8-byte digest of z + `_n`      (MeZO's message: bytes, whatever K is)
    server    replays the mean scalars in z-space: z <- z - sum (lr / P) mean_k(g) u      (DeComFL's aggregator;
              the replay touches K latents, not the model's weights: no forward, no weight-sized work)
    downlink  seed-only records by default (DeComFL's), or z itself (`down = model`): K floats, never weights

The perturbation lives in z-space (K = 1,296 on MiniLM at r = 6, ~20K at r = 24) instead of the 22-135M
weights, so the two-point estimate's variance, which grows with the dimension, is four orders of
magnitude lower; memory stays at inference level (forwards only, no gradients, no optimizer state).
Directions are seeds.normal draws (portable), so any server replays a client's z bit for bit.

`zoflite_split`: the same latent trained by FedSPZO's split optimizer (methods/fedspzo.py) instead:
    theta1 = the slices of z read by f1's layers (embeddings + first L - split layers)
    theta2 = the slices read by f2's layers (last `split` layers) + the head when it is trained
Per step, P1 directions of theta1, each side's f1 output reused by Ps two-point estimates on theta2
(options split, P1, Ps, eps, lr, lr2 as FedSPZO's); uplink "g1" (K x P1) + "g2" (K x 2 P1 Ps) + digest;
the server replays the mean scalars on those slices (DeComFL's aggregator, seed-only downlink).
A block here is a set of slices of one tensor, so the perturbation is written in place on them and
copied back (zo.shifted: K floats, bit-exact), not put on the owners by hooks: f2 calls the last layers
without the model root's forward, where the root's z would otherwise be perturbed.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lightfed.config import ConfigError
from lightfed.methods import decomfl, fedspzo, flite
from lightfed.methods.base import Method
from lightfed.models import latent
from lightfed.models.split import split
from lightfed.optim import zeroth_order as zo


@dataclass
class Options(decomfl.Options, flite.LatentOptions):
    r: int = 20                 # FLITE's rank (14,400 latents on MiniLM-L6), what zoflite_claims ran
    def check(self):
        super().check()
        self.check_latent()


class ZOFLITE(decomfl.DeComFL):
    name = "zoflite"
    Options = Options
    TAG = 0x5A4F464C            # its own directions
    lr = 1e-3                   # in z-space: kept the accuracy in both calibrations (zoflite_*calibrate.md); 1e-2 won
                                # on SmolLM2's prompts but cost 5 pp on MiniLM's probed head
    in_place = True             # z is a K-float root tensor: shift it in place, copy it back
    defaults_why = ("FLITE's r = 20; the head frozen (orthogonal), not trained as flite's: a head trained by zeroth "
                    "order from its random start only adds to the perturbed dimension; after a probe use head=keep "
                    "(LP-then-ZO, as benchmarks/zoflite_claims.py); the latents never travel, so flite's int4 codec has no role")

    def prepare(self, model):
        self.seed, self.info = flite.install(model, self.opts, self.cfg.seed)   # everything frozen but z (+ head)
        self.names = [n for n, p in model.named_parameters() if p.requires_grad]
        return Method.prepare(self, model)


@dataclass
class SplitOptions(fedspzo.Options, flite.LatentOptions):
    down: str = "seeds"         # DeComFL's seed-only downlink (model: z to everyone)
    r: int = 20

    def check(self):
        super().check()
        self.check_latent()


class ZOFLITESplit(ZOFLITE, fedspzo.FedSPZO):
    """FLITE's install + FedSPZO's local step and scalars + DeComFL's aggregator, on slices of z."""
    name = "zoflite_split"
    Options = SplitOptions
    TAG = 0x5A4F5350

    def prepare(self, model):
        model = ZOFLITE.prepare(self, model)
        f2 = set(split(model, self.cfg.task, self.opts.split).f2_names)
        side = {1: [], 2: []}                          # z ranges [lo, hi) by the side whose layer reads them
        for name, m in latent.latent_layers(model):
            s = side[2 if f"{name}.base.weight" in f2 else 1]
            if s and s[-1][1] == m.lo:
                s[-1] = (s[-1][0], m.hi)               # contiguous layers: one slice
            else:
                s.append((m.lo, m.hi))
        if not side[2]:
            raise ConfigError(f"zoflite_split: no latent layer in f2 (split = {self.opts.split})")
        rest = [n for n in self.names if n != "z"]     # the trained head, if any
        self._slices = {f"z[{lo}:{hi}]": slice(lo, hi) for lo, hi in side[1] + side[2]}
        self._blocks = {"theta1": [f"z[{lo}:{hi}]" for lo, hi in side[1]] + [n for n in rest if n not in f2],
                        "theta2": [f"z[{lo}:{hi}]" for lo, hi in side[2]] + [n for n in rest if n in f2]}
        return model

    def _views(self, tensors: dict) -> dict:
        """{block: {name: tensor}} with "z[lo:hi]" a view of tensors["z"]: updates write through."""
        def get(n):
            return tensors["z"].detach()[self._slices[n]] if n in self._slices else tensors[n].detach()
        return {b: {n: get(n) for n in ns} for b, ns in self.blocks().items()}

    def _bind(self, model):
        self.block_params = self._views(dict(model.named_parameters()))
        self.owner_map = zo.owners(model)
        self.sp = split(model, self.cfg.task, self.opts.split)

    @torch.no_grad()
    def replay(self, state, rnd: int, fields):
        out = {n: state[n].detach().clone() for n in self.names}
        views = self._views(out)
        for block, seed, coef in self.updates_of(rnd, fields):
            zo.apply_update(views[block], seed, coef, self.fast)
        return out
