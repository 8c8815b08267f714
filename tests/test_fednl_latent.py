"""FedNL's rules as FLITE latents (issue 48, item 3): theta = theta_0 + map(z), z the only thing trained and sent. On
the tiny passkey twin: z = 0 is plain FedNL's start; the upload is z alone; averaging z averages theta; z learns what
theta learns on a toy; the export bakes theta into the plain layout that `lightfed.load` reads."""
import copy

import pytest
import torch

from conftest import TINY, tiny_config, tiny_task
from lightfed import load, methods
from lightfed import config as C
from lightfed.data.tensors import batches
from lightfed.engine import local
from lightfed.engine import protocol as P
from lightfed.models import streaming
from lightfed.models.backbones import seeded
from lightfed.tasks import passkey as PK

TASK = {**TINY["passkey"], "lengths": "2,3", "depths": "0,0.5,1", "test_per_cell": 3}


def built(**opts):
    T = tiny_task("passkey")
    cfg = tiny_config("passkey", "fednl", method_options={"gate": 0.5, **opts}, task_options=TASK)
    m = methods.build(cfg)
    with seeded(0):
        model = m.prepare(copy.deepcopy(T.model))
    return T, cfg, m, model


def test_latents_start_at_plain_fednl_and_are_all_that_trains_and_travels():
    T, cfg, plain, base = built()
    _, _, m, model = built(latent_r=2, codec="int4")
    theta = plain.trainable(base)
    assert set(m.trainable(model)) == {"z"} and set(m.up_schema()) == {"z"}
    mats, vecs = sum(p.dim() > 1 for p in theta.values()), sum(p.dim() == 1 for p in theta.values())
    K = model.z.numel()
    assert K == 4 * mats + 2 * vecs == m.info["latent"] and m.info["theta"] == sum(p.numel() for p in theta.values())
    assert torch.equal(model.z, torch.zeros(K))
    ids = next(batches(T.train, 2, torch.Generator().manual_seed(0)))["input_ids"]
    with torch.no_grad():
        a, b = streaming.hidden(base, ids, TASK.get("window", 64)), streaming.hidden(model, ids, TASK.get("window", 64))
    assert torch.equal(a, b), "z = 0 is plain FedNL's theta_0"
    blob = P.broadcast(m, m.init_state(model), 1)
    assert len(blob) < 200 + K // 2                                   # int4 latents, not theta's floats


def test_averaging_latents_averages_the_rules():
    from torch.nn.utils import parametrize
    _, _, m, model = built(latent_r=2)
    where = [(mod, attr) for mod in model.modules() if parametrize.is_parametrized(mod) for attr in mod.parametrizations]
    assert len(where) == len(built()[2].trainable(built()[3]))          # every tensor of theta
    K = model.z.numel()
    zs = [torch.randn(K, generator=torch.Generator().manual_seed(s)) for s in (1, 2)]

    def theta(z):
        with torch.no_grad():
            model.z.copy_(z)
            return [getattr(mod, attr).detach().clone() for mod, attr in where]
    each, mean = [theta(z) for z in zs], theta((zs[0] + zs[1]) / 2)
    assert all(torch.allclose(t, (a + b) / 2, atol=1e-6) for t, a, b in zip(mean, *each))
    assert not all(torch.equal(a, b) for a, b in zip(*each))


def test_a_toy_latent_learns_what_theta_learns_and_more_latents_fit_closer():
    """A teacher: plain FedNL with its rules moved at random. Students fit its hidden states on the same streams, 25
    Adam steps: theta itself, and z at rank 4 and 8 (240 and 928 latents for theta's 2,700 floats on this twin). Every student's
    error falls; z's by less than theta's and by more with more latents (the map's span is what limits it)."""
    T, _, tm, teacher = built()
    with torch.no_grad():
        g = torch.Generator().manual_seed(3)
        for p in tm.trainable(teacher).values():
            p.add_(torch.randn(p.shape, generator=g) * 0.3 * (p.abs().mean() + 0.1))
    ids = next(batches(T.train, 4, torch.Generator().manual_seed(0)))["input_ids"]
    W = PK.Options(**TASK).window
    with torch.no_grad():
        target = streaming.hidden(teacher, ids, W)                                      # (4, T, d)
    fit = {}
    for name, opts in (("theta", {}), ("z r4", {"latent_r": 4}), ("z r8", {"latent_r": 8})):
        _, _, m, model = built(**opts)
        opt = torch.optim.Adam(list(m.trainable(model).values()), lr=3e-2)
        losses = []
        for _ in range(25):
            loss = (streaming.hidden(model, ids, W) - target).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        fit[name] = min(losses[-5:]) / losses[0]
    assert fit["theta"] < 0.4 and fit["z r8"] < 0.55 and fit["theta"] < fit["z r8"] < fit["z r4"] < 0.8, fit


def test_a_latent_fednl_run_exports_theta_in_the_plain_layout_and_loads(tmp_path):
    from lightfed import cli
    run = tmp_path / "run"
    local.run(tiny_config("passkey", "fednl", run, rounds=1, lr=5e-2, method_options={"gate": 0.5, "latent_r": 2},
                          task_options=TASK), log=lambda *a: None)
    S, _ = local.final_model(run)
    assert cli.main(["export", str(run), "--to", str(tmp_path / "x")]) == 0
    exported = load(tmp_path / "x")
    assert not hasattr(exported.model, "z")
    o = PK.Options(**TASK)
    ss = PK.streams(o, exported.tok, "eval")[:3]
    assert PK.scores(S.model, ss, o.window) == PK.scores(exported.model, ss, o.window)
    with torch.no_grad():
        a = streaming.hidden(S.model, ss[0].ids[None], o.window)
        b = streaming.hidden(exported.model, ss[0].ids[None], o.window)
    assert torch.allclose(a, b, atol=1e-5)


def test_gate_lr_is_refused_with_latents():
    with pytest.raises(C.ConfigError, match="gate_lr"):
        methods.options("fednl", {"latent_r": 2, "gate_lr": 1e-3})


def test_under_bf16_the_rules_stay_fp32_as_plain_fednls_do():
    """device.place with bf16 turns frozen weights to bfloat16, but not theta_0 under the map: theta is fp32 as the
    plain method's trainable theta is, so a small step of z is not rounded away."""
    from torch.nn.utils import parametrize
    from lightfed import device
    _, _, m, model = built(latent_r=2)
    device.place(model, "cpu", "bf16")
    where = [(mod, attr) for mod in model.modules() if parametrize.is_parametrized(mod) for attr in mod.parametrizations]
    assert where and all(getattr(mod, attr).dtype == torch.float32 for mod, attr in where)
    assert any(p.dtype == torch.bfloat16 for p in model.parameters())            # the backbone did go to bf16
    mod, attr = where[0]
    before = getattr(mod, attr).detach().clone()
    with torch.no_grad():
        model.z.add_(1e-4)
    assert not torch.equal(getattr(mod, attr), before)
