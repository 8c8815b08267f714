"""Robust aggregation (RunConfig.robust) on every kind of aggregate: dense weights, FLITE latents, top-k /
PowerSGD updates, and zeroth-order scalars per step. One hostile client (a scaled sign flip) among honest ones."""
import copy

import pytest
import torch

from conftest import tiny_config, tiny_task
from lightfed import config, methods
from lightfed.data.tensors import subset
from lightfed.engine import protocol as P
from lightfed.methods.base import ClientContext, combine
from lightfed.wire import decode, encode


def test_combine_rules_by_hand():
    ups = [({"x": torch.tensor([1.0, 10.0])}, 1.0), ({"x": torch.tensor([2.0, 20.0])}, 1.0),
           ({"x": torch.tensor([3.0, 30.0])}, 1.0), ({"x": torch.tensor([1000.0, -1000.0])}, 1.0)]
    assert torch.equal(combine(ups, ["x"], "median")["x"], torch.tensor([2.5, 15.0]))
    assert torch.equal(combine(ups, ["x"], "trim:0.25")["x"], torch.tensor([2.5, 15.0]))
    assert torch.allclose(combine(ups, ["x"], "mean")["x"], torch.tensor([251.5, -235.0]))
    ref = {"x": torch.zeros(2)}
    clipped = combine(ups, ["x"], "clip:1", ref=ref)["x"]
    assert all(torch.linalg.norm(f["x"] / max(1, torch.linalg.norm(f["x"]))) <= 1 + 1e-6 for f, _ in ups)
    assert torch.linalg.norm(clipped) <= 1 + 1e-6


@pytest.mark.parametrize("rule,ok", [("mean", True), ("median", True), ("trim:0.3", True), ("clip:1e-3", True),
                                     ("bad", False), ("trim:0.5", False), ("clip:0", False), ("median:2", False)])
def test_the_rule_is_checked_before_any_work(rule, ok):
    from lightfed.engine import local
    cfg = tiny_config("sentiment", "fedavg", robust=rule)
    if ok:
        local.check(cfg)
    else:
        with pytest.raises(config.ConfigError, match="robust"):
            local.check(cfg)


def _round(name, task, rule, lr=1e-3, **opts):
    T = tiny_task(task)
    cfg = tiny_config(task, name, robust=rule, clients=5, lr=lr, method_options=opts)
    m = methods.build(cfg)
    model = m.prepare(copy.deepcopy(T.model))
    state = m.init_state(model)
    down = P.broadcast(m, state, 1)
    ups = []
    for cid in range(5):
        up, _ = P.client_round(m, model, down, subset(T.train, range(8 * cid, 8 * cid + 16)),
                               ClientContext(cid, 1, 50 + cid, cfg, T.loss, {}), cfg.max_message_bytes)
        ups.append((cid, up))
    return m, state, ups, cfg


def name_is_weights(m) -> bool:
    """Does the upload carry weights (fedavg, flite) rather than updates (top-k, PowerSGD)?"""
    return m.name in ("fedavg", "flite")


def _hostile(m, state, blob, cfg):
    """Client 4 sends -100x its honest update (a scaled sign flip), as a well-formed message."""
    f = decode(blob, P.up_schema(m), kind=f"{m.name}/up", max_bytes=cfg.max_message_bytes)
    for k, v in list(f.items()):
        if not torch.is_tensor(v) or not v.is_floating_point() or (k.endswith(".Q") and not getattr(m, "shared", True)):
            continue                  # PowerSGD with its own factors: the update is P Q^T, scaling P suffices
        f[k] = state[k] - 100 * (v - state[k]) if k in state and k in m.shapes and name_is_weights(m) else -100 * v
    return encode(f, P.up_schema(m), kind=f"{m.name}/up")


@pytest.mark.parametrize("name,task,opts", [("fedavg", "fmnist", {}), ("flite", "sentiment", {}), ("topk", "fmnist", {"ratio": 0.5}),
                                            ("powersgd", "fmnist", {}), ("powersgd", "fmnist", {"factors": "own"}), ("decomfl", "sentiment", {"lr": 1e-2})])
def test_median_and_trim_resist_one_hostile_client_where_the_mean_does_not(name, task, opts):
    dist = {}
    for rule in ("mean", "median", "trim:0.2"):
        m, state, ups, cfg = _round(name, task, rule, **opts)
        honest, _ = P.aggregate(m, state, ups[:4], 1, max_bytes=cfg.max_message_bytes)
        if name == "decomfl":      # hostile scalars: flip and scale them (the digest is recomputed by the attacker)
            f = decode(ups[4][1], P.up_schema(m), kind="decomfl/up", max_bytes=10**6)
            f["g"] = -100 * f["g"]
            f["digest"] = __import__("lightfed.optim.zeroth_order", fromlist=["digest"]).digest(m.replay(state, 1, f))
            bad = encode(f, P.up_schema(m), kind="decomfl/up")
        else:
            bad = _hostile(m, state, ups[4][1], cfg)
        attacked, report = P.aggregate(m, state, ups[:4] + [(4, bad)], 1, max_bytes=cfg.max_message_bytes)
        assert report["accepted"] == 5
        keys = list(m.shapes)
        move = sum(float((honest[k] - state[k]).norm() ** 2) for k in keys) ** 0.5
        dist[rule] = sum(float((attacked[k] - honest[k]).norm() ** 2) for k in keys) ** 0.5 / move
    assert dist["mean"] > 10 and dist["median"] < 2 and dist["trim:0.2"] < 2, dist


