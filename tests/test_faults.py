"""Simulated dropouts and stragglers (in-process engine): who drops is named per round, drawn from the
seed, their downlink is counted, a run still converges, and a resumed run drops the same clients."""
import json

import pytest

from conftest import tiny_config
from lightfed import config as C
from lightfed.engine import flower_app, local

FAULTS = {"clients": 10, "fraction": 1.0, "dropout": 0.3, "straggle": 1.0, "deadline": 2.0}


def _records(out):
    return [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]


def test_faults_are_drawn_per_round_and_client_and_named():
    cfg = tiny_config("austen", "fedavg", **FAULTS)
    per_round = [local.faults(cfg, r, list(range(10)), [10] * 10) for r in range(1, 41)]
    failed = [c for f in per_round for c in f]
    share = len(failed) / (40 * 10)
    assert 0.3 <= share <= 0.5, share       # 30% dropout plus the stragglers past 2x the median
    assert any("straggler" in w for f in per_round for w in f.values())
    assert any("dropout" in w for f in per_round for w in f.values())
    assert len({tuple(sorted(f)) for f in per_round}) > 10, "a different set every round"
    assert per_round[0] == local.faults(cfg, 1, list(range(10)), [10] * 10), "drawn from (seed, round, client)"
    none = tiny_config("austen", "fedavg", clients=10)
    assert local.faults(none, 1, list(range(10)), [10] * 10) == {}


def test_a_run_with_30pct_dropout_and_stragglers_converges_and_names_who_dropped(tmp_path):
    kw = dict(rounds=4, local_steps=3, lr=3e-3)
    clean = local.run(tiny_config("austen", "fedavg", tmp_path / "clean", clients=10, fraction=1.0, **kw), log=lambda *a: None)
    s = local.run(tiny_config("austen", "fedavg", tmp_path / "faulty", **FAULTS, **kw), log=lambda *a: None)
    recs = _records(tmp_path / "faulty")[1:]
    for r in recs:
        want = local.faults(C.load_json(tmp_path / "faulty" / "config.json"), r["round"], list(range(10)),
                            [c["examples"] for c in json.loads((tmp_path / "faulty" / "setup.json").read_text())["clients"]])
        assert sorted(d["id"] for d in r.get("dropped", [])) == sorted(want)
        assert r["accepted"] == 10 - len(want) == len(r["clients"])
        assert all(d["down"] > 0 for d in r.get("dropped", []))      # they got the broadcast
    assert s["dropped_by_round"] == {str(r["round"]): [d["id"] for d in r["dropped"]] for r in recs if r.get("dropped")}
    assert sum(len(v) for v in s["dropped_by_round"].values()) >= 4
    assert s["bytes"]["down_total"] == sum(c["down"] for r in recs for c in r["clients"]) + \
        sum(d["down"] for r in recs for d in r.get("dropped", []))
    # converges (perplexity falls), close to the run without faults
    assert s["final"] < 0.9 * s["initial"]
    assert s["final"] < 1.1 * clean["final"], (s["final"], clean["final"])


def test_a_resumed_faulty_run_drops_the_same_clients(tmp_path):
    kw = dict(rounds=3, **FAULTS)
    full = local.run(tiny_config("austen", "lora", tmp_path / "full", **kw), log=lambda *a: None)
    local.run(tiny_config("austen", "lora", tmp_path / "part", **kw), stop_after=1, log=lambda *a: None)
    resumed = local.run(resume=tmp_path / "part", log=lambda *a: None)
    assert resumed["dropped_by_round"] == full["dropped_by_round"] and resumed["history"] == full["history"]


@pytest.mark.parametrize("bad, words", [({"dropout": 1.0}, "dropout"), ({"straggle": 1.0}, "needs a deadline"),
                                        ({"straggle": 1.0, "deadline": 0.5}, "deadline")])
def test_bad_fault_settings_fail_before_any_work(bad, words):
    with pytest.raises(C.ConfigError, match=words):
        local.check(tiny_config("austen", "fedavg", **bad))


def test_flower_refuses_simulated_faults():
    with pytest.raises(C.ConfigError, match="faults are real"):
        flower_app.options(tiny_config("austen", "fedavg", dropout=0.3))
