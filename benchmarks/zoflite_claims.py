"""Zeroth order in FLITE's latent vs on the weights (issue #10, items 3-4), in two settings where ZO starts above chance.

    python benchmarks/zoflite_claims.py --calibrate     # the ZO lr sweep, centralised (1 client): writes _calibrate
    python benchmarks/zoflite_claims.py                 # the grid: 7 methods x seeds 0,1,2
    python benchmarks/zoflite_claims.py --from-runs     # report the runs that finished, list the others
    python benchmarks/zoflite_claims.py --quick         # smoke test at tiny sizes
    python benchmarks/zoflite_claims.py --setting prompt [--calibrate]   # the prompt-based setting (SmolLM2)
    python benchmarks/zoflite_claims.py --setting prompt_long --seeds 0  # one ZO-FLITE run of 2,000 client steps
    python benchmarks/zoflite_claims.py --setting prompt --methods fedzo,fedavg   # some methods only

Setting `probed` (the default; results zoflite_claims*): sentiment on real MiniLM-L6, 10 clients, half a round,
K local steps of B examples, every method starting from the same probed head (methods/probe.py, one round: LP
then ZO, so ZO starts above chance).
- ZO-FLITE: DeComFL's client and aggregator on FLITE's latent z (r = 20: 14,400 latents; the probe's head kept);
- ZO-FLITE split: FedSPZO's split step on the slices of z (theta1: f1's layers, theta2: the last layer's);
- FedSPZO and DeComFL on the weights: the last two layers (3.5M weights; the head kept);
- FedZO on the same weights, as published (b2 = 4 one-sided directions on the unit sphere, full-weight uplink), its
  radius mu matched to the others' perturbation norm, DeComFL's lr;
- FedAvg+LoRA: the first-order reference (rank-8 q/v adapters + head, AdamW); FedAvg: all weights (AdamW 5e-5).
Setting `prompt` (results zoflite_prompt*): psentiment on real SmolLM2-135M, the prompt "Tweet: {text}\nSentiment:"
scored by the label words " negative" / " positive" (zero-shot above chance: round 0), no head and no probe. The
same seven methods: ZO-FLITE on z (r = 20: 84,400 latents over the 211 linear layers), FedSPZO and DeComFL on the
last two decoder layers (7.1M weights; FedSPZO's f2 = the last layer + the final norm + the tied lm_head's two
label-word rows, read, not trained), FedZO on those weights, FedAvg+LoRA and FedAvg with fewer local steps (first order converges in fewer; the
curves are read against FLOPs). Sized for the 2 CPU cores (SETTINGS["prompt"]): hundreds of client steps a run, not the
thousands the ZO papers run: a GPU session should raise rounds and local_steps. Setting `prompt_long` (results
zoflite_prompt_long*): one seed of ZO-FLITE for 2,000 client steps (40 rounds x 25 steps x 2 clients).
Every ZO method runs the same rounds and steps; its lr is the calibration's (see SETTINGS[...]["lr"]). Reported per method over 3 seeds: final accuracy, the curve against cumulative
client forward FLOPs (summary flops, FlopCounterMode per sample x samples), uplink / downlink bytes per client
per round (len() of the messages), accounted client memory (weights + activations + transient z).
Targets (issue #10): ZO-FLITE reaches the target accuracy (the start's round-0 accuracy + GAIN) with
>= 10x fewer client forward FLOPs than FedSPZO on the weights, at <= 1 KB uplink per client per round, with
accounted memory <= 0.5x LoRA's; FedSPZO >= 2x fewer than DeComFL to the same target; FedSPZO and DeComFL within
3 pp of FedAvg+LoRA. A run that never reaches the target is censored: where one method reaches it on every seed
and the other does not within its whole run, the ratio is bounded below by (the other's whole-run FLOPs) / (the
FLOPs the first needed), and a bound >= the target ratio on 3 seeds is "met (lower bound)".
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import common  # noqa: E402
from common import RESULTS, meta, records, verdict, wilson, write  # noqa: E402

from lightfed.report import human_bytes  # noqa: E402

# Each setting: the run config every method shares, the quick (smoke) sizes, the ZO lr sweep and the calibrated lrs,
# the methods, and whether every run starts from a per-seed federated probe.
ZO_FLITE, ZO_FLITE_SPLIT = "ZO-FLITE (DeComFL's step in z)", "ZO-FLITE split (FedSPZO's step in z)"
SETTINGS = {
    "probed": {
        "name": "zoflite_claims", "calibration": "zoflite_claims_calibrate.md", "probe": True,
        "base": {"task": "sentiment", "clients": 10, "fraction": 0.5, "batch_size": 8, "local_steps": 10, "rounds": 20,
                 "partition": "iid", "eval_every": 1, "progress": False,
                 "task_options": {"train_size": 800, "test_size": 500, "max_len": 32}},
        "quick": {"rounds": 2, "local_steps": 2, "task_options": {"train_size": 80, "test_size": 40, "max_len": 16}},
        # the sweep per kind: a ZO step moves every perturbed coordinate, so its safe lr falls with the dimension
        # (z: 14,400; the weights: 3.5M)
        "lrs": {"zoflite": (1e-5, 1e-4, 1e-3, 1e-2, 1e-1), "zoflite_split": (1e-5, 1e-4, 1e-3, 1e-2, 1e-1),
                "fedspzo": (1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2), "decomfl": (1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2)},
        # calibrated (results/zoflite_claims_calibrate.md): of lrs[m], the lr with the lowest last-round train loss
        # (every lr sees the same batches) among those that keep the accuracy within 1 pp of the probed start. (The
        # probe's head gives large logits: CE ~3.8 at 80% accuracy, so a lower CE can come with a lower accuracy.)
        "lr": {"zoflite": 1e-3, "zoflite_split": 1e-3, "fedspzo": 1e-5, "decomfl": 1e-5, "fedzo": 1e-5},   # FedZO: DeComFL's
        "methods": [  # (label, method, options); lr from "lr" (ZO) or the run's own
            (ZO_FLITE, "zoflite", {"r": 20, "head": "keep", "P": 1}),
            (ZO_FLITE_SPLIT, "zoflite_split", {"r": 20, "head": "keep", "split": 1, "P1": 1, "Ps": 2}),
            ("FedSPZO (weights)", "fedspzo", {"trainable": "layer.4.,layer.5.", "z": "fast", "split": 1, "P1": 1, "Ps": 2}),
            ("DeComFL (weights)", "decomfl", {"trainable": "layer.4.,layer.5.", "z": "fast", "P": 1}),
            ("FedAvg+LoRA (first order)", "lora", {}),
            # mu = 1e-3 x sqrt(3,548,928): the norm of the others' perturbation (see the prompt setting)
            ("FedZO (weights)", "fedzo", {"trainable": "layer.4.,layer.5.", "z": "fast", "b2": 4, "mu": 1.884}),
            ("FedAvg (first order, all weights)", "fedavg", {}),
        ],
        "first_order": {},
        "first_order_lr": {"fedavg": 5e-5},  # AdamW on all 22.6M weights (as fedspzo_claims); LoRA: 5e-4
    },
    "prompt": {
        "name": "zoflite_prompt", "calibration": "zoflite_prompt_calibrate.md", "probe": False,
        # 2 clients a round x 20 steps of 8 prompts (<= 48 tokens, ~38 on average): 320 client steps a ZO run,
        # ~1.5 s a two-point step on one thread; 500 test prompts (one = 0.2 pp)
        "base": {"task": "psentiment", "clients": 10, "fraction": 0.2, "batch_size": 8, "local_steps": 20, "rounds": 8,
                 "partition": "iid", "eval_every": 2, "progress": False,
                 "task_options": {"train_size": 1000, "test_size": 500, "max_len": 48}},
        "quick": {"rounds": 1, "local_steps": 2, "eval_every": 1,
                  "task_options": {"tiny": True, "train_size": 40, "test_size": 20, "max_len": 24}},
        "quick_trainable": "layers.0.,layers.1.",   # the tiny twin has two decoder layers
        # z: 84,400 latents; the weights: 7.1M. The split methods take their DeComFL twin's lr (same space)
        "lrs": {"zoflite": (3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1), "decomfl": (1e-6, 1e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2)},
        # calibrated (results/zoflite_prompt_calibrate.md), the same rule as above (on the weights it picks 3e-4, not
        # the most accurate 1e-3); FedZO takes DeComFL's lr: the same weights, an estimator of the same gradient.
        "lr": {"zoflite": 1e-2, "zoflite_split": 1e-2, "fedspzo": 3e-4, "decomfl": 3e-4, "fedzo": 3e-4},
        "methods": [
            (ZO_FLITE, "zoflite", {"r": 20, "P": 1}),
            ("FedSPZO (weights)", "fedspzo", {"trainable": "layers.28.,layers.29.", "z": "fast", "split": 1, "P1": 1, "Ps": 2}),
            ("DeComFL (weights)", "decomfl", {"trainable": "layers.28.,layers.29.", "z": "fast", "P": 1}),
            ("FedAvg+LoRA (first order)", "lora", {}),
            (ZO_FLITE_SPLIT, "zoflite_split", {"r": 20, "split": 1, "P1": 1, "Ps": 2}),
            # FedZO's directions are on the unit sphere: mu = 1e-3 x sqrt(7,080,192) gives its perturbation the norm
            # of the others' (eps 1e-3 times a Gaussian z of 7.1M coordinates); mu = 1e-3 would move each weight by
            # ~4e-7, where fp32 rounding of the loss is of the size of the signal.
            ("FedZO (weights)", "fedzo", {"trainable": "layers.28.,layers.29.", "z": "fast", "b2": 4, "mu": 2.661}),
            ("FedAvg (first order, all weights)", "fedavg", {}),
        ],
        "first_order": {"local_steps": 5},   # LoRA and FedAvg: 80 client steps a run (forward + backward)
        "first_order_lr": {"fedavg": 5e-5},  # AdamW on all 134.5M weights (as fedspzo_claims); LoRA: 5e-4
        "run_options": {"fedavg": {"max_message_bytes": 2**30}},   # its messages: 538 MB > the 512 MiB default
    },
}
# One seed of ZO-FLITE for thousands of client steps (40 rounds x 25 steps x 2 clients = 2,000; 1,000 aggregated
# steps), beside the 3-seed grid's 320: does zeroth order in z go past recalibrating the label words?
SETTINGS["prompt_long"] = {**SETTINGS["prompt"], "name": "zoflite_prompt_long",
                           "base": {**SETTINGS["prompt"]["base"], "rounds": 40, "local_steps": 25, "eval_every": 4},
                           "methods": SETTINGS["prompt"]["methods"][:1]}
GAIN = 0.02           # the target: the start's accuracy (round 0, mean over every run) + 2 pp


def _base(S: dict, quick: bool, seed: int) -> dict:
    b = {**S["base"], "seed": seed}
    return {**b, **S["quick"], "task_options": {**b["task_options"], **S["quick"]["task_options"]}} if quick else b


def configs(S: dict, seeds, quick: bool, calibrate: bool = False, only: list[str] | None = None):
    """(probe runs, method runs) as [(label, config)], method by method (a grid cut short keeps whole methods)."""
    probes, grid = [], []
    probe = {seed: f"probe s{seed}" for seed in seeds} if S["probe"] else {}   # common.chained: its store folder
    for seed in probe:
        probes.append((probe[seed], {**_base(S, quick, seed), "method": "probe", "rounds": 1, "local_steps": 0, "lr": 0.0}))
    for label, m, opts in S["methods"]:
        if only and m not in only:
            continue
        if quick and "trainable" in opts and S.get("quick_trainable"):
            opts = {**opts, "trainable": S["quick_trainable"]}
        for seed in seeds:
            b = {**_base(S, quick, seed), **({"init": probe[seed]} if probe else {})}
            if calibrate:
                for lr in S["lrs"].get(m, ()):
                    c = {**b, "method": m, "method_options": opts, "clients": 1, "fraction": 1.0,
                         "rounds": 1 if quick else 3, "local_steps": 2 if quick else 25, "lr": lr, "eval_every": 3}
                    grid.append((f"{label} | lr {lr:g} | s{seed}", c))
                continue
            lr = S["lr"].get(m)
            c = {**b, **({} if lr else S["first_order"]), **S.get("run_options", {}).get(m, {}), "method": m,
                 "method_options": opts,
                 "lr": lr or S.get("first_order_lr", {}).get(m, 5e-4)}
            grid.append((f"{label} | s{seed}", c))
    return probes, grid


def curves(s: dict) -> tuple[tuple[list, list], tuple[list, list]]:
    """From one read of metrics.jsonl: (cumulative client forward FLOPs, accuracy) and (cumulative bytes up + down,
    the encoded messages' lengths, accuracy), one point per evaluated round."""
    recs = records(s["out"])
    fx, bx, y, flops, sent = [0.0], [0.0], [recs[0][s["metric"]]], 0.0, 0.0
    for r in recs[1:]:
        flops += sum(c.get("flops", 0) for c in r.get("clients", []))
        sent += sum(c["up"] + c["down"] for c in r.get("clients", []))
        if s["metric"] in r:
            fx.append(flops)
            bx.append(sent)
            y.append(r[s["metric"]])
    return (fx, y), (bx, y)


def to_target(x, y, target):
    """Client FLOPs to the target as the evaluations bound them: (lo, hi] with hi = the FLOPs at the first evaluation
    at or above the target (after round 0) and lo = those at the evaluation before it; None if never reached. The
    steps-to-target lie somewhere in between: no verdict may rest on where the evaluations happened to fall."""
    for i in range(1, len(y)):
        if y[i] >= target:
            return (x[i - 1], x[i])
    return None


def recalibration(base: dict) -> dict:
    """A diagnostic for the prompt setting: the pretrained LM's test accuracy with the best single bias between
    the two label words (the threshold on their logit margin, chosen on the test set itself: an oracle, not a
    method). A run that ends at or below it has done no more than recalibrate the label words."""
    import torch
    from lightfed import tasks
    from lightfed.data.tensors import batches
    from lightfed.models.lm import label_scores
    t = tasks.build(base["task"], base["task_options"], base["seed"])
    m, d, y = t.model.eval(), [], []
    with torch.no_grad():
        for b in batches(t.test, 32):
            sc = label_scores(m, b["input_ids"], b["attention_mask"], b["label_ids"])  # (B, 2)
            d.append(sc[:, 1] - sc[:, 0])
            y.append(b["labels"])
    d, y = torch.cat(d), torch.cat(y)
    acc = lambda th: ((d > th).long() == y).float().mean().item()   # noqa: E731
    best = max(torch.cat([d, torch.tensor([d.min().item() - 1])]).tolist(), key=acc)
    return {"zero_shot": acc(0.0), "best_bias": acc(best), "margin": best, "positive_share": (d > 0).float().mean().item()}


def flops_claim(fast: dict, slow: dict, factor: float, target: float) -> dict:
    """`fast` reaches `target` with >= factor x fewer client FLOPs than `slow`, seed by seed, judged on the interval
    the evaluations leave: FLOPs-to-target of each run lie in (lo, hi] (to_target), so the ratio slow / fast lies in
    (slow_lo / fast_hi, slow_hi / fast_lo). A run that never reaches the target is censored at its whole-run FLOPs.
    "met" only where the ratio's lower bound is >= factor on every seed (>= 3), "missed" where its upper bound is
    below factor on every seed; otherwise the evaluation grid cannot decide it: "inconclusive"."""
    def by_seed(r):
        return {sd: (t, tot) for sd, t, tot in zip(r["seeds"], r["flops_to_target"], r["flops_total"])}
    F, S = by_seed(fast), by_seed(slow)
    common = sorted(set(F) & set(S))
    parts, above, below = [], 0, 0
    for sd in common:
        (tf, totf), (ts, tots) = F[sd], S[sd]
        if tf and ts:
            lo, hi = ts[0] / tf[1], (ts[1] / tf[0] if tf[0] > 0 else float("inf"))
        elif tf:                                   # slow never reached it: more than its whole run
            lo, hi = tots / tf[1], float("inf")
        elif ts:                                   # fast never reached it
            lo, hi = 0.0, ts[1] / totf
        else:
            parts.append(f"s{sd}: neither reached it")
            continue
        parts.append(f"s{sd}: {lo:,.1f}x to {'inf' if hi == float('inf') else f'{hi:,.1f}x'}")
        above, below = above + (lo >= factor), below + (hi < factor)
    shown = len(common)
    v = ("met" if above >= 3 and above == shown else "missed" if below >= 3 and below == shown else
         f"inconclusive ({max(above, below)} of {shown} seed(s) decide it; a claim needs 3 whose whole interval "
         "lies on one side)")
    return {"target": f"{fast['label']}: >= {factor:g}x fewer client FLOPs than {slow['label']} to {target:.4f} (round 0 + {GAIN * 100:g} pp)",
            "measured": "ratio between the bounds the evaluations leave: " + "; ".join(parts), "verdict": v}


def per_step(r: dict, steps: int) -> float:
    """Client forward FLOPs per local step (whole run / client steps): a cost the evaluation grid does not touch."""
    return float(np.mean(r["flops_total"])) / steps


def summarize(grid, summaries, methods) -> dict:
    by: dict[str, list] = {}
    missing = []
    for (label, _), s in zip(grid, summaries):
        name = label.rsplit(" | ", 1)[0]
        if "error" in s:
            missing.append({"label": label, "error": s["error"]})
        else:
            by.setdefault(name, []).append(s)
    rows = []
    for label, m, _ in methods:
        ss = by.get(label, [])
        if not ss:
            continue
        fin = [s["final"] for s in ss]
        both = [curves(s) for s in ss]
        flop_curves = [f for f, _ in both]
        def most(key):   # the largest of a memory figure over the seeds
            return max(s["memory"].get(key) or 0 for s in ss)
        rows.append({"label": label, "method": m, "seeds": [s["config"]["seed"] for s in ss], "finals": fin,
                     "initials": [s["initial"] for s in ss], "mean": float(np.mean(fin)), "std": float(np.std(fin)),
                     "min": min(fin), "max": max(fin), "curves": flop_curves, "byte_curves": [b for _, b in both],
                     "up_bytes": max(s["bytes"]["up_per_client_round"] for s in ss),
                     "down_bytes": max(s["bytes"]["down_per_client_round"] for s in ss),
                     "flops_total": [float(x[-1]) for x, _ in flop_curves], "accounted_memory": most("client_accounted_bytes"),
                     "rss_peak": most("client_rss_peak_bytes"), "rss_rise": most("client_rss_rise_bytes"),
                     "trainable": ss[0]["trainable_params"]})
    setup = [json.loads((Path(s["out"]) / "setup.json").read_text()) for s in summaries if "error" not in s][:1]
    tokens = setup[0]["task"].get("prompt_tokens_mean") if setup else None
    return {"rows": rows, "missing": missing, "prompt_tokens_mean": tokens}


def targets_of(rows: list[dict], steps: int) -> dict:
    """The claims, from the rows alone (so --render rebuilds them from the JSON). steps: client steps in a run."""
    get = {r["method"]: r for r in rows}
    targets = []
    fs, zf, lo, dc = get.get("fedspzo"), get.get("zoflite"), get.get("lora"), get.get("decomfl")
    target = round(float(np.mean([i for r in rows for i in r["initials"]])) + GAIN, 4) if rows else None
    for r in rows:
        r["flops_to_target"] = [to_target(x, y, target) for x, y in r["curves"]]
        targets.append({"target": f"{r['label']}: final above its start (round 0)",
                        "measured": f"{np.mean(r['initials']):.4f} -> {r['mean']:.4f} (gain {np.mean(r['finals']) - np.mean(r['initials']):+.4f})",
                        "verdict": verdict(r["finals"], r["initials"], a_lower=False)})
    for fast, slow, factor in ((get.get("zoflite"), fs, 10), (get.get("zoflite_split"), fs, 10), (fs, dc, 2),
                               (fs, get.get("fedzo"), 2)):
        if fast and slow:
            targets.append(flops_claim(fast, slow, factor, target))
            targets.append({"target": f"{fast['label']} vs {slow['label']}: forward FLOPs per client step",
                            "measured": f"{per_step(fast, steps):.3g} vs {per_step(slow, steps):.3g} "
                                        f"({per_step(slow, steps) / per_step(fast, steps):.2f}x fewer)",
                            "verdict": "reported (a cost per step, not a claim)"})
    for r in (fs, dc):
        if r and lo:
            targets.append({"target": f"{r['label']} within 3 pp of FedAvg+LoRA (final accuracy)",
                            "measured": f"{r['mean']:.4f} vs {lo['mean']:.4f}",
                            "verdict": verdict([f + 0.03 for f in r["finals"]], lo["finals"], a_lower=False)})
    if zf:
        targets.append({"target": "ZO-FLITE uplink <= 1 KB per client per round", "measured": f"{zf['up_bytes']:,.0f} B",
                        "verdict": "met" if zf["up_bytes"] <= 1000 else "missed"})
        if lo:
            ratio = zf["accounted_memory"] / lo["accounted_memory"] if lo["accounted_memory"] else None
            targets.append({"target": "ZO-FLITE accounted client memory <= 0.5x FedAvg+LoRA's",
                            "measured": f"{human_bytes(zf['accounted_memory'])} vs {human_bytes(lo['accounted_memory'])}"
                                        + (f" ({ratio:.2f}x)" if ratio else ""),
                            "verdict": "met" if ratio is not None and ratio <= 0.5 else "missed"})
            if zf["rss_peak"] and lo["rss_peak"]:
                targets.append({"target": "ZO-FLITE measured memory vs FedAvg+LoRA's: peak RSS; its rise in a client update",
                                "measured": f"{zf['rss_peak'] / lo['rss_peak']:.2f}x; {zf['rss_rise'] / max(lo['rss_rise'], 1):.3f}x "
                                            f"({human_bytes(zf['rss_rise'])} vs {human_bytes(lo['rss_rise'])})",
                                "verdict": "reported"})
            if fs:
                targets.append({"target": "ZO-FLITE final accuracy above FedSPZO's (weights), same client steps",
                                "measured": f"{zf['mean']:.4f} vs {fs['mean']:.4f}",
                                "verdict": "reported: " + verdict(zf["finals"], fs["finals"], a_lower=False)})
            targets.append({"target": "ZO-FLITE final accuracy vs FedAvg+LoRA (first order)",
                            "measured": f"{zf['mean']:.4f} vs {lo['mean']:.4f}",
                            "verdict": "reported: " + verdict(zf["finals"], lo["finals"], a_lower=True).replace("met", "below")})
    return {"targets": targets, "target": target}


def client_steps(base: dict) -> int:
    """Client steps of one run of the grid's base config (every method runs the same)."""
    per_round = max(base.get("min_clients", 1), round(base.get("fraction", 1.0) * base["clients"]))
    return base["rounds"] * per_round * base["local_steps"]


def seed_record_downlink(res: dict) -> dict | None:
    """FedSPZO ran with the weights going down (down = model); what it would have sent with DeComFL's seed records
    (down = seeds), derived exactly from its config: the round's sampled clients (local.sample_clients), a
    first-time client gets the weights (the run's own downlink), a returning one the records of the rounds since it
    last took part (SeedReplay.seed_down_bytes). -> {"per_client_round": B, "curves": [(bytes x, accuracy y)] per seed}"""
    from lightfed import config as C, methods
    from lightfed.engine import local
    row = next((r for r in res["rows"] if r["method"] == "fedspzo"), None)
    if row is None:
        return None
    base = res["config"]["base"]
    opts = res["config"]["methods"]["fedspzo"]
    cfg = C.from_dict({**base, "method": "fedspzo", "method_options": {**opts, "down": "seeds"}, "seed": 0})
    m = methods.build(cfg)
    out, per = [], []
    R, every = base["rounds"], base.get("eval_every", 1)
    for seed, (_, y) in zip(row["seeds"], row["byte_curves"]):
        cfg.seed = seed
        last, sent, xs = {}, 0.0, [0.0]
        for rnd in range(1, R + 1):
            for cid in local.sample_clients(cfg, rnd):
                down = m.seed_down_bytes(base["local_steps"], rnd - last[cid]) if cid in last else row["down_bytes"]
                sent += row["up_bytes"] + down
                per.append(down)
                last[cid] = rnd
            if rnd % every == 0 or rnd == R:        # the evaluated rounds: where the accuracy y was read
                xs.append(sent)
        out.append((xs, y))
    return {"per_client_round": float(np.mean(per)), "curves": out}


def render(res: dict) -> str:
    c = res["config"]
    L = [f"# Zeroth order in FLITE's latent vs on the weights ({res['meta']['date']})\n", f"Command: `{res['meta']['command']}`  ",
         f"Setting `{c['setting']}`: `{json.dumps({k: v for k, v in c['base'].items() if k != 'progress'})}`, seeds {c['seeds']}, "
         + ("every method from the seed's probed head" if c["setting"] == "probed" else
            f"every method from the pretrained LM (zero-shot); first-order runs: {json.dumps(c['first_order'])}")
         + f"; ZO lrs {json.dumps(c['lr'])} (calibration: {c['calibration']}); "
         f"methods and options: {json.dumps(c['methods'])}. Each run on one torch thread ({c['workers']} side by side); "
         f"the runs' own wall time adds up to {res.get('runs_wall_s', 0) / 60:.0f} min (this invocation: {res['wall_s'] / 60:.0f} min; "
         "finished runs are reused)."
         + (f" A prompt averages {res['prompt_tokens_mean']:.1f} tokens (train and test)." if res.get("prompt_tokens_mean") else "")
         + (f" Target accuracy: {res['target']:.4f} (round 0 + {GAIN * 100:g} pp)." if res.get("target") else "") + "\n",
         "| method | accuracy (mean ± std) | min / max | round 0 | up B/client/round | down B/client/round | trainable | "
         "client forward FLOPs, whole run (mean) | accounted client memory | peak RSS (process) / its rise in a client update |",
         "|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        L.append(f"| {r['label']} | {r['mean']:.4f} ± {r['std']:.4f} (n = {len(r['finals'])}) | {r['min']:.4f} / {r['max']:.4f} | "
                 f"{np.mean(r['initials']):.4f} | {r['up_bytes']:,.0f} | {r['down_bytes']:,.0f} | {r['trainable']:,} | "
                 f"{np.mean(r['flops_total']):.3g} | {human_bytes(r['accounted_memory'])} | "
                 f"{human_bytes(r.get('rss_peak'))} / {human_bytes(r.get('rss_rise'))} |")
    n_test = c["base"]["task_options"].get("test_size")
    for r in res["rows"]:
        if len(r["finals"]) == 1 and n_test:   # one seed: the test sample's own spread is all there is to read
            lo, hi = wilson(r["mean"] * n_test, n_test)
            L += ["", f"{r['label']}, one seed: {r['mean']:.4f} on {n_test} test examples has a 95% Wilson interval of "
                  f"[{lo:.4f}, {hi:.4f}] from the test sample alone; its evaluated rounds after round 0 range "
                  f"{min(min(y[1:]) for _, y in r['curves']):.4f}-{max(max(y[1:]) for _, y in r['curves']):.4f}."]
    L += ["", "Memory: accounted = the client's own tensors (weights, activations of one forward (and backward for "
          "first order: gradients, optimizer state), transient perturbation); peak RSS = the whole process's during a "
          "client update (the in-process engine also holds the server's state and the data), its rise = above the RSS "
          "at the update's start. FLOPs: forward only for ZO; forward + backward for first order."]
    if res.get("recalibration"):
        rc = res["recalibration"]
        L += ["", f"Diagnostic (an oracle, not a method): the pretrained LM predicts \" positive\" for {rc['positive_share']:.1%} "
              f"of the test prompts at {rc['zero_shot']:.4f}; the best single bias between the two label words "
              f"(logit margin > {rc['margin']:.3f}, chosen on the test set) gives {rc['best_bias']:.4f}. A run at or below "
              "that has done no more than recalibrate the label words."]
    alt = res.get("fedspzo_seed_records")
    if alt:
        fs = next(r for r in res["rows"] if r["method"] == "fedspzo")
        L += ["", f"Downlink: FedSPZO ran with the weights going down ({fs['down_bytes']:,.0f} B per client per round), DeComFL "
              f"and ZO-FLITE with seed records. With records too (derived exactly from its config: the weights to a first-time "
              f"client, the records since its last round to a returning one), FedSPZO's downlink would average "
              f"{alt['per_client_round']:,.0f} B per client per round; the bytes panel shows both (dashed: with records)."]
    L += ["", "FLOPs-to-target claims are judged on the interval the evaluations leave (a run reaches the target somewhere "
          "between the evaluation before the one that first shows it and that one); the cost per client step is reported "
          "apart, and no verdict rests on where the evaluations fell."]
    L += ["", "| target | measured | verdict |", "|---|---|---|"]
    L += [f"| {t['target']} | {t['measured']} | **{t['verdict']}** |" for t in res["targets"]]
    if res["missing"]:
        L += ["", "Not run or failed:", ""] + [f"- {m['label']}: {m['error'][:160]}" for m in res["missing"]]
    L += ["", f"![accuracy vs client forward FLOPs]({res['name']}.png)", ""]
    return "\n".join(L)


def plot(res: dict, path: Path) -> None:
    plt = common.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for ax, key, xlabel in ((axes[0], "curves", "cumulative client FLOPs (log; forward only for ZO, forward + backward for first order)"),
                            (axes[1], "byte_curves", "cumulative bytes, up + down, all clients (log; encoded messages)")):
        for j, r in enumerate(res["rows"]):
            for i, (x, y) in enumerate(r.get(key, [])):   # round 0 (x = 0) is the "start" line on a log axis
                ax.plot(x[1:], y[1:], color=f"C{j}", alpha=0.8, marker=".", label=r["label"] if i == 0 else None)
        alt = res.get("fedspzo_seed_records") if key == "byte_curves" else None
        if alt:
            j = next(i for i, r in enumerate(res["rows"]) if r["method"] == "fedspzo")
            for i, (x, y) in enumerate(alt["curves"]):
                ax.plot(x[1:], y[1:], color=f"C{j}", ls="--", alpha=0.8, label="FedSPZO with seed records down (derived)" if i == 0 else None)
        starts = [i for r in res["rows"] for i in r["initials"]]
        if starts:
            ax.axhline(float(np.mean(starts)), color="grey", ls="-", lw=0.8, label="start (round 0)")
        if res.get("target"):
            ax.axhline(res["target"], color="grey", ls="--", lw=0.8, label="target")
        if res.get("recalibration"):
            ax.axhline(res["recalibration"]["best_bias"], color="black", ls=":", lw=0.8,
                       label="zero-shot with the best label bias (test-set oracle)")
        ax.set_xscale("log")
        ax.set_xlabel(xlabel, fontsize=8)
        ax.set_ylabel("accuracy (one line per seed)")
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=7)
    axes[1].legend(fontsize=6)
    common.save(fig, path)


