"""What a user hits first (issue 45): resume wherever the folder lives, no flag silently ignored, the main job kept
by --seed / --out, settings a method cannot honour refused, training needles placed by chunk index."""
import copy
import json
import shutil

import numpy as np
import pytest
import torch

from conftest import tiny_config, tiny_task
from lightfed import cli
from lightfed import config as C
from lightfed import methods
from lightfed.cli import main
from lightfed.engine import local
from safetensors.torch import load_file


def _final(out):
    meta = json.loads((out / "ckpt" / "latest.json").read_text())
    return load_file(out / "ckpt" / meta["dir"] / "state.safetensors")


def test_resume_continues_the_folder_it_is_given_wherever_it_now_lives(tmp_path):
    """A run folder moved (or copied) and resumed there finishes there: nothing is written at the recorded path."""
    full = local.run(tiny_config("sentiment", "fedavg", tmp_path / "full", rounds=3), log=lambda *a: None)
    local.run(tiny_config("sentiment", "fedavg", tmp_path / "a", rounds=3), stop_after=1, log=lambda *a: None)
    shutil.move(tmp_path / "a", tmp_path / "b")
    shutil.copytree(tmp_path / "b", tmp_path / "c")
    assert main(["run", "--resume", str(tmp_path / "b"), "--no-progress"]) == 0
    assert not (tmp_path / "a").exists()
    assert not (tmp_path / "c" / "summary.json").exists()          # the copy's twin was not touched
    s = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert s["history"] == full["history"] and s["out"] == str(tmp_path / "b")
    assert json.loads((tmp_path / "b" / "config.json").read_text())["out"] == str(tmp_path / "b")
    a, b = _final(tmp_path / "full"), _final(tmp_path / "b")
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("flags", [["--seed", "1"], ["--clients", "3"], ["--set", "lr=0.1"], ["--opt", "mu=1"],
                                   ["--task-opt", "max_len=8"], ["--out", "elsewhere"], ["--method", "lora"]])
def test_resume_refuses_a_flag_it_would_ignore(tmp_path, capsys, flags):
    local.run(tiny_config("sentiment", "fedavg", tmp_path / "r", rounds=2), stop_after=1, log=lambda *a: None)
    before = (tmp_path / "r" / "config.json").read_text()
    assert main(["run", "--resume", str(tmp_path / "r"), *flags]) == 2
    err = capsys.readouterr().err
    assert flags[0] in err and "would be ignored" in err
    assert (tmp_path / "r" / "config.json").read_text() == before and not (tmp_path / "r" / "summary.json").exists()


def test_resume_names_the_flag_it_refuses(tmp_path, capsys):
    local.run(tiny_config("sentiment", "fedavg", tmp_path / "r", rounds=2), stop_after=1, log=lambda *a: None)
    assert main(["run", "--resume", str(tmp_path / "r"), "--set", "lr=0.1", "--seed", "2"]) == 2
    err = capsys.readouterr().err
    assert "--seed, --set lr would be ignored" in err and "--rounds N" in err


def test_resume_with_rounds_extends_a_finished_run_to_the_run_made_with_that_many(tmp_path):
    """--rounds N on a finished 2-round run: the same final state, metric and per-round losses as 4 rounds from
    the start (every random draw is (seed, round, client); no schedule depends on the number of rounds here)."""
    four = local.run(tiny_config("sentiment", "lora", tmp_path / "four", rounds=4), log=lambda *a: None)
    local.run(tiny_config("sentiment", "lora", tmp_path / "two", rounds=2), log=lambda *a: None)
    assert main(["run", "--resume", str(tmp_path / "two"), "--rounds", "4", "--no-progress"]) == 0
    s = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert s["final"] == four["final"] and s["config"]["rounds"] == 4
    assert s["history"] == four["history"]
    a, b = _final(tmp_path / "four"), _final(tmp_path / "two")
    assert all(torch.equal(a[k], b[k]) for k in a)
    loss = lambda out: [[c["train_loss"] for c in json.loads(l)["clients"]]                       # noqa: E731
                        for l in (out / "metrics.jsonl").read_text().splitlines()[1:]]
    assert loss(tmp_path / "two") == loss(tmp_path / "four")


