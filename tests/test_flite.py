"""FLITE: the latent-delta parameterization's invariants, and the method's wire and head."""
import json
import contextlib
import copy
import io
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

from conftest import tiny_config, tiny_task
from lightfed import methods
from lightfed.data.tensors import subset
from lightfed.engine import protocol as P
from lightfed.methods.base import ClientContext
from lightfed.models import latent
from lightfed.wire import Spec, decode, encode, encoded_size

SEED = 2**64 - 12345      # a full 64-bit factor seed


class Toy(nn.Module):
    """One layer of every kind the parameterization handles, and a task head."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 8, padding_idx=0)
        self.conv = nn.Conv2d(2, 8, 3, padding=1)
        self.lin = nn.Linear(8, 12)
        self.head = nn.Linear(12, 3)

    def forward(self, ids, img):                                                  # (B, T), (B, 2, 5, 5)
        h = self.emb(ids).mean(1) + self.conv(img).mean((2, 3))                  # (B, 8)
        return self.head(torch.tanh(self.lin(h)))                                # (B, 3)


def toy(**kw):
    torch.manual_seed(0)
    base = Toy().eval()
    kw = {"layers": "linear,conv,embedding", "seed": SEED, **kw}
    return base, latent.install(copy.deepcopy(base), **kw)


def inputs():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 50, (4, 6), generator=g), torch.randn(4, 2, 5, 5, generator=g)


def set_z(model, seed):
    with torch.no_grad():
        model.z.copy_(torch.randn(model.z.shape, generator=torch.Generator().manual_seed(seed)))


@pytest.mark.parametrize("form", ["matrix", "flat"])
@pytest.mark.parametrize("mode", ["cache", "regen"])
def test_zero_latent_is_the_pretrained_model(form, mode):
    base, m = toy(form=form, mode=mode, k=10)
    assert m.z.numel() == 3 * (36 if form == "matrix" else 10) and torch.equal(m.z, torch.zeros_like(m.z))
    assert "head" not in dict(latent.latent_layers(m))
    assert torch.equal(m(*inputs()), base(*inputs()))
    set_z(m, 0)
    assert not torch.allclose(m(*inputs()), base(*inputs()))


def test_regen_equals_cache_and_holds_no_factors():
    _, c = toy()
    _, r = toy(mode="regen")
    set_z(c, 3)
    set_z(r, 3)
    assert torch.equal(c(*inputs()), r(*inputs()))
    assert latent.factor_bytes(r) == 0
    assert latent.factor_bytes(c) == latent.factor_bytes(r, held=False) == 4 * 6 * ((50 + 8) + (8 + 18) + (12 + 8))
    assert not any(k.endswith((".A", ".Bt")) for k in c.state_dict()), "factors are never saved"


@pytest.mark.parametrize("form", ["matrix", "flat"])
def test_averaging_latents_is_averaging_weights(form):
    _, m = toy(form=form, k=10)
    zs = [torch.randn(m.z.shape, generator=torch.Generator().manual_seed(s), dtype=torch.float64) for s in range(5)]
    w = torch.tensor([3.0, 1.0, 7.0, 2.0, 5.0], dtype=torch.float64) / 18
    z_mean = sum(wk * z for wk, z in zip(w, zs))
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-6)):
        each = [latent.materialize(m, z.to(dtype), dtype) for z in zs]
        ref = latent.materialize(m, z_mean.to(dtype), dtype)
        for k, W in ref.items():
            avg = sum(wk.to(dtype) * e[k] for wk, e in zip(w, each))
            assert (avg - W).abs().max().item() < tol, (dtype, k)
    # the forward uses exactly the materialized weights (matrix form: through its low-rank path)
    set_z(m, 4)
    W = latent.materialize(m)
    x = torch.randn(3, 8)
    assert torch.allclose(m.lin(x), x @ W["lin.weight"].t() + m.lin.base.bias, atol=1e-6)


def test_live_dim_is_the_rank_of_the_map():
    for form, k, live in (("matrix", 0, 36), ("flat", 10, 6), ("flat", 4, 4)):
        _, m = toy(form=form, k=k)
        layer = m.lin
        J = torch.stack([layer.delta(e).reshape(-1) for e in torch.eye(layer.k)])       # k x (rows cols)
        assert torch.linalg.matrix_rank(J).item() == layer.live_dim() == live
        assert latent.info(m)["live"] == 3 * live


def test_gradients_reach_only_z():
    _, m = toy()
    set_z(m, 2)
    m(*inputs()).square().sum().backward()
    assert [n for n, p in m.named_parameters() if p.requires_grad] == ["z"]
    assert m.z.grad is not None and m.z.grad.abs().sum() > 0
    assert all(p.grad is None for n, p in m.named_parameters() if n != "z")


FACTOR_HASH = """
import hashlib, torch, torch.nn as nn
from lightfed.models import latent
torch.manual_seed(0)
m = latent.install(nn.Sequential(nn.Embedding(50, 8), nn.Conv2d(2, 8, 3), nn.Linear(8, 12)),
                   layers="linear,conv,embedding", seed={seed})