def render_calibrate(res: dict) -> str:
    setting = res.get("setting") or ("prompt" if "--setting prompt" in res["meta"]["command"] else "probed")
    L = [f"# ZO learning rates in z-space and on the weights ({res['meta']['date']})\n", f"Command: `{res['meta']['command']}`  ",
         "Centralised (1 client, 3 rounds x 25 steps of the benchmark's batch), from "
         + ("the probed head" if SETTINGS[setting]["probe"] else "the pretrained LM (zero-shot)") + "; every lr sees the "
         "same batches, which differ between rounds (so the loss falls from round to round at any lr: compare a "
         "round's loss across lrs, not across rounds). Rule: the lowest last-round loss among the lrs that keep the "
         "accuracy within 1 pp of the start.\n",
         "| run | train loss per round | accuracy |", "|---|---|---|"]
    for r in res["rows"]:
        L.append(f"| {r['label']} | {r['error'][:100]} | |" if "error" in r else
                 f"| {r['label'].replace(' | ', ', ')} | {' -> '.join(f'{x:.4f}' for x in r['losses'])} | "
                 f"{r['initial']:.4f} -> {r['final']:.4f} |")
    return "\n".join(L) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--calibrate", action="store_true")
    ap.add_argument("--setting", choices=sorted(SETTINGS), default="probed")
    ap.add_argument("--methods", default="", help="comma-separated method names to run (default: the setting's all)")
    common.add_args(ap)
    a = ap.parse_args(argv)
    common.configure(a)
    S = SETTINGS[a.setting]
    if a.calibrate and common.rerender(a, S["name"] + "_calibrate" + ("_quick" if a.quick else ""), render_calibrate):
        return
    if a.render:
        name = S["name"] + ("_quick" if a.quick else "")
        res = json.loads((RESULTS / f"{name}.json").read_text())
        res.update(targets_of(res["rows"], client_steps(res["config"]["base"])))
        res["fedspzo_seed_records"] = seed_record_downlink(res)
        res["meta"]["rendered"] = {"command": "python benchmarks/zoflite_claims.py " + " ".join(sys.argv[1:] if argv is None else argv),
                                   "date": time.strftime("%Y-%m-%d %H:%M"), "code": meta("")["code"]}
        plot(res, RESULTS / f"{name}.png")
        print(write(name, res, render(res)))
        return
    seeds = [0] if a.calibrate else [int(s) for s in a.seeds.split(",")]
    name = S["name"] + ("_calibrate" if a.calibrate else "") + ("_quick" if a.quick else "")
    probes, grid = configs(S, seeds, a.quick, calibrate=a.calibrate, only=[m for m in a.methods.split(",") if m])
    t0 = time.time()
    ps, ss = common.chained(probes, grid, a.workers, a.from_runs)
    cmd = "python benchmarks/zoflite_claims.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if a.calibrate:
        rows = [{"label": label, "error": s["error"]} if "error" in s else
                {"label": label, "losses": [c_["train_loss"] for r in records(s["out"])[1:] for c_ in r["clients"]],
                 "initial": s["initial"], "final": s["final"]} for (label, c), s in zip(grid, ss)]
        res = {"meta": meta(cmd), "setting": a.setting, "rows": rows}
        print(write(name, res, render_calibrate(res)))
        return
    res = {"meta": meta(cmd), "name": name,
           "config": {"setting": a.setting, "base": _base(S, a.quick, 0), "seeds": seeds, "lr": S["lr"], "calibration": S["calibration"], "workers": a.workers,
                      "first_order": S["first_order"], "methods": {m: o for _, m, o in S["methods"]}},
           "wall_s": time.time() - t0, "runs_wall_s": sum(x["time"]["wall"] for x in ss if "error" not in x), "probes": [{"seed": p["config"]["seed"], "final": p.get("final")} for p in ps if "error" not in p],
           **({} if S["probe"] else {"recalibration": recalibration(_base(S, a.quick, 0))}),
           **summarize(grid, ss, S["methods"])}
    res.update(targets_of(res["rows"], client_steps(res["config"]["base"])))
    res["fedspzo_seed_records"] = seed_record_downlink(res)
    md = render(res)
    if res["rows"]:
        plot(res, RESULTS / f"{name}.png")
    print(write(name, res, md))
    print(md)


if __name__ == "__main__":
    main()
