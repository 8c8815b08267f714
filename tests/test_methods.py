"""What each baseline promises beyond the shared contract."""
import copy

import pytest
import torch

from conftest import tiny_config, tiny_task
from lightfed import config as C
from lightfed import methods
from lightfed.data.tensors import subset
from lightfed.engine import protocol as P
from lightfed.methods.base import ClientContext, weighted_mean
from lightfed.wire import decode


def _setup(name, task="fmnist", **opts):
    T = tiny_task(task)
    cfg = tiny_config(task, name, method_options=opts)
    m = methods.build(cfg)
    model = m.prepare(copy.deepcopy(T.model))
    return T, cfg, m, model


def _client(T, cfg, m, model, state, seed=1, rows=range(16), cstate=None):
    down = P.broadcast(m, state, 1)
    ctx = ClientContext(0, 1, seed, cfg, T.loss, {} if cstate is None else cstate)
    up, stats = P.client_round(m, model, down, subset(T.train, rows), ctx, cfg.max_message_bytes)
    f = decode(up, P.up_schema(m), kind=f"{m.name}/up", max_bytes=cfg.max_message_bytes)
    return up, f, stats


def test_fedavg_aggregate_is_the_sample_weighted_mean():
    T, cfg, m, model = _setup("fedavg")
    state = m.init_state(model)
    _, f1, _ = _client(T, cfg, m, model, state, 1, range(8))
    _, f2, _ = _client(T, cfg, m, model, state, 2, range(8, 32))
    n1, n2 = f1.pop(P.EXAMPLES), f2.pop(P.EXAMPLES)
    new = m.aggregate(state, [(f1, n1), (f2, n2)], 1)
    for k in state:
        want = (f1[k].double() * n1 + f2[k].double() * n2) / (n1 + n2)
        assert torch.allclose(new[k].double(), want, atol=1e-6)


def test_weighted_mean_matches_float64_reference():
    g = torch.Generator().manual_seed(0)
    ups = [({"a": torch.randn(1000, generator=g)}, float(w)) for w in (1, 5, 9)]
    ref = sum(f["a"].double() * w for f, w in ups) / 15
    assert (weighted_mean(ups, ["a"])["a"].double() - ref).abs().max() < 1e-6


@pytest.mark.parametrize("codec,nbytes", [("fp32", 4), ("bf16", 2), ("int8", 1), ("int4", 0.5)])
def test_fedavg_codec_sets_the_bytes(codec, nbytes):
    T, cfg, m, model = _setup("fedavg", codec=codec)
    state = m.init_state(model)
    down = P.broadcast(m, state, 1)
    n = sum(v.numel() for v in state.values())
    assert n * nbytes <= len(down) < n * nbytes + 40 * len(state) + 64


def test_fedprox_pulls_towards_the_global_model():
    dist, share = {}, {}
    for mu in (0.0, 100.0):
        T, cfg, m, model = _setup("fedprox", mu=mu)
        cfg.lr = 1e-2
        state = m.init_state(model)
        _, f, stats = _client(T, cfg, m, model, state)
        dist[mu] = sum(((f[k] - state[k]) ** 2).sum().item() for k in state)
        share[mu] = stats["penalty_share"]
    assert dist[100.0] < dist[0.0]
    assert share[0.0] == 0.0 and 0.0 < share[100.0] < 1.0     # the penalty's share of the loss, reported


def test_fedprox_with_mu_zero_is_fedavg():
    ups = {}
    for name, opts in (("fedavg", {}), ("fedprox", {"mu": 0.0})):
        T, cfg, m, model = _setup(name, **opts)
        _, f, _ = _client(T, cfg, m, model, m.init_state(model))
        ups[name] = f
    assert ups["fedavg"].pop(P.EXAMPLES) == ups["fedprox"].pop(P.EXAMPLES)
    assert all(torch.equal(ups["fedavg"][k], ups["fedprox"][k]) for k in ups["fedavg"])


def test_lora_trains_only_adapters_and_head():
    T, cfg, m, model = _setup("lora", "sentiment", r=4)
    names = list(m.trainable(model))
    assert names and all("lora_" in n or n.startswith("head.") for n in names)
    assert any("lora_A" in n for n in names) and any("lora_B" in n for n in names)


def test_vera_refuses_a_model_without_linear_targets():
    T = tiny_task("fmnist")
    m = methods.build(tiny_config("fmnist", "vera"))
    with pytest.raises(C.ConfigError, match="Linear layers only"):
        m.prepare(copy.deepcopy(T.model))