h = hashlib.sha256()
for _, l in latent.latent_layers(m):
    h.update(l.A.numpy().tobytes()); h.update(l.Bt.numpy().tobytes())
print(h.hexdigest())
"""


def test_factors_regenerate_identically_in_another_process():
    code = FACTOR_HASH.format(seed=SEED)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, {})
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out.getvalue().strip() == there and len(there) == 64
    A = latent.make_factors(latent.layer_seed(SEED, 0), 50, 8, 6)[0]
    assert not torch.equal(A, latent.make_factors(latent.layer_seed(SEED - 1, 0), 50, 8, 6)[0])


SVD_HASH = """
import hashlib, torch, torch.nn as nn
from lightfed.models import latent
torch.manual_seed(0)
m = latent.install(nn.Sequential(nn.Embedding(50, 8), nn.Conv2d(2, 8, 3), nn.Linear(8, 12)),
                   layers="linear,conv,embedding", seed=7, basis="svd", scale="weight")
h = hashlib.sha256()
for _, l in latent.latent_layers(m):
    h.update(l.A.numpy().tobytes()); h.update(l.Bt.numpy().tobytes())
print(h.hexdigest())
"""


def test_svd_factors_span_the_pretrained_singular_subspaces_and_regenerate_identically():
    base, m = toy(basis="svd", r=3)
    for name, layer in latent.latent_layers(m):
        W = layer.base.weight.detach().double().reshape(layer.rows, layer.cols)
        U, S, Vh = torch.linalg.svd(W, full_matrices=False)
        rr = min(3, U.shape[1])
        A, Bt = layer.A.double()[:, :rr], layer.Bt.double()[:rr]
        # the columns of A are the top singular vectors up to sign, scaled to the random factors' norms
        assert torch.allclose((U[:, :rr].T @ A).abs(), torch.eye(rr, dtype=torch.float64) * (layer.rows / 3) ** 0.5, atol=1e-4)
        assert torch.allclose((Vh[:rr] @ Bt.T).abs(), torch.eye(rr, dtype=torch.float64) / 3 ** 0.5, atol=1e-4)
    ids, img = inputs()
    assert torch.equal(base(ids, img), m(ids, img)), "z = 0 is still the pretrained model"
    here = io.StringIO()
    with contextlib.redirect_stdout(here):
        exec(SVD_HASH, {})
    there = subprocess.run([sys.executable, "-c", SVD_HASH], capture_output=True, text=True, check=True).stdout.strip()
    assert here.getvalue().strip() == there


def test_weight_scale_moves_each_layer_by_the_same_fraction_of_its_weight():
    _, m = toy(scale="weight", r=4)
    set_z(m, 3)
    ratios = []
    for _, layer in latent.latent_layers(m):
        W = layer.base.weight.detach().double()
        assert layer.gain == pytest.approx(W.square().mean().sqrt().item() * layer.cols ** 0.5, rel=1e-6)
        dW = layer.delta().double()
        ratios.append((dW.square().mean().sqrt() / W.square().mean().sqrt()).item())
    z_rms = m.z.detach().square().mean().sqrt().item()
    assert all(0.2 * z_rms < r < 5 * z_rms for r in ratios), (ratios, z_rms)


@pytest.mark.parametrize("opts, words", [({"basis": "svd", "mode": "regen"}, "basis = svd"), ({"scale": "x"}, "scale"),
                                         ({"basis": "pca"}, "basis")])
def test_bad_map_options_fail_before_any_work(opts, words):
    from lightfed import config as C
    with pytest.raises(C.ConfigError, match=words):
        methods.options("flite", opts)


def test_a_rank_pattern_gives_layers_their_own_rank_and_leaves_the_others_factors_as_they_were():
    base, whole = toy(r=3)
    _, m = toy(r=3, ranks="lin:5,emb:0")                    # lin at r = 5, emb without latents, conv at the map's r
    ls = dict(latent.latent_layers(m))
    assert sorted(ls) == ["conv", "lin"] and ls["lin"].r == 5 and ls["conv"].r == 3
    assert m.z.numel() == 5 * 5 + 3 * 3 and isinstance(m.emb, nn.Embedding)
    assert torch.equal(m(*inputs()), base(*inputs()))      # z = 0 is still the pretrained model
    conv = dict(latent.latent_layers(whole))["conv"]
    assert torch.equal(ls["conv"].A, conv.A) and torch.equal(ls["conv"].Bt, conv.Bt)   # its seed: its index by kind
    _, only = toy(r=3, ranks="conv:3,*:0")
    assert [n for n, _ in latent.latent_layers(only)] == ["conv"] and only.z.numel() == 9
    set_z(m, 0)
    m.z.grad = None
    m(*inputs()).sum().backward()
    assert m.z.grad is not None and base.lin.weight.grad is None


@pytest.mark.parametrize("ranks, words", [("lin", "not <layer name suffix>:<rank>"), ("lin:-1", "not <layer"),
                                          ("lin:2,lin:3", "given twice")])
def test_a_malformed_rank_pattern_fails_before_any_work(ranks, words):
    from lightfed import config as C
    with pytest.raises(C.ConfigError, match=words):
        methods.options("flite", {"rank_pattern": ranks})


@pytest.mark.parametrize("ranks, words", [("v_proj:4", r"\['v_proj'\] match no"), ("*:0", "leaves no layer")])
def test_a_rank_pattern_that_names_no_layer_is_refused_when_the_map_is_built(ranks, words):
    from lightfed import config as C
    T = tiny_task("fmnist")
    m = methods.build(tiny_config("fmnist", "flite", method_options={"rank_pattern": ranks}))
    with pytest.raises(C.ConfigError, match=words):
        m.prepare(copy.deepcopy(T.model))


@pytest.mark.parametrize("opts", [{"basis": "svd"}, {"scale": "weight"}])
def test_averaging_latents_is_averaging_weights_with_derived_maps(opts):
    _, m = toy(**opts)
    zs = [torch.randn(m.z.shape, generator=torch.Generator().manual_seed(s), dtype=torch.float64) for s in (1, 2)]
    mean = latent.materialize(m, (zs[0] + zs[1]) / 2, torch.float64)
    each = [latent.materialize(m, z, torch.float64) for z in zs]
    assert all(torch.allclose(mean[k], (each[0][k] + each[1][k]) / 2, atol=1e-10) for k in mean)


# --- the method -----------------------------------------------------------------------------------
PAPER = {"r": 6, "head": "orthogonal"}       # the paper's map (lightfed's default: r = 20, the head trained and sent)


def flite(defaults=PAPER, **opts):
    T = tiny_task("fmnist")
    cfg = tiny_config("fmnist", "flite", method_options={"seed": SEED, **defaults, **opts})
    m = methods.build(cfg)
    return T, cfg, m, m.prepare(copy.deepcopy(T.model))


def test_the_paper_head_is_frozen_orthogonal_and_off_the_wire():
    T, cfg, m, model = flite(codec="int4", head="orthogonal")
    assert set(m.up_schema()) == set(m.down_schema()) == {"z"}
    K = model.z.numel()
    assert m.up_schema()["z"] == Spec("tensor", (K,), "int4")
    state = m.init_state(model)
    assert torch.equal(state["z"], torch.zeros(K))
    W = model.head.weight                                                         # (10, 16): orthonormal rows
    assert not W.requires_grad and torch.allclose(W @ W.t(), torch.eye(10), atol=1e-5)
    assert torch.equal(model.head.bias, torch.zeros(10))
    _, _, _, again = flite(head="orthogonal")
    assert torch.equal(again.head.weight, W), "the head is regenerated from the factor seed"
    _, _, mt, _ = flite(defaults={})                                              # lightfed's default: trained, sent
    assert set(mt.up_schema()) == {"z", "head.weight", "head.bias"}
    assert mt.opts.r == 20 and mt.up_schema()["z"].codec == "int4"


@pytest.mark.parametrize("codec", ["int4", "int8"])
def test_latent_round_trip_on_the_wire(codec):
    _, _, m, model = flite(codec=codec)
    K = model.z.numel()
    z = torch.randn(K, generator=torch.Generator().manual_seed(5))
    blob = encode({"z": z}, m.up_schema(), kind="flite/up")
    qmax = 7 if codec == "int4" else 127
    payload = (K + 1) // 2 if codec == "int4" else K
    # header 8, name "z" 2, type/codec/ndim 3, one varint dim (K >= 128: 2 B), scale 4, CRC 4
    assert len(blob) == encoded_size(m.up_schema(), "flite/up") == payload + 23
    up = encode({"z": z, P.EXAMPLES: 80}, P.up_schema(m), kind="flite/up")   # + the sample count: 8 B
    assert len(up) - payload == 31      # < 5% from 1,240 int4 latents on (MiniLM: 1,296), see test_wire
    back = decode(blob, m.up_schema(), kind="flite/up", max_bytes=10**6)["z"]
    assert (back - z).abs().max() <= z.abs().max() / qmax / 2 + 1e-7


def test_latents_at_int4g_carry_a_scale_per_group_of_32_and_stochastic_rounding_stays_on_its_grid():
    """codec = int4g: the latents' int4 codes with one scale per 32 (a layer of small latents is not rounded against
    another layer's large ones); the client's stochastic rounding lands on values the wire then carries exactly."""
    from lightfed.wire.quantize import GROUP, payload_nbytes
    _, cfg, m, model = flite(codec="int4g", stochastic=True)
    K = model.z.numel()
    z = torch.randn(K, generator=torch.Generator().manual_seed(5)) * torch.logspace(-3, 0, K)   # layers of all sizes
    blob = encode({"z": z}, m.up_schema(), kind="flite/up")
    # header 8, name "z" 2, type/codec/ndim 3, one varint dim (K >= 128: 2 B), no scale in the head, CRC 4
    assert len(blob) == encoded_size(m.up_schema(), "flite/up") == payload_nbytes("int4g", K) + 19
    back = decode(blob, m.up_schema(), kind="flite/up", max_bytes=10**6)["z"]
    step = torch.cat([z, z.new_zeros(-K % GROUP)]).view(-1, GROUP).abs().amax(1).repeat_interleave(GROUP)[:K] / 7
    assert ((back - z).abs() <= step / 2 * (1 + 1e-6)).all()
    assert (back != 0).float().mean() > 0.8          # one scale for all (int4) would zero most of the small layers
    on_grid = m._round({"z": z}, torch.Generator().manual_seed(1))["z"]            # the client's stochastic rounding
    assert not torch.equal(on_grid, back)
    again = decode(encode({"z": on_grid}, m.up_schema(), kind="flite/up"), m.up_schema(), kind="flite/up",
                   max_bytes=10**6)["z"]
    assert torch.equal(again, on_grid)


def test_client_update_changes_only_z_and_stochastic_rounding_is_on_the_grid():
    T, cfg, m, model = flite(codec="int4", stochastic=True)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    state = m.init_state(model)
    state["z"] = torch.randn(model.z.shape, generator=torch.Generator().manual_seed(0)) * 0.1
    down = P.broadcast(m, state, 1)
    ctx = ClientContext(0, 1, 123, cfg, T.loss, {})
    up, stats = P.client_round(m, model, down, subset(T.train, range(16)), ctx, cfg.max_message_bytes)
    assert len(up) == encoded_size(P.up_schema(m), "flite/up") and stats["steps"] == 2
    after = model.state_dict()
    assert set(after) == set(before)
    assert [k for k in after if not torch.equal(after[k], before[k])] == ["z"]
    # the client's stochastic rounding leaves values the wire's nearest rounding keeps exactly
    z_up = decode(up, P.up_schema(m), kind="flite/up", max_bytes=10**6)["z"]
    trained = model.z.detach()
    fields, _ = m.client_update(model, decode(down, m.down_schema(), kind="flite/down", max_bytes=10**6),
                                subset(T.train, range(16)), ClientContext(0, 1, 123, cfg, T.loss, {}))
    assert torch.equal(fields["z"], z_up)
    assert not torch.equal(z_up, trained) and (z_up - trained).abs().max() <= trained.abs().max() / 7 + 1e-6


def test_stochastic_rounding_is_unbiased():
    from lightfed.seeds import generator
    _, _, m, _ = flite(codec="int4", stochastic=True)
    z = torch.linspace(-1, 1, 64)
    mean = sum(m._round({"z": z}, generator(0, i))["z"] for i in range(400)) / 400
    assert (mean - z).abs().max() < 0.05                  # nearest rounding is off by up to 1/14
    assert torch.equal(m.broadcast({"z": z}, 3)["z"], m.broadcast({"z": z}, 3)["z"])
    assert not torch.equal(m.broadcast({"z": z}, 3)["z"], m.broadcast({"z": z}, 4)["z"])


def test_quantised_flite_is_evaluated_as_the_clients_receive_it(tmp_path):
    """int4 latents: the run's metric is that of the model built from the dequantised broadcast (what a
    client holds), not of the server's fp32 mean z."""
    import json
    from lightfed.engine import local
    from lightfed.engine import protocol as P
    tiny_task("austen")      # perplexity: a continuous metric, so any other z shows
    cfg = tiny_config("austen", "flite", tmp_path, rounds=1, method_options={"codec": "int4"})
    s = local.run(cfg, log=lambda *a: None)
    S = local.build(cfg)
    _, state, _, _ = local.load_checkpoint(tmp_path)
    got = P.received(S.method, state, 2, cfg.max_message_bytes)
    assert not torch.equal(got["z"], state["z"]), "int4 must round the mean z"
    S.method.load(S.model, got)
    assert S.task.evaluate(S.model, S.task.test) == s["final"]
    S.method.load(S.model, state)
    assert S.task.evaluate(S.model, S.task.test) != s["final"]
    assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])["perplexity"] == s["final"]


