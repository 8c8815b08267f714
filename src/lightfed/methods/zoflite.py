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
"""
from __future__ import annotations

from dataclasses import dataclass

from lightfed.methods import decomfl, flite
from lightfed.methods.base import Method


@dataclass
class Options(decomfl.Options, flite.LatentOptions):
    def check(self):
        super().check()
        self.check_latent()


class ZOFLITE(decomfl.DeComFL):
    name = "zoflite"
    Options = Options
    TAG = 0x5A4F464C            # its own directions

    def prepare(self, model):
        self.seed, self.info = flite.install(model, self.opts, self.cfg.seed)   # everything frozen but z (+ head)
        self.names = [n for n, p in model.named_parameters() if p.requires_grad]
        return Method.prepare(self, model)
