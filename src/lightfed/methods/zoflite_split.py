"""`zoflite_split`: FLITE's latent z (methods/flite.py) trained by FedSPZO's split step (zo_server.Split) on the
shared seed-replay server (methods/zo_server.py), with DeComFL's aggregator and seed-only downlink:

    theta1 = the slices of z read by f1's layers (embeddings + first L - split layers)
    theta2 = the slices of z read by f2's layers (last `split` layers) + the head when it is trained
    per step: P1 directions of theta1, each side's f1 output reused by Ps two-point estimates on theta2
    uplink "g1" (K x P1) + "g2" (K x 2 P1 Ps) + digest; the server replays the mean scalars on those slices

A block here is a set of slices of one tensor (`views`), so the perturbation is written in place on them and
copied back (zo.shifted: K floats, bit-exact), not put on the owners by hooks: f2 calls the last layers without
the model root's forward, where the root's z would otherwise be perturbed.
"""
from __future__ import annotations

from dataclasses import dataclass

from lightfed.config import ConfigError
from lightfed.methods import fedspzo, flite, zoflite
from lightfed.methods.zo_server import SeedReplay, Split
from lightfed.models import latent
from lightfed.models.split import split


@dataclass
class Options(zoflite.LatentZO, fedspzo.Options):
    down: str = "seeds"         # DeComFL's seed-only downlink (model: z to everyone)


class ZOFLITESplit(SeedReplay):
    name = "zoflite_split"
    Options = Options
    TAG = 0x5A4F5350
    lr = 1e-3                   # as zoflite's
    average_scalars = True
    in_place = True

    def prepare(self, model):
        o = self.opts
        self.seed, self.info = flite.install(model, o, self.cfg.seed)      # everything frozen but z (+ head)
        self.names = [n for n, p in model.named_parameters() if p.requires_grad]
        f2 = set(split(model, self.cfg.task, o.split).f2_names)
        side = {1: [], 2: []}                          # z ranges [lo, hi) by the side whose layer reads them
        for name, m in latent.latent_layers(model):
            s = side[2 if f"{name}.base.weight" in f2 else 1]
            if s and s[-1][1] == m.lo:
                s[-1] = (s[-1][0], m.hi)               # contiguous layers: one slice
            else:
                s.append((m.lo, m.hi))
        if not side[2]:
            raise ConfigError(f"zoflite_split: no latent layer in f2 (split = {o.split})")
        rest = [n for n in self.names if n != "z"]     # the trained head, if any
        self._slices = {f"z[{lo}:{hi}]": slice(lo, hi) for lo, hi in side[1] + side[2]}
        self.layout = {"theta1": [f"z[{lo}:{hi}]" for lo, hi in side[1]] + [n for n in rest if n not in f2],
                       "theta2": [f"z[{lo}:{hi}]" for lo, hi in side[2]] + [n for n in rest if n in f2]}
        return super().prepare(model)

    def make_step(self):
        o = self.opts
        return Split(o.P1, o.Ps, o.eps, self.cfg.lr, o.lr2, o.split, o.estimate)

    def views(self, tensors):
        """{block: {name: tensor}} with "z[lo:hi]" a view of tensors["z"]: updates write through."""
        def get(n):
            return tensors["z"].detach()[self._slices[n]] if n in self._slices else tensors[n].detach()
        return {b: {n: get(n) for n in ns} for b, ns in self.layout.items()}
