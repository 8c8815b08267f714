"""FedALA, FedSSI and local-only training on the tiny Llama twin of `trivia`, driven through the
byte-level protocol (P.broadcast / P.client_round / P.aggregate) with 2 clients."""
import copy

import pytest
import torch

from conftest import tiny_config, tiny_task
from lightfed import seeds
from lightfed.data.tensors import subset
from lightfed.engine import protocol as P
from lightfed.methods import resolve_lr
from lightfed.methods.base import ClientContext
from lightfed.methods.fedala import OWN, WEIGHT, FedALA, top_layers
from lightfed.methods.fedssi import OMEGA, FedSSI, importance
from lightfed.methods.local_only import LocalOnly
from lightfed.wire import encoded_size

ROWS = {0: range(0, 16), 1: range(16, 32)}


class Run:
    """One method on the trivia twin: a model, the global state, 2 clients with their ctx.state."""

    def __init__(self, cls, cfg_kw=None, **opts):
        self.T = T = tiny_task("trivia")
        self.cfg = resolve_lr(tiny_config("trivia", cls.name, **(cfg_kw or {})))   # the method's lr and optimizer
        o = cls.Options(**opts)
        o.check()
        self.m = cls(o, self.cfg)
        torch.manual_seed(0)                 # PEFT draws the adapters' init from the global RNG
        self.model = self.m.prepare(copy.deepcopy(T.model))
        self.state = self.m.init_state(self.model)
        self.trainable = set(self.m.trainable(self.model))
        self.frozen = {n: p.detach().clone() for n, p in self.model.named_parameters() if n not in self.trainable}
        self.cstate = {0: {}, 1: {}}

    def data(self, cid):
        return subset(self.T.train, ROWS[cid])

    def ctx(self, cid, rnd, state=None):
        return ClientContext(cid, rnd, seeds.derive(0, rnd, cid), self.cfg, self.T.loss,
                             self.cstate[cid] if state is None else state)

    def client(self, cid, rnd, state=None):
        down = P.broadcast(self.m, self.state, rnd)
        return P.client_round(self.m, self.model, down, self.data(cid), self.ctx(cid, rnd, state), self.cfg.max_message_bytes)

    def round(self, rnd, garbage=False):
        ups = [(cid, self.client(cid, rnd)[0]) for cid in (0, 1)]
        if garbage:
            ups.append((2, b"\x00garbage"))
        self.state, report = P.aggregate(self.m, self.state, ups, rnd, max_bytes=self.cfg.max_message_bytes)
        return ups, report

    def down_fields(self):
        return {k: v.clone() for k, v in self.state.items()}


def clone_state(s):
    return {k: v.clone() for k, v in s.items()}


def names_of(run, key):
    return [n for n in run.m.shapes if key in n]


# --- every method ---------------------------------------------------------------------------------

@pytest.mark.parametrize("cls", [FedALA, FedSSI, LocalOnly])
def test_garbage_refused_and_backbone_frozen(cls, one_thread):
    r = Run(cls, max_steps=4, k=2) if cls is FedALA else Run(cls)
    for rnd in (1, 2):                       # round 2: FedALA's ALA and FedSSI's drift-based pull run too
        _, report = r.round(rnd, garbage=True)
        assert report["accepted"] == 2 and [x["id"] for x in report["rejected"]] == [2]
        assert "wire" in report["rejected"][0]["error"]
    for n, p in r.model.named_parameters():
        if n in r.frozen:
            assert torch.equal(p, r.frozen[n]), f"frozen parameter {n} changed"


@pytest.mark.parametrize("cls", [FedALA, FedSSI, LocalOnly])
def test_stats(cls, one_thread):
    r = Run(cls)
    _, stats = r.client(0, 1)
    assert stats["steps"] == 2 and stats["samples"] == 16 and stats["flops"] > 0 and stats["train_loss"] > 0


# --- FedALA ---------------------------------------------------------------------------------------

def test_fedala_top_layers():
    names = [f"model.layers.{i}.q.lora_{ab}" for i in range(3) for ab in "AB"]
    assert top_layers(names, 1) == {"model.layers.2.q.lora_A", "model.layers.2.q.lora_B"}
    assert top_layers(names, 2) == set(names[2:])
    assert top_layers(["enc.layer.0.a", "enc.layer.1.a", "head.weight", "head.bias"], 1) == \
        {"enc.layer.1.a", "head.weight", "head.bias"}
    assert top_layers(["a", "b", "c"], 2) == {"b", "c"}


