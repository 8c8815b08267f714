"""ZO-FLITE: zeroth order in FLITE's latent space. The two-point estimate on a loss quadratic in z is the
directional derivative; the server's replay rebuilds the client's latent bit for bit; the uplink is
scalars, not latents."""
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from conftest import tiny_config, tiny_task
from lightfed import methods
from lightfed.data.tensors import subset
from lightfed.engine import protocol as P
from lightfed.methods.base import ClientContext
from lightfed.models import latent
from lightfed.optim import zeroth_order as zo
from lightfed.wire import decode


class Lin(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(12, 5)

    def forward(self, x):
        return self.lin(x)


def test_two_point_in_z_space_is_the_directional_derivative_of_a_quadratic():
    """y = x (W_pre + A Z B^T)^T is affine in z, so the MSE is quadratic in z: the central difference is exact."""
    torch.manual_seed(0)
    model = latent.install(Lin(), r=3, layers="linear", seed=11)
    with torch.no_grad():
        model.z.normal_()
    x, y = torch.randn(32, 12), torch.randn(32, 5)
    loss = lambda: F.mse_loss(model(x), y)          # noqa: E731
    seed, eps = zo.derive(7, 0, 0, 0), 1e-2
    g, _, _ = zo.two_point(loss, model, {"z": model.z}, seed, eps)
    u = zo.direction(seed, 0, model.z.shape)
    model.zero_grad()
    loss().backward()
    exact = float(model.z.grad @ u)
    assert abs(exact) > 1e-3 and abs(g - exact) < 1e-3 * abs(exact)


def test_the_server_replays_the_clients_latent_bit_for_bit_and_the_uplink_is_scalars():
    T = tiny_task("sentiment")
    cfg = tiny_config("sentiment", "zoflite", lr=1e-2, method_options={"P": 2})
    m = methods.build(cfg)
    model = m.prepare(copy.deepcopy(T.model))
    assert m.names == ["z"] and m.shapes == {"z": (model.z.numel(),)}
    state = m.init_state(model)
    up, stats = P.client_round(m, model, P.broadcast(m, state, 1), subset(T.train, range(16)),
                               ClientContext(0, 1, 5, cfg, T.loss, {}), cfg.max_message_bytes)
    f = decode(up, P.up_schema(m), kind="zoflite/up", max_bytes=10**6)
    assert f["g"].shape == (2, 2) and len(up) < 100 < 4 * model.z.numel()     # K x P scalars, not K latents
    rebuilt = m.replay(state, 1, f)
    assert torch.equal(rebuilt["z"], model.z.detach()) and not torch.equal(rebuilt["z"], state["z"])
    new, report = P.aggregate(m, state, [(0, up)], 1, max_bytes=cfg.max_message_bytes)
    assert report["accepted"] == 1 and torch.equal(new["z"], rebuilt["z"])
    frozen = [p for n, p in model.named_parameters() if n != "z"]
    assert all(not p.requires_grad for p in frozen)


def test_shifted_slices_give_the_directional_derivative_and_restore_z_bit_for_bit():
    """zo.shifted on views (slices) of z: the central difference on a quadratic in z is the exact directional
    derivative along the slice's direction, and z is bit-identical after each context."""
    model = latent.install(Lin(), r=3, layers="linear", seed=11)
    with torch.no_grad():
        model.z.normal_(generator=torch.Generator().manual_seed(3))
    before = model.z.detach().clone()
    x, y = torch.randn(32, 12), torch.randn(32, 5)
    loss = lambda: F.mse_loss(model(x), y)          # noqa: E731
    block = {"z[2:7]": model.z.detach()[2:7]}
    seed, eps = zo.derive(9, 0, 2, 1), 1e-2
    g, _, _ = zo.two_point(loss, model, block, seed, eps, in_place=True)
    assert torch.equal(model.z.detach(), before)
    u = torch.zeros_like(model.z)
    u[2:7] = zo.direction(seed, 0, (5,))
    model.zero_grad()
    loss().backward()
    exact = float(model.z.grad @ u)
    assert abs(exact) > 1e-3 and abs(g - exact) < 1e-3 * abs(exact)
    with zo.shifted(block, seed, 0.5):
        assert torch.equal(model.z.detach()[2:7], before[2:7] + 0.5 * u[2:7]) and torch.equal(model.z.detach()[:2], before[:2])
    assert torch.equal(model.z.detach(), before)


def test_split_zoflite_perturbs_f1_and_f2_slices_and_the_server_replays_them_bit_for_bit():
    T = tiny_task("sentiment")
    cfg = tiny_config("sentiment", "zoflite_split", lr=1e-2, method_options={"P1": 1, "Ps": 2, "head": "trainable"})
    m = methods.build(cfg)
    model = m.prepare(copy.deepcopy(T.model))
    K = model.z.numel()
    b = m.blocks()
    cover = sorted(tuple(map(int, n[2:-1].split(":"))) for blk in b.values() for n in blk if n.startswith("z["))
    assert cover[0][0] == 0 and cover[-1][1] == K and all(a[1] == c[0] for a, c in zip(cover, cover[1:]))
    f2_layers = [n for n, l in latent.latent_layers(model) if any(n2.startswith("z[") and int(n2[2:-1].split(":")[0]) <= l.lo < int(n2[2:-1].split(":")[1]) for n2 in b["theta2"])]
    assert f2_layers and all(".layer.1." in n for n in f2_layers), f2_layers    # the tiny twin has 2 layers; split = 1
    assert {"head.weight", "head.bias"} <= set(b["theta2"])
    state = m.init_state(model)
    up, stats = P.client_round(m, model, P.broadcast(m, state, 1), subset(T.train, range(16)),
                               ClientContext(0, 1, 5, cfg, T.loss, {}), cfg.max_message_bytes)
    f = decode(up, P.up_schema(m), kind="zoflite_split/up", max_bytes=10**6)
    assert f["g1"].shape == (2, 1) and f["g2"].shape == (2, 4) and len(up) < 120
    assert stats["forwards_per_step"] == {"f1": 2, "f2": 8}
    rebuilt = m.replay(state, 1, f)
    trained = m.trainable(model)
    assert all(torch.equal(rebuilt[n], trained[n].detach()) for n in m.names)
    z0 = state["z"]
    moved = rebuilt["z"] != z0
    lo2 = min(int(n[2:-1].split(":")[0]) for n in b["theta2"] if n.startswith("z["))
    assert moved[:lo2].any() and moved[lo2:].any(), "both blocks move"
    new, report = P.aggregate(m, state, [(0, up)], 1, max_bytes=cfg.max_message_bytes)
    assert report["accepted"] == 1 and torch.equal(new["z"], rebuilt["z"])
