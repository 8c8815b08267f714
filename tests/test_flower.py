"""The Flower engine (engine/flower_app.py, engine/flower/): the same bytes and the same result as the in-process engine.

The equality holds for the same config, seed and torch thread count: CPU kernels may add up in another
order with another number of threads. These tests run both engines with 1 thread.
"""
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import tiny_config, tiny_task
from lightfed import config as C
from lightfed import methods
from lightfed.cli import main
from lightfed.engine import local

pytest.importorskip("flwr", reason="Flower not installed (pip install -e '.[flower]')")
from flwr.app import ConfigRecord, MetricRecord, RecordDict  # noqa: E402

from lightfed.engine import flower_app as F  # noqa: E402
from lightfed.engine.flower import client as FC, config as FK, faults as FF, records as FR  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
quiet = lambda *a: None  # noqa: E731
# one xdist worker runs every test here, one after another: each starts its own Ray cluster and Flower processes
pytestmark = pytest.mark.xdist_group("flower")


@contextlib.contextmanager
def torch_threads(n: int):
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def records(out: Path) -> list[dict]:
    return [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]


# --- pieces, no Flower runtime ----------------------------------------------------------------
def test_stats_travel_as_numbers_and_come_back_equal():
    stats = {"steps": 2, "samples": 16, "train_loss": 0.6233682334423065, "flops": 28317696.0,
             "memory_accounted": {"params": 4049672, "grads": 4041480}, "forwards_per_step": {"f1": 2, "f2": 8},
             "maybe": None, "note": "text", "a.b": 1, "per_step": [0.5, 0.25]}
    rd = FR.pack_stats(stats)
    assert all(isinstance(v, (int, float, list)) for v in rd["stats"].values())
    # through Flower's own serialization, as on the wire
    rd2 = RecordDict({k: type(v).inflate(v.deflate()) for k, v in rd.items()})
    assert FR.unpack_stats(rd2) == stats


def test_lightfed_bytes_survive_flower_records_exactly():
    blob = bytes(range(256)) * 41 + b"\x00\xff"
    rec = ConfigRecord({"down": blob, "round": 3, "cid": 7, "config": "abc"})
    back = ConfigRecord.inflate(rec.deflate())
    assert back["down"] == blob and back["round"] == 3 and back["cid"] == 7
    m = MetricRecord({"i": 2**40, "f": 0.1})
    mb = MetricRecord.inflate(m.deflate())
    assert mb["i"] == 2**40 and isinstance(mb["i"], int) and mb["f"] == 0.1


def test_run_config_carries_the_whole_config():
    cfg = tiny_config("fmnist", "fedprox", method_options={"mu": 0.1}, engine_options={"round_timeout": 30.0})
    import tomllib
    rc = tomllib.loads(FK.run_config_toml(cfg, "/tmp/x"))
    back = FK.config_from_run_config(rc)
    assert back.to_dict() == cfg.to_dict() and rc[FK.OUT_KEY] == "/tmp/x"
    other = C.from_dict({"out": "elsewhere", "progress": True}, cfg)
    assert FK.digest(other) == FK.digest(cfg), "where results go does not change what clients compute"
    assert FK.digest(C.from_dict({"seed": 1}, cfg)) != FK.digest(cfg)
    with pytest.raises(C.ConfigError, match=FK.RUN_CONFIG_KEY):
        FK.config_from_run_config({FK.RUN_CONFIG_KEY: ""})


@pytest.mark.parametrize("opts, msg", [({"client_threads": 0}, "client_threads"), ({"nope": 1}, "no option 'nope'"),
                                       ({"round_timeout": -1.0}, "round_timeout"), ({"client_cpus": 0.0}, "client_cpus")])
def test_engine_options_are_checked(opts, msg):
    with pytest.raises(C.ConfigError, match=msg):
        FK.options(tiny_config(engine_options=opts))


def test_faults_parse():
    assert FF.parse_faults("raise@1:2, sleep@2:0:30,exit@3:1") == (
        FF.Fault("raise", 1, 2), FF.Fault("sleep", 2, 0, 30.0), FF.Fault("exit", 3, 1))
    assert FF.parse_faults("") == ()
    with pytest.raises(ValueError):
        FF.parse_faults("melt@1:1")


