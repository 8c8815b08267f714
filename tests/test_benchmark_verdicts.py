"""The benchmarks' verdict rules: a claim is "met" only over 3 seeds that separate the claimed way, and a run that
never reaches a target counts only through the bound its whole-run cost gives."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
from common import verdict  # noqa: E402
from zoflite_claims import flops_claim  # noqa: E402


def test_verdict_needs_three_separated_seeds():
    assert verdict([0.80, 0.81, 0.82], [0.70, 0.71, 0.72], a_lower=False) == "met"
    assert verdict([0.80, 0.81, 0.82], [0.70, 0.71, 0.72], a_lower=True) == "missed"
    assert verdict([0.70, 0.81, 0.82], [0.70, 0.71, 0.72], a_lower=False).startswith("inconclusive")
    assert verdict([0.80, 0.81], [0.70, 0.71], a_lower=False).startswith("inconclusive")


def row(label, to, total):
    return {"label": label, "seeds": [0, 1, 2], "flops_to_target": to, "flops_total": total}


def test_flops_claim_exact_ratios():
    fast, slow = row("fast", [1.0, 1.0, 2.0], [5.0] * 3), row("slow", [20.0, 15.0, 30.0], [50.0] * 3)
    c = flops_claim(fast, slow, 10, 0.7)                                 # 20x, 15x, 15x
    assert c["verdict"] == "met" and "s1: 15.0x" in c["measured"]
    assert flops_claim(fast, slow, 20, 0.7)["verdict"].startswith("inconclusive (2 of 3")   # one seed at 20x, two below
    assert flops_claim(fast, slow, 25, 0.7)["verdict"] == "missed"


def test_flops_claim_censored_runs_give_bounds():
    fast = row("fast", [1.0, 1.0, 1.0], [4.0] * 3)
    never = row("slow", [None, None, None], [12.0, 15.0, 30.0])          # slow never reached it: ratio > 12, 15, 30
    c = flops_claim(fast, never, 10, 0.7)
    assert c["verdict"] == "met (lower bound)" and "> 12.0x" in c["measured"]
    short = row("slow", [None, None, None], [5.0, 5.0, 30.0])            # its run too short to bound 10x on 2 seeds
    assert flops_claim(fast, short, 10, 0.7)["verdict"].startswith("inconclusive")
    f_never = row("fast", [None, None, None], [8.0] * 3)
    s_early = row("slow", [2.0, 2.0, 2.0], [9.0] * 3)                    # ratio < 2 / 8: far below 10x
    assert flops_claim(f_never, s_early, 10, 0.7)["verdict"] == "missed"
    both_never = row("slow", [None] * 3, [9.0] * 3)
    assert flops_claim(f_never, both_never, 10, 0.7)["verdict"].startswith("inconclusive (0 of 3")


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


def test_wilson_interval_matches_a_hand_computation():
    from zoflite_claims import wilson
    lo, hi = wilson(0.5, 100)   # centre 0.5; half-width 1.96 * sqrt(0.25 / 100 + 1.96^2 / 40000) / (1 + 1.96^2 / 100)
    half = 1.96 * (0.0025 + 1.96 ** 2 / 40000) ** 0.5 / (1 + 1.96 ** 2 / 100)
    assert abs(lo - (0.5 - half)) < 1e-12 and abs(hi - (0.5 + half)) < 1e-12 and 0.40 < lo < 0.41
    lo0, hi0 = wilson(0.0, 50)
    assert abs(lo0) < 1e-12 and 0.07 < hi0 < 0.072   # the known upper bound 3.84 / 53.84