def test_setup_and_summary_report_the_latent_and_the_one_time_cost(tmp_path):
    from conftest import tiny_config
    from lightfed.engine import local
    s = local.run(tiny_config("sentiment", "flite", tmp_path, rounds=1), log=lambda *a: None)
    setup = json.loads((tmp_path / "setup.json").read_text())["method"]
    assert setup == s["method_info"]
    head = sum(p.numel() for p in tiny_task("sentiment").model.head.parameters())     # the default: trained, sent
    assert setup["head"] == "trainable" and setup["latent"] + head == s["trainable_params"]
    assert 0 < setup["live"] <= setup["latent"]
    assert setup["factor_bytes"] > 0 and setup["one_time"]["factor_seed_bytes"] == 8
    assert setup["one_time"]["pretrained_bytes_held_by_every_party"] >= 4 * (s["model_params"] - setup["latent"])


def test_the_engine_s_mean_of_latents_is_fedavg_of_the_generated_weights(tmp_path):
    """One round, two clients, through the in-process engine: the new global z is the n_k-weighted mean of
    the two uploads, and the weights it generates are FedAvg of the weights each client's z generates."""
    from lightfed.engine import local
    from lightfed.engine import protocol as P
    cfg = tiny_config("sentiment", "flite", tmp_path, clients=2, fraction=1.0, rounds=1,
                      method_options={"codec": "fp32"}, partition="dirichlet:0.5")   # unequal n_k
    ups = {}
    local.run(cfg, tamper=lambda rnd, cid, up: ups.setdefault(cid, up), log=lambda *a: None)
    S = local.build(cfg)
    got = [decode(ups[c], P.up_schema(S.method), kind="flite/up", max_bytes=10**7) for c in sorted(ups)]
    n = torch.tensor([float(f.pop(P.EXAMPLES)) for f in got], dtype=torch.float64)
    assert len(got) == 2 and n[0] != n[1] and not torch.equal(got[0]["z"], got[1]["z"])
    _, state, _, _ = local.load_checkpoint(tmp_path)
    w = n / n.sum()
    for k in state:                                          # z, and the trained head (FedAvg's mean too)
        mean = sum(wk * f[k].double() for wk, f in zip(w, got))
        assert torch.allclose(state[k].double(), mean, atol=1e-6), k
    model = S.model
    each = [latent.materialize(model, f["z"].double(), torch.float64) for f in got]
    new = latent.materialize(model, state["z"].double(), torch.float64)
    assert new and all(torch.allclose(new[k], sum(wk * e[k] for wk, e in zip(w, each)), atol=1e-6) for k in new)