def test_cli_engine_flag(tmp_path):
    assert main(["run", "--resume", str(tmp_path), "--engine", "flower-sim"]) == 2
    assert main(["run", "--task", "fmnist", "--engine", "flower-sim", "--set", "engine_options={client_threads=0}",
                 "--out", str(tmp_path / "x")]) == 2


def test_run_config_command_writes_a_flwr_run_config(tmp_path):
    p = subprocess.run([sys.executable, "-m", "lightfed.engine.flower_app", "run-config", "--set", "rounds=3",
                        "--set", "method=lora", "--task-opt", "tiny=true", "--out", str(tmp_path)],
                       capture_output=True, text=True, check=True)
    import tomllib
    cfg = FK.config_from_run_config(tomllib.loads(p.stdout))
    assert (cfg.rounds, cfg.method, cfg.task_options) == (3, "lora", {"tiny": True})


# --- the Simulation Engine (Ray; each test starts and stops its own) ----------------------------
def test_flower_simulation_equals_the_local_engine(tmp_path):
    """FedAvg on tiny sentiment: same final model, metrics and bytes per client and round."""
    tiny_task("sentiment")
    kw = dict(rounds=2, clients=4, fraction=0.5)
    with torch_threads(1):
        s_local = local.run(tiny_config("sentiment", "fedavg", tmp_path / "local", **kw), log=quiet)
        s_fl = F.run_simulation(tiny_config("sentiment", "fedavg", tmp_path / "flower", **kw,
                                            engine_options={"client_threads": 1, "client_cpus": 1.0}), log=quiet)
    for f in ("config.json", "setup.json", "metrics.jsonl", "summary.json"):
        assert (tmp_path / "flower" / f).is_file(), f
    assert F.compare(tmp_path / "flower", tmp_path / "local") == []
    assert s_fl["history"] == s_local["history"] and s_fl["bytes"] == s_local["bytes"]
    assert s_fl["engine"] == "flower-sim" and s_fl["flower"]["dropped"] == 0
    fl, lo = records(tmp_path / "flower"), records(tmp_path / "local")
    per_client = lambda rs: [(r["round"], c["id"], c["up"], c["down"]) for r in rs[1:] for c in r["clients"]]  # noqa: E731
    assert per_client(fl) == per_client(lo) and len(per_client(fl)) == 4
    # Flower's envelope is reported apart, and is small next to lightfed's bytes
    for r in fl[1:]:
        for c in r["clients"]:
            assert 0 < c["flower"]["up_envelope"] < 4096 and 0 < c["flower"]["down_envelope"] < 4096


def test_a_client_that_crashes_is_dropped_and_the_run_finishes(tmp_path):
    """Client 2 raises in round 1 after training: the round aggregates the 3 others, records the drop,
    and ends where the in-process engine ends when that upload is lost on the wire."""
    tiny_task("fmnist")
    kw = dict(rounds=2, clients=4, fraction=1.0, min_clients=2)
    victim = 2
    with torch_threads(1):
        s = F.run_simulation(tiny_config("fmnist", "fedavg", tmp_path / "flower", **kw), log=quiet,
                             faults=[FF.Fault("raise", 1, victim)])
        local.run(tiny_config("fmnist", "fedavg", tmp_path / "local", **kw), log=quiet,
                  tamper=lambda r, c, b: b[:-1] if (r, c) == (1, victim) else b)
    r1, r2 = records(tmp_path / "flower")[1:]
    assert [d["id"] for d in r1["dropped"]] == [victim] and "injected fault" in r1["dropped"][0]["error"]
    assert r1["accepted"] == 3 and [c["id"] for c in r1["clients"]] == [0, 1, 3] and "failed" not in r1
    assert r2["dropped"] == [] and r2["accepted"] == 4
    assert s["flower"]["dropped"] == 1 and s["dropped_by_round"] == {"1": [victim]}
    diffs = F.compare(tmp_path / "flower", tmp_path / "local")
    # the local run refused the victim's bytes (so it lists it as a client that sent something): all else equal
    assert all("round 1" in d for d in diffs) and "final global state differs" not in diffs


