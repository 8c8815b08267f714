"""The run's lr: an explicit one always trains, an unset one (0) takes the method's recommended lr, and the
results folder records the lr that trained each parameter group (review defect 1: flite, fednl and vera used
to replace the run's lr with their own option, while config.json recorded the lr the user asked for)."""
import json

import pytest
import torch

from conftest import tiny_config, tiny_task
from lightfed import cli, config as C, methods
from lightfed.engine import local


def _lr_seen(monkeypatch):
    """Record the lr of every parameter group the first-order optimizer is built with."""
    seen = []
    real = torch.optim.AdamW

    class Spy(real):
        def __init__(self, params, *a, **kw):
            super().__init__(params, *a, **kw)
            seen.append([g["lr"] for g in self.param_groups])

    monkeypatch.setattr(torch.optim, "AdamW", Spy)
    return seen


@pytest.mark.parametrize("method,task", [("flite", "sentiment"), ("vera", "sentiment"), ("fednl", "austen"),
                                         ("fedavg", "sentiment"), ("lora", "austen")])
def test_an_explicit_run_lr_trains_and_is_recorded(tmp_path, monkeypatch, method, task):
    tiny_task(task)
    seen = _lr_seen(monkeypatch)
    s = local.run(tiny_config(task, method, tmp_path, rounds=1, lr=3.7e-4), log=lambda *a: None)
    assert seen and all(lr == 3.7e-4 for groups in seen for lr in groups)
    assert json.loads((tmp_path / "config.json").read_text())["lr"] == 3.7e-4
    assert set(s["lr"].values()) == {3.7e-4} and json.loads((tmp_path / "setup.json").read_text())["lr"] == s["lr"]


@pytest.mark.parametrize("method,task", [("flite", "sentiment"), ("fednl", "austen"), ("lora", "austen")])
def test_no_run_lr_means_the_methods_recommended_one_and_config_json_says_which(tmp_path, monkeypatch, method, task):
    tiny_task(task)
    seen = _lr_seen(monkeypatch)
    cfg = tiny_config(task, method, tmp_path, rounds=1)
    cfg.lr = 0.0
    local.run(cfg, log=lambda *a: None)
    rec = methods.METHODS[method].lr
    assert all(lr == rec for groups in seen for lr in groups)
    saved = json.loads((tmp_path / "config.json").read_text())["lr"]
    assert saved == rec
    # rerunning the saved config trains at the same lr (the run is reproducible from config.json)
    assert C.load_json(tmp_path / "config.json").lr == rec


def test_zeroth_order_methods_take_the_run_lr(tmp_path):
    for name in ("mezo", "fedspzo", "decomfl", "zoflite"):
        m = methods.build(tiny_config("sentiment", name, lr=2.5e-3))
        assert set(m.lrs().values()) == {2.5e-3}, name
    m = methods.build(tiny_config("sentiment", "fedspzo", lr=2.5e-3, method_options={"lr2": 1e-4}))
    assert m.lrs() == {"g1": 2.5e-3, "g2": 1e-4}


def test_a_method_option_lr_is_refused_with_where_the_lr_goes():
    with pytest.raises(C.ConfigError, match=r"run's setting \(--set lr=X.*flite recommends 0.01"):
        local.check(tiny_config("sentiment", "flite", method_options={"lr": 1e-2}))


def test_lightfed_list_shows_each_methods_recommended_lr(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert "flite          lr 0.01;" in out and "fednl          lr 0.01;" in out and "vera           lr 0.005;" in out
    assert "--set lr=X always wins" in out
    assert "the head frozen (orthogonal), not trained as flite's" in out     # zoflite says why its defaults differ


def test_help_prints_the_examples_unmangled(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "dirichlet:0.1 \\\n                 --opt mu=0.01" in out
