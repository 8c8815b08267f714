import pytest

from lightfed import config as C
from lightfed.cli import main
from lightfed.engine import local


def test_defaults_are_valid():
    local.check(C.RunConfig())


@pytest.mark.parametrize("d,needle", [
    ({"clients": 0}, "clients"),
    ({"rounds": 0}, "rounds"),
    ({"fraction": 1.5}, "fraction"),
    ({"partition": "dirichlet:-1"}, "alpha"),
    ({"partition": "zipf"}, "iid, domain, dirichlet"),
    ({"lr": -1.0}, "lr"),
    ({"optimizer": "lion"}, "adamw or sgd"),
    ({"min_clients": 5, "clients": 10, "fraction": 0.2}, "min_clients"),
    ({"method": "fedsgdx"}, "unknown method"),
    ({"task": "mnist"}, "unknown task"),
    ({"method": "fedprox", "method_options": {"mu": -1.0}}, "mu"),
    ({"method": "fedprox", "method_options": {"nu": 1.0}}, "no option 'nu'"),
    ({"method": "lora", "method_options": {"r": "eight"}}, "expected int"),
    ({"method": "fedavg", "method_options": {"codec": "int3"}}, "codec"),
    ({"task_options": {"max_len": 4}}, "max_len"),
    ({"holdout": "10"}, "client ids must be in"),
    ({"holdout": "a,b"}, "comma-separated client ids"),
    ({"holdout": "0,1,2", "clients": 4, "min_clients": 2}, "leaves 1 clients to train"),
])
def test_bad_config_fails_before_work(d, needle):
    with pytest.raises(C.ConfigError, match=needle):
        local.check(C.from_dict(d))


def test_unknown_and_mistyped_keys():
    with pytest.raises(C.ConfigError, match="unknown config key 'round'"):
        C.from_dict({"round": 3})
    with pytest.raises(C.ConfigError, match="expected an integer"):
        C.from_dict({"clients": "ten"})
    with pytest.raises(C.ConfigError, match="expected a number"):
        C.from_dict({"lr": True})


def test_toml_file_and_overrides(tmp_path):
    p = tmp_path / "run.toml"
    p.write_text('task = "fmnist"\nrounds = 7\n[method_options]\ncodec = "int8"\n')
    cfg = C.load_toml(p)
    assert (cfg.task, cfg.rounds, cfg.method_options) == ("fmnist", 7, {"codec": "int8"})
    (tmp_path / "bad.toml").write_text("rounds = [")
    with pytest.raises(C.ConfigError, match="not valid TOML"):
        C.load_toml(tmp_path / "bad.toml")
    assert C.parse_assignment("mu=0.01") == ("mu", 0.01)
    assert C.parse_assignment("targets=query,value") == ("targets", "query,value")


def test_cli_refuses_bad_config_with_exit_2(capsys, tmp_path):
    rc = main(["run", "--task", "sentiment", "--clients", "0", "--out", str(tmp_path / "x")])
    assert rc == 2
    assert "clients" in capsys.readouterr().err
    assert not (tmp_path / "x").exists(), "nothing written before the config is valid"
    rc = main(["run", "--method", "fedprox", "--opt", "mu=-3"])
    assert rc == 2


def test_cli_list(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for word in ("sentiment", "trivia", "austen", "fmnist", "fedavg", "fedprox", "lora", "mu=", "dirichlet"):
        assert word in out