def test_an_interrupted_flower_run_resumes_to_the_uninterrupted_result(tmp_path):
    """top-k keeps its error-feedback residual on the client: after the server stops at round 1 and resumes,
    the clients continue from the state they kept in client_state_dir, and the run equals the local engine's."""
    tiny_task("fmnist")
    kw = dict(rounds=3, clients=2, fraction=1.0)
    with torch_threads(1):
        local.run(tiny_config("fmnist", "topk", tmp_path / "local", **kw), log=quiet)
        part = F.run_simulation(tiny_config("fmnist", "topk", tmp_path / "flower", **kw), log=quiet, stop_after=1)
        assert part["interrupted_after"] == 1 and not (tmp_path / "flower" / "summary.json").exists()
        assert sorted(p.name for p in (tmp_path / "flower" / "client_state").iterdir()) == \
            ["client-0-r000001.safetensors", "client-1-r000001.safetensors"]
        assert main(["run", "--engine", "flower-sim", "--resume", str(tmp_path / "flower")]) == 0
    assert F.compare(tmp_path / "flower", tmp_path / "local") == []
    assert [r["round"] for r in records(tmp_path / "flower")] == [0, 1, 2, 3]


def test_secure_aggregation_on_flower_sim_recovers_a_dropped_client_and_sends_the_local_engines_bytes(tmp_path):
    """FedAvg with secagg on the Simulation Engine, client 2 crashing after its training in round 1: the sum of
    the 3 survivors is unmasked (client 2's pairwise masks rebuilt from the others' shares), so the model is
    plain FedAvg without client 2 (to the fixed point's 2^-24); round 2, all 4 there, sends per client the
    bytes the in-process engine's secagg run sends (the protocol's messages included)."""
    tiny_task("sentiment")
    kw = dict(rounds=2, clients=4, fraction=1.0, min_clients=2)
    victim = 2
    with torch_threads(1):
        F.run_simulation(tiny_config("sentiment", "fedavg", tmp_path / "flower", secagg=True, **kw), log=quiet,
                         faults=[FF.Fault("raise", 1, victim)])
        local.run(tiny_config("sentiment", "fedavg", tmp_path / "plain", **kw), log=quiet,
                  tamper=lambda r, c, b: b[:-1] if (r, c) == (1, victim) else b)
        local.run(tiny_config("sentiment", "fedavg", tmp_path / "local", secagg=True, **kw), log=quiet)
    r1, r2 = records(tmp_path / "flower")[1:]
    assert r1["secagg"]["survivors"] == [0, 1, 3] and r1["accepted"] == 3 and [d["id"] for d in r1["dropped"]] == [victim]
    assert r1["dropped"][0]["up"] > 0                      # its keys and shares went out
    a, b = local.load_checkpoint(tmp_path / "flower")[1], local.load_checkpoint(tmp_path / "plain")[1]
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5
    lo = records(tmp_path / "local")[2]
    per_client = lambda r: [(c["id"], c["up"], c["down"], c["secagg"]) for r_ in [r] for c in r_["clients"]]  # noqa: E731
    assert per_client(r2) == per_client(lo) and r2["secagg"]["survivors"] == [0, 1, 2, 3]


@pytest.mark.slow
@pytest.mark.parametrize("method", sorted(methods.METHODS))
def test_every_method_on_flower_sim_equals_the_local_engine(tmp_path, method):
    """Every method, 3 rounds, every client in every round: what a client keeps between rounds
    (error feedback, warm starts) lives in Flower's Context.state and must give the same result."""
    task = {"vera": "sentiment", "fednl": "austen"}.get(method, "fmnist")   # VeRA: Linear layers; FedNL: a causal LM
    tiny_task(task)
    kw = dict(rounds=3, clients=2, fraction=1.0)
    with torch_threads(1):
        local.run(tiny_config(task, method, tmp_path / "local", **kw), log=quiet)
        F.run_simulation(tiny_config(task, method, tmp_path / "flower", **kw), log=quiet)
    assert F.compare(tmp_path / "flower", tmp_path / "local") == []


@pytest.mark.slow
def test_a_client_that_times_out_is_dropped(tmp_path):
    tiny_task("fmnist")
    cfg = tiny_config("fmnist", "fedavg", tmp_path, rounds=2, clients=2, fraction=1.0,
                      engine_options={"round_timeout": 60.0})
    with torch_threads(1):
        s = F.run_simulation(cfg, log=quiet, faults=[FF.Fault("sleep", 2, 1, 90.0)])
    r2 = records(tmp_path)[2]
    assert [d["id"] for d in r2["dropped"]] == [1] and "no reply within" in r2["dropped"][0]["error"]
    assert r2["accepted"] == 1 and s["flower"]["dropped"] == 1


