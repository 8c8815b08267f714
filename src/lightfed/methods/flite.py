"""FLITE (Achanta & Reed, 2026, "Federated Lightweight Fine-Tuning"): clients never send weights.
Every selected layer's weight is generated from one small latent through a frozen map shared by
seed (lightfed.models.latent):

    theta_l = theta_pre,l + dW_l(z_l)        dW_l = A_l Z_l B_l^T   (A_l: rows x r, B_l: cols x r, Z_l = z_l (r x r))
    z = [z_1; ...; z_L]                      K = L r^2 latents (MiniLM-L6, 36 Linear, r = 6: 1,296)

Round t:   server -> clients   z^t                       (the only per-round payload; factors: one 8-byte seed, once)
           client k            z_k = local_train(z^t)    (AdamW on z only, from z^t; the backbone stays theta_pre)
           server              z^{t+1} = sum_k n_k z_k / sum_k n_k
The map is affine, so the server's mean of latents is exactly FedAvg of the generated weights:
    mean_k (theta_pre + M z_k) = theta_pre + M mean_k z_k.

Defaults (lightfed's, from benchmarks/results/flite_ablation.md: real MiniLM sentiment, 10 rounds, 3 seeds):
r = 20, int4 on the wire, the head trained and sent: 0.850 vs FedAvg fp32's 0.831 at 11,791x fewer uplink
bytes. The paper's map (r = 6, frozen orthogonal head) measured 0.731 there: `r=6 head=orthogonal`.

Head (a model's nn.Linear `head`): "orthogonal" = seeds.orthogonal from the factor seed, bias 0, frozen,
not sent (the paper); "random" = N(0, 1/in) from the factor seed, frozen; "trainable" = the task's
head, trained and sent (fields head.weight, head.bias); "keep" = the model's head as it is, frozen (a
probed head from `init`: LP-then-FT).
Wire: field "z" (+ head fields), `codec` both ways. `stochastic`: int8/int4/int4g values are rounded
stochastically before the wire sees them (client: its own generator; server: a generator seeded
by (factor seed, round)); the values then lie on the wire's grid, whose round-to-nearest keeps
them (the scale is recomputed from them, exact up to one float32 ulp), so the mean is unbiased.
`delta`: clients upload z_k - z^t instead of z_k. With absolute int4 latents and one scale per message, a round's
move smaller than half a grid step (max|z| / 14) rounds back to the code it started from; the move's own scale keeps
it (GN ResNet-18: |z| ~ 50 at FLITE's lr, benchmarks/results/flite_vision.md).
`server_lr` (lightfed's, FedOpt's server step; the paper takes the mean): the server moves from the latents the clients
started from (the decoded broadcast z^t) by server_lr times their mean move,
    z^{t+1} = z^t + server_lr sum_k n_k (z_k - z^t) / n         (delta: the server's fp32 z plus server_lr x the mean move)
so that what the clients agree on counts for more than one round's average of their moves (IID ResNet-18: averaging
keeps ~0.73 of a client's move in z, FedAvg's weights ~0.92; benchmarks/results/flite_vision_rank.md).
Recommended lr (`FLITE.lr`, what a run that sets no lr uses): latents want a far larger step than full
fine-tuning. 1e-2, from a centralised check (real MiniLM sentiment, 640 train / 200 test, 60 AdamW steps of
16, one seed; accuracy at z = 0: 0.56 with the orthogonal head):
    lr            3e-3   1e-2   3e-2   1e-1
    orthogonal    0.725  0.805  0.805  0.785     (train loss 0.66 / 0.61 / 0.54 / 0.55)
    trainable     0.835  0.830  0.825  0.785     (the head trains at the same lr)
1e-2..3e-2 is a flat optimum; 1e-2 keeps a 10x margin below where it degrades (1e-1). With
`trainable` the head trains at the same lr (one parameter group), or at `head_lr`: latents and weights
want steps orders of magnitude apart (ResNet-18 below: z at lr 3, a head trained at lr 3 diverged).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from lightfed import seeds
from lightfed.config import ConfigError
from lightfed.methods import fedavg
from lightfed.models import latent
from lightfed.wire import decode, dequantize, encode, quantize

HEADS = ("orthogonal", "random", "trainable", "keep")


@dataclass
class LatentOptions:
    """The latent map's options (FLITE, ZO-FLITE)."""
    r: int = 6                      # rank; matrix form: r^2 latents per layer
    layers: str = "linear,conv"     # module types parameterized: linear, conv, embedding
    form: str = "matrix"            # matrix (A Z B^T, every latent live) | flat (the paper's U V^T z)
    k: int = 0                      # flat form: latents per layer (0 = r; only min(k, r) are live)
    mode: str = "cache"             # cache (factors in memory) | regen (drawn again each forward)
    seed: int = -1                  # 64-bit factor seed; -1 = derived from the run seed
    basis: str = "random"           # random (seeded draws) | svd (each weight's top-r singular subspaces: from
                                    # theta_pre, which every party holds: no bytes)
    scale: str = "fanin"            # fanin (z in fan-in units) | weight (a unit of z moves each layer by the same
                                    # fraction of its own weight's rms)
    head: str = "orthogonal"        # orthogonal | random | trainable | keep (the model's own head, frozen: e.g. a
                                    # probe's, with init = <probe run>)
    rank_pattern: str = ""          # layers' own ranks by name suffix, "v_proj:66,*:0" (rank 0: no latents; "*": the
                                    # layers no key names; default r): latents placed where they count

    def check_latent(self):
        if self.r < 1 or self.k < 0:
            raise ConfigError(f"r = {self.r}, k = {self.k}: need r >= 1 and k >= 0")
        try:
            latent.parse_kinds(self.layers)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        for name, val, ok in (("form", self.form, latent.FORMS), ("mode", self.mode, latent.MODES), ("head", self.head, HEADS),
                              ("basis", self.basis, latent.BASES), ("scale", self.scale, latent.SCALES)):
            if val not in ok:
                raise ConfigError(f"{name} = {val!r}: use one of {', '.join(ok)}")
        try:
            latent.parse_ranks(self.rank_pattern)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if not -1 <= self.seed < 2**64:
            raise ConfigError(f"seed = {self.seed}: a 64-bit seed in [0, 2**64), or -1 (from the run seed)")
        if self.basis == "svd" and (self.form != "matrix" or self.mode != "cache"):
            raise ConfigError("basis = svd needs form = matrix and mode = cache")