def test_resume_with_rounds_refuses_a_run_whose_schedule_depends_on_its_rounds(tmp_path, capsys):
    local.run(tiny_config("sentiment", "lora", tmp_path / "cos", rounds=2, lr_decay="cosine"), log=lambda *a: None)
    assert main(["run", "--resume", str(tmp_path / "cos"), "--rounds", "4"]) == 2
    assert "lr decays over its 2 rounds (lr_decay = cosine)" in capsys.readouterr().err
    local.run(tiny_config("sentiment", "lora", tmp_path / "half", rounds=3), stop_after=2, log=lambda *a: None)
    assert main(["run", "--resume", str(tmp_path / "half"), "--rounds", "1"]) == 2
    assert "already trained 2 rounds" in capsys.readouterr().err


def test_resume_and_export_take_another_device_than_the_recorded_one(tmp_path, capsys):
    """A run recorded with device = cuda continues and exports on a CPU machine with --set device=cpu (without it,
    the refusal says so)."""
    local.run(tiny_config("sentiment", "fedavg", tmp_path / "r", rounds=2), stop_after=1, log=lambda *a: None)
    cfg = json.loads((tmp_path / "r" / "config.json").read_text())
    (tmp_path / "r" / "config.json").write_text(json.dumps({**cfg, "device": "cuda"}))
    if not torch.cuda.is_available():
        assert main(["run", "--resume", str(tmp_path / "r")]) == 2
        assert "--set device=cpu" in capsys.readouterr().err
    assert main(["run", "--resume", str(tmp_path / "r"), "--set", "device=cpu", "--no-progress"]) == 0
    assert json.loads((tmp_path / "r" / "config.json").read_text())["device"] == "cpu"
    (tmp_path / "r" / "config.json").write_text(json.dumps({**cfg, "device": "cuda"}))
    assert main(["export", str(tmp_path / "r"), "--to", str(tmp_path / "x")]) == 0   # export builds on the CPU
    assert (tmp_path / "x" / "head.safetensors").is_file()


@pytest.mark.parametrize("argv", [[], ["--seed", "1"], ["--out", "x"], ["--no-progress"], ["--seed", "3", "--out", "y"]])
def test_seed_out_and_no_progress_keep_the_main_job(argv):
    a = cli._parser().parse_args(["run", *argv])
    cfgs = cli.build_configs(a)
    assert [c.method for c in cfgs] == cli.MAIN_METHODS
    assert all(c.task == cli.MAIN_JOB["task"] and c.clients == cli.MAIN_JOB["clients"] and c.rounds == cli.MAIN_JOB["rounds"]
               and c.task_options["train_size"] == cli.MAIN_JOB["task_options"]["train_size"] for c in cfgs)
    if "--seed" in argv:
        assert all(c.seed == int(argv[argv.index("--seed") + 1]) for c in cfgs)
    if "--out" in argv:
        assert [c.out for c in cfgs] == [f"{argv[argv.index('--out') + 1]}/{m}" for m in cli.MAIN_METHODS]


def test_a_config_files_progress_setting_is_kept(tmp_path):
    (tmp_path / "r.toml").write_text('progress = false\nmethod = "lora"\n')
    assert all(not c.progress for c in cli.build_configs(cli._parser().parse_args(["run", "--config", str(tmp_path / "r.toml")])))


ZO = [n for n, m in methods.METHODS.items() if m.zeroth_order]