@pytest.mark.parametrize("delta", [False, True])
def test_int4_keeps_a_round_s_small_move_only_when_the_move_is_uploaded(delta):
    """|z| large (ResNet-18: ~50) and a round's move small: the absolute int4 upload rounds the trained z back to
    the broadcast's codes and the server's z stays put; uploading z_k - z^t (delta) keeps the move, and the server
    adds it to its own fp32 z."""
    T, cfg, m, model = flite(codec="int4", delta=delta)
    state = m.init_state(model)
    state["z"] = torch.randn(model.z.shape, generator=torch.Generator().manual_seed(0)) * 50
    down = decode(P.broadcast(m, state, 1), m.down_schema(), kind="flite/down", max_bytes=10**6)
    data, ctx = subset(T.train, range(16)), ClientContext(0, 1, 123, cfg, T.loss, {})
    fields, _ = m.client_update(model, down, data, ctx)
    move = model.z.detach() - down["z"]                              # what the client's training did
    assert 0 < move.abs().max() < state["z"].abs().max() / 14       # under half an int4 step of z
    up, _ = P.client_round(m, model, P.broadcast(m, state, 1), data, ctx, cfg.max_message_bytes)
    got = decode(up, P.up_schema(m), kind="flite/up", max_bytes=10**6)
    n = float(got.pop(P.EXAMPLES))
    new = m.aggregate(state, [(got, n), (got, n)], 1)["z"]
    if delta:
        assert torch.allclose(fields["z"], move)
        assert (new - state["z"] - move).norm() / move.norm() < 0.2       # int4's error on the move itself
    else:
        def codes(x):
            return torch.round(x / (x.abs().max() / 7))
        assert torch.equal(codes(got["z"]), codes(down["z"]))            # the trained z rounds back to its codes
        assert torch.equal(codes(new), codes(down["z"]))                  # and the server's z with it: no move


