"""FedSSI (Li et al., ICML 2025): rehearsal-free continual FL with synergistic synaptic intelligence.
Local training from the global model theta* adds the synaptic-intelligence (SI, Zenke et al., 2017)
penalty; the server runs FedAvg:

    L_k(theta) + c * sum_i Omega_i (theta_i - theta*_i)^2

Omega is computed on a personalised surrogate: before training, the client trains the same number of
steps (same batches, same optimizer) from theta* on  L_k(theta) + (lam / 2) ||theta - theta*||^2,
accumulating each parameter's contribution to the loss decrease,
    omega_i += -g_i * dtheta_i        (g: the gradient of L_k alone, dtheta: the step's move)
and normalises it at the end of the task:  Omega_i += max(omega_i, 0) / ((Delta theta_i)^2 + xi * m),
m = mean_j (Delta theta_j)^2 (the task's mean squared move).

Choices: each round is a task (Omega accumulates across rounds in ctx.state, "omega.<name>"); as in
synaptic intelligence, a task's importance constrains only the tasks after it: the penalty of round t
uses the Omega of the client's earlier rounds (none on its first participation), and this round's
importance is added after its training. xi is relative to the task's moves (m above): LoRA's moves are
~1e-3 per entry, so an absolute xi of 1e-3 (SI's) would swamp (Delta theta)^2 and flatten Omega. A
negative omega_i (a move that raised the loss) counts as no importance, so Omega >= 0 and the
penalty only ever pulls toward theta*. Stats: `omega_mean` (the scale of the Omega the penalty used),
`penalty_share` (the penalty's share of the loss trained on). The pull: lam = lam0 * d / (1 + d), with
d = ||theta_prev - theta*|| / ||theta*|| the relative distance of the client's previous local model
(kept in ctx.state, "own.<name>") from this round's global model, a proxy of how heterogeneous
the client is (the further it drifts, the harder its surrogate is pulled to the global knowledge);
lam = lam0 on a client's first participation. The surrogate's FLOPs are added to `flops`;
`steps`/`samples` are local training's. The trainable tensors are LoRA's (this subclasses lora.LoRA).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.utils.flop_counter import FlopCounterMode

from lightfed.config import ConfigError, round_lr_scale
from lightfed.data.tensors import batches, size
from lightfed.methods import lora
from lightfed.optim.first_order import local_train

OWN, OMEGA = "own.", "omega."


@dataclass
class Options(lora.Options):
    c: float = 0.5       # strength of the SI penalty
    xi: float = 0.1      # damping of the normalisation, relative to the task's mean squared move (SI's 0.1)
    lam: float = 1.0     # lam0: the largest proximal pull of the surrogate

    def check(self):
        super().check()
        for k in ("c", "lam"):
            if getattr(self, k) < 0:
                raise ConfigError(f"{k} = {getattr(self, k)}: must be >= 0")
        if self.xi <= 0:
            raise ConfigError(f"xi = {self.xi}: must be > 0")


def mean_entry(ts: dict) -> float:
    """The mean over every entry of every tensor (0 for none)."""
    return sum(t.sum().item() for t in ts.values()) / max(1, sum(t.numel() for t in ts.values()))


def importance(omega: dict, delta: dict, xi: float) -> dict:
    """SI's normalisation of one task:  max(omega_i, 0) / (delta_i^2 + xi * m),  m = mean_j delta_j^2 over every tensor."""
    move = {n: d ** 2 for n, d in delta.items()}
    m = mean_entry(move)
    damp = xi * m if m > 0 else xi
    return {n: omega[n].clamp(min=0) / (move[n] + damp) for n in omega}


