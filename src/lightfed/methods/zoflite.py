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

`zoflite_split` (methods/zoflite_split.py): the same latent trained by FedSPZO's split step.
"""
from __future__ import annotations

from dataclasses import dataclass

from lightfed.methods import decomfl, flite
from lightfed.methods.zo_server import SeedReplay, TwoPoint


@dataclass
class LatentZO(flite.LatentOptions):
    """FLITE's map for a zeroth-order method; listed first in an Options' bases, its check runs the ZO options' too."""
    r: int = 20                 # FLITE's rank (14,400 latents on MiniLM-L6), what zoflite_claims ran

    def check(self):
        super().check()         # the next options class in the MRO: the ZO method's
        self.check_latent()


@dataclass
class Options(LatentZO, decomfl.Options):
    pass


class ZOFLITE(SeedReplay):
    name = "zoflite"
    Options = Options
    TAG = 0x5A4F464C            # its own directions
    lr = 1e-3                   # in z-space: kept the accuracy in both calibrations (zoflite_*calibrate.md); 1e-2 won
                                # on SmolLM2's prompts but cost 5 pp on MiniLM's probed head
    average_scalars = True      # DeComFL's aggregator: the replay of the mean scalars
    in_place = True             # z is a K-float root tensor: shift it in place, copy it back
    defaults_why = ("FLITE's r = 20; the head frozen (orthogonal), not trained as flite's: a head trained by zeroth "
                    "order from its random start only adds to the perturbed dimension; after a probe use head=keep "
                    "(LP-then-ZO, as benchmarks/zoflite_claims.py); the latents never travel, so flite's int4 codec has no role")

    def prepare(self, model):
        self.seed, self.info = flite.install(model, self.opts, self.cfg.seed)   # everything frozen but z (+ head)
        self.names = [n for n, p in model.named_parameters() if p.requires_grad]
        self.layout = {"all": self.names}
        return super().prepare(model)

    def make_step(self):
        return TwoPoint(self.opts.P, self.opts.eps, self.cfg.lr)
