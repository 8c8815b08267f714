"""The benchmarks' verdict rules: a claim is "met" only over 3 seeds that separate the claimed way, and a run that
never reaches a target counts only through the bound its whole-run cost gives."""
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
from common import verdict  # noqa: E402
from fednl_retrieval import cached, cached_pair, threshold_target  # noqa: E402
from zoflite_claims import flops_claim  # noqa: E402


def test_verdict_needs_three_separated_seeds():
    assert verdict([0.80, 0.81, 0.82], [0.70, 0.71, 0.72], a_lower=False) == "met"
    assert verdict([0.80, 0.81, 0.82], [0.70, 0.71, 0.72], a_lower=True) == "missed"
    assert verdict([0.70, 0.81, 0.82], [0.70, 0.71, 0.72], a_lower=False).startswith("inconclusive")
    assert verdict([0.80, 0.81], [0.70, 0.71], a_lower=False).startswith("inconclusive")


def row(label, to, total):
    """to: per seed the (lo, hi] FLOPs-to-target interval the evaluations leave, or None (never reached)."""
    return {"label": label, "seeds": [0, 1, 2], "flops_to_target": to, "flops_total": total}


def test_flops_claim_is_judged_on_the_interval_the_evaluations_leave():
    """The same runs evaluated every round (tight intervals) give a verdict; evaluated coarsely, where the interval
    spans the factor, the verdict is inconclusive: no verdict rests on where the evaluations fell."""
    fast = row("fast", [(0.9, 1.0), (0.9, 1.0), (1.9, 2.0)], [5.0] * 3)
    slow = row("slow", [(19.0, 20.0), (14.0, 15.0), (29.0, 30.0)], [50.0] * 3)
    c = flops_claim(fast, slow, 10, 0.7)                                 # ratios in [19, 22.2], [14, 16.7], [14.5, 15.8]
    assert c["verdict"] == "met" and "s1: 14.0x to 16.7x" in c["measured"]
    assert flops_claim(fast, slow, 25, 0.7)["verdict"] == "missed"      # every upper bound below 25
    assert flops_claim(fast, slow, 20, 0.7)["verdict"].startswith("inconclusive")
    coarse_fast = row("fast", [(0.0, 1.0)] * 3, [5.0] * 3)              # first shown at the first evaluation
    c = flops_claim(coarse_fast, slow, 10, 0.7)
    assert c["verdict"] == "met"                                          # lower bounds 19, 14, 29 >= 10 still
    coarse_slow = row("slow", [(0.0, 20.0), (0.0, 15.0), (0.0, 30.0)], [50.0] * 3)
    assert flops_claim(coarse_fast, coarse_slow, 2, 0.7)["verdict"].startswith("inconclusive")   # 0 to inf: undecided


def test_flops_claim_censored_runs_give_bounds():
    fast = row("fast", [(0.5, 1.0)] * 3, [4.0] * 3)
    never = row("slow", [None, None, None], [12.0, 15.0, 30.0])          # slow never reached it: ratio > 12, 15, 30
    c = flops_claim(fast, never, 10, 0.7)
    assert c["verdict"] == "met" and "s0: 12.0x to inf" in c["measured"]
    short = row("slow", [None, None, None], [5.0, 5.0, 30.0])            # its run too short to bound 10x on 2 seeds
    assert flops_claim(fast, short, 10, 0.7)["verdict"].startswith("inconclusive")
    f_never = row("fast", [None, None, None], [8.0] * 3)
    s_early = row("slow", [(1.0, 2.0)] * 3, [9.0] * 3)                  # ratio < 2 / 8: far below 10x
    assert flops_claim(f_never, s_early, 10, 0.7)["verdict"] == "missed"
    both_never = row("slow", [None] * 3, [9.0] * 3)
    assert flops_claim(f_never, both_never, 10, 0.7)["verdict"].startswith("inconclusive (0 of 3")


def test_to_target_returns_the_evaluations_bracket():
    from zoflite_claims import to_target
    assert to_target([0, 10, 20, 30], [0.5, 0.6, 0.75, 0.8], 0.7) == (10, 20)
    assert to_target([0, 10, 20], [0.5, 0.6, 0.65], 0.7) is None
    assert to_target([0, 10], [0.8, 0.9], 0.7) == (0, 10)               # round 0 never counts


@pytest.mark.parametrize("setting", ["probed", "prompt", "prompt_long"])
@pytest.mark.parametrize("quick", [False, True])
def test_every_grid_config_of_zoflite_claims_validates(setting, quick):
    """A typo in a method's options fails here, not an hour into a grid (init is left out: the probe runs it names
    are made by the grid itself)."""
    from lightfed import config as C
    from lightfed.engine import local
    from zoflite_claims import SETTINGS, configs
    S = SETTINGS[setting]
    probes, grid = configs(S, [0, 1, 2], quick)
    assert len(grid) == 3 * len(S["methods"]) and len(probes) == (3 if S["probe"] else 0)
    for _, c in probes + grid:
        local.check(C.from_dict({k: v for k, v in c.items() if k != "init"}))
    zo_lrs = {c["method"]: c["lr"] for _, c in grid if c["method"] in S["lr"]}
    assert zo_lrs == {m: S["lr"][m] for m in zo_lrs}   # every ZO run takes its calibrated lr


@pytest.mark.parametrize("quick", [False, True])
def test_every_config_of_flite_vision_validates_and_takes_its_calibrated_lr(quick):
    from lightfed import config as C
    from lightfed.engine import local
    from flite_vision import LR_OF, ONCE, PAIRED, PROBED, ROWS, SWEEP, calibration_grid, grid, starts_of
    lrs = {"flite": 0.1, "flite_obase": 1.0, "flite_r16g": 3.0, "flite_r20g": 0.3, "flite_r20g_srv": [0.3, 2.0], "flite_r20g_delta": 0.3, "flite_r32g": 1.0, "flite_r16g_probe": 0.3, "flite_wscale": 0.01, "fedavg": 3e-5, "lora": 3e-4, "flite_head": [1e-2, 1e-3],
           "fedavg@dirichlet:0.1": 1e-5,      # chosen on Dirichlet clients: the grid's Dirichlet cells of FedAvg's kind take it
           "fedavg_probe@dirichlet:0.1": 2e-4,    # a row swept only on Dirichlet clients (it has no IID cell)
           "fedavg_central": 3e-5}                # a central row with its own lr, swept in its own setting
    g = grid([0, 1, 2], quick, lrs)
    cal = calibration_grid(quick)
    assert {label.split("|")[0] for label, _ in g} == {r[0] for r in ROWS}
    for label, c in g + cal + starts_of(g + cal):
        local.check(C.from_dict({k: v for k, v in c.items() if k != "init"}))
    starts = dict(starts_of(g + cal))       # a probed row starts from its own partition's and seed's probe, one round
    for label, c in g + cal:
        key = label.split("|")[0].split(" ")[0].split("@")[0]
        assert ("init" in c) == (key in PROBED)
        if key in PROBED:
            p = starts[c["init"]]
            assert (p["method"], p["rounds"], p["partition"], p["seed"], p["task_options"]) == \
                ("probe", 1, c["partition"], c["seed"], c["task_options"])
    for label, c in cal:            # a central row's sweep runs in its own setting (one client, 50 steps a round)
        assert (c["clients"] == 1) == label.startswith("fedavg_central")
    probe_row = next(c for label, c in g if label == "probe|iid|s0")    # the grid's probe row is the IID seed-0 start
    assert starts["probe|iid|s0"] == probe_row
    for label, c in g:
        key, part, _ = label.split("|")
        want = lrs.get(f"{LR_OF[key]}@{part}", lrs.get(LR_OF[key])) if LR_OF[key] else None
        assert (want == 1e-5) == (LR_OF[key] == "fedavg" and part == "dirichlet:0.1")
        if key in PAIRED:           # z's lr and the second step's (the trained head's, the server's)
            assert [c["lr"], c["method_options"][PAIRED[key]]] == want
        else:
            assert c["lr"] == want if want else {k: c[k] for k in ONCE} == ONCE
            assert not set(PAIRED.values()) & set(c["method_options"])
    import common
    assert len(cal) == sum(map(len, SWEEP.values())) == len({common.store_folder(c) for _, c in cal})
    assert len(g) == len({common.store_folder(c) for _, c in g})      # every run its own folder in the store
    heads = [(c["lr"], c["method_options"]["head_lr"]) for label, c in cal if label.startswith("flite_head ")]
    assert heads == list(SWEEP["flite_head"])
    parts = {label.split(" ")[0]: c["partition"] for label, c in cal}     # a kind "<row>@<partition>" sweeps there
    assert parts["fedavg@dirichlet:0.1"] == "dirichlet:0.1" and parts["fedavg"] == "iid"


def test_wilson_interval_matches_a_hand_computation():
    from common import wilson
    lo, hi = wilson(50, 100)    # centre 0.5; half-width 1.96 * sqrt(0.25 / 100 + 1.96^2 / 40000) / (1 + 1.96^2 / 100)
    half = 1.96 * (0.0025 + 1.96 ** 2 / 40000) ** 0.5 / (1 + 1.96 ** 2 / 100)
    assert abs(lo - (0.5 - half)) < 1e-12 and abs(hi - (0.5 + half)) < 1e-12 and 0.40 < lo < 0.41
    lo0, hi0 = wilson(0, 50)
    assert abs(lo0) < 1e-12 and 0.07 < hi0 < 0.072   # the known upper bound 3.84 / 53.84


