"""Client-level DP (privacy.py): the accountant against known values, the clip and the noise's scale,
and runs through the engine for a dense method, FLITE's latent and a zeroth-order method."""
import json
import math

import pytest
import torch
from scipy.optimize import brentq
from scipy.stats import norm

from conftest import tiny_config
from lightfed import config as C
from lightfed import privacy
from lightfed.engine import local


def analytic_gaussian_epsilon(sigma: float, delta: float) -> float:
    """The exact epsilon of one Gaussian mechanism (sensitivity 1, std sigma) at delta (Balle & Wang 2018, Thm 8)."""
    d = lambda e: norm.cdf(0.5 / sigma - e * sigma) - math.exp(e) * norm.cdf(-0.5 / sigma - e * sigma)  # noqa: E731
    return brentq(lambda e: d(e) - delta, 0.0, 100.0)


@pytest.mark.parametrize("sigma", [0.8, 1.0, 2.0, 5.0])
def test_accountant_between_the_exact_gaussian_and_the_classic_rdp_bound(sigma):
    delta = 1e-5
    eps = privacy.gaussian_epsilon(sigma, 1.0, 1, delta)
    exact = analytic_gaussian_epsilon(sigma, delta)
    classic = min(a / (2 * sigma**2) + math.log(1 / delta) / (a - 1) for a in [1 + x / 100 for x in range(1, 20000)])
    assert exact <= eps <= classic + 1e-9, (exact, eps, classic)
    assert eps < 1.25 * exact               # RDP is close to exact for one Gaussian


def test_accountant_composition_and_subsampling():
    # T rounds of noise z without sampling = one round of noise z / sqrt(T) (Gaussian RDP adds up exactly)
    assert privacy.gaussian_epsilon(4.0, 1.0, 16, 1e-5) == pytest.approx(privacy.gaussian_epsilon(1.0, 1.0, 1, 1e-5), rel=1e-6)
    # sampling amplifies; more rounds cost more
    assert privacy.gaussian_epsilon(1.0, 0.1, 10, 1e-5) < privacy.gaussian_epsilon(1.0, 1.0, 10, 1e-5)
    assert privacy.gaussian_epsilon(1.0, 0.1, 10, 1e-5) < privacy.gaussian_epsilon(1.0, 0.1, 20, 1e-5)


def test_privatize_clips_to_C_and_adds_noise_of_the_stated_scale():
    cfg = tiny_config("sentiment", "fedavg", clients=4, fraction=1.0, dp_clip=1.0, dp_noise=0.0)
    recv = {"a": torch.zeros(1000), "b": torch.ones(10, 10)}
    big = {"a": torch.full((1000,), 0.5), "b": torch.ones(10, 10) * 2}
    out, st = privacy.privatize(big, recv, cfg, client_seed=3)
    d = torch.cat([(out["a"] - recv["a"]).flatten(), (out["b"] - recv["b"]).flatten()])
    assert st["dp_clipped"] and d.norm().item() == pytest.approx(1.0, rel=1e-5)
    assert torch.allclose(d / d.norm(), torch.cat([torch.full((1000,), 0.5), torch.ones(100)]) / math.sqrt(350), atol=1e-6)
    small = {"a": torch.full((1000,), 1e-3), "b": torch.ones(10, 10)}
    out, st = privacy.privatize(small, recv, cfg, 3)
    assert not st["dp_clipped"] and all(torch.equal(out[k], small[k]) for k in small)
    noisy = C.from_dict({"dp_noise": 2.0}, cfg)
    out1, _ = privacy.privatize(small, recv, noisy, 3)
    out2, _ = privacy.privatize(small, recv, noisy, 3)
    assert all(torch.equal(out1[k], out2[k]) for k in small), "seeded: reproducible"
    std = (out1["a"] - small["a"]).std().item()
    assert std == pytest.approx(2.0 * 1.0 / math.sqrt(4), rel=0.1)     # z C / sqrt(m), m = 4 clients per round
    osrc = C.from_dict({"dp_seeded": False}, noisy)
    assert not torch.equal(privacy.privatize(small, recv, osrc, 3)[0]["a"], privacy.privatize(small, recv, osrc, 3)[0]["a"])


@pytest.mark.parametrize("method", ["fedavg", "flite"])
def test_a_dp_run_reports_epsilon_every_round_and_is_reproducible(tmp_path, method):
    kw = dict(rounds=2, clients=4, fraction=0.5, dp_clip=0.5, dp_noise=1.0)
    a = local.run(tiny_config("sentiment", method, tmp_path / "a", **kw), log=lambda *x: None)
    b = local.run(tiny_config("sentiment", method, tmp_path / "b", **kw), log=lambda *x: None)
    local.run(tiny_config("sentiment", method, tmp_path / "p", rounds=2), log=lambda *x: None)
    recs = [json.loads(l) for l in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()][1:]
    eps = [r["dp"]["epsilon"] for r in recs]
    assert eps[0] < eps[1] and a["dp"]["epsilon"] == eps[1] == privacy.gaussian_epsilon(1.0, 0.5, 2, 1e-5)
    assert a["dp"]["epsilon_message"] > a["dp"]["epsilon"]        # one message alone carries noise z / sqrt(m)
    assert all("dp_norm" in c for r in recs for c in r["clients"])
    assert a["history"] == b["history"] and a["bytes"] == b["bytes"]
    ckpt = lambda o: local.load_checkpoint(o)[1]                      # noqa: E731
    sa, sp = ckpt(tmp_path / "a"), ckpt(tmp_path / "p")
    assert any(not torch.equal(sa[k], sp[k]) for k in sa), "the noise reached the model"


def test_zeroth_order_dp_clips_each_step_and_the_replay_still_matches(tmp_path):
    kw = dict(rounds=1, clients=2, fraction=1.0, local_steps=4, dp_clip=1e-3, dp_noise=0.0)
    s = local.run(tiny_config("sentiment", "mezo", tmp_path, **kw), log=lambda *x: None)
    rec = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()][1]
    assert rec["accepted"] == 2 and not rec["rejected"], "the server's replay matched the client's noised steps"
    assert all(c["dp_clipped_steps"] == 4 for c in rec["clients"])
    assert s["dp"]["epsilon"] is None and "no guarantee" in s["dp"]["note"]
    noisy = local.run(tiny_config("sentiment", "fedspzo", tmp_path / "spzo", **{**kw, "dp_noise": 1.0}), log=lambda *x: None)
    assert noisy["bytes"]["rejected_messages"] == 0 and noisy["dp"]["epsilon"] > 0


def test_dp_config_errors_name_the_problem():
    with pytest.raises(C.ConfigError, match="compresses"):
        local.check(tiny_config("sentiment", "topk", dp_clip=1.0))
    with pytest.raises(C.ConfigError, match="needs dp_clip"):
        local.check(tiny_config("sentiment", "fedavg", dp_noise=1.0))
