"""FedSPZO (spec: shared/spec/fedspzo.md): federated zeroth-order fine-tuning with split perturbation.

The model is cut (models/split.py) into f1 (embeddings + first L - split layers; theta1) and f2
(last `split` layers + head; theta2). Per local step on a mini-batch B:

    for a in 1..P1:                          z1_a from seed derive(round_seed, k, 1, a)
        for s in (+, -):                     f1 once at theta1 + s eps z1_a -> boundary y_s (cached)
            for q in 1..Ps:                  direction j = (2a + [s = -]) Ps + q of theta2
                L(y_s; theta2 +- eps z2_j)   two f2 forwards; g2_j = (L+ - L-) / (2 eps)
            Lbar_s = mean of that side's 2 Ps losses
        g1_a = (Lbar_+ - Lbar_-) / (2 eps)
    theta1 <- theta1 - (lr / P1) g1_a z1_a  (a = 1..P1), then theta2 <- theta2 - (lr2 / P2) g2_j z2_j

P2 = 2 P1 Ps directions of theta2; f1 runs 2 P1 times and f2 2 P2 times per step. theta1's
perturbation stays in force while f2 runs on that side's boundary (it matters only for weights
f2 shares with f1: SmolLM2's tied embedding / lm_head, held once per side).

estimate = "independent" (the ablation): each block gets its own estimate with the other block at
rest, the same directions, scalars, wire and replay:
    g1_a = (L(f2(f1(x; theta1 + eps z1_a))) - L(f2(f1(x; theta1 - eps z1_a)))) / (2 eps)    (theta2 unperturbed)
    y0 = f1(x; theta1), once;  g2_j = (L(y0; theta2 + eps z2_j) - L(y0; theta2 - eps z2_j)) / (2 eps)
so f1 runs 2 P1 + 1 times and f2 2 P1 + 2 P2 times per step (2 P1 more f2 forwards and one more f1).

Wire and server: as MeZO (methods/mezo.py, which this subclasses): up = "g1" (K x P1 fp32) +
"g2" (K x P2 fp32) + 8-byte digest + `_n` (sample count); the server replays both blocks with the same
apply_update, checks the digest, averages the replayed models. Down = the weights (fp32) +
round seed, or with down = "seeds" records of mean scalars (round seed + K x (P1 + P2) floats per
round since the client's last accepted round; the server then replays the mean scalars).
stats: flops = flops_f1 + flops_f2 (forward FLOPs per sample, FlopCounterMode, x forwards x
samples); memory_accounted = params, activations (peak of one f1 or f2 forward), boundary (one
cached f1 output: only one side is alive at a time), z (largest transient perturbation, + the
held shared tensor while f2 runs).
"""
from __future__ import annotations

from dataclasses import dataclass

from torch.utils.flop_counter import FlopCounterMode

from lightfed.config import ConfigError
from lightfed.data.tensors import size
from lightfed.methods import mezo
from lightfed.models.split import split
from lightfed.optim import zeroth_order as zo


@dataclass
class Options:
    split: int = 1              # trailing layers in f2 (with the head)
    P1: int = 1                 # directions of theta1 per step
    Ps: int = 2                 # theta2 directions per f1 output (P2 = 2 P1 Ps)
    eps: float = 1e-3
    lr2: float = 0.0            # ZO-SGD lr of theta2; 0 = the run's lr (which theta1 always takes)
    trainable: str = "all"      # "all", or comma-separated substrings of parameter names
    max_steps: int = 100_000
    z: str = "portable"         # see methods/mezo.py
    estimate: str = "split"     # split (the method) | independent (per-block estimates: the ablation)
    down: str = "model"         # model | seeds (see methods/mezo.py)

    def check(self):
        mezo._check_common(self)
        if self.estimate not in ("split", "independent"):
            raise ConfigError(f"estimate = {self.estimate!r}: use split or independent")
        if self.split < 1 or self.P1 < 1 or self.Ps < 1:
            raise ConfigError(f"split = {self.split}, P1 = {self.P1}, Ps = {self.Ps}: each must be >= 1")
        if self.lr2 < 0:
            raise ConfigError(f"lr2 = {self.lr2}: must be >= 0 (0 = lr)")


