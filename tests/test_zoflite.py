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
    cfg = tiny_config("sentiment", "zoflite", method_options={"P": 2, "lr": 1e-2})
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