def test_fedala(one_thread):
    r = Run(FedALA, max_steps=4, k=2, threshold=0.0)      # threshold 0: the first ALA runs max_steps
    top, lower = names_of(r, "layers.1."), names_of(r, "layers.0.")
    assert r.m.adaptive == set(top) and lower

    # first participation: no local model, start = global, no W yet
    down = r.down_fields()
    start, ala = r.m.adapt(r.model, down, r.data(0), r.ctx(0, 1))
    assert ala["ala_steps"] == 0 and all(torch.equal(start[n], down[n]) for n in down)
    r.round(1)
    assert all(OWN + n in r.cstate[0] for n in r.m.shapes)
    assert not any(k.startswith(WEIGHT) for k in r.cstate[0])

    # theta_local == theta_global: W stays exactly 1 and the ALA result is the global model
    down = r.down_fields()
    same = {OWN + n: v.clone() for n, v in down.items()}
    start, ala = r.m.adapt(r.model, down, r.data(0), r.ctx(0, 2, same))
    assert ala["ala_steps"] == 4
    assert all(torch.equal(same[WEIGHT + n], torch.ones_like(down[n])) for n in top)
    assert all(torch.equal(start[n], down[n]) for n in down)

    # second participation: start lies strictly between local and global on the top layer
    keep = clone_state(r.cstate[0])
    local = {n: keep[OWN + n] for n in r.m.shapes}
    assert any(not torch.equal(local[n], down[n]) for n in top)
    start, ala = r.m.adapt(r.model, down, r.data(0), r.ctx(0, 2, clone_state(keep)))
    assert ala["ala_steps"] == 4 and ala["flops"] > 0
    assert any(not torch.equal(start[n], down[n]) for n in top), "ALA did not move W"
    assert any(not torch.equal(start[n], local[n]) for n in top)
    for n in lower:
        assert torch.equal(start[n], down[n]), f"lower layer {n} did not take the global weights"

    # a huge step: W is clipped to [0, 1], and reaches 0 (start = local) where the gradient says so
    r2 = Run(FedALA, max_steps=4, k=2, threshold=0.0, eta=1e9)
    st = clone_state(keep)
    r2.m.adapt(r2.model, down, r.data(0), r.ctx(0, 2, st))
    w = torch.cat([st[WEIGHT + n].flatten() for n in top])
    assert w.min() >= 0 and w.max() <= 1 and (w == 0).any() and (w == 1).any()

    # deterministic: the same round twice from the same client state -> the same upload bytes
    a, stats = r.client(0, 2, clone_state(keep))
    b, _ = r.client(0, 2, clone_state(keep))
    assert a == b and stats["ala_steps"] == 4 and stats["steps"] == 2

    # personal(): the client's own tensors over the global state (the global where it has none)
    r.round(2)
    probe = r.m.prepare(copy.deepcopy(r.T.model))
    r.m.personal(probe, r.state, r.cstate[0])
    got = r.m.init_state(probe)
    assert all(torch.equal(got[n], r.cstate[0][OWN + n]) for n in r.m.shapes)
    assert any(not torch.equal(got[n], r.state[n]) for n in top)
    r.m.personal(probe, r.state, {})
    assert all(torch.equal(v, r.state[n]) for n, v in r.m.init_state(probe).items())


def test_fedala_every_layer_and_its_weights_reported(one_thread):
    r = Run(FedALA, max_steps=4, k=2, top=0)
    assert r.m.adaptive == set(r.m.shapes)
    _, s1 = r.client(0, 1)
    r.round(1)
    _, s2 = r.client(0, 2)
    assert s1["ala_one_minus_w"] == 0.0                   # first participation: the global model, whole
    assert 0.0 < s2["ala_one_minus_w"] <= 1.0, s2        # W learned below 1 somewhere: the local model kept in part


def test_fedala_later_rounds_one_pass(one_thread):
    r = Run(FedALA, max_steps=7, k=2, threshold=0.0, s=50)    # 50% of 16 rows = 8 = one batch of 8
    r.round(1)
    _, s2 = r.client(0, 2)
    _, s3 = r.client(0, 3)
    assert s2["ala_steps"] == 7 and s3["ala_steps"] == 1
    r = Run(FedALA, max_steps=7, k=3, threshold=1e9)      # any window converges: stop after k steps
    r.round(1)
    assert r.client(0, 2)[1]["ala_steps"] == 3


# --- FedSSI ---------------------------------------------------------------------------------------

def test_fedssi_importance(one_thread):
    r = Run(FedSSI)
    r.round(1)
    om1 = {n: r.cstate[0][OMEGA + n].clone() for n in r.m.shapes}
    # asserted: every Omega_i >= 0 (negative path contributions are clipped) and most are > 0
    assert all((o >= 0).all() for o in om1.values())
    flat = torch.cat([o.flatten() for o in om1.values()])
    assert (flat > 0).float().mean() > 0.5 and torch.isfinite(flat).all()
    r.round(2)
    om2 = {n: r.cstate[0][OMEGA + n] for n in r.m.shapes}
    assert all((om2[n] >= om1[n]).all() for n in om1)
    assert sum(om2[n].sum() for n in om2) > sum(om1[n].sum() for n in om1)
    # deterministic
    keep = clone_state(r.cstate[1])
    a, stats = r.client(1, 3, clone_state(keep))
    b, _ = r.client(1, 3, clone_state(keep))
    assert a == b and stats["surrogate_steps"] == 2 and 0 < stats["lam"] < r.m.opts.lam