@pytest.mark.parametrize("codec,delta", [("fp32", False), ("int4g", False), ("int4g", True)])
def test_the_server_step_scales_the_clients_mean_move_from_what_they_started_at(codec, delta):
    """server_lr = 1 is the clients' mean; server_lr = 2.5 moves from the decoded broadcast (delta: the server's fp32
    z) by 2.5 times the mean move, so the move the clients agree on counts for more."""
    news = {}
    for lr in (1.0, 2.5):
        T, cfg, m, model = flite(codec=codec, delta=delta, server_lr=lr)
        state = m.init_state(model)
        state["z"] = torch.randn(model.z.shape, generator=torch.Generator().manual_seed(0))
        ups = []
        for cid in (0, 1):
            ctx = ClientContext(cid, 1, 100 + cid, cfg, T.loss, {})
            up, _ = P.client_round(m, model, P.broadcast(m, state, 1), subset(T.train, range(8 * cid, 8 * cid + 16)),
                                   ctx, cfg.max_message_bytes)
            f = decode(up, P.up_schema(m), kind="flite/up", max_bytes=10**6)
            ups.append((f, float(f.pop(P.EXAMPLES))))
        news[lr] = m.aggregate(state, ups, 1)["z"]
    start = state["z"] if delta else decode(P.broadcast(m, state, 1), m.down_schema(), kind="flite/down", max_bytes=10**6)["z"]
    move = news[1.0] - start
    assert move.norm() > 0 and (codec == "fp32" or delta or not torch.equal(start, state["z"]))   # int4g rounds z^t
    assert torch.allclose(news[2.5], start + 2.5 * move, atol=1e-5)