def test_a_client_round_that_fails_leaves_the_client_state_as_it_was():
    T = tiny_task("sentiment")
    cfg = tiny_config("sentiment", "fedavg")
    m = methods.build(cfg)
    model = m.prepare(copy.deepcopy(T.model))
    down = P.broadcast(m, m.init_state(model), 1)
    ctx = ClientContext(0, 1, 5, cfg, T.loss, {"kept": torch.ones(2)})

    def half_done(model, down, data, ctx):      # commits some state, then fails (e.g. a non-finite upload)
        ctx.state["kept"] = torch.zeros(2)
        ctx.state["new"] = torch.ones(1)
        raise RuntimeError("failed mid-round")

    m.client_update = half_done
    with pytest.raises(RuntimeError, match="mid-round"):
        P.client_round(m, model, down, subset(T.train, range(8)), ctx, cfg.max_message_bytes)
    assert list(ctx.state) == ["kept"] and torch.equal(ctx.state["kept"], torch.ones(2))


def test_a_downlink_that_makes_the_loss_non_finite_is_refused_cleanly():
    """Found by fuzzing: FedALA's convergence check crashed (statistics on inf) on a well-formed downlink of
    huge weights; the round now ends in the wire's non-finite refusal, the client's state unchanged."""
    from lightfed.wire import WireError
    T = tiny_task("sentiment")
    cfg = tiny_config("sentiment", "fedala")
    m = methods.build(cfg)
    model = m.prepare(copy.deepcopy(T.model))
    state = m.init_state(model)
    ctx = ClientContext(0, 1, 5, cfg, T.loss, {})
    P.client_round(m, model, P.broadcast(m, state, 1), subset(T.train, range(16)), ctx, cfg.max_message_bytes)
    kept = dict(ctx.state)
    huge = {k: torch.full_like(v, 3e38) for k, v in state.items()}
    ctx2 = ClientContext(0, 2, 6, cfg, T.loss, ctx.state)
    with pytest.raises(WireError, match="finite"):
        P.client_round(m, model, P.broadcast(m, huge, 2), subset(T.train, range(16)), ctx2, cfg.max_message_bytes)
    assert ctx.state.keys() == kept.keys() and all(ctx.state[k] is kept[k] for k in kept)


# ---- fuzzing: every message kind of every method, fed malformed to its receiver (engine/fuzz.py) ----------------

@pytest.mark.parametrize("name", sorted(methods.METHODS))
def test_every_message_kind_of_every_method_refuses_its_mutants_without_a_crash_or_a_state_change(one_thread, name):
    """60 mutants of each of the method's real messages (flips, cuts, insertions, garbage; stale and recomputed CRCs):
    the server's aggregate or the client's round refuses them (naming the field), none crashes, and a refused one
    leaves the server's or the client's state as it was. The benchmark's robustness.md runs 10,000 a kind."""
    import random
    from lightfed.engine import fuzz
    task = "austen" if name == "fednl" else "sentiment"
    T = tiny_task(task)
    cfg = tiny_config(task, name, method_options={"down": "seeds"} if name in ("decomfl", "mezo", "fedspzo", "zoflite") else {})
    receivers = fuzz.method_receivers(methods.build(cfg), copy.deepcopy(T.model), T.train, cfg, T.loss)
    assert {"up", "down"} <= set(receivers)
    for kind, r in receivers.items():
        c = fuzz.tally(60, random.Random(0), r)
        assert c["crashes"] == 0 and c["state_changed"] == 0, (kind, c["examples"])
        assert c["refused"] >= c["mutants"] // 2 and c["named"] >= 0.9 * c["refused"], (kind, c)


def test_secure_aggregations_messages_refuse_their_mutants_without_a_crash():
    import random
    from lightfed.engine import fuzz
    for kind, r in fuzz.secagg_receivers().items():
        c = fuzz.tally(60, random.Random(1), r)
        assert c["crashes"] == 0 and c["refused"] > 0, (kind, c["examples"])


def test_the_fuzz_tally_counts_a_crash_and_a_refusal_that_changes_state():
    """The tally's own contract, on a receiver built to fail each way: a check that cannot fail proves nothing."""
    import random
    from lightfed.engine import fuzz
    held = {"w": torch.zeros(2)}

    def receive(b):
        if b[0] % 2:
            raise KeyError("a crash")
        held["w"].add_(1)                      # an in-place write, then a refusal
        return "wire: field 'w': bad"
    c = fuzz.tally(40, random.Random(0), fuzz.Receiver(b"LF\x02" + bytes(20), receive, lambda: fuzz.marks(held)))
    assert c["crashes"] > 0 and c["refused"] > 0 and c["state_changed"] == c["refused"] and c["named"] == c["refused"]
    assert c["crashes"] + c["refused"] == c["mutants"]