# --- the Deployment Engine on loopback (SuperLink + SuperNodes as processes) ----------------------
@pytest.mark.slow
def test_deployment_with_tls_and_node_authentication(tmp_path):
    """scripts/flower_deploy_demo.sh: TLS with a CA made on the spot, SuperNodes authenticated by their
    registered EC keys; the result must equal the in-process engine's; every process is stopped."""
    tiny_task("fmnist")
    p = subprocess.run(["bash", str(ROOT / "scripts" / "flower_deploy_demo.sh"), "--tls", "--auth", "--check-local",
                        "--work", str(tmp_path), "fedavg"], capture_output=True, text=True, timeout=900,
                       env={**os.environ, "PYTHONPATH": ""})
    assert p.returncode == 0, p.stderr[-3000:]
    assert "same final state" in p.stderr
    s = json.loads((tmp_path / "results" / "fedavg" / "summary.json").read_text())
    assert s["engine"] == "flower-deployment" and s["flower"]["dropped"] == 0
    left = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True).stdout.split()
    assert not left, f"processes left running: {left}"


def test_seed_only_downlink_on_flower_sim_equals_the_local_engine(tmp_path):
    """FedSPZO with down = "seeds": what a client holds between rounds (the global model of the last
    round it took part in) lives in Flower's Context.state; records replace the weights downstream."""
    tiny_task("sentiment")
    kw = dict(rounds=3, clients=4, fraction=0.5, lr=1e-2, method_options={"P1": 1, "Ps": 1, "down": "seeds"})
    with torch_threads(1):
        local.run(tiny_config("sentiment", "fedspzo", tmp_path / "local", **kw), log=quiet)
        F.run_simulation(tiny_config("sentiment", "fedspzo", tmp_path / "flower", **kw,
                                     engine_options={"client_threads": 1, "client_cpus": 1.0}), log=quiet)
    assert F.compare(tmp_path / "flower", tmp_path / "local") == []
    downs = [c["down"] for r in records(tmp_path / "flower")[1:] for c in r["clients"]]
    assert all(r["accepted"] == 2 for r in records(tmp_path / "flower")[1:])
    assert min(downs) < 200 < 10**5 < max(downs)      # some clients got records, first-timers the weights


def test_a_node_worker_keeps_the_model_and_gives_the_same_bytes(tmp_path, monkeypatch):
    """Two rounds through the per-node worker: the second builds nothing, and the upload and the client's
    state equal what the in-process handler makes."""
    from safetensors.torch import load, save
    from lightfed.engine.flower import node_worker as W
    import tempfile
    short = tempfile.mkdtemp(prefix="lfw", dir="/tmp")           # Unix socket paths must stay short
    monkeypatch.setattr(tempfile, "tempdir", short)
    tiny_task("fmnist")
    cfg = tiny_config("fmnist", "topk", clients=2, fraction=1.0)
    S = local.build(cfg)
    down = __import__("lightfed.engine.protocol", fromlist=["P"]).broadcast(S.method, S.method.init_state(S.model), 1)
    path = W.socket_path(FK.digest(cfg), 0)
    try:
        state = b""
        for rnd in (1, 2):
            h, (state, up) = W.call(path, {"config": cfg.to_dict(), "round": rnd, "cid": 0}, [state, down],
                                    max_bytes=2**30, idle=60)
            if rnd == 1:
                first_up, first_state = up, state
        assert h["measure"]["build_seconds"] < 0.05 and h["measure"]["process_age"] > 0
        with torch_threads(1):
            up1, st1, _, _ = FC.train_core(cfg, 1, 0, down, {})
        assert up1 == first_up and load(first_state).keys() == st1.keys()
        assert all(torch.equal(load(first_state)[k], st1[k]) for k in st1)
    finally:
        with contextlib.suppress(Exception):
            import signal
            pid = int(open(str(path) + ".log").read().split("lightfed node worker ")[1].split()[0])
            os.kill(pid, signal.SIGTERM)
        __import__("shutil").rmtree(short, ignore_errors=True)
    r = subprocess.run([sys.executable, "-c", "import sys, lightfed.engine.flower_app, lightfed.engine.flower.node_worker; "
                        "print('torch' in sys.modules)"], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "False", "the client app must not import torch"