@pytest.mark.parametrize("setting,needle", [
    ({"method": "probe", "lr": 0.5}, "probe has no lr"),
    ({"method": "probe", "optimizer": "sgd", "lr": 0.0}, "probe has no first-order optimizer"),
    *[({"method": m, "optimizer": "sgd"}, f"{m} has no first-order optimizer") for m in ZO],
    *[({"method": m, "weight_decay": 0.01}, "weight_decay = 0.01") for m in ZO],
    *[({"method": m, "dtype": "bf16"}, "dtype = 'bf16'") for m in ZO],
    ({"method": "decomfl", "lr_decay": "cosine"}, "keeps one lr across rounds"),
])
def test_a_setting_a_method_cannot_honour_is_refused_before_any_work(tmp_path, setting, needle):
    cfg = tiny_config("sentiment", setting.pop("method"), tmp_path / "x", **setting)
    with pytest.raises(C.ConfigError, match=needle):
        local.check(cfg)
    with pytest.raises(C.ConfigError, match=needle):
        local.run(cfg, log=lambda *a: None)
    assert not (tmp_path / "x").exists()


def test_first_order_methods_take_the_optimizer_set_and_record_it(tmp_path):
    s = local.run(tiny_config("sentiment", "lora", tmp_path / "a", rounds=1), log=lambda *a: None)
    assert s["config"]["optimizer"] == "adamw"                       # unset: the method's, recorded
    s = local.run(tiny_config("sentiment", "lora", tmp_path / "b", rounds=1, optimizer="sgd"), log=lambda *a: None)
    assert s["config"]["optimizer"] == "sgd"
    s = local.run(tiny_config("sentiment", "mezo", tmp_path / "c", rounds=1, lr=1e-3), log=lambda *a: None)
    assert s["config"]["optimizer"] == ""                            # none: nothing claimed


def test_why_zeroth_order_refuses_bf16_its_estimates_are_not_the_fp32_ones():
    """The two-point estimate (L(theta + eps z) - L(theta - eps z)) / 2 eps of 24 directions, fp32 against bf16
    forwards (autocast) on the tiny causal-LM twin at MeZO's eps: fp32 is the reference the replay and the
    method's analysis assume; bf16 moves the estimates far from it. The policy: refuse bf16 (the test above), so
    every ZO estimate a run makes is the fp32 one."""
    from lightfed.data.tensors import subset
    from lightfed.optim import zeroth_order as zo
    T = tiny_task("austen")
    model = copy.deepcopy(T.model).eval()
    params = {n: p for n, p in model.named_parameters()}
    batch = subset(T.train, range(8))
    eps = methods.METHODS["mezo"].Options().eps
    est = {}
    for dtype in ("fp32", "bf16"):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
            est[dtype] = np.array([zo.two_point(lambda: T.loss(model, batch), model, params, 1000 + i, eps)[0] for i in range(24)])
    again = np.array([zo.two_point(lambda: T.loss(model, batch), model, params, 1000 + i, eps)[0] for i in range(24)])
    assert np.array_equal(again, est["fp32"])                          # fp32: the same estimate every time
    rel = np.abs(est["bf16"] - est["fp32"]).mean() / np.abs(est["fp32"]).mean()
    corr = float(np.corrcoef(est["bf16"], est["fp32"])[0, 1])
    assert rel > 0.2 and corr < 0.95, (rel, corr)


def test_the_package_asks_for_a_torch_floor_and_the_setup_script_installs_the_cpu_pin_first():
    """lightfed installs beside any torch at or above its floor (a GPU machine's own build); the set-up script alone
    pins the CPU build, before anything else could pull a CUDA one."""
    import re
    import tomllib
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    deps = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    torch_req = [d for d in deps if re.match(r"torch\b", d)]
    assert len(torch_req) == 1 and re.fullmatch(r"torch>=[0-9.]+", torch_req[0].replace(" ", "")), torch_req
    setup = (root / "scripts" / "setup.sh").read_text().splitlines()
    installs = [i for i, line in enumerate(setup) if "pip install" in line and not line.lstrip().startswith("#")]
    assert installs and "torch==" in setup[installs[0]], "setup.sh's first install pins torch (the CPU build)"
