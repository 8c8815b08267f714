"""The local engine: results folder, exact byte counts, faults, checkpoints and resume."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from conftest import TINY, tiny_config, tiny_task
from lightfed import config as C
from lightfed import methods
from lightfed.cli import main
from lightfed.engine import local
from lightfed.engine import protocol as P
from lightfed.wire import encoded_size


def _final_state(out):
    meta = json.loads((out / "ckpt" / "latest.json").read_text())
    return load_file(out / "ckpt" / meta["dir"] / "state.safetensors")


def test_run_writes_results_and_counts_bytes_exactly(tmp_path):
    tiny_task("sentiment")
    cfg = tiny_config("sentiment", "fedavg", tmp_path, rounds=2)
    s = local.run(cfg, log=lambda *a: None)
    for f in ("config.json", "setup.json", "metrics.jsonl", "summary.json"):
        assert (tmp_path / f).is_file(), f
    lines = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [l["round"] for l in lines] == [0, 1, 2]
    # bytes: what each client sent and received is the exact encoded size of the schema
    setup = local.build(cfg)
    up = encoded_size(P.up_schema(setup.method), kind="fedavg/up")
    down = encoded_size(setup.method.down_schema(), kind="fedavg/down")
    for l in lines[1:]:
        assert len(l["clients"]) == 2 and all(c["up"] == up and c["down"] == down for c in l["clients"])
    assert s["bytes"]["up_per_client_round"] == up and s["bytes"]["up_total"] == 4 * up
    assert s["flops"]["client_total"] > 0 and s["memory"]["client_rss_peak_bytes"] > 0
    assert s["time"]["client_compute"] > 0 and s["time"]["engine_overhead"] >= 0
    hist = json.loads((tmp_path / "setup.json").read_text())["label_histograms"]
    assert len(hist) == 4 and sum(sum(h.values()) for h in hist) == TINY["sentiment"]["train_size"]


def test_same_config_same_result(tmp_path):
    a = local.run(tiny_config("fmnist", "fedprox", tmp_path / "a"), log=lambda *a: None)
    b = local.run(tiny_config("fmnist", "fedprox", tmp_path / "b"), log=lambda *a: None)
    assert a["history"] == b["history"]
    sa, sb = _final_state(tmp_path / "a"), _final_state(tmp_path / "b")
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


def test_eval_start_false_skips_only_the_round_0_evaluation(tmp_path):
    """A grid whose runs all start from one pretrained model scores it once itself; the runs then train the same."""
    a = local.run(tiny_config("fmnist", "fedavg", tmp_path / "a"), log=lambda *a: None)
    b = local.run(tiny_config("fmnist", "fedavg", tmp_path / "b", eval_start=False), log=lambda *a: None)
    assert a["initial"] is not None and b["initial"] is None
    assert b["history"] == a["history"][1:] and b["final"] == a["final"]
    assert all(torch.equal(x, y) for x, y in zip(_final_state(tmp_path / "a").values(), _final_state(tmp_path / "b").values()))
    assert "accuracy" not in json.loads((tmp_path / "b" / "metrics.jsonl").read_text().splitlines()[0])
    with pytest.raises(C.ConfigError, match="eval_start"):
        C.from_dict({**tiny_config("fmnist", "fedavg").to_dict(), "eval_start": "no"})


def test_holdout_clients_never_train_and_the_rest_draw_as_before():
    from lightfed import config as C
    base = C.from_dict({"clients": 7, "fraction": 0.5})
    held = C.from_dict({"clients": 7, "fraction": 0.5, "holdout": "6"})
    assert C.per_round(held) == round(0.5 * 6)
    seen = set()
    for rnd in range(1, 40):
        s = local.sample_clients(held, rnd)
        assert 6 not in s and len(s) == 3 and len(set(s)) == 3
        seen.update(s)
    assert seen == set(range(6))
    everyone = C.from_dict({"clients": 7, "fraction": 1.0, "holdout": "6"})
    assert local.sample_clients(everyone, 1) == list(range(6))
    # without a holdout the draws are the ones every earlier run made
    import numpy as np
    for rnd in (1, 2, 3):
        rng = np.random.default_rng([base.seed, rnd, 7])
        assert local.sample_clients(base, rnd) == sorted(rng.choice(7, 4, replace=False).tolist())


def test_interrupted_run_resumes_to_the_same_result(tmp_path):
    full = local.run(tiny_config("sentiment", "lora", tmp_path / "full", rounds=3), log=lambda *a: None)
    part = local.run(tiny_config("sentiment", "lora", tmp_path / "part", rounds=3), stop_after=1, log=lambda *a: None)
    assert part["interrupted_after"] == 1 and not (tmp_path / "part" / "summary.json").exists()
    resumed = local.run(resume=tmp_path / "part", log=lambda *a: None)
    assert resumed["history"] == full["history"]
    sa, sb = _final_state(tmp_path / "full"), _final_state(tmp_path / "part")
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    rounds = [json.loads(l)["round"] for l in (tmp_path / "part" / "metrics.jsonl").read_text().splitlines()]
    assert rounds == [0, 1, 2, 3]


def test_a_fresh_run_in_an_old_runs_folder_leaves_no_checkpoint_of_it_to_resume(tmp_path):
    """A new run started where an interrupted one left its checkpoint, then killed before its own first round:
    a resume must not take the old checkpoint under the new config (it did, until the fresh start removed it)."""
    out = tmp_path / "run"
    local.run(tiny_config("sentiment", "fedavg", tmp_path / "done", rounds=2), log=lambda *a: None)
    local.run(tiny_config("sentiment", "fedavg", out, rounds=3), stop_after=2, log=lambda *a: None)
    assert (out / "ckpt" / "latest.json").is_file()
    for old in (out, tmp_path / "done"):        # killed after its round 0
        local.begin(tiny_config("sentiment", "lora", old, rounds=3), False, lambda *a: None)
        assert not (old / "ckpt").exists() and not (old / "summary.json").exists()
    with pytest.raises(C.ConfigError, match="no config.json"):
        local.run(resume=out, log=lambda *a: None)


def test_a_kill_between_the_checkpoint_and_the_metrics_line_loses_no_round(tmp_path):
    """The checkpoint is the commit point and holds every round's record: a round whose metrics line never
    reached the disk comes back on resume, and the summary lists every round."""
    full = local.run(tiny_config("sentiment", "fedavg", tmp_path / "full", rounds=3), log=lambda *a: None)
    local.run(tiny_config("sentiment", "fedavg", tmp_path / "part", rounds=3), stop_after=2, log=lambda *a: None)
    metrics = tmp_path / "part" / "metrics.jsonl"
    metrics.write_text("".join(l + "\n" for l in metrics.read_text().splitlines()[:-1]))   # round 2's line is lost
    resumed = local.run(resume=tmp_path / "part", log=lambda *a: None)
    assert resumed["history"] == full["history"]
    assert [json.loads(l)["round"] for l in metrics.read_text().splitlines()] == [0, 1, 2, 3]
    assert resumed["bytes"]["up_total"] == full["bytes"]["up_total"]


def test_killed_process_resumes_to_the_same_result(tmp_path, capsys):
    """A real SIGKILL mid-run (whatever it was doing, a checkpoint write included), then --resume. While the run is
    alive, a second process in its folder (a resume, or a fresh run there) is refused and changes nothing."""
    args = ["--task", "fmnist", "--method", "fedavg", "--clients", "4", "--rounds", "12", "--seed", "1",
            "--set", "local_steps=2", "--set", "batch_size=8", "--set", "lr=1e-3", "--set", "fraction=0.5",
            "--task-opt", "tiny=true", "--task-opt", "train_size=64", "--task-opt", "test_size=32", "--no-progress"]
    out = tmp_path / "killed"
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}   # the threads of the runs it is compared with
    proc = subprocess.Popen([sys.executable, "-m", "lightfed.cli", "run", *args, "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    metrics = out / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 4:   # rounds 0-3 done
            break
        time.sleep(0.05)
    if proc.poll() is not None:
        pytest.fail("the run finished before it could be killed; give it more rounds")
    proc.send_signal(signal.SIGSTOP)             # alive, holding its folder: a second process there is refused
    try:
        kept = (out / "ckpt" / "latest.json").read_bytes()
        for second in (["run", "--resume", str(out)], ["run", *args, "--out", str(out)]):
            assert main(second) == 2
            assert f"process {proc.pid} is running in this folder" in capsys.readouterr().err
        assert (out / "ckpt" / "latest.json").read_bytes() == kept      # its checkpoint untouched
    finally:
        proc.send_signal(signal.SIGKILL)             # no lock outlives its holder
    proc.wait()
    assert not (out / "summary.json").exists()
    assert main(["run", "--resume", str(out)]) == 0
    assert main(["run", *args, "--out", str(tmp_path / "clean")]) == 0
    a = json.loads((out / "summary.json").read_text())
    b = json.loads((tmp_path / "clean" / "summary.json").read_text())
    assert a["history"] == b["history"] and a["final"] == b["final"]
    rounds = [json.loads(l)["round"] for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert rounds == list(range(13))                                   # every round recorded once
    sa, sb = _final_state(out), _final_state(tmp_path / "clean")
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("attack", ["flip", "truncate", "oversize", "nan"])
def test_bad_upload_is_refused_and_the_round_goes_on(tmp_path, attack):
    cfg = tiny_config("fmnist", "fedavg", tmp_path / attack, rounds=1, clients=4, fraction=1.0,
                      max_message_bytes=10**6)
    victim = local.sample_clients(cfg, 1)[1]

    def tamper(rnd, cid, blob):
        if cid != victim:
            return blob
        if attack == "flip":
            return blob[:100] + bytes([blob[100] ^ 0xFF]) + blob[101:]
        if attack == "truncate":
            return blob[: len(blob) // 2]
        if attack == "oversize":
            return blob + b"\0" * 10**6
        # a NaN written into a float payload, with the CRC recomputed: only the finiteness check can catch it
        import struct, zlib
        body = bytearray(blob[:-4])
        end = len(body) - (1 + len(P.EXAMPLES) + 1 + 4)      # the last fp32 value before the 4-byte sample count
        body[end - 4:end] = struct.pack("<f", float("nan"))
        return bytes(body) + struct.pack("<I", zlib.crc32(bytes(body)))

    s = local.run(cfg, tamper=tamper, log=lambda *a: None)
    rec = [json.loads(l) for l in (tmp_path / attack / "metrics.jsonl").read_text().splitlines()][1]
    assert [r["id"] for r in rec["rejected"]] == [victim]
    assert "wire" in rec["rejected"][0]["error"]
    assert rec["accepted"] == 3 and s["bytes"]["rejected_messages"] == 1
    assert torch.isfinite(torch.tensor(s["final"]))


def test_round_with_too_few_valid_replies_keeps_the_state(tmp_path):
    cfg = tiny_config("fmnist", "fedavg", tmp_path, rounds=1, clients=2, fraction=1.0, min_clients=2)
    s = local.run(cfg, tamper=lambda r, c, b: b[:-1] if c == 0 else b, log=lambda *a: None)
    rec = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()][1]
    assert "failed" in rec
    assert s["final"] == s["initial"], "global model unchanged when the round fails"


def test_resume_refuses_a_folder_without_checkpoint(tmp_path):
    assert main(["run", "--resume", str(tmp_path)]) == 2


def test_cli_end_to_end_on_real_assets(tmp_path, capsys):
    """The real MiniLM and real tweets, at a size that takes seconds."""
    rc = main(["run", "--task", "sentiment", "--method", "fedavg,lora", "--clients", "2", "--rounds", "1",
               "--task-opt", "train_size=32", "--task-opt", "test_size=32", "--task-opt", "max_len=16",
               "--set", "batch_size=8", "--out", str(tmp_path), "--no-progress"])
    if rc == 2 and "not installed" in capsys.readouterr().err:
        pytest.skip("MiniLM asset not installed")
    assert rc == 0
    out = capsys.readouterr().out
    assert "| sentiment | fedavg |" in out and "| sentiment | lora |" in out
    fed = json.loads((tmp_path / "fedavg" / "summary.json").read_text())
    lora = json.loads((tmp_path / "lora" / "summary.json").read_text())
    assert fed["trainable_params"] > 22_000_000 > 100 * lora["trainable_params"]
    assert fed["bytes"]["up_per_client_round"] > 4 * fed["trainable_params"]
    assert lora["bytes"]["up_per_client_round"] < fed["bytes"]["up_per_client_round"] / 50