def test_topk_sends_k_entries_and_keeps_the_rest_as_residual():
    T, cfg, m, model = _setup("topk", ratio=0.05)
    state = m.init_state(model)
    cstate = {}
    up, f, _ = _client(T, cfg, m, model, state, cstate=cstate)
    assert f["idx"].numel() == m.k == -(-m.D * 5 // 100)
    assert len(up) < 8 * m.k + 200
    # sent + residual == the full local update (error feedback loses nothing)
    model2 = copy.deepcopy(model)
    full, _ = m.__class__.__mro__[1].client_update(m, model2, P.decode(P.broadcast(m, state, 1), m.down_schema(),
                                                   kind="topk/down", max_bytes=10**9), subset(T.train, range(16)),
                                                   ClientContext(0, 1, 1, cfg, T.loss, {}))
    from lightfed.methods.topk import flatten
    d = flatten(full, m.shapes) - flatten(state, m.shapes)
    sent = torch.zeros(m.D).index_add_(0, f["idx"].long(), f["val"])
    assert torch.allclose(sent + cstate["residual"], d, atol=1e-7)
    assert f["val"].abs().min() >= cstate["residual"].abs().max() - 1e-12, "the largest entries are the ones sent"


def test_topk_refuses_duplicate_indices():
    T, cfg, m, model = _setup("topk", ratio=0.05)
    state = m.init_state(model)
    _, f, _ = _client(T, cfg, m, model, state)
    f["idx"][1] = f["idx"][0]
    with pytest.raises(methods.base.Rejected, match="strictly increasing"):
        m.validate(state, f, 1)


def test_powersgd_own_factors_and_error_feedback():
    T, cfg, m, model = _setup("powersgd", rank=2, factors="own")
    state = m.init_state(model)
    cstate = {}
    up, f, _ = _client(T, cfg, m, model, state, cstate=cstate)
    assert m.mats, "some matrices are compressed"
    for k, (rows, cols) in m.mats.items():
        P_, Q = f[k + ".P"], f[k + ".Q"]
        assert P_.shape == (rows, 2) and Q.shape == (cols, 2)
        assert torch.allclose(P_.T @ P_, torch.eye(2), atol=1e-5), "P is orthonormal"
        assert k + ".E" in cstate and k + ".Q" in cstate, "residual and warm start kept on the client"
    dense = sum(v.numel() * 4 for v in state.values())
    assert len(up) < dense / 2


def test_powersgd_shared_factors_are_one_power_step_on_the_mean_update():
    """Vogels et al.'s scheme: the clients' Q shares in the broadcast subspace P^ average to M^T P^ of the
    mean update M, the new weights are w + P^ P^T M, and next round's P^ is orth(M Q~)."""
    T, cfg, m, model = _setup("powersgd", rank=2)
    state = m.init_state(model)
    k, (rows, cols) = next(iter(m.mats.items()))
    assert torch.allclose(state["_" + k + ".P"].T @ state["_" + k + ".P"], torch.eye(2), atol=1e-5)
    ups, Ms = [], []
    for seed, rows_ in ((1, range(8)), (2, range(8, 32))):
        cst = {}
        up, f, _ = _client(T, cfg, m, model, state, seed, rows_, cstate=cst)
        n = f.pop(P.EXAMPLES)
        ups.append((f, float(n)))
        # the client's update, rebuilt from its residual: M_k = E_k + P^ Q_k^T
        Ms.append((cst[k + ".E"] + state["_" + k + ".P"] @ f[k + ".Q"].T, float(n)))
        assert f[k + ".Q"].shape == (cols, 2) and f[k + ".P"].shape == (rows, 2)
        assert torch.allclose(f[k + ".P"], Ms[-1][0] @ state["_" + k + ".Q"], atol=1e-5), "P share = M_k Q~"
    M = sum(Mk * n for Mk, n in Ms) / sum(n for _, n in Ms)                         # (rows, cols) the mean update
    new = m.aggregate(state, ups, 1)
    Ph = state["_" + k + ".P"]
    want = state[k].reshape(rows, cols) + Ph @ Ph.T @ M
    assert torch.allclose(new[k].reshape(rows, cols), want, atol=1e-5)
    assert torch.allclose(new["_" + k + ".Q"], M.T @ Ph, atol=1e-5)
    Pn = new["_" + k + ".P"]
    assert torch.allclose(Pn.T @ Pn, torch.eye(2), atol=1e-5)
    Pw = torch.linalg.qr(M @ state["_" + k + ".Q"]).Q                                       # the same subspace as orth(M Q~)
    assert torch.allclose(Pn @ Pn.T, Pw @ Pw.T, atol=1e-4)
    # the round trip of the broadcast carries the shared factors, fp32
    from lightfed.wire import decode as dec
    got = dec(P.broadcast(m, new, 2), m.down_schema(), kind=f"{m.name}/down", max_bytes=cfg.max_message_bytes)
    assert torch.equal(got["_" + k + ".P"], new["_" + k + ".P"]) and torch.equal(got["_" + k + ".Q"], new["_" + k + ".Q"])


def test_the_aggregation_weight_is_the_clients_example_count_not_the_samples_processed():
    """With local_steps, both clients process 2 x 8 samples; FedAvg weighs them by the 8 and 24 examples they hold."""
    T, cfg, m, model = _setup("fedavg")
    state = m.init_state(model)
    _, f1, s1 = _client(T, cfg, m, model, state, 1, range(8))
    _, f2, s2 = _client(T, cfg, m, model, state, 2, range(8, 32))
    assert s1["samples"] == s2["samples"] == 16
    assert (f1[P.EXAMPLES], f2[P.EXAMPLES]) == (8, 24)