def test_a_server_step_out_of_range_is_refused_before_any_work():
    from lightfed.config import ConfigError
    for bad in (0.0, -1.0, 1000.0):
        with pytest.raises(ConfigError, match="server_lr"):
            flite(server_lr=bad)


def test_differential_privacy_clips_the_same_move_whether_z_or_its_move_is_uploaded():
    """privacy.py clips an upload's change from what the client received; FLITE's delta upload is that change
    already, so both uploads report the same norm and, clipped, carry the same server z."""
    got = {}
    for delta in (False, True):
        T, cfg, m, model = flite(codec="fp32", delta=delta)
        cfg = cfg.__class__(**{**cfg.to_dict(), "dp_clip": 1e-3})           # far under the move: it clips
        state = m.init_state(model)
        state["z"] = torch.randn(model.z.shape, generator=torch.Generator().manual_seed(0))
        ctx = ClientContext(0, 1, 123, cfg, T.loss, {})
        up, stats = P.client_round(m, model, P.broadcast(m, state, 1), subset(T.train, range(16)), ctx, cfg.max_message_bytes)
        fields = decode(up, P.up_schema(m), kind="flite/up", max_bytes=10**6)
        n = float(fields.pop(P.EXAMPLES))
        got[delta] = stats["dp_norm"], stats["dp_clipped"], m.aggregate(state, [(fields, n)], 1)["z"]
        assert (got[delta][2] - state["z"]).norm() <= 1e-3 * 1.01       # clipped to C (fp32 z of norm ~30)
    assert got[True][0] == pytest.approx(got[False][0], rel=1e-6) and got[True][1] and got[False][1]
    assert torch.allclose(got[True][2], got[False][2], atol=1e-6)