def test_threshold_target_needs_every_seed():
    assert threshold_target([0.91, 0.95, 0.90], 0.9).startswith("met")
    assert threshold_target([0.5, 0.6, 0.7], 0.9).startswith("missed")
    got = threshold_target([0.81, 0.91, 0.44], 0.9)
    assert got.startswith("not met on every seed (1 of 3; the mean 0.72 is 0.18 short)") and got.endswith("(0.81, 0.91, 0.44)")
    assert threshold_target([0.84, 0.82, 0.11], 0.5).startswith("not met on every seed (2 of 3)")
    assert threshold_target([0.95, 0.97], 0.9).startswith("inconclusive")


def test_cached_evaluations_are_redone_when_what_made_them_changes(tmp_path):
    calls = []

    def f(v):
        return lambda: calls.append(v) or v
    assert cached(tmp_path / "e.json", {"code": "a"}, f(1)) == 1
    assert cached(tmp_path / "e.json", {"code": "a"}, f(2)) == 1          # kept: same key, not recomputed
    assert cached(tmp_path / "e.json", {"code": "b"}, f(3)) == 3          # another code: computed afresh
    assert calls == [1, 3]


def test_cached_evaluations_are_redone_when_the_evaluator_changes(tmp_path, monkeypatch):
    """The key holds the scorer's code as well as the run's: a change to how a finished run is scored re-scores it."""
    import fednl_retrieval as R
    monkeypatch.setattr(R, "evaluator", lambda: "scorer-1")
    assert cached(tmp_path / "e.json", {"code": "a"}, lambda: 1) == 1
    assert cached(tmp_path / "e.json", {"code": "a"}, lambda: 2) == 1
    monkeypatch.setattr(R, "evaluator", lambda: "scorer-2")
    assert cached(tmp_path / "e.json", {"code": "a"}, lambda: 3) == 3
    monkeypatch.undo()
    assert len(R.evaluator()) == 12 and R.evaluator() == R.evaluator()      # the real one: a hash of real sources


def test_a_pair_of_evaluations_from_one_pass_is_computed_once_for_whatever_is_missing(tmp_path):
    a, b, calls = tmp_path / "a.json", tmp_path / "b.json", []

    def f(x, y):
        return lambda: calls.append((x, y)) or (x, y)
    assert cached_pair((a, None), {"code": "k"}, f(1, 2)) == [1]           # only a asked: b not written
    assert not b.exists()
    assert cached_pair((a, b), {"code": "k"}, f(5, 6)) == [1, 6]           # a kept as it was on disk, b from the pass
    assert cached_pair((a, b), {"code": "k"}, f(7, 8)) == [1, 6]           # both on disk: no pass at all
    assert cached_pair((a, b), {"code": "j"}, f(9, 10)) == [9, 10]         # another key: both afresh, one pass
    assert calls == [(1, 2), (5, 6), (9, 10)]


@pytest.mark.parametrize("size", ["cpu", "smoke"])
def test_every_config_of_the_fednl_retrieval_grids_validates_and_the_unseen_client_holds_the_unseen_template(size):
    from lightfed import config as C, methods
    from lightfed.data import partition
    from lightfed.engine import local
    from lightfed.tasks import passkey
    import fednl_retrieval as R
    from fednl_claims import RECIPE
    grids = R.retrieval_grid(R.SIZES[size], [0, 1, 2], RECIPE) + R.templates_grid(R.TEMPLATES_SIZES[size], [0, 1, 2], RECIPE)
    for _, c in grids + R.recipe_grid(R.SIZES[size]):
        cfg = C.from_dict(c)
        local.check(cfg)
        methods.build(cfg)                          # lr_decay and every method option accepted
    names = sorted(passkey.TEMPLATES7)
    shards = partition.by_domain([t for t in names for _ in range(3)], len(names), 0)
    held = [c for label, c in R.templates_grid(R.TEMPLATES_SIZES[size], [0], RECIPE) if "unseen" in label][0]
    assert {[t for t in names for _ in range(3)][i] for i in shards[int(held["holdout"])]} == {R.UNSEEN}
    fednl = [c for label, c in grids if c["method"] == "fednl"]
    assert {c.get("lr_decay", "none") for c in fednl} == {"cosine", "none"}     # the grid and the first grid's constant lr


def test_every_stream_of_the_templates_grid_builds_at_every_size():
    """The config checks pass without building streams; a template whose needle and question might not fit a chunk
    fails when its streams are made (multiquery at depth 1 in 128 tokens did, when the grid first started)."""
    from lightfed import assets
    from lightfed.models import backbones
    from lightfed.tasks import passkey
    import fednl_retrieval as R
    try:
        tok = backbones.smollm2_tokenizer()
    except assets.AssetMissing as e:
        pytest.skip(str(e))
    tok.model_max_length = 10**9
    for size in R.TEMPLATES_SIZES.values():
        o = passkey.Options(**size["task"])
        for t in o.names():
            assert len(passkey.streams(o, tok, "eval", template=t)) == len(o.lens()) * len(o.deps()) * o.test_per_cell
            assert len(passkey.streams(o, tok, "train", template=t)) == o.train_size


def test_an_interrupted_benchmark_run_resumes_only_with_its_own_config_and_code(tmp_path, monkeypatch, capsys):
    import common
    from conftest import tiny_config
    from lightfed import config as C
    from lightfed.engine import local
    c = tiny_config("sentiment", "fedavg", tmp_path / "part", rounds=3).to_dict()
    full = common._run_one(("full", {**c, "out": str(tmp_path / "full")}))
    common.mark_start(c)
    local.run(C.from_dict(c), stop_after=1, log=lambda *a: None)          # killed after round 1
    assert common.resumable(c)
    assert not common.resumable({**c, "lr": 2e-3})                       # another config starts afresh
    monkeypatch.setattr(common, "code", lambda: "other code")
    assert not common.resumable(c)                                       # so does other code
    monkeypatch.undo()
    resumed = common._run_one(("part", c))
    assert "[bench] resume part" in capsys.readouterr().err
    assert resumed["history"] == full["history"] and resumed["final"] == full["final"]
    assert not common.resumable(c)                                       # finished: nothing left to resume
    local.run(C.from_dict({**c, "out": str(tmp_path / "old")}), stop_after=1, log=lambda *a: None)
    other = {**c, "out": str(tmp_path / "old"), "lr": 2e-3}              # a new config where a checkpoint lies
    common.mark_start(other)                                             # killed before its first checkpoint
    assert not common.resumable(other)


def test_a_benchmark_run_is_refused_while_another_process_runs_in_its_folder(tmp_path, capsys):
    """A killed benchmark's pool worker that goes on with its run holds the run's folder: the restarted benchmark's
    run there fails, named, and leaves the checkpoint alone (it had resumed beside the worker, and the run's last
    round was recorded twice); once the holder is gone it resumes."""
    import subprocess
    import common
    from conftest import tiny_config
    from lightfed import config as C
    from lightfed.engine import local
    c = tiny_config("sentiment", "fedavg", tmp_path / "run", rounds=3).to_dict()
    common.mark_start(c)
    local.run(C.from_dict(c), stop_after=1, log=lambda *a: None)
    kept = (tmp_path / "run" / "ckpt" / "latest.json").read_bytes()
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from lightfed.engine.lock import hold\n"
                               "with hold(sys.argv[1]):\n    print('held', flush=True); time.sleep(120)", c["out"]],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        s = common._run_one(("run", c))
        assert f"process {holder.pid} is running in this folder" in s["error"]
        assert "[bench] FAILED run" in capsys.readouterr().err
        assert (tmp_path / "run" / "ckpt" / "latest.json").read_bytes() == kept
    finally:
        holder.kill()
        holder.wait()
    s = common._run_one(("run", c))
    assert "error" not in s and [h["round"] for h in s["history"]] == [0, 1, 2, 3]


def test_flite_claims_over_one_task_runs_that_tasks_grid_and_reports_every_task(tmp_path):
    """--tasks fmnist may run fmnist's runs only (and the Pareto's with --baselines); the file's grid holds every
    task's, each in the store by its config, reported from the store or as not run (no file merged by hand)."""
    import common
    from flite_claims import PARTITIONS, TASKS, asked, grid_for, summarize
    g = grid_for(list(TASKS), [0, 1], False, True)
    assert len({common.store_folder(c) for _, c in g}) == len(g) and not any("out" in c for _, c in g)
    one = asked(g, ["fmnist"], False)
    assert one and all(label.startswith("fmnist |") for label in one)
    assert len(one) == sum(1 for label, _ in g if label.startswith("fmnist |"))
    assert {label.split(" | ")[0] for label in asked(g, ["fmnist"], True)} == {"fmnist", "pareto"}
    got = summarize(g, [{"label": label, "error": "not run"} for label, _ in g])
    assert got["rows"] == [] and len(got["missing"]) == len(g) and PARTITIONS["fmnist"]


