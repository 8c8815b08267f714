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

The step is zo_server.Split (the loop above, and the ablation below, read there); the blocks come from
models/split. Wire and server: the shared seed-replay server (methods/zo_server.py): up = "g1" (K x P1 fp32) +
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

from lightfed.config import ConfigError
from lightfed.methods import zo_server
from lightfed.methods.zo_server import SeedReplay, Split


@dataclass
class Options:
    split: int = 1              # trailing layers in f2 (with the head)
    P1: int = 1                 # directions of theta1 per step
    Ps: int = 2                 # theta2 directions per f1 output (P2 = 2 P1 Ps)
    eps: float = 1e-3
    lr2: float = 0.0            # ZO-SGD lr of theta2; 0 = the run's lr (which theta1 always takes)
    trainable: str = "all"      # "all", or comma-separated substrings of parameter names
    max_steps: int = 100_000
    z: str = "portable"         # see methods/zo_server.py
    estimate: str = "split"     # split (the method) | independent (per-block estimates: the ablation)
    down: str = "model"         # model | seeds (see methods/zo_server.py)

    def check(self):
        zo_server.check_common(self)
        if self.estimate not in ("split", "independent"):
            raise ConfigError(f"estimate = {self.estimate!r}: use split or independent")
        if self.split < 1 or self.P1 < 1 or self.Ps < 1:
            raise ConfigError(f"split = {self.split}, P1 = {self.P1}, Ps = {self.Ps}: each must be >= 1")
        if self.lr2 < 0:
            raise ConfigError(f"lr2 = {self.lr2}: must be >= 0 (0 = lr)")


class FedSPZO(SeedReplay):
    name = "fedspzo"
    Options = Options
    TAG = 0x53505A4F

    def prepare(self, model):
        o = self.opts
        self.names = zo_server.select_trainable(model, o.trainable, self.name)
        self.layout = zo_server.split_blocks(model, self.cfg.task, o.split, self.names)
        return super().prepare(model)

    def make_step(self):
        o = self.opts
        return Split(o.P1, o.Ps, o.eps, self.cfg.lr, o.lr2, o.split, o.estimate)
