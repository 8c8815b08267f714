"""The zeroth-order FL baselines: FedZO (full-model uplink) and DeComFL (scalars, averaged and replayed)."""
import copy

import pytest
import torch

from conftest import Quadratic, tiny_config, tiny_task
from lightfed import methods
from lightfed.data.tensors import subset
from lightfed import measure
from lightfed.engine import protocol as P
from lightfed.methods.base import ClientContext, weighted_mean
from lightfed.methods.fedzo import direction_norm, forward_difference
from lightfed.optim import zeroth_order as zo
from lightfed.wire import decode, encoded_size, kind_tag


pytestmark = pytest.mark.usefixtures("one_thread")


def test_fedzo_estimate_is_the_forward_difference_formula_on_a_quadratic():
    q = Quadratic()
    params = {"theta": q.theta}
    theta = q.theta.detach().clone()
    d, mu, seeds = theta.numel(), 1e-3, [11, 12, 13]
    L0, coefs = forward_difference(lambda: q(), q, params, seeds, mu)
    # reference, written out: u_j on the unit sphere, g = d / (b2 mu) sum_j (f(theta + mu u_j) - f(theta)) u_j
    ref = torch.zeros_like(theta)
    for s in seeds:
        u = zo.direction(s, 0, theta.shape).double()
        u = u / u.norm()
        ref += d / (len(seeds) * mu) * (q.f(theta + mu * u) - q.f(theta)) * u
    got = sum(c * zo.direction(s, 0, theta.shape).double() for s, c, _ in coefs)
    assert L0 == pytest.approx(q.f(theta), rel=1e-12)
    assert torch.allclose(got, ref, rtol=1e-7, atol=1e-9)
    assert direction_norm(params, 11) == pytest.approx(zo.direction(11, 0, theta.shape).double().norm().item())
    assert torch.equal(q.theta.detach(), theta), "the perturbed forwards wrote to the weights"
    # applying the coefficients (what a client does) is one SGD step along g
    for s, c, _ in coefs:
        zo.apply_update(params, s, 0.1 * c)
    assert torch.allclose(q.theta.detach(), theta - 0.1 * ref, rtol=1e-6, atol=1e-6)
    # and g is an (almost unbiased) estimate of the gradient: many directions -> close to it
    with torch.no_grad():
        q.theta.copy_(theta)
    _, many = forward_difference(lambda: q(), q, params, list(range(100, 2100)), mu)
    g = sum(c * zo.direction(s, 0, theta.shape).double() for s, c, _ in many)
    grad = q.A @ theta + q.b
    assert torch.nn.functional.cosine_similarity(g, grad, dim=0) > 0.9


def _client(name, rows, seed=100, rnd=1, state=None, **kw):
    T = tiny_task("sentiment")
    cfg = tiny_config("sentiment", name, **kw)
    m = methods.build(cfg)
    model = m.prepare(copy.deepcopy(T.model))
    st = m.init_state(model)
    down = P.broadcast(m, st, rnd)
    ctx = ClientContext(0, rnd, seed, cfg, T.loss, {} if state is None else state)
    up, stats = P.client_round(m, model, down, subset(T.train, rows), ctx, cfg.max_message_bytes)
    return T, cfg, m, model, st, up, stats


def test_fedzo_uploads_the_full_model_and_counts_b2_plus_one_forwards():
    opts = {"b2": 3, "trainable": "layer.1.,head."}
    T, cfg, m, model, state, up, stats = _client("fedzo", range(16), lr=1e-2, method_options=opts)
    f = decode(up, P.up_schema(m), kind="fedzo/up", max_bytes=10**8)
    d = sum(p.numel() for p in m.trainable(model).values())
    assert d == sum(p.numel() for n, p in model.named_parameters() if "layer.1." in n or "head." in n) > 5_000
    assert {k: tuple(v.shape) for k, v in f.items() if k != P.EXAMPLES} == m.shapes
    assert sum(v.numel() for k, v in f.items() if k != P.EXAMPLES) == d
    assert 4 * d < len(up) == encoded_size(P.up_schema(m), kind="fedzo/up") < 4 * d + 4096   # d fp32 + framing
    assert any(not torch.equal(f[n], state[n]) for n in state)
    assert stats["forwards_per_step"] == {"fwd": 4} and stats["steps"] == 2 and stats["samples"] == 16
    model.eval()                     # as the client counts (CPU SDPA in eval mode: FlopCounterMode skips attention)
    _, fl = measure.count_flops(lambda: T.loss(model, subset(T.train, range(8))))
    assert stats["flops"] == fl / 8 * 4 * 16
    assert set(stats["memory_accounted"]) == {"params", "activations", "z"}
    assert all(p.grad is None for p in model.parameters())
    # the directions are the client's own: another client seed, other directions, another model
    *_, up2, _ = _client("fedzo", range(16), seed=101, lr=1e-2, method_options=opts)
    assert up2 != up


@pytest.fixture(scope="module")
def decomfl_round():
    T = tiny_task("sentiment")
    cfg = tiny_config("sentiment", "decomfl", local_steps=0, local_epochs=1.0, lr=1e-2, method_options={"P": 2})
    m = methods.build(cfg)
    model = m.prepare(copy.deepcopy(T.model))
    state = m.init_state(model)
    down = P.broadcast(m, state, 1)
    ups = []
    for cid, rows in ((0, range(16)), (1, range(16, 24)), (2, range(24, 48))):   # unequal sample weights
        ctx = ClientContext(cid, 1, 100 + cid, cfg, T.loss, {})
        up, stats = P.client_round(m, model, down, subset(T.train, rows), ctx, cfg.max_message_bytes)
        ups.append((up, stats))
    return T, cfg, m, model, state, ups