def test_flite_vision_rounds_the_fp32_runs_final_z_to_int4_as_the_wire_does(tmp_path):
    """int4_roundtrip scores the fp32-latent run's own final model (its accuracy equals the run's final one), then
    the same z after one int4 round trip; other rows get None."""
    import numpy as np
    from conftest import tiny_config
    from flite_vision import claims, int4_roundtrip
    from lightfed import config as C
    from lightfed.engine import local
    c = tiny_config("fmnist", "flite", tmp_path / "f32", lr=0.3, eval_every=2,
                    method_options={"r": 2, "head": "orthogonal", "codec": "fp32"}).to_dict()
    s = local.run(C.from_dict(c), log=lambda *a: None)
    x = int4_roundtrip(c)
    assert x["accuracy"]["fp32"] == s["final"]
    assert 0 < x["rel_error"] < 0.3 and 0 <= x["zeroed"] < 1 and x["median_abs_z"] > 0
    assert int4_roundtrip({**c, "method_options": {**c["method_options"], "codec": "int4"}}) is None
    assert int4_roundtrip({**c, "method": "fedavg", "method_options": {}}) is None
    rows = {"flite|iid": {"finals": [0.5], "seeds": [0]},
            "flite_fp32|iid": {"finals": [s["final"]], "seeds": [0], "int4_roundtrip": [x]}}
    lines = dict(claims(rows, 10 ** 6))
    got = lines["the fp32-latent run's final z through one int4 round trip, seed 0"]
    assert got.startswith(f"{s['final']:.4f} -> {x['accuracy']['int4']:.4f}") and np.isfinite(x["accuracy"]["int4"])


def test_flite_vision_per_class_accuracy_adds_up_to_the_runs_final_accuracy(tmp_path):
    """per_class scores the run's own final model class by class: weighted by each class's test images, it gives the
    accuracy the run reported."""
    import numpy as np
    from conftest import tiny_config
    from flite_vision import per_class
    from lightfed import config as C
    from lightfed.engine import local
    c = tiny_config("fmnist", "flite", tmp_path / "f", lr=0.3, eval_every=2, partition="dirichlet:0.1",
                    method_options={"r": 2, "head": "orthogonal", "codec": "int4g"}).to_dict()
    s = local.run(C.from_dict(c), log=lambda *a: None)
    got = per_class(c)
    labels = local.final_model(c["out"])[0].task.test["labels"].numpy()
    counts = {k: int((labels == k).sum()) for k in got}
    assert set(got) == set(labels.tolist()) and all(0 <= v <= 1 for v in got.values())
    assert abs(sum(got[k] * counts[k] for k in got) / len(labels) - s["final"]) < 1e-9
    assert len(set(np.round(list(got.values()), 6))) > 1          # the classes differ: not one number repeated


def test_flite_vision_judges_the_trained_head_against_the_frozen_one_under_dirichlet():
    """The skew question's claim: both rows under Dirichlet(0.1), judged over their seeds, the gap seed by seed."""
    from flite_vision import claims
    name = "Dirichlet(0.1): a trained head above the frozen orthogonal head (fp32 latents)"
    rows = {"flite_head|dirichlet:0.1": {"finals": [0.50, 0.52, 0.51], "seeds": [0, 1, 2]},
            "flite_fp32|dirichlet:0.1": {"finals": [0.40, 0.41, 0.42], "seeds": [0, 1, 2]}}
    got = dict(claims(rows, 10 ** 6))[name]
    assert got.startswith("met") and "trained - frozen = +10.00 pp over seeds 0, 1, 2" in got
    rows["flite_fp32|dirichlet:0.1"]["finals"] = [0.50, 0.53, 0.49]             # ranges overlap
    assert not dict(claims(rows, 10 ** 6))[name].startswith("met")
    assert name not in dict(claims({"flite_head|iid": rows["flite_head|dirichlet:0.1"]}, 10 ** 6))


def test_a_quick_grids_tiny_twin_runs_leave_no_record():
    import common
    c = {"task": "fmnist", "method": "flite", "task_options": {"arch": "resnet18"}}
    c["out"] = common.store_folder(c)
    assert common.record_path(c) == common.RECORDS / f"{Path(c['out']).name}.json"
    tiny = {**c, "task_options": {"arch": "resnet18", "tiny": True}}
    assert common.record_path({**tiny, "out": common.store_folder(tiny)}) is None


def test_flite_vision_judges_the_probed_head_and_charges_the_probes_bytes_to_the_whole_run():
    """The probed row against the fresh orthogonal head on each partition; the probe's one round of uplink is added to
    the run's own before the whole run is compared with FedAvg's."""
    from flite_vision import claims
    name = "FLITE r = 16 int4g on a probed head above the fresh frozen orthogonal head (dirichlet:0.1)"
    rows = {"flite_r16g_probe|dirichlet:0.1": {"finals": [0.60, 0.62, 0.61], "seeds": [0, 1, 2], "up": 5, "up_total": 300,
                                               "initials": [0.55] * 3,
                                               "init": {"up_total": 100, "metric": 0.55}},
            "flite_r16g|dirichlet:0.1": {"finals": [0.40, 0.41, 0.42], "seeds": [0, 1, 2], "up": 5},
            "fedavg|dirichlet:0.1": {"finals": [0.7] * 3, "seeds": [0, 1, 2], "up": 50, "up_total": 4000}}
    got = dict(claims(rows, 10 ** 6))[name]
    assert got.startswith("met") and "probed - orthogonal = +20.00 pp" in got
    assert "100 B up over all clients, once" in got and "alone scores 0.5500" in got and "10x below FedAvg's" in got
    assert "(iid)" not in " ".join(dict(claims(rows, 10 ** 6)))
    own = dict(claims(rows, 10 ** 6))["FLITE's latents add to the probed head: above the probe alone (dirichlet:0.1)"]
    assert own.startswith("met") and "FLITE - probe alone = +6.00 pp" in own
    assert not [k for k, _ in claims(rows, 10 ** 6) if "same probed head" in k]     # no FedAvg from the probe: no claim
    rows["fedavg_probe|dirichlet:0.1"] = {"finals": [0.64, 0.65, 0.66], "seeds": [0, 1, 2], "up": 50}
    got = dict(claims(rows, 10 ** 6))
    same = got["on the same probed head, FLITE r = 16 int4g no worse than FedAvg fp32 - 1 pp (dirichlet:0.1)"]
    assert same.startswith("missed") and "FLITE - FedAvg = -4.00 pp" in same and "10x below" in same
    helps = got["the probed head helps FedAvg too: from the probe above from the fresh head (dirichlet:0.1)"]
    assert helps.startswith("missed") and "probed - fresh = -5.00 pp" in helps
    rows.update({"flite|iid": {"finals": [0.5] * 3, "seeds": [0, 1, 2], "up": 5},     # the full grid: the probe's
                 "fedavg|iid": {"finals": [0.8] * 3, "seeds": [0, 1, 2], "up": 50},   # reference line names both
                 "probe|iid": {"finals": [0.6], "seeds": [0], "up": 5}})
    ref = dict(claims(rows, 10 ** 6))["what the frozen base's features allow (the probe: a closed-form head, no body change; for reference)"]
    assert ref == "0.6000; FLITE 0.5000, FedAvg fp32 0.8000"


def test_flite_vision_sets_the_averaging_cost_of_flite_beside_fedavgs_seed_by_seed():
    """Each method's central row against its federated one, seed by seed; the two costs are compared seed by seed (a
    cost FedAvg pays as much is the protocol's, not FLITE's)."""
    from flite_vision import claims
    row = lambda finals, seeds=(0, 1, 2): {"finals": list(finals), "seeds": list(seeds), "up": 5}
    rows = {"flite_r16g_central|iid": row([0.82, 0.83, 0.84]), "flite_r16g|iid": row([0.77, 0.78, 0.79]),
            "fedavg|iid": row([0.80, 0.81, 0.82])}
    assert not [k for k, _ in claims(rows, 10 ** 6) if "FedAvg fp32 (central" in k or "costs FedAvg" in k]
    rows["fedavg_central|iid"] = row([0.84, 0.86, 0.85], (0, 2, 1))          # seeds out of order: paired by seed
    got = dict(claims(rows, 10 ** 6))
    assert got["what averaging costs FedAvg fp32: centralised (same steps) above federated"].startswith("met")
    both = got["averaging costs FLITE r = 16 int4g more than FedAvg fp32 (central - federated, seed by seed)"]
    assert both.startswith("met") and "FLITE's cost +5.00 pp, FedAvg's +4.00 pp" in both, both
    assert "centralised, FLITE - FedAvg = -2.00 pp over seeds 0, 1, 2" in both