class FedSSI(lora.LoRA):
    name = "fedssi"
    Options = Options

    def pull(self, down, ctx) -> float:
        names = list(self.shapes)
        if not all(OWN + n in ctx.state for n in names):
            return self.opts.lam
        d2 = sum(((ctx.state[OWN + n] - down[n]) ** 2).sum().item() for n in names)
        g2 = sum((down[n] ** 2).sum().item() for n in names)
        d = math.sqrt(d2) / max(math.sqrt(g2), 1e-12)
        return self.opts.lam * d / (1 + d)

    def surrogate(self, model, down, data, ctx, lam) -> tuple[dict, dict]:
        """Train the surrogate from theta*; return this task's normalised importance and its stats."""
        c = ctx.cfg
        self.load(model, down)
        params = self.trainable(model)
        ps = list(params.values())
        lr = c.lr * round_lr_scale(c, ctx.round)
        opt = (torch.optim.AdamW(ps, lr=lr, weight_decay=c.weight_decay) if c.optimizer == "adamw"
               else torch.optim.SGD(ps, lr=lr, weight_decay=c.weight_decay))
        total = c.local_steps if c.local_steps > 0 else max(1, math.ceil(c.local_epochs * math.ceil(size(data) / c.batch_size)))
        omega = {n: torch.zeros_like(p) for n, p in params.items()}
        done, samples, per_sample = 0, 0, 0.0
        g = ctx.generator()                 # the same batches as the local training that follows
        model.train()
        while done < total:
            for b in batches(data, c.batch_size, g):
                opt.zero_grad(set_to_none=True)
                if done == 0:
                    with FlopCounterMode(display=False) as fc:
                        ctx.loss(model, b).backward()
                    per_sample = fc.get_total_flops() / size(b)
                else:
                    ctx.loss(model, b).backward()
                before, grads = {}, {}
                with torch.no_grad():
                    for n, p in params.items():
                        grads[n] = p.grad.clone() if p.grad is not None else torch.zeros_like(p)
                        before[n] = p.detach().clone()
                        if lam > 0:
                            p.grad = grads[n] + lam * (p - down[n])
                opt.step()
                with torch.no_grad():
                    for n, p in params.items():
                        omega[n].sub_(grads[n] * (p - before[n]))
                samples += size(b)
                done += 1
                if done == total:
                    break
        opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            imp = importance(omega, {n: p.detach() - down[n] for n, p in params.items()}, self.opts.xi)
        return imp, {"surrogate_steps": done, "flops": per_sample * samples}

    def client_update(self, model, down, data, ctx):
        lam = self.pull(down, ctx)
        imp, sur = self.surrogate(model, down, data, ctx, lam)
        earlier = {n: ctx.state[OMEGA + n] for n in imp if OMEGA + n in ctx.state}   # the earlier rounds' Omega
        anchor = {n: down[n].detach().clone() for n in imp}          # theta*, fixed during the round
        self.load(model, down)
        params = self.trainable(model)
        cst, co = ctx.cfg, self.opts.c
        reg = ((lambda: co * sum((earlier[n] * (p - anchor[n]) ** 2).sum() for n, p in params.items() if n in earlier))
               if co > 0 and earlier else None)
        s = round_lr_scale(cst, ctx.round)
        stats = local_train(model, list(params.values()), data, ctx.loss, epochs=cst.local_epochs, steps=cst.local_steps,
                            batch_size=cst.batch_size, lr=cst.lr * s, optimizer=cst.optimizer, weight_decay=cst.weight_decay,
                            generator=ctx.generator(), regularizer=reg)
        for n, t in imp.items():                                      # this round's importance: for later rounds
            ctx.state[OMEGA + n] = earlier[n] + t if n in earlier else t
        upload = {n: p.detach() for n, p in params.items()}
        ctx.state.update({OWN + n: t.clone() for n, t in upload.items()})
        stats["flops"] += sur.pop("flops")
        stats.update(sur, lam=lam, omega_mean=mean_entry(earlier), lr_scale=s)
        stats.setdefault("penalty_share", 0.0)
        stats["memory_accounted"]["method_state"] = sum(t.numel() * t.element_size() for t in ctx.state.values())
        return upload, stats