def test_decomfl_replay_of_mean_scalars_equals_the_weighted_mean_of_replayed_models(decomfl_round):
    T, cfg, m, model, state, ups = decomfl_round
    new, report = P.aggregate(m, state, [(c, u) for c, (u, _) in enumerate(ups)], 1, max_bytes=cfg.max_message_bytes)
    assert report["accepted"] == 3
    fields = []
    for up, _ in ups:
        f = decode(up, P.up_schema(m), kind="decomfl/up", max_bytes=10**6)
        fields.append((f, float(f.pop(P.EXAMPLES))))
    assert [w for _, w in fields] == [16.0, 8.0, 24.0]              # K = 2, 1, 3 steps of 8
    models = [(m.replay(state, 1, f), w) for f, w in fields]   # each client's model, rebuilt (digest-checked above)
    fedavg = weighted_mean(models, m.names)                  # the weights (the state also holds down=seeds' log)
    moved = max((fedavg[k] - state[k]).abs().max().item() for k in m.names)
    assert moved > 1e-4
    for k in m.names:
        assert torch.allclose(new[k], fedavg[k], rtol=0, atol=1e-6), k
    # the averaged scalars are the only thing the round's downlink record needs
    assert all(torch.equal(new[k], v) for k, v in m.replay_mean(state, 1, fields).items())


def test_decomfl_uplink_is_K_by_P_scalars_plus_framing(decomfl_round):
    T, cfg, m, model, state, ups = decomfl_round
    up, stats = ups[0]                                             # K = 2 steps, P = 2
    f = decode(up, P.up_schema(m), kind="decomfl/up", max_bytes=10**6)
    assert f["g"].shape == (2, 2) and f["g"].dtype == torch.float32 and len(f["digest"]) == 8
    framing = len(up) - 4 * 2 * 2
    assert 0 < framing < 80                                        # header, names, dims, digest, _n, CRC
    _, _, m4, _, _, up4, _ = _client("decomfl", range(16), local_steps=5, lr=1e-2, method_options={"P": 2})
    assert len(up4) - len(up) == 4 * 2 * (5 - 2)                   # 4 bytes per extra scalar, nothing else


def test_decomfl_catch_up_downlink_grows_with_missed_rounds():
    state = {}
    *_, s1 = _client("decomfl", range(8), rnd=1, state=state)
    assert s1["seed_records_missed"] == 0 and s1["down_seed_history_bytes"] == 0
    *_, s4 = _client("decomfl", range(8), rnd=4, state=state)         # took part in round 1, back in round 4
    assert s4["seed_records_missed"] == 3
    # one message of 3 records shares its header and round seed: less than 3 one-record messages
    assert s4["down_seed_only_bytes"] < s4["down_seed_history_bytes"] < 3 * s4["down_seed_only_bytes"]
    *_, s3 = _client("decomfl", range(8), rnd=3, state={})            # first time in round 3: rounds 1, 2
    assert s3["seed_records_missed"] == 2


# --- down = "seeds": the seed-only downlink, sent and replayed -------------------------------------
@pytest.mark.parametrize("name", ["fedspzo", "decomfl"])
def test_seed_only_downlink_rebuilds_the_global_model_bit_for_bit(name):
    """Client 1 misses round 2 (two records in round 3); client 2 is new in round 2 (the model) and
    its round-2 upload is refused, so round 3 sends it the model again."""
    T = tiny_task("sentiment")
    opts = {"P1": 1, "Ps": 1} if name == "fedspzo" else {"P": 1}
    cfg = tiny_config("sentiment", name, clients=4, lr=1e-2, method_options={**opts, "down": "seeds"})
    m = methods.build(cfg)
    model = m.prepare(copy.deepcopy(T.model))
    state = m.init_state(model)
    held = {c: {} for c in range(4)}
    plan = {1: [0, 1], 2: [0, 2], 3: [0, 1, 2]}
    expect = {1: {0: "down", 1: "down"}, 2: {0: "seeds/1", 2: "down"}, 3: {0: "seeds/2", 1: "seeds/1", 2: "down"}}
    full = None
    for rnd, cids in plan.items():
        ups = []
        for c in cids:
            down = P.broadcast(m, state, rnd, c)
            kind = next(k for k in m.down_kinds(ClientContext(c, rnd, 0, cfg, T.loss, held[c]))
                        if bytes(down[3:7]) == kind_tag(f"{name}/{k}"))
            assert kind == expect[rnd][c]
            full = len(down) if kind == "down" else full
            if kind != "down":             # round seed + records of 2 steps x (P1 + P2) scalars, not the weights
                records = rnd - int(held[c]["held_round"][0])
                assert len(down) < 200 * records < full / 1000
                assert len(down) == m.seed_down_bytes(cfg.local_steps, records)   # the reported size is the real one
            ctx = ClientContext(c, rnd, 100 * rnd + c, cfg, T.loss, held[c])
            up, _ = P.client_round(m, model, down, subset(T.train, range(8 * c, 8 * c + 16)), ctx, cfg.max_message_bytes)
            # what the client trained from is the server's global model of this round, bit for bit
            assert all(torch.equal(held[c]["held." + n], state[n]) for n in m.names)
            if (rnd, c) == (2, 2):
                up = up[:-5] + bytes([up[-5] ^ 1]) + up[-4:]     # corrupted in transit: refused
            ups.append((c, up))
        state, report = P.aggregate(m, state, ups, rnd, max_bytes=cfg.max_message_bytes, sampled=cids)
        assert report["accepted"] == len(cids) - ((rnd, 2) == (2, 2))
    assert state["_held"].tolist() == [3, 3, 3, -1]
    assert sorted(k for k in state if k.startswith("_log.1.")) == sorted(f"_log.1.{f}" for f in m.scalars())