@dataclass
class Options(fedavg.Options, LatentOptions):
    # lightfed's default map (benchmarks/results/flite_ablation.md); the paper's: r = 6, head = "orthogonal"
    r: int = 20                     # 36 x 400 = 14,400 latents on MiniLM-L6
    head: str = "trainable"
    codec: str = "int4"             # 4 bits a latent on the wire, both ways (int4g: + a float32 scale per 32 latents)
    stochastic: bool = False        # stochastic rounding for int8/int4/int4g
    head_lr: float = 0.0            # head = trainable: the head's own lr (0: the run's lr, one group with z)
    delta: bool = False             # upload z_k - z^t (the round's move) instead of z_k; the server adds the mean
                                    # move to its fp32 z (lightfed's; the paper sends z)
    server_lr: float = 1.0          # the server's step on the clients' mean move (1: their mean; lightfed's)

    def check(self):
        super().check()
        self.check_latent()
        if self.head_lr < 0:
            raise ConfigError(f"flite: head_lr = {self.head_lr}: must be >= 0 (0: the run's lr)")
        if not 0 < self.server_lr <= 100:
            raise ConfigError(f"flite: server_lr = {self.server_lr}: must be in (0, 100] (1: the clients' mean)")
        if self.head_lr and self.head != "trainable":
            raise ConfigError(f"flite: head_lr = {self.head_lr} trains nothing with head = {self.head!r}: "
                              "it needs head = trainable")