class FedSPZO(mezo.MeZO):
    name = "fedspzo"
    Options = Options
    TAG = 0x53505A4F

    def prepare(self, model):
        model = super().prepare(model)
        sp = split(model, self.cfg.task, self.opts.split)
        keep = set(self.names)
        self._blocks = {"theta1": [n for n in sp.f1_names if n in keep], "theta2": [n for n in sp.f2_names if n in keep]}
        return model

    def blocks(self):
        return self._blocks

    def scalars(self):
        return {"g1": self.opts.P1, "g2": 2 * self.opts.P1 * self.opts.Ps}

    def lrs(self):
        return {"g1": self.cfg.lr, "g2": self.opts.lr2 or self.cfg.lr}

    def step_updates(self, round_seed, k, row):
        P = self.scalars()
        lr = self.lrs()
        return ([("theta1", zo.derive(round_seed, k, 1, a), lr["g1"] * g / P["g1"]) for a, g in enumerate(row["g1"])]
                + [("theta2", zo.derive(round_seed, k, 2, j), lr["g2"] * g / P["g2"]) for j, g in enumerate(row["g2"])])

    def _bind(self, model):
        super()._bind(model)
        self.sp = split(model, self.cfg.task, self.opts.split)

    def local_step(self, model, batch, k, round_seed, loss):
        if self.opts.estimate == "independent":
            return self._independent_step(model, batch, k, round_seed)
        o, sp = self.opts, self.sp
        th1, th2 = self.block_params["theta1"], self.block_params["theta2"]
        g1, g2, losses = [], [0.0] * (2 * o.P1 * o.Ps), []
        for a in range(o.P1):
            s1 = zo.derive(round_seed, k, 1, a)
            side = []
            for i, sign in enumerate((1.0, -1.0)):
                with self.perturb(model, th1, s1, sign * o.eps):
                    y = sp.f1(batch)
                    ls = []
                    for q in range(o.Ps):
                        j = (2 * a + i) * o.Ps + q
                        g, lp, lm = zo.two_point(lambda: sp.f2_loss(y, batch), model, th2,
                                                 zo.derive(round_seed, k, 2, j), o.eps, self.owner_map, self.fast, self.in_place)
                        g2[j] = zo.f32(g)
                        ls += [lp, lm]
                    del y
                side.append(sum(ls) / len(ls))
                losses += ls
            g1.append(zo.f32((side[0] - side[1]) / (2 * o.eps)))
        return {"g1": g1, "g2": g2}, losses, {"f1": 2 * o.P1, "f2": 4 * o.P1 * o.Ps}

    def _independent_step(self, model, batch, k, round_seed):
        o, sp = self.opts, self.sp
        th1, th2 = self.block_params["theta1"], self.block_params["theta2"]
        g1, g2, losses = [], [], []
        for a in range(o.P1):                 # theta1 alone, through the whole model
            g, lp, lm = zo.two_point(lambda: sp.f2_loss(sp.f1(batch), batch), model, th1,
                                     zo.derive(round_seed, k, 1, a), o.eps, self.owner_map, self.fast, self.in_place)
            g1.append(zo.f32(g))
            losses += [lp, lm]
        y = sp.f1(batch)                       # theta2 alone, on the unperturbed boundary
        for j in range(2 * o.P1 * o.Ps):
            g, lp, lm = zo.two_point(lambda: sp.f2_loss(y, batch), model, th2,
                                     zo.derive(round_seed, k, 2, j), o.eps, self.owner_map, self.fast, self.in_place)
            g2.append(zo.f32(g))
            losses += [lp, lm]
        return {"g1": g1, "g2": g2}, losses, {"f1": 2 * o.P1 + 1, "f2": 2 * o.P1 + 4 * o.P1 * o.Ps}

    def measure(self, model, batch, loss):
        sp = self.sp
        exclude = zo.storage_ptrs(list(model.parameters()), list(model.buffers()), batch)
        with FlopCounterMode(display=False) as fc:
            y, act1 = zo.peak_live_bytes(lambda: sp.f1(batch), exclude)
        fl1 = fc.get_total_flops()
        with FlopCounterMode(display=False) as fc:
            _, act2 = zo.peak_live_bytes(lambda: sp.f2_loss(y, batch), exclude | zo.storage_ptrs(y.args, y.kwargs))
        fl2 = fc.get_total_flops()
        return {"f1": fl1 / size(batch), "f2": fl2 / size(batch), "activations": max(act1, act2),
                "boundary": zo.tensor_bytes(y.args, y.kwargs)}

    def memory(self, model, meas):
        th1, th2 = self.block_params["theta1"], self.block_params["theta2"]
        held = {n: th1[n] for n in self.sp.shared if n in th1}
        z = max(zo.z_bytes(th1), zo.z_bytes(th2, held))
        return {"params": zo.tensor_bytes(list(model.parameters()), list(model.buffers())),
                "activations": meas["activations"], "boundary": meas["boundary"], "z": z}