def test_fedssi_penalty_pulls(one_thread):
    """Round 1 has no earlier importance: no penalty. Round 2 is pulled toward theta* by round 1's Omega."""
    def moved(c):
        r = Run(FedSSI, {"local_steps": 6, "lr": 1e-2}, c=c)
        _, s1 = r.client(0, 1)
        om_before = {n: r.cstate[0][OMEGA + n].clone() for n in r.m.shapes}
        theta_star = r.down_fields()
        _, s2 = r.client(0, 2)
        d = torch.cat([(r.cstate[0][OWN + n] - theta_star[n]).flatten() for n in theta_star])
        return d, torch.cat([om_before[n].flatten() for n in theta_star]), s1, s2

    (free, om0, f1, f2), (held, om1, h1, h2) = moved(0.0), moved(1e6)
    assert torch.equal(om0, om1), "the importance does not depend on c"
    assert h1["penalty_share"] == 0.0 and h1["omega_mean"] == 0.0, "round 1 has no earlier rounds to constrain it"
    assert h2["omega_mean"] > 0 and h2["penalty_share"] > 0.5, h2
    assert f2["penalty_share"] == 0.0
    on = om1 > 0           # the penalty acts where Omega > 0 (most entries); elsewhere both runs move alike
    assert on.float().mean() > 0.5
    assert held[on].norm() < 0.3 * free[on].norm(), (held[on].norm(), free[on].norm())
    assert held.norm() < free.norm()


def test_fedssi_xi_relative_to_the_moves():
    """xi scales with the task's mean squared move, so LoRA-sized moves (~1e-3 a entry) are not swamped by the
    damping: an entry that moved by the typical amount keeps omega / delta^2 up to 1 / (1 + xi); SI's absolute
    xi = 1e-3 would have divided by ~1e-3 and flattened Omega to omega's shape."""
    g = torch.Generator().manual_seed(0)
    delta = {"a": 1e-3 * torch.randn(1000, generator=g), "b": 1e-3 * torch.randn(10, 10, generator=g)}
    omega = {n: d.abs() * 1e-2 for n, d in delta.items()}
    omega["a"][:5] = -1.0                                            # moves that raised the loss: no importance
    imp = importance(omega, delta, 0.1)
    assert (imp["a"][:5] == 0).all() and all((v >= 0).all() for v in imp.values())
    m = torch.cat([d.flatten() ** 2 for d in delta.values()]).mean()
    ratio = imp["b"] * (delta["b"] ** 2 + 0.1 * m) / omega["b"]      # exactly the formula
    assert torch.allclose(ratio, torch.ones_like(ratio), rtol=1e-4)
    typical = (delta["b"] ** 2 - m).abs().argmin()
    assert imp["b"].flatten()[typical] * m / omega["b"].flatten()[typical] > 0.85
    # the absolute damping flattens: Omega ~ omega / 1e-3, the moves' own scale lost
    flat = {n: omega[n].clamp(min=0) / (delta[n] ** 2 + 1e-3) for n in omega}
    assert (flat["b"] * 1e-3 / omega["b"]).min() > 0.99


# --- local-only -----------------------------------------------------------------------------------

def test_local_only(one_thread):
    r = Run(LocalOnly)
    s0 = clone_state(r.state)
    for rnd in (1, 2):
        ups, _ = r.round(rnd)
        assert all(torch.equal(r.state[n], s0[n]) for n in s0), "the server state moved"
        for _, up in ups:   # only the engine's sample count travels
            assert len(up) == encoded_size(P.up_schema(r.m), kind="local_only/up") == 20
    # round 2 started from each client's own tensors, not the broadcast
    mine = [{n: r.cstate[c][OWN + n] for n in s0} for c in (0, 1)]
    probe = r.m.prepare(copy.deepcopy(r.T.model))
    models = []
    for c in (0, 1):
        r.m.personal(probe, r.state, r.cstate[c])
        models.append(r.m.init_state(probe))
        assert all(torch.equal(models[c][n], mine[c][n]) for n in s0)
        assert any(not torch.equal(models[c][n], s0[n]) for n in s0)
    assert any(not torch.equal(models[0][n], models[1][n]) for n in s0)
    # the second round continued from round 1's tensors: a fresh client's round 2 ends elsewhere
    fresh = {}
    r.client(0, 2, fresh)
    assert any(not torch.equal(fresh[OWN + n], mine[0][n]) for n in s0)
