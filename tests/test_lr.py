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


def test_flite_head_lr_trains_the_head_at_its_own_lr_and_is_refused_without_a_trained_head(tmp_path, monkeypatch):
    tiny_task("sentiment")
    seen = _lr_seen(monkeypatch)
    s = local.run(tiny_config("sentiment", "flite", tmp_path, rounds=1, lr=0.5,
                              method_options={"head": "trainable", "head_lr": 2e-3}), log=lambda *a: None)
    assert seen and all(groups == [0.5, 2e-3] for groups in seen)
    assert s["lr"] == {"z": 0.5, "head": 2e-3} == json.loads((tmp_path / "setup.json").read_text())["lr"]
    with pytest.raises(C.ConfigError, match=r"head_lr = 0.002 trains nothing with head = 'orthogonal'"):
        local.check(tiny_config("sentiment", "flite", method_options={"head": "orthogonal", "head_lr": 2e-3}))


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
    assert "flite          lr 0.01;" in out and "fednl          lr 0.01, lr_decay cosine;" in out and "vera           lr 0.005;" in out
    assert "--set lr=X always wins" in out
    assert "the head frozen (orthogonal), not trained as flite's" in out     # zoflite says why its defaults differ


def test_help_prints_the_examples_unmangled(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "dirichlet:0.1 \\\n                 --opt mu=0.01" in out


def test_cosine_lr_decay_scales_every_group_per_round_and_the_stats_say_so(tmp_path, monkeypatch):
    """lr_decay = cosine: round r of R trains every parameter group at lr x 0.5 (1 + cos(pi (r - 1) / R))."""
    tiny_task("austen")
    seen = _lr_seen(monkeypatch)
    s = local.run(tiny_config("austen", "fednl", tmp_path, rounds=3, fraction=1.0, clients=2, lr=1e-2,
                              lr_decay="cosine", method_options={"gate_lr": 2e-2}), log=lambda *a: None)
    scales = [1.0, 0.75, 0.25]                       # 0.5 (1 + cos(0)), 0.5 (1 + cos(pi/3)), 0.5 (1 + cos(2 pi/3))
    want = [[1e-2 * k, 2e-2 * k] for k in scales for _ in range(2)]    # 2 clients a round, two groups each
    assert [[round(x, 12) for x in g] for g in seen] == [[round(x, 12) for x in g] for g in want]
    hist = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [[round(c["lr_scale"], 12) for c in h["clients"]] for h in hist if h["round"] > 0] == [[k, k] for k in scales]
    assert json.loads((tmp_path / "config.json").read_text())["lr_decay"] == "cosine"
    assert s["lr"] == {"rules": 1e-2, "gate": 2e-2}        # the lrs asked for; the rounds' factor is in the stats


def test_lr_decay_never_reaches_zero_and_is_one_without_decay():
    cfg = tiny_config("sentiment", "fedavg", rounds=10, lr_decay="cosine")
    xs = [C.round_lr_scale(cfg, r) for r in range(1, 11)]
    assert xs[0] == 1.0 and all(a > b for a, b in zip(xs, xs[1:])) and xs[-1] > 0
    assert C.round_lr_scale(tiny_config("sentiment", "fedavg", rounds=10), 7) == 1.0


def test_lr_decay_is_refused_where_the_server_replays_the_lr_and_a_bad_name_fails_early():
    with pytest.raises(C.ConfigError, match=r"lr_decay = 'cosine': fedspzo keeps one lr.*first-order methods: fedavg"):
        methods.build(tiny_config("sentiment", "fedspzo", lr_decay="cosine"))
    with pytest.raises(C.ConfigError, match=r"lr_decay = 'linear': use none or cosine"):
        local.check(tiny_config("sentiment", "fedavg", lr_decay="linear"))


def test_a_run_that_sets_no_lr_decay_takes_the_methods_and_an_explicit_one_wins(tmp_path):
    tiny_task("austen")
    for given, want in (("", "cosine"), ("none", "none")):
        out = tmp_path / (given or "unset")
        s = local.run(tiny_config("austen", "fednl", out, rounds=2, lr_decay=given), log=lambda *a: None)
        assert json.loads((out / "config.json").read_text())["lr_decay"] == want
        hist = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
        scales = {c["lr_scale"] for h in hist if h["round"] == 2 for c in h["clients"]}
        assert scales == ({0.5} if want == "cosine" else {1.0}), scales
    assert methods.build(tiny_config("sentiment", "fedspzo")).cfg.lr_decay == "none"   # zeroth order: never decays


def test_a_flower_nodes_config_digest_is_the_same_before_and_after_the_method_fills_in_lr_and_lr_decay():
    """The server digests its config after building the method (lr, lr_decay resolved), a node before: one digest."""
    pytest.importorskip("flwr")
    from lightfed.engine.flower.config import digest
    for name in ("fedavg", "fednl", "fedspzo"):
        unset = tiny_config("austen" if name == "fednl" else "sentiment", name, lr=0.0, lr_decay="")
        built = methods.build(tiny_config("austen" if name == "fednl" else "sentiment", name, lr=0.0, lr_decay="")).cfg
        assert (unset.lr, unset.lr_decay) == (0.0, "") and digest(unset) == digest(built), name
    assert digest(tiny_config("sentiment", "fedavg", lr_decay="cosine")) != digest(tiny_config("sentiment", "fedavg"))
