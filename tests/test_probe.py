"""The federated closed-form probe and `init` (LP-then-FT): pooled statistics whatever the partition,
a real MiniLM head above chance from one round, and a run that starts from it."""
import json

import pytest
import torch

from conftest import tiny_config, tiny_task
from lightfed import config as C
from lightfed import methods
from lightfed.engine import local


def _fields(m, feats, labels):
    onehot = torch.nn.functional.one_hot(labels, m.C).double()
    return {"sum": (onehot.T @ feats).float(), "sq": (onehot.T @ (feats * feats).sum(1)).float(), "count": onehot.sum(0).float()}


def test_the_head_is_the_gaussian_discriminant_of_the_pooled_data_whatever_the_split():
    m = methods.build(tiny_config("sentiment", "probe"))
    m.C, m.d = 2, 3
    g = torch.Generator().manual_seed(0)
    mu = torch.tensor([[2.0, 0.0, 0.0], [-2.0, 1.0, 0.0]], dtype=torch.float64)
    y = torch.randint(0, 2, (400,), generator=g)
    x = mu[y] + 0.5 * torch.randn(400, 3, generator=g, dtype=torch.float64)
    pooled = m.aggregate({}, [(_fields(m, x, y), 400.0)], 1)
    by_label = m.aggregate({}, [(_fields(m, x[y == c], y[y == c]), 1.0) for c in (0, 1)], 1)   # one class per client
    assert all(torch.allclose(pooled[k], by_label[k], atol=1e-5) for k in pooled)
    # by hand: class means, within-class variance per dimension, W = (mu_c - mu) / var
    mc = torch.stack([x[y == c].mean(0) for c in (0, 1)])
    n = torch.tensor([(y == c).sum() for c in (0, 1)], dtype=torch.float64)
    mean = (n[:, None] * mc).sum(0) / 400
    var = sum(((x[y == c] - mc[c]) ** 2).sum() for c in (0, 1)) / (400 * 3)
    assert torch.allclose(pooled["head.weight"].double(), (mc - mean) / var, atol=1e-4)
    acc = ((x.float() @ pooled["head.weight"].T + pooled["head.bias"]).argmax(1) == y).float().mean()
    assert acc > 0.95


def test_a_class_no_client_holds_is_never_predicted():
    m = methods.build(tiny_config("sentiment", "probe"))
    m.C, m.d = 3, 2
    x, y = torch.randn(20, 2, dtype=torch.float64), torch.randint(0, 2, (20,))
    h = m.aggregate({}, [(_fields(m, x, y), 20.0)], 1)
    assert torch.all(h["head.weight"][2] == 0) and h["head.bias"][2] < -1e3


def test_probe_then_zeroth_order_starts_from_the_probe_and_reports_its_cost(tmp_path):
    tiny_task("sentiment")
    p = local.run(tiny_config("sentiment", "probe", tmp_path / "probe", rounds=1, clients=4, fraction=1.0), log=lambda *a: None)
    assert p["bytes"]["up_per_client_round"] < 2000 and p["flops"]["client_total"] > 0
    s = local.run(tiny_config("sentiment", "fedspzo", tmp_path / "zo", rounds=1, init=str(tmp_path / "probe")), log=lambda *a: None)
    assert s["initial"] == p["final"], "round 0 of the ZO run is the probed model"
    init = json.loads((tmp_path / "zo" / "setup.json").read_text())["init"]
    assert init["method"] == "probe" and init["up_total"] == p["bytes"]["up_total"] and init["client_flops"] > 0
    assert s["init"] == init
    with pytest.raises(C.ConfigError, match="no finished run"):
        local.check(tiny_config("sentiment", "fedspzo", init=str(tmp_path / "nothing")))
    local.run(tiny_config("sentiment", "flite", tmp_path / "flite", rounds=1), log=lambda *a: None)
    with pytest.raises(C.ConfigError, match="not tensors of this model"):       # FLITE's state is its latent z
        local.run(tiny_config("sentiment", "fedspzo", tmp_path / "bad", rounds=1, init=str(tmp_path / "flite")), log=lambda *a: None)


@pytest.mark.slow
def test_a_probe_on_real_minilm_is_far_above_chance(tmp_path):
    opts = {"train_size": 400, "test_size": 400, "max_len": 48}
    cfg = C.from_dict({"task": "sentiment", "method": "probe", "clients": 4, "rounds": 1, "partition": "dirichlet:0.5",
                       "batch_size": 64, "progress": False, "task_options": opts, "out": str(tmp_path)})
    s = local.run(cfg, log=lambda *a: None)
    assert s["final"] > 0.65 and s["final"] > s["initial"] + 0.1, (s["initial"], s["final"])


def test_zo_flite_keeps_a_probed_head(tmp_path):
    tiny_task("sentiment")
    p = local.run(tiny_config("sentiment", "probe", tmp_path / "probe", rounds=1), log=lambda *a: None)
    s = local.run(tiny_config("sentiment", "zoflite", tmp_path / "zo", rounds=1, init=str(tmp_path / "probe"),
                              method_options={"head": "keep"}), log=lambda *a: None)
    assert s["initial"] == p["final"] and s["trainable_params"] == s["method_info"]["latent"]