def test_trivia_report_gives_own_models_only_to_personalised_methods_and_flags_an_outgrown_grid():
    """FedNL's clients hold the global model (its memory is a stream's): no own-model figure even where an older run
    recorded one, and no verdict against a personalised baseline's global model; a grid whose stored setting is not
    the code's preset says it is outgrown."""
    import fednl_claims as F
    seeds = [0.10, 0.11, 0.12]

    def method(name, personalised, own=None):
        return {"method": name, "personalised": personalised, "mean": (0.5, 0.0, 3), "initial": (0.3, 0.0, 3),
                "finals": [0.5] * 3, "per_domain": {"sports": (0.5, 0.0, 3)}, "drop": {"sports": (0.1, 0.0, 3)},
                "abs_drop_by_seed": seeds, "abs_own_drop_by_seed": own or [], "personal": (0.6, 0.0, 3) if own else None,
                "up_bytes": 10, "errors": [], "provenance": [{"at_hand": True}] * 3}
    size = F.SIZES["cpu"]
    rows = {label: method(m, m in ("fedala", "local_only"), [0.03] * 3 if m in ("fednl", "fedala") else None)
            for label, m, _ in F.METHODS}
    res = {"meta": {"date": "-"}, "trivia": {"size": "cpu", "task_options": size["trivia"], "run": size["trivia_run"],
                                             "methods": rows}}
    md = F.render(res)
    table = {line.split(" | ")[0]: line for line in md.splitlines() if line.startswith("| ") and "0.100, 0.110" in line}
    assert table["| FedNL"].endswith("| 0.100, 0.110, 0.120 | - |")             # recorded, yet not shown as its own
    assert table["| FedALA (p = every layer)"].endswith("| 0.030, 0.030, 0.030 |")
    assert "than FedAvg+LoRA's" in md and "than FedALA" not in md
    assert "Outgrown" not in md
    # runs that skipped round 0 (eval_start False) show the backbone's one score there
    assert "| FedNL | 0.300 ± 0.000 (n=3) |" in md and "(the backbone, scored once)" not in md
    rows["FedNL"]["initial"] = F.ms([None, None, None])
    res["trivia"]["backbone"] = {"accuracy": 0.33, "per_domain": {"sports": 0.33}}
    assert "| FedNL | 0.330 (the backbone, scored once) |" in F.render(res)
    res["trivia"]["task_options"] = {**size["trivia"], "test_per_domain": 100}
    assert "**Outgrown:**" in F.render(res)
    del rows["FedNL"]["provenance"]                       # kept without a record of its code: its name is marked
    assert "| FedNL† | 0.330 (the backbone, scored once) |" in F.render(res)


def test_a_passkey_grid_without_a_fednl_row_renders_and_plots(tmp_path):
    # a baseline collected alone (--rows 'FedAvg+LoRA, full attention' into a new --name) has no FedNL memory state
    import json
    import fednl_retrieval as R
    p = json.loads((Path(__file__).parents[1] / "benchmarks" / "results" / "fednl_claims.json").read_text())["passkey"]
    keep = "FedAvg+LoRA, full attention"
    r = {**p, "rows": {keep: p["rows"][keep]}, "retrieval": {keep: p["retrieval"][keep]},
         "ce": {**p["ce"], "curves": {}, "trend_last_vs_first": {}},
         "inference_bytes": {**p["inference_bytes"], "fednl_state_fp32": None}}
    md = "\n".join(R.markdown_retrieval(r))
    assert "FedNL's memory state - (no FedNL row in this grid)" in md and f"| {keep} | 1.000" in md
    R.plot_retrieval(r, tmp_path / "r.png")
    assert (tmp_path / "r.png").stat().st_size > 0


def _fake_finished_run(tmp_path, label):
    """A run folder with a checkpoint marker: what common.derived computes from (the values themselves are faked)."""
    d = tmp_path / label.replace(" ", "_").replace(",", "")
    (d / "ckpt").mkdir(parents=True)
    (d / "ckpt" / "latest.json").write_text("{}")
    return {"out": str(d)}