def install(model: nn.Module, o, run_seed: int) -> tuple[int, dict]:
    """FLITE's parameterization on `model` (in place): the latent map on its layers (everything frozen but
    z) and the head policy `o.head`. -> (factor seed, latent.info). Shared with methods/zoflite.py."""
    seed = o.seed if o.seed >= 0 else seeds.derive(run_seed, 0xF117E)     # the factor seed (8 B, sent once)
    pre = sum(p.numel() * p.element_size() for p in model.parameters())   # what every party must already hold
    try:
        latent.install(model, r=o.r, layers=o.layers, seed=seed, mode=o.mode, form=o.form, k=o.k,  # freezes all
                       basis=o.basis, scale=o.scale, ranks=o.rank_pattern)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    head = getattr(model, "head", None)
    if isinstance(head, nn.Linear):
        with torch.no_grad():     # portable draws: server and clients regenerate the same frozen head
            hs = seeds.derive(seed, 2)
            if o.head == "orthogonal":
                head.weight.copy_(seeds.orthogonal(head.weight.shape, hs))
            elif o.head == "random":
                head.weight.copy_(seeds.normal(head.weight.shape, hs) * head.in_features ** -0.5)
            if o.head in ("orthogonal", "random") and head.bias is not None:
                head.bias.zero_()
        head.requires_grad_(o.head == "trainable")
    return seed, {**latent.info(model), "one_time": {"pretrained_bytes_held_by_every_party": pre, "factor_seed_bytes": 8},
                  "head": o.head if isinstance(head, nn.Linear) else None}     # None: the model has no separate head


class FLITE(fedavg.FedAvg):
    name = "flite"
    Options = Options
    lr = 1e-2                       # the latents' step (see above)
    defaults_why = ("r = 20, int4, head trained and sent: lightfed's measured best (flite_ablation.md); "
                    "the paper's map is r=6 head=orthogonal")

    def prepare(self, model):
        self.seed, self.info = install(model, self.opts, self.cfg.seed)
        if self.opts.head_lr and self.info["head"] is None:
            raise ConfigError("flite: head_lr: this model has no separate nn.Linear `head` to train")
        return super().prepare(model)    # shapes: {"z": (K,)} (+ head.weight, head.bias)

    def lrs(self):
        return {"z": self.cfg.lr, "head": self.opts.head_lr} if self.opts.head_lr else super().lrs()

    def param_groups(self, model):      # head_lr: z and the trained head each at its own lr
        if not self.opts.head_lr:
            return super().param_groups(model)
        ps = self.trainable(model)
        return [{"params": [p for n, p in ps.items() if not n.startswith("head.")], "lr": self.cfg.lr},
                {"params": [p for n, p in ps.items() if n.startswith("head.")], "lr": self.opts.head_lr}]

    def _round(self, fields, g):
        if not (self.opts.stochastic and self.opts.codec in ("int8", "int4", "int4g")):
            return fields
        out = {}
        for n, t in fields.items():
            payload, scale = quantize(t, self.opts.codec, g)
            out[n] = dequantize(payload, self.opts.codec, scale, t.numel()).view(t.shape)
        return out

    def broadcast(self, state, rnd):
        return self._round(dict(state), seeds.generator(self.seed, 3, rnd))

    def client_update(self, model, down, data, ctx):   # FedAvg's local_train on z (at the run's lr), then rounding
        fields, stats = super().client_update(model, down, data, ctx)
        if self.opts.delta:             # z_k - z^t: int4's one scale then spans the round's move, not |z| itself
            fields = {**fields, "z": fields["z"] - down["z"]}
        return self._round(fields, ctx.generator(1)), stats

    def dp_reference(self, received):   # delta: the upload is already the change
        return {**received, "z": torch.zeros_like(received["z"])} if self.opts.delta else received

    def aggregate(self, state, updates, rnd):
        start = state if self.opts.delta else self.sent(state, rnd)    # what the clients' moves are measured from
        if self.opts.delta:             # z^{t+1} = z^t + sum_k n_k (z_k - z^t) / n, on the server's fp32 z
            updates = [({**f, "z": state["z"] + f["z"]}, n) for f, n in updates]
        mean = super().aggregate(state, updates, rnd)
        if self.opts.server_lr == 1:
            return mean
        return {k: start[k] + self.opts.server_lr * (v - start[k]) for k, v in mean.items()}

    def sent(self, state, rnd):
        """The state as every client decoded this round's broadcast (the codec's rounding included)."""
        schema, kind = self.down_schema(), f"{self.name}/down"
        got = decode(encode(self.broadcast(state, rnd), schema, kind=kind), schema, kind=kind, max_bytes=2**62)
        return {k: got.get(k, v).float() for k, v in state.items()}