def test_trivia_grid_reports_every_seed_with_each_baselines_own_mechanism(monkeypatch, tmp_path):
    """The trivia part over the seeds asked for: a run that did not finish is reported as such; each baseline's
    internals and its distance from FedAvg+LoRA's adapters (same seed) are derived from its run; the backbone's score
    is the seed-free round 0."""
    import fednl_claims as F
    size = F.SIZES["cpu"]
    doms = size["trivia"]["domains"].split(",")

    def summary(method, seed, acc, opts):
        return {"method": method, "config": {"seed": seed, "method_options": opts}, "final": acc, "initial": None, "code": "x",
                "per_domain": {d: acc for d in doms}, "bytes": {"up_per_client_round": 7},
                "per_client": {str(i): {"accuracy": acc + 0.1, "domains": [d]} for i, d in enumerate(doms)}
                if method in ("fedala", "local_only") else None}

    def fake_grid(size_, task, to, clients, seeds, methods, tag, workers):
        g = [(f"trivia {label} s{seed}", {**_fake_finished_run(tmp_path, f"{label} s{seed}"), "seed": seed})
             for seed in seeds for label, _, _ in methods]
        return g, [summary(m, seed, [0.4, 0.5, 0.6][seed], o) if seed != 1 or m != "fednl" else {"error": "not run"}
                   for seed in seeds for _, m, o in methods]
    monkeypatch.setattr(F, "grid", fake_grid)
    monkeypatch.setattr(F, "backbone_trivia", lambda s: {"accuracy": 0.33, "per_domain": {}})
    monkeypatch.setattr(F.R, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(F.R, "internals", lambda s, slug: {"fedala": {"ala_one_minus_w": 0.01}}.get(slug, {"penalty_share": 0.2}))
    monkeypatch.setattr(F.R, "adapter_distance", lambda a, b: 0.0 if a is b else 0.1)
    r = F.part_trivia(size, [0, 1, 2], 1)
    assert r["methods"]["FedAvg+LoRA"]["finals"] == [0.4, 0.5, 0.6] and r["methods"]["FedNL"]["finals"] == [0.4, 0.6]
    assert r["methods"]["FedNL"]["errors"] == ["not run"]
    assert r["methods"]["local-only"]["personal"][2] == 3 and r["backbone"]["accuracy"] == 0.33
    md = F.render({"meta": {"date": "-"}, "trivia": {**r, "size": "cpu"}})    # internals kept; equal finals counted
    assert "| FedALA (p = every layer) | ala_one_minus_w 0.01 | 0.1000 ± 0.0000 (n=3) | 3 of 3 seeds |" in md
    assert "| FedProx (LoRA, mu 1) | penalty_share 0.2 |" in md and "| FedNL | -" not in md.split("own mechanisms")[1]


def test_ce_grid_reports_each_fednl_row_with_its_lr_and_schedule(monkeypatch, tmp_path):
    """The CE part: each run's curve (and FedNL's memory-reset twin) derived from its final model, the backbone's
    computed once; each FedNL row gets its own verdicts, and states the lr and schedule it ran."""
    import fednl_claims as F
    size = F.SIZES["cpu"]
    n = size["ce_tokens"] // size["ce_bucket"]

    def fake_grid(size_, task, to, clients, seeds, methods, tag, workers):
        g = [(f"austen {label} s{seed}", {**_fake_finished_run(tmp_path, f"{label} s{seed}"), "lr_decay": "cosine"})
             for seed in seeds for label, _, _ in methods]
        return g, [{"method": m, "final": 30.0, "initial": 35.0, "bytes": {}, "lr": {"rules": 0.01}, "config": {"lr": 0.0}, "seed": seed}
                   for seed in seeds for _, m, _ in methods]
    curve = {"carry": [3.0] * (n - 1) + [2.7], "reset": [3.0] * n}     # the carried memory's CE falls 10% along the stream
    monkeypatch.setattr(F, "grid", fake_grid)
    monkeypatch.setattr(F.R, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(F.R, "final_model", lambda s, dtype="bf16": s)
    monkeypatch.setattr(F, "ce_curve", lambda model, ids, bucket, carry=True: [5.0] * n if not isinstance(model, dict)
                        else curve["carry" if carry else "reset"])
    monkeypatch.setattr(F.R, "heldout_austen_ids", lambda k: None)
    import torch
    from lightfed.models import backbones
    monkeypatch.setattr(backbones, "smollm2", lambda *a: torch.nn.Identity())     # the frozen backbone: not loaded
    monkeypatch.setattr(F, "METHODS", [m for m in F.METHODS if m[0] == "FedNL, its own lr"])
    ce = F.part_ce(size, [0, 1, 2], 1)
    assert ce["curves"]["frozen backbone"] == [5.0] * n
    assert ce["curves"]["austen FedNL, its own lr s0"] == curve["carry"]
    assert ce["curves"]["austen FedNL, its own lr s2, memory reset per chunk"] == curve["reset"]
    assert {r["label"]: (r["lr"], r["lr_decay"]) for r in ce["runs"]} == {
        f"austen FedNL, its own lr s{i}": (0.01, "cosine") for i in range(3)}
    md = F.render({"meta": {"date": "-"}, "ce": {**ce, "size": "cpu"}})
    own = md.split("**FedNL, its own lr** (lr 0.01 cosine):")[1]
    assert "help along the stream (its trend below the same model's with the memory emptied at every chunk)? **met**" in own


def test_passkey_targets_are_decided_on_their_own_test_set():
    """A FedNL row with the targets' test set (JUDGE: 500 streams a length) is judged on it, not on the grid's 20-stream
    cells; without it, the grid's cells."""
    import json
    import fednl_retrieval as R
    p = json.loads((Path(__file__).parents[1] / "benchmarks" / "results" / "fednl_claims.json").read_text())["passkey"]
    p = {**p, "setting": {**p["setting"], "judge": R.JUDGE}, "rows": {**p["rows"]}}
    name = "FedNL"
    for k in (name, "FedNL, memory reset per chunk"):
        p["rows"][k] = {**p["rows"][k], "seeds": [0, 1, 2], "cells": p["rows"][k]["cells"][:3]}
        p["rows"][k].pop("judged", None)
    grid_line = R.threshold_target(p["retrieval"][name]["4"], 0.9)
    assert f"| FedNL >= 0.9 at 4 chunks | {grid_line} |" in "\n".join(R.markdown_retrieval({**p, "retrieval_judged": {}}))
    cells = lambda x, y: {f"{L}/{d}": v for L, v in (("4", x), ("16", y)) for d in ("0", "0.25", "0.5", "0.75")}
    p["rows"][name]["judged"] = {"0": cells(0.95, 0.6), "1": cells(0.91, 0.55), "2": cells(0.93, 0.7)}
    p["rows"]["FedNL, memory reset per chunk"]["judged"] = {str(i): cells(0.0, 0.02) for i in range(3)}
    p["rows"]["backbone, full attention"] = {**p["rows"]["backbone, full attention"], "judged": {"-": cells(1.0, 0.98)}}
    p["retrieval_judged"] = R.judged_retrieval(p["rows"])
    assert p["retrieval_judged"][name] == {"4": [0.95, 0.91, 0.93], "16": [0.6, 0.55, 0.7]}
    md = "\n".join(R.markdown_retrieval(p))
    assert "| FedNL vs full attention at 1024 tokens, the targets' test set | 0.617 vs 0.980 |" in md
    assert "| backbone, full attention | 1.000 | 0.980 | - |" in md
    assert "the thresholds on the targets' test set;" in md and "one stream 0.20 pp" in md
    assert "| FedNL >= 0.9 at 4 chunks | met (0.95, 0.91, 0.93) |" in md
    assert "| the reset control <= 0.1 at every length | met (max 0.02) |" in md
    p["rows"][name]["judged"]["1"] = cells(0.85, 0.5)
    p["retrieval_judged"] = R.judged_retrieval(p["rows"])
    assert "| FedNL >= 0.9 at 4 chunks | not met on every seed (2 of 3) (0.95, 0.85, 0.93) |" in "\n".join(R.markdown_retrieval(p))


def test_recipe_rows_run_alone_are_reported_with_every_row_of_the_store_in_the_recipes_order(monkeypatch, tmp_path):
    """--rows: only those rows may run; the report holds every row of RECIPE (the others from the store, or 'not run'),
    its steps and training losses read from the run's records (kept in the run's record)."""
    import common
    import fednl_retrieval as R
    monkeypatch.setattr(common, "STORE", tmp_path / "store")
    new = R.RECIPE[-1][0]
    asked = []

    def fake_run(grid, workers, from_runs=False, only=None):
        asked.append(only if not from_runs else ("from runs", only))
        out = []
        for label, c in grid:
            if label not in only:
                out.append({"label": label, "error": "not run: not asked for by this command, and not in the store"})
                continue
            d = Path(c["out"])
            (d / "ckpt").mkdir(parents=True)
            (d / "ckpt" / "latest.json").write_text("{}")
            (d / "metrics.jsonl").write_text('{"round": 0}\n{"round": 1, "clients": [{"steps": 30, "train_loss": 1.0}]}\n')
            out.append({"out": str(d), "cells": {"passkey": {"4/0": 1.0, "4/1": 0.5}}, "time": {"client_compute": 60.0},
                        "initial": 0.0, "final": 0.75})
        return out
    monkeypatch.setattr(R, "reuse_or_run", fake_run)
    monkeypatch.setattr(R, "step_costs", lambda size: {"fresh": 1.0})
    r = R.part_recipe("cpu", 1, {new})
    assert asked == [{new}] and [x["label"] for x in r["rows"]] == [x[0] for x in R.RECIPE]
    assert all(x["error"].startswith("not run") for x in r["rows"][:-1])
    assert r["rows"][-1]["outside_question_chunk"] == 1.0 and r["rows"][-1]["s_per_step"] == 2.0
    assert r["rows"][-1]["train_loss"] == [1.0]
    with pytest.raises(ValueError, match="unknown rows"):
        R.part_recipe("cpu", 1, {"no such row"})
    monkeypatch.setattr(R, "step_costs", lambda size: pytest.fail("--from-runs measured the step costs"))
    shutil.rmtree(tmp_path / "store")
    r = R.part_recipe("cpu", 1, {new}, from_runs=True)       # --from-runs: nothing runs, no cost is measured
    assert asked[-1] == ("from runs", {new}) and r["costs"] is None
    assert "Cost of one training step" not in "\n".join(R.markdown_recipe(r))


def test_why_table_sets_each_edit_beside_the_streams_as_drawn():
    import json
    import fednl_retrieval as R
    p = json.loads((Path(__file__).parents[1] / "benchmarks" / "results" / "fednl_claims.json").read_text())["passkey"]
    p = {**p, "setting": {**p["setting"], "judge": R.JUDGE}, "rows": {**p["rows"]}}
    four = lambda *xs: {f"4/{d}": x for d, x in zip(("0", "0.25", "0.5", "0.75"), xs)}      # noqa: E731
    judged = {str(i): {**four(0.8, 0.8, 0.9, 1.0), "16/0": 0.5} for i in range(3)}
    why = {str(i): {"needle moved next to the question": four(1.0, 1.0, 1.0, 1.0),
                    "needle's chunk alone before the question": four(0.7, 0.7, 0.7, 0.7)} for i in range(3)}
    p["rows"]["FedNL"] = {**p["rows"]["FedNL"], "seeds": [0, 1, 2], "cells": p["rows"]["FedNL"]["cells"][:3],
                          "judged": judged, "why": why}
    p["retrieval_judged"] = R.judged_retrieval(p["rows"])
    md = "\n".join(R.markdown_retrieval(p))
    assert "| seed | streams | depth 0 (3 back) | depth 0.25 (3 back) | depth 0.5 (2 back) | depth 0.75 (1 back) | mean |" in md
    assert "| 1 | as drawn | 0.800 | 0.800 | 0.900 | 1.000 | 0.875 |" in md
    assert "| 2 | needle moved next to the question | 1.000 | 1.000 | 1.000 | 1.000 | 1.000 |" in md
    assert ("needle moved next to the question, against as drawn (per seed 0, 1, 2): the mean over depths +0.125, "
            "+0.125, +0.125; at depth 0 (3 chunks back) +0.200, +0.200, +0.200.") in md
    assert "at depth 0 (3 chunks back) -0.100, -0.100, -0.100." in md
    del p["rows"]["FedNL"]["why"]
    assert "streams | depth 0" not in "\n".join(R.markdown_retrieval(p))


def test_ce_bounded_table_sets_the_memory_emptied_every_k_chunks_beside_carried_and_reset():
    import fednl_retrieval as R
    rows = {"FedNL": {"seeds": [0, 1], "cells": [{}, {}],
                      "ce_bounded": {"1": {"reset_every": 4, "curve": [2.0, 2.2]}}}}
    curves = {"FedNL": [[3.0, 3.3], [4.0, 5.0]], "FedNL, memory reset per chunk": [[1.0, 1.0], [2.0, 2.0]]}
    md = "\n".join(R.markdown_ce_bounded(rows, curves))
    assert "| seed | carried | emptied every 4 chunks | emptied every chunk |" in md
    assert "| 1 | 4.500, +0.250 | 2.100, +0.100 | 2.000, +0.000 |" in md and "| 0 |" not in md
    assert R.markdown_ce_bounded({"FedNL": {**rows["FedNL"], "ce_bounded": {}}}, curves) == []


def test_templates_verdict_says_how_much_each_templates_client_trained():
    import json
    import fednl_retrieval as R
    t = json.loads((Path(__file__).parents[1] / "benchmarks" / "results" / "fednl_claims.json").read_text())["templates"]
    md = "\n".join(R.markdown_templates(t))
    assert "FedNL above FedALA: " in md and "each template's client about 64 local steps over the run (10 rounds x 3 of 7" in md
    md = "\n".join(R.markdown_templates({**t, "setting": {**t["setting"], "rounds": 21}}))
    assert "each template's client about 135 local steps over the run (21 rounds x 3 of 7" in md


def test_the_run_store_names_a_run_by_its_config_and_reuses_it_while_the_code_it_ran_is_unchanged(tmp_path, monkeypatch):
    """A config without "out" lives in runs/store/<task>-<method>-<config hash>; run once, it is reused (not run
    again) with its provenance, until a function it ran changes (here: its recorded fingerprint edited), when it is
    run afresh; a figure from a run not made by the code at hand is marked."""
    import json

    import common
    import torch
    monkeypatch.setattr(common, "STORE", tmp_path / "store")
    threads = torch.get_num_threads()
    c = {"task": "synthetic", "method": "fedavg", "clients": 2, "rounds": 1, "local_steps": 1, "batch_size": 4,
         "lr": 1e-2, "progress": False, "task_options": {"kind": "clf"}}
    f = common.store_folder(c)
    assert f == common.store_folder({**c, "progress": True}) != common.store_folder({**c, "lr": 2e-2})
    assert Path(f).name.startswith("synthetic-fedavg-")
    runs = []
    monkeypatch.setattr(common, "run_grid", lambda todo, *a, **k: runs.append(todo) or [common._run_one(g) for g in todo])
    try:
        (s,) = common.reuse_or_run([("row", c)], workers=1)
        assert s["out"] == f and len(runs) == 1
        bench = json.loads((Path(f) / "bench.json").read_text())
        assert bench["config"] == {**c, "out": f}
        assert "methods/fedavg.py::FedAvg.client_update" in bench["code_used"]
        (again,) = common.reuse_or_run([("row", c)], workers=1)
        assert len(runs) == 1 and again["final"] == s["final"]                 # reused, not run again
        prov = common.provenance(again)
        assert prov["at_hand"] and prov["code"] == s["code"] and prov["command"]
        assert common.marked("0.5", [prov]) == "0.5"
        assert common.marked("0.5", []) == common.marked("0.5", None) == "0.5†"     # no record of its maker: marked
        bench["code_used"]["methods/fedavg.py::FedAvg.client_update"] = "0" * 12   # as if the code had changed since
        (Path(f) / "bench.json").write_text(json.dumps(bench))
        stale = {**again, "bench": bench}
        assert not common.provenance(stale)["at_hand"] and common.marked("0.5", [prov, common.provenance(stale)]) == "0.5†"
        (shown,) = common.reuse_or_run([("row", c)], workers=1, from_runs=True)     # reported as it is, marked, not run
        assert len(runs) == 1 and shown["final"] == s["final"] and not common.provenance(shown)["at_hand"]
        (kept,) = common.reuse_or_run([("row", c)], workers=1, only=set())            # not asked for: the same
        assert len(runs) == 1 and kept["final"] == s["final"] and not common.provenance(kept)["at_hand"]
        common.reuse_or_run([("row", c)], workers=1)
        assert len(runs) == 2                                                  # that run's code changed: made afresh
        other = {**c, "lr": 2e-2}                 # only=: the rows this command may run; the others come from the store
        for only in (set(), None):            # a run in neither the store nor the records: the report stops, unwritten
            with pytest.raises(SystemExit, match="1 run.*'other'.*--allow-missing"):
                common.reuse_or_run([("row", c), ("other", other)], workers=1, only=only, from_runs=only is None)
        assert len(runs) == 2
        monkeypatch.setattr(common, "ALLOW_MISSING", True)                     # --allow-missing: listed as not run
        kept, absent = common.reuse_or_run([("row", c), ("other", other)], workers=1, only=set())
        assert len(runs) == 2 and kept["final"] == s["final"] and absent["error"].startswith("not run")
        common.reuse_or_run([("row", c), ("other", other)], workers=1, only={"other"})
        assert len(runs) == 3 and [label for label, _ in runs[-1]] == ["other"]
    finally:
        torch.set_num_threads(threads)


def test_a_hostile_run_records_who_made_it_like_every_benchmark_run(tmp_path):
    """robustness's own runner writes bench.json as common's does (the config as asked, hostility included, and the
    functions the run executed), so its runs are judged by the code they ran, not by every file of src/lightfed."""
    import json
    import common
    from conftest import tiny_config
    from robustness import _hostile_one
    c = {**tiny_config("sentiment", "fedavg", tmp_path / "h").to_dict(), "engine_options": {"hostile": 0}}
    s = _hostile_one(("fedavg|hostile0|s0", c))
    b = json.loads((tmp_path / "h" / "bench.json").read_text())
    assert b == s["bench"] and b["config"] == c and b["code_used"] and common.at_hand(s)
    assert common.finished("x", c)["final"] == s["final"]        # reused as it was asked for


def tiny_store(tmp_path, monkeypatch, note):
    """A run store and its records under tmp_path, a tiny config, and the list each run_grid call appends note(todo) to."""
    import common
    for k, v in (("STORE", tmp_path / "store"), ("RECORDED", tmp_path / "store"), ("RECORDS", tmp_path / "records")):
        monkeypatch.setattr(common, k, v)
    c = {"task": "synthetic", "method": "fedavg", "clients": 2, "rounds": 1, "local_steps": 1, "batch_size": 4,
         "lr": 1e-2, "progress": False, "task_options": {"kind": "clf"}}
    runs = []
    monkeypatch.setattr(common, "run_grid", lambda todo, *a, **k: runs.append(note(todo)) or
                        [common._run_one(g) for g in todo])
    return c, runs


def test_a_store_runs_record_outlives_its_folder_with_what_was_derived_from_its_checkpoint(tmp_path, monkeypatch):
    """A finished store run leaves a record (benchmarks/records/<folder>.json: its summary and bench.json); on a machine
    without the run's folder the record is reused as the run was (same provenance), and a value derived from the
    checkpoint (common.derived) comes from the record while the code that derived it is the same; changed, with the
    checkpoint gone, it is None (not the old value)."""
    import json
    import shutil

    import common
    import torch
    threads = torch.get_num_threads()
    c, runs = tiny_store(tmp_path, monkeypatch, lambda todo: todo)
    calls = []

    def norm(c):                                # a value only the checkpoint holds
        from lightfed.engine import local
        calls.append(1)
        return float(sum(v.float().norm() for v in local.load_checkpoint(Path(c["out"]))[1].values()))
    try:
        (s,) = common.reuse_or_run([("row", c)], workers=1)
        (_, placed), = common.placed([("row", c)])
        rec = json.loads(common.record_path(placed).read_text())
        assert rec["final"] == s["final"] and rec["bench"]["config"] == placed
        v = common.derived(placed, "norm", norm)
        assert v > 0 and common.derived(placed, "norm", norm) == v and len(calls) == 1     # computed once, kept
        shutil.rmtree(placed["out"])                                  # another machine: the record only
        (again,) = common.reuse_or_run([("row", c)], workers=1)
        assert len(runs) == 1 and again["final"] == s["final"] and common.provenance(again)["at_hand"]
        assert common.derived(placed, "norm", norm) == v and len(calls) == 1
        assert [r["round"] for r in common.records(placed["out"])] == [0, 1]             # its rounds, from the record
        Path(placed["out"]).mkdir(parents=True)          # a restart of the run, killed after its round 0: the
        (Path(placed["out"]) / "metrics.jsonl").write_text(json.dumps({"round": 0}) + "\n")     # record keeps its rounds
        common.keep(common.finished("row", placed))
        assert [r["round"] for r in json.loads(common.record_path(placed).read_text())["rounds"]] == [0, 1]
        shutil.rmtree(placed["out"])
        assert common.derived(placed, "norm", lambda c: norm(c) + 1) is None              # other code, no checkpoint
        (_, other), = common.placed([("row", {**c, "lr": 2e-2})])
        assert common.finished("row", other) is None and common.derived(other, "norm", norm) is None
        monkeypatch.setattr(common, "STORE", tmp_path / "elsewhere")   # another store (reproduce's): no record read
        (_, there), = common.placed([("row", c)])
        assert common.record_path(there) is None and common.finished("row", there) is None
    finally:
        torch.set_num_threads(threads)


def test_from_runs_reports_an_evaluation_other_code_made_marked_and_makes_again_only_what_was_never_made(tmp_path, monkeypatch):
    """fednl_retrieval with --from-runs (REPORT_ONLY): an evaluation kept by another evaluator is reported as it is, not
    made again, and the row it belongs to is marked (its figures get a dagger); a backbone evaluation kept under another
    key likewise; one never made is computed. Without --from-runs the other evaluator's value is made again."""
    import common
    import fednl_retrieval as R
    import torch
    threads = torch.get_num_threads()
    c, _ = tiny_store(tmp_path, monkeypatch, lambda todo: todo)
    calls = []

    def f(v):
        return lambda: calls.append(v) or v
    monkeypatch.setattr(R, "STALE", [])
    try:
        (s,) = common.reuse_or_run([("row", c)], workers=1)
        (_, placed), = common.placed([("row", c)])
        monkeypatch.setattr(R, "evaluator", lambda: "scorer-1")
        assert R.evaluated(placed, "score", f(1), task="t") == 1 and calls == [1]
        monkeypatch.setattr(R, "evaluator", lambda: "scorer-2")            # the scorer changed since
        monkeypatch.setattr(R, "REPORT_ONLY", True)
        row = {"provenance": [common.provenance(s)]}
        assert common.marked("1", row["provenance"]) == "1"
        assert R.evaluated(placed, "score", f(2), task="t") == 1 and calls == [1]   # reported, not made again
        assert R.STALE == [f"{Path(placed['out']).name}: score"]
        R.marks(row, 0)
        assert common.marked("1", row["provenance"]) == "1†" and row["provenance"][-1]["evaluations"] == R.STALE
        assert R.evaluated(placed, "never", f(3), task="t") == 3 and calls == [1, 3]  # never made: computed
        assert R.cached_pair((tmp_path / "b.json", None), {"backbone": "x"}, f((4,))) == [4]
        monkeypatch.setattr(R, "evaluator", lambda: "scorer-3")
        assert R.cached_pair((tmp_path / "b.json", tmp_path / "g.json"), {"backbone": "x"}, f((5, 6))) == [4, 6]
        assert R.STALE[-1] == str(tmp_path / "b.json") and len(R.STALE) == 2
        monkeypatch.setattr(R, "REPORT_ONLY", False)
        assert R.evaluated(placed, "score", f(7), task="t") == 7                   # a run that may run: made again
        assert R.marks(row, len(R.STALE)) is None and len(row["provenance"]) == 2  # nothing new reported: no new mark
    finally:
        torch.set_num_threads(threads)


def test_a_chained_store_run_starts_from_its_starts_folder_and_a_gone_start_is_made_again_only_when_needed(tmp_path, monkeypatch):
    """common.chained: a grid run naming a start's label in "init" starts from that start's store folder; with both
    folders gone (records only) nothing runs again; a new grid run whose start's checkpoint is gone makes the start
    again, then itself."""
    import shutil

    import common
    import torch
    threads = torch.get_num_threads()
    c, runs = tiny_store(tmp_path, monkeypatch, lambda todo: [label for label, _ in todo])
    starts, grid = [("start", c)], [("next", {**c, "lr": 2e-2, "init": "start"})]
    try:
        (s0,), (s1,) = common.chained(starts, grid, workers=1)
        assert runs == [["start"], ["next"]] and s1["bench"]["config"]["init"] == s0["bench"]["config"]["out"]
        for s in (s0, s1):
            shutil.rmtree(s["bench"]["config"]["out"])
        (r0,), (r1,) = common.chained(starts, grid, workers=1)           # both finished: their records
        assert len(runs) == 2 and r1["final"] == s1["final"]
        (_, (n1,)) = common.chained(starts, [("other", {**c, "lr": 3e-2, "init": "start"})], workers=1)
        assert runs[2:] == [["start"], ["other"]] and "error" not in n1
        assert (Path(s0["bench"]["config"]["out"]) / "ckpt" / "latest.json").exists()
    finally:
        torch.set_num_threads(threads)


def test_flite_vision_agreement_measures_what_averaging_keeps_of_the_clients_moves(tmp_path):
    """agreement_of: identical moves keep everything (1), opposite ones nothing (0), K orthogonal equal ones 1/sqrt(K);
    agreement on the tiny twin, FLITE and FedAvg under label skew: a bounded measure of a real move in both spaces."""
    import torch
    from conftest import tiny_config
    from flite_vision import agreement, agreement_of
    v = torch.randn(50)
    assert abs(agreement_of(torch.stack([v, v, v]), [1, 2, 3])["efficiency"] - 1) < 1e-9
    assert agreement_of(torch.stack([v, -v]), [1, 1])["efficiency"] < 1e-9
    assert abs(agreement_of(torch.eye(4), [5] * 4)["efficiency"] - 0.5) < 1e-9
    assert abs(agreement_of(torch.eye(4), [5] * 4)["cosine"] - 0.5) < 1e-9
    for method, mo, lr in (("flite", {"r": 2, "head": "orthogonal", "codec": "fp32"}, 0.3), ("fedavg", {}, 1e-3)):
        c = tiny_config("fmnist", method, tmp_path / method, lr=lr, clients=3, partition="dirichlet:0.1",
                        method_options=mo).to_dict()
        got = agreement(c)
        assert set(got) == {"convolutions' weights", "trained parameters"}
        for a in got.values():
            assert 0 < a["efficiency"] <= 1 + 1e-9 and -1 <= a["cosine"] <= 1 and a["move_norm_median"] > 0


def test_fednl_in_flite_latents_waits_for_its_lr_and_takes_the_one_validation_streams_chose(monkeypatch):
    """The passkey grid's latent row runs with the options and lr of the recipe's latent row with the best validation
    exact match outside the question's chunk; until each of those rows finished, it is not in the grid."""
    import common
    import fednl_retrieval as R
    from fednl_claims import RECIPE
    size = R.SIZES["smoke"]
    score = {1e-2: 0.2, 1e-1: 0.6, 1.0: 0.4}
    done = {}

    def finished(label, c):
        return {"cells": {"passkey": {"4/0": score[c["lr"]], "4/1": 1.0}}} if c["lr"] in done else None
    monkeypatch.setattr(common, "finished", finished)
    done.update({1e-2: 1, 1e-1: 1})
    assert R.latent_choice(size) is None
    assert not [l for l, _ in R.retrieval_grid(size, [0], RECIPE) if l.startswith("FedNL in FLITE latents")]
    done[1.0] = 1
    assert R.latent_choice(size)[1] == 1e-1
    (c,) = [c for l, c in R.retrieval_grid(size, [0], RECIPE) if l.startswith("FedNL in FLITE latents")]
    assert c["lr"] == 1e-1 and c["method_options"]["latent_r"] == 8 and c["method_options"]["codec"] == "int4"


def test_flite_lm_chooses_lrs_on_a_validation_corpus_that_never_holds_the_test_text(tmp_path, monkeypatch):
    """The sweep runs on the novels' first 88% (whose own held-out 10% is training text of the real task); every config
    validates; the grid runs each row at the lr with the lowest validation perplexity, and a row whose sweep has not
    finished is left out."""
    from lightfed import config as C
    from lightfed.data import datasets
    from lightfed.engine import local
    import flite_lm as L
    books = datasets.load_austen()
    monkeypatch.setattr(datasets, "load_austen", lambda: dict(books))     # the asset stays where it is installed
    monkeypatch.setenv("LIGHTFED_CACHE", str(tmp_path))
    d = Path(L.validation_corpus())
    assert d.parent == tmp_path
    assert sorted(p.stem for p in d.glob("*.txt")) == sorted(books)
    for title, text in books.items():
        v = (d / f"{title}.txt").read_text(encoding="utf-8")
        assert text.startswith(v) and len(v) == int(len(text) * L.CUT) and L.CUT <= 0.9 * 0.98   # clear of the test's 10%
    for quick in (False, True):
        cal = L.configs(quick, None, [0])
        assert len(cal) == sum(map(len, L.SWEEP["austen"].values())) and all(c["task_options"]["data"] == str(d) for _, c in cal)
        grid = L.configs(quick, {k: 1e-3 for k in L.SWEEP["austen"]}, [0, 1, 2])
        assert len(grid) == 3 * len(L.SWEEP["austen"]) and not any("data" in c["task_options"] for _, c in grid)
        pcal = L.configs(quick, None, [0], "psentiment")      # psentiment: tweets outside its train and test rows
        pgrid = L.configs(quick, {k: 1e-3 for k in L.SWEEP["psentiment"]}, [0, 1, 2], "psentiment")
        assert len(pcal) == sum(map(len, L.SWEEP["psentiment"].values())) and all(c["task_options"]["validation"] for _, c in pcal)
        assert len(pgrid) == 3 * len(L.SWEEP["psentiment"]) and not any("validation" in c["task_options"] for _, c in pgrid)
        for _, c in cal + grid + pcal + pgrid:
            local.check(C.from_dict(c))
        steps = {label.split(" ")[0]: c["rounds"] * c["local_steps"] * max(1, round(c["clients"] * c["fraction"]))
                 for label, c in pgrid}
        central = {label.split(" ")[0] for label, c in pgrid if c["clients"] == 1}
        assert central == {"fedavg_central", "flite_central", "flite_central_r64"} and len(set(steps.values())) == 1   # the same steps
        for label, c in grid if not quick else []:    # austen: a round is 3 clients x one epoch of 20 blocks, batch 4
            per_client = -(-c["task_options"]["train_blocks"] // 10 // c["batch_size"])
            want = round(10 * 0.3) * per_client
            if label.split(" ")[0] in L.ROW_RUN:
                assert c["clients"] == 1 and c["local_steps"] == want == 15 and c["rounds"] == L.BASE["austen"]["rounds"]
            else:
                assert (c["clients"], c["fraction"], c["local_epochs"], c.get("local_steps", 0)) == (10, 0.3, 1.0, 0)
    cal = L.configs(False, None, [0])
    ppl = {("fedavg", 5e-5): 40.0, ("flite", 3e-2): 41.0, ("flite_r22g", 1e-1): 39.0}
    sums = [{"final": ppl.get((label.split(" ")[0], c["lr"]), 50.0)} for label, c in cal]
    sums = [{"error": "not run"} if label.startswith("flite_delta") and c["lr"] == 0.1 else x    # its sweep unfinished:
            for (label, c), x in zip(cal, sums)]                                               # no lr yet
    lrs, table = L.choose(cal, sums)
    assert {k: lrs[k] for k in ("fedavg", "flite", "flite_r22g", "flite_delta")} == {
        "fedavg": 5e-5, "flite": 3e-2, "flite_r22g": 1e-1, "flite_delta": None}
    chosen = [t["edge"] for t in table if t["chosen"] and t["row"] in ("fedavg", "flite", "flite_r22g")]
    assert chosen == [False, False, True]   # 0.1: the top of r22g's sweep
    pcal = L.configs(False, None, [0], "psentiment")          # accuracy: the highest validation score wins
    acc = {("fedavg", 1e-4): 0.80, ("flite", 1e-1): 0.79}
    lrs, table = L.choose(pcal, [{"final": acc.get((label.split(" ")[0], c["lr"]), 0.7)} for label, c in pcal], "psentiment")
    assert {k: lrs[k] for k in ("fedavg", "flite")} == {"fedavg": 1e-4, "flite": 1e-1}
    assert [t["edge"] for t in table if t["chosen"] and t["row"] in ("fedavg", "flite")] == [False, True]


def test_flite_lm_rows_runs_only_the_rows_asked_for(tmp_path, monkeypatch):
    """--rows flite_delta: the sweep's and the grid's runs of that row may run; every other row is reported as the
    store holds it (reuse_or_run's `only`)."""
    import common
    import flite_lm as L
    asked = []
    def fake(grid, workers, from_runs=False, only=None, **k):
        asked.append((len(grid), only))
        return [{"label": label, "error": "not run"} for label, _ in grid]
    monkeypatch.setattr(common, "reuse_or_run", fake)
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    L.main(["--task", "psentiment", "--rows", "flite_delta"])
    (n, only), (m, _) = asked                # no lr chosen: the grid has no run to ask for
    assert m == 0
    assert n == sum(map(len, L.SWEEP["psentiment"].values()))
    assert only == {f"flite_delta lr {lr:g}" for lr in L.SWEEP["psentiment"]["flite_delta"]}
    assert (tmp_path / "flite_lm_psentiment.md").exists()


def test_flite_lm_misses_its_claim_under_the_uplink_target_whatever_the_perplexity():
    import flite_lm as L
    rows = {"fedavg": {"finals": [45.0, 45.1, 45.2], "up": 8_000_000},
            "flite": {"finals": [45.1, 45.2, 45.3], "up": 900},          # 8,889x, within 1% on every seed
            "flite_r22g": {"finals": [45.1, 45.2, 45.3], "up": 1100}}    # 7,273x
    got = dict(L.claims(rows))
    a, b = (next(v for k, v in got.items() if k.startswith(L.ROWS[i][1])) for i in (1, 2))
    assert a.startswith("met") and "8,889x" in a and "at least 8,000x" in a
    assert b.startswith("missed") and "under 8,000x" in b
    rows["flite"]["finals"] = [46.0, 46.1, 46.2]                          # 2% above: separated the wrong way
    assert dict(L.claims(rows))[next(k for k in got if k.startswith(L.ROWS[1][1]))].startswith("missed")
    acc = {"fedavg": {"finals": [0.80, 0.805, 0.80], "up": 8_000_000}, "flite": {"finals": [0.798, 0.80, 0.80], "up": 900}}
    (k, v), = L.claims(acc, "psentiment")                # accuracy: within 1 pp, FLITE's range above FedAvg's - 1 pp
    assert "accuracy within 1 pp" in k and v.startswith("met") and "-0.2 pp" in v
    acc["flite"]["finals"] = [0.78, 0.785, 0.78]
    assert dict(L.claims(acc, "psentiment"))[k].startswith("missed")
    acc |= {"flite_central": {"finals": [0.80, 0.805, 0.80], "up": 337_000},          # the central twins: no 8,000x claim,
            "fedavg_central": {"finals": [0.83, 0.825, 0.835], "up": 8_000_000}}    # only where the shortfall lies
    got = dict(L.claims(acc, "psentiment"))
    assert not any(k.startswith(L.ROWS[i][1]) for k in got for i, r in enumerate(L.ROWS) if r[0] in L.ROW_RUN)
    assert got["FLITE's map centrally (fp32 latents) within 1 pp of FedAvg centrally"].startswith("missed")
    assert got["what the federation (averaging + int4 z) costs FLITE: central above federated"].startswith("met")
    assert got["what averaging costs FedAvg: central above federated"].startswith("met")
    ppl = {"fedavg": {"finals": [43.4, 43.6, 43.8], "up": 8_000_000}, "flite": {"finals": [47.0, 47.1, 47.2], "up": 900},
           "fedavg_central": {"finals": [42.0, 42.1, 42.2], "up": 8_000_000},       # perplexity: lower is better
           "flite_central": {"finals": [42.2, 42.3, 42.35], "up": 337_000}}
    got = dict(L.claims(ppl))
    assert got["FLITE's map centrally (fp32 latents) within 1% of FedAvg centrally"].startswith("met")   # < 42.2 x 1.01
    assert got["what the federation (averaging + int4 z) costs FLITE: central below federated"].startswith("met")
    assert got["what averaging costs FedAvg: central below federated"].startswith("met")
    ppl["flite_central"]["finals"] = [43.0, 43.1, 43.2]                 # 2% above FedAvg's central: the map's shortfall
    assert dict(L.claims(ppl))["FLITE's map centrally (fp32 latents) within 1% of FedAvg centrally"].startswith("missed")


def test_fednl_claims_latent_part_judges_the_latent_row_against_fednl_and_marks_figures_made_elsewhere(monkeypatch):
    """The `latent` part: the grid's latent row (its runs, here faked) against FedNL's row as the file's passkey part
    holds it; FedNL's figures, kept without provenance (made in another clone), are daggered; the targets: within 2 pp
    at 4 and 16 chunks (3 seeds each, ranges apart) and the uplink under 8,000 B."""
    import common
    import fednl_claims as F
    import fednl_retrieval as R
    cells = lambda v: {f"{L}/{d}": v for L in (4, 8, 16, 32) for d in (0, 0.5, 1)}      # noqa: E731
    monkeypatch.setattr(R, "latent_choice", lambda size: ({"latent_r": 18, "codec": "int4g"}, 0.1))

    def fake(grid, workers, from_runs=False, **k):
        assert [label for label, _ in grid] == [f"{F.LATENT} s{s}" for s in (0, 1, 2)]
        assert all(c["method_options"]["latent_r"] == 18 and c["lr"] == 0.1 for _, c in grid)
        return [{"cells": {"passkey": cells(v)}, "bytes": {"up_per_client_round": 7227.0}, "trainable_params": 11520,
                 "bench": {"config": c}, "code": "x"} for v, (_, c) in zip((0.5, 0.45, 0.55), grid)]
    monkeypatch.setattr(common, "reuse_or_run", fake)
    monkeypatch.setattr(common, "at_hand", lambda s: True)
    res = {"passkey": {"command": "python benchmarks/fednl_claims.py --parts passkey", "rows": {"FedNL": {
        "seeds": [0, 1, 2], "cells": [cells(v) for v in (0.93, 0.92, 0.94)], "up_bytes": 466436.0, "trainable": 116220}}}}
    r = F.part_latent([0, 1, 2], 1, res, False)
    assert r["retrieval"][F.LATENT]["4"] == [0.5, 0.45, 0.55] and r["uplink_bytes"] == {"FedNL": 466436.0, F.LATENT: 7227.0}
    v = r["verdicts"]
    assert v["within 2 pp of FedNL at 4 chunks"] == v["within 2 pp of FedNL at 16 chunks"] == "missed"
    assert v["uplink under 8,000 B"] == "met"
    md = "\n".join(F.markdown_latent(r))
    assert "| FedNL | 0.930 ± 0.010†" in md and f"| {F.LATENT} | 0.500 ± 0.050 (" in md      # only FedNL's marked
    res["passkey"]["rows"]["FedNL"]["cells"] = [cells(v) for v in (0.51, 0.50, 0.52)]       # FedNL - 2 pp below all
    r = F.part_latent([0, 1, 2], 1, res, False)
    assert r["verdicts"]["within 2 pp of FedNL at 4 chunks"].startswith("inconclusive")      # 0.45 < 0.52 - 0.02


def test_fednl_results_mark_every_figure_kept_without_a_record_of_its_code(tmp_path):
    """fednl_claims.json's parts made before per-run provenance: re-rendered, every figure of the passkey, templates and
    recipe tables carries a dagger and every row of the ce and trivia tables a marked name; a ce row whose run and a
    backbone whose evaluation this code made are not marked."""
    import json

    import fednl_claims as F
    res = json.loads((Path(__file__).parents[1] / "benchmarks" / "results" / "fednl_claims.json").read_text())
    md = F.render(res)
    retrieval = md.split("## Retrieval")[1].split("\n\n")[2].splitlines()[2:]
    assert retrieval and all(c.strip().endswith("†") for row in retrieval for c in row.split("|")[2:7])
    assert "| frozen backbone† |" in md and "| FedAvg+LoRA† |" in md
    ce = res["ce"]
    ce["backbone_provenance"] = {"at_hand": True}
    for r in ce["runs"]:
        r["provenance"] = {"at_hand": r["label"].startswith("austen FedAvg+LoRA")}
    md = F.render({"meta": res["meta"], "ce": ce})
    assert "| frozen backbone |" in md and "| austen FedAvg+LoRA s0 |" in md and "| austen FedNL s0† |" in md
    assert "| FedAvg+LoRA |" in md and "| FedNL, memory reset per chunk† |" in md


def test_flite_lm_where_splits_a_run_s_latents_into_groups_that_cover_them(tmp_path, monkeypatch):
    """--where on a tiny FLITE run: every latent layer lies in exactly one of the layer-type groups (their latents and
    shares of |z|^2 add up to the whole), a group scored alone moves the validation perplexity off the base's, and a
    group with no latents leaves the base as it is."""
    from conftest import tiny_config
    from lightfed.data import datasets
    from lightfed.engine import local
    import flite_lm as L
    books = datasets.load_austen()
    monkeypatch.setattr(datasets, "load_austen", lambda: dict(books))
    monkeypatch.setenv("LIGHTFED_CACHE", str(tmp_path / "cache"))
    cfg = tiny_config("austen", "flite", tmp_path / "run", rounds=1, lr=0.1, method_options={"r": 2, "codec": "fp32"})
    local.run(cfg)
    w = L.where(cfg.out)
    types = {g: w["groups"][g] for g in L.GROUPS}
    K = sum(x["latents"] for x in types.values())
    assert K == local.final_model(cfg.out)[0].model.z.numel() and K > 0
    assert abs(sum(x["z_share"] for x in types.values()) - 1) < 1e-5
    assert w["all"] != w["none"]
    empty = [g for g, x in w["groups"].items() if x["latents"] == 0]
    assert empty and all(w["groups"][g]["only"] == w["none"] for g in empty)      # the tiny twin has < 10 layers
