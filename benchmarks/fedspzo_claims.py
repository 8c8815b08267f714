"""FedSPZO's claims, side by side (spec: shared/spec/fedspzo.md): FedSPZO vs the zeroth-order FL
baselines FedZO (full-model uplink) and DeComFL (shared seeds, averaged scalars), the ablations
(MeZO-style uniform perturbation; FedSPZO with the smallest f2 budget), and the first-order
FedAvg and FedAvg+LoRA of the foundation, on `sentiment` (real MiniLM-L6, primary) and a shorter
run on `austen` (SmolLM2-135M). Plus a one-step memory probe at a paper-like context.

    .venv/bin/python benchmarks/fedspzo_claims.py                     # ~25 min with 2 workers on 2 cores
    .venv/bin/python benchmarks/fedspzo_claims.py --tasks sentiment   # the primary task only
    .venv/bin/python benchmarks/fedspzo_claims.py --quick             # smoke test of the grid at tiny sizes (~3 min)
    .venv/bin/python benchmarks/fedspzo_claims.py --calibrate         # the lr calibration behind ZO_LR (~15 min)

Writes benchmarks/results/fedspzo_claims.{json,md,png} (`_quick` / `_calibrate` suffixes for those modes).

Protocol (what is compared, and what is not the paper's):
- Every method starts from the same task model (pretrained backbone + the task's seeded random
  head: ZO methods start at chance). The 3-seed ZO claims of issue #10, from a start above chance
  (the probed head; the prompt-based SmolLM2 setting), are benchmarks/zoflite_claims.py's.
- Zeroth-order methods train the SAME restricted set of weights (ZO_TRAINABLE: the last two
  transformer layers + the head for sentiment; the last two decoder layers for austen, whose
  lm_head is tied to the 28M-weight embedding) because drawing z for all 22.7M / 135M weights on
  a CPU costs ~1 s / ~6 s per direction. FedSPZO's split = 1 puts the last layer (+ head) in f2,
  so theta1 = the trainable layer of f1 and theta2 = the last layer (+ head); f1 still runs
  every frozen layer below. First-order baselines train what the foundation trains (FedAvg: all
  weights; FedAvg+LoRA: rank-8 q/v adapters + head).
- z = "fast" for every ZO method (float32 draws: wall time only; FLOPs and results of one machine
  are unaffected). Same batch size, sequence length, local steps per round, clients per round
  and seed for every method; ZO rounds are set so that every ZO run gets about the same total
  client forward FLOPs (ROUNDS), first-order runs fewer rounds (they converge in a few).
- Learning rates: one lr for every ZO method of a task (ZO_LR: the largest of {1e-3, 3e-3} at
  which MeZO is stable on sentiment; the others were not better at 3e-3: `--calibrate` reruns
  the sweep for every ZO method); first-order ones are the foundation's. One seed: differences
  of a few points are within the noise of a 250-example test set.
- FLOPs: torch FlopCounterMode per sample x samples, client side only (ZO: forwards; FO: forward +
  backward). lightfed.measure registers torch's SDPA formula for the fused CPU attention kernel
  eval mode takes (FlopCounterMode has none), so ZO forwards count the attention matmuls too. Curves: accuracy (perplexity) after each round against the
  cumulative client FLOPs of all sampled clients, read from each run's metrics.jsonl.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import common  # noqa: E402
from common import meta, reuse_or_run, write  # noqa: E402

from lightfed.report import human_bytes, markdown  # noqa: E402

HERE = Path(__file__).parent

TASKS = {
    "sentiment": {"task": "sentiment", "clients": 10, "fraction": 0.2, "batch_size": 8, "local_steps": 10,
                  "partition": "iid", "seed": 0, "eval_every": 1,
                  "task_options": {"train_size": 2000, "test_size": 250, "max_len": 24}},
    "austen": {"task": "austen", "clients": 10, "fraction": 0.2, "batch_size": 2, "local_steps": 4,
               "partition": "iid", "seed": 0, "eval_every": 1,
               "max_message_bytes": 2**30,       # FedAvg's SmolLM2 weights: 538 MB > the 512 MiB default
               "task_options": {"train_blocks": 300, "test_blocks": 12, "block_len": 32}},
}
ZO_TRAINABLE = {"sentiment": "layer.4.,layer.5.,head.", "austen": "layers.28.,layers.29."}

# (label, method, method options, role); ZO methods get trainable, z and lr added per task.
METHODS = [
    ("FedSPZO", "fedspzo", {"split": 1, "P1": 1, "Ps": 2}, "zo"),
    ("FedZO", "fedzo", {"b2": 4, "mu": 1e-3}, "zo"),
    ("DeComFL", "decomfl", {"P": 1}, "zo"),
    ("MeZO uniform P=2 (ablation)", "mezo", {"P": 2}, "ablation"),
    ("FedSPZO Ps=1 (ablation)", "fedspzo", {"split": 1, "P1": 1, "Ps": 1}, "ablation"),
    ("FedSPZO independent (ablation)", "fedspzo", {"split": 1, "P1": 1, "Ps": 2, "estimate": "independent"}, "ablation"),
    ("FedAvg+LoRA", "lora", {}, "fo"),
    ("FedAvg", "fedavg", {}, "fo"),
]
ZO_ROLES = ("zo", "ablation")
SEED_DOWN = ("fedspzo", "mezo", "decomfl")   # these send a client that holds an earlier model records, not weights
# One lr for every ZO method of a task: the largest at which the uniform baseline is stable (sentiment: MeZO diverged
# at 3e-3; austen: 1e-3 made the perplexity worse; see --calibrate).
ZO_LR = {"sentiment": 1e-3, "austen": 1e-4}
FO_LR = {"sentiment": {"FedAvg+LoRA": 5e-4, "FedAvg": 5e-5}, "austen": {"FedAvg+LoRA": 5e-4, "FedAvg": 5e-5}}
# Rounds per run: ZO runs get ~ equal total client forward FLOPs. Per step, in full forwards: sentiment (6-layer
# MiniLM, f2 = 1 layer + head ~ 1/6 of a forward): FedSPZO Ps=2 ~ 2 x 5/6 + 8 x 1/6 = 3.0, Ps=1 ~ 2.3, FedZO b2=4: 5,
# DeComFL P=1: 2, MeZO P=2: 4, FedSPZO independent ~ 3 x 5/6 + 10 x 1/6 = 4.2; austen (30-layer SmolLM2, f2 = 1 layer + the 49,152-word lm_head ~ 0.24 of a
# forward): FedSPZO ~ 3.4. First-order runs get a few rounds (they converge in a few).
ROUNDS = {"sentiment": {"FedSPZO": 9, "FedZO": 5, "DeComFL": 14, "MeZO uniform P=2 (ablation)": 7,
                        "FedSPZO Ps=1 (ablation)": 12, "FedSPZO independent (ablation)": 7, "FedAvg+LoRA": 4, "FedAvg": 4},
          "austen": {"FedSPZO": 3, "FedZO": 2, "DeComFL": 5, "FedAvg+LoRA": 2, "FedAvg": 2}}
SKIP = {("austen", "FedSPZO Ps=1 (ablation)"), ("austen", "MeZO uniform P=2 (ablation)"),
        ("austen", "FedSPZO independent (ablation)")}   # short run: claims only
# A FLOPs-to-target claim is judged only if the target beats round 0 by more than this (test-set noise).
MARGIN = {"accuracy": 0.02, "perplexity": 0.005}   # accuracy: absolute; perplexity: relative

# One local step at a paper-like context (RoBERTa-large ctx 256 in the paper; MiniLM here), for memory only.
PROBE = {"task": "sentiment", "clients": 1, "fraction": 1.0, "rounds": 1, "local_steps": 1, "batch_size": 16,
         "seed": 0, "task_options": {"train_size": 32, "test_size": 2, "max_len": 256}}
PROBE_METHODS = ["FedSPZO", "MeZO uniform P=2 (ablation)", "FedAvg+LoRA", "FedAvg"]

QUICK = {"sentiment": {"local_steps": 2, "task_options": {"train_size": 40, "test_size": 20, "max_len": 16}},
         "austen": {"local_steps": 1, "task_options": {"train_blocks": 12, "test_blocks": 6, "block_len": 16}}}
QUICK_ROUNDS = {"sentiment": 2, "austen": 1}
QUICK_SKIP = {("austen", "FedZO"), ("austen", "DeComFL"), ("austen", "FedAvg+LoRA")}   # building austen (tokenising
# 6 novels) costs ~15-25 s a run; quick keeps its split ZO path and its 538 MB FedAvg messages
QUICK_PROBE = {"batch_size": 2, "task_options": {"train_size": 4, "test_size": 2, "max_len": 32}}


def _method(label):
    return next(m for m in METHODS if m[0] == label)


def config_for(task, label, quick):
    _, method, opts, role = _method(label)
    base = {**TASKS[task], "progress": False}
    if quick:
        base = {**base, **QUICK[task], "task_options": {**base["task_options"], **QUICK[task]["task_options"]}}
    cfg = {**base, "method": method, "rounds": QUICK_ROUNDS[task] if quick else ROUNDS[task][label]}
    if role in ZO_ROLES:
        lr = ZO_LR[task]
        cfg.update(lr=lr, method_options={**opts, "trainable": ZO_TRAINABLE[task], "z": "fast",
                                          **({"down": "seeds"} if method in SEED_DOWN else {})})
    else:
        cfg.update(lr=FO_LR[task][label], method_options=dict(opts))
    return cfg


def grid_for(tasks, quick, probe=True):
    """(runs, probes): [(label, config)] each, in the run store; probes are one-step runs for memory only."""
    grid, probes = [], []
    for t in tasks:
        for label, *_ in METHODS:
            if (t, label) not in SKIP and not (quick and (t, label) in QUICK_SKIP):
                grid.append((f"{t} | {label}", config_for(t, label, quick)))
    if probe and "sentiment" in tasks:
        for label in PROBE_METHODS:
            c = {**config_for("sentiment", label, quick), **PROBE, "progress": False}
            if quick:
                c.update(QUICK_PROBE)
            probes.append((f"probe | {label}", c))
    return grid, probes


# --- reading the runs ----------------------------------------------------------------------------
def curve(out: str, metric: str):
    """[(cumulative client FLOPs after the round, metric)] from round 0, from <out>/metrics.jsonl."""
    pts, cum = [], 0.0
    for r in common.records(out):
        cum += sum(c.get("flops", 0) for c in r.get("clients", []))
        if metric in r:
            pts.append((cum, r[metric]))
    return pts


def client_stat(out: str, key: str):
    """Mean of a per-client stat over every client update of the run (None if no client reports it)."""
    xs = [c[key] for r in common.records(out) for c in r.get("clients", []) if c.get(key) is not None]
    return sum(xs) / len(xs) if xs else None


def records_down(out: str) -> dict:
    """The downlinks sent as seed records (down_records > 0): how many of all, and their mean size."""
    cs = [c for r in common.records(out) for c in r.get("clients", [])]
    rec = [c["down"] for c in cs if c.get("down_records")]
    return {"down_records_share": (len(rec), len(cs)), "down_records_bytes": sum(rec) / len(rec) if rec else None}


def flops_to(pts, target, higher):
    """Cumulative client FLOPs when the curve first reaches `target` (None: never)."""
    for x, y in pts:
        if (y >= target) if higher else (y <= target):
            return x
    return None


def best(pts, higher):
    ys = [y for _, y in pts]
    return max(ys) if higher else min(ys)


def collect(grid, summaries):
    runs = []
    for (label, cfg), s in zip(grid, summaries):
        task, mlabel = [x.strip() for x in label.split("|")]
        if "error" in s:
            runs.append({"label": label, "task": task, "method_label": mlabel, "error": s["error"], "config": cfg})
            continue
        role = _method(mlabel)[3]
        mem = s["memory"]
        pts = curve(s["out"], s["metric"])
        runs.append({
            "label": label, "task": task, "method_label": mlabel, "method": s["method"], "role": role,
            "metric": s["metric"], "higher": s["metric"] != "perplexity", "initial": s["initial"], "final": s["final"],
            "curve": pts, "rounds": cfg["rounds"], "K": cfg["local_steps"], "batch": cfg["batch_size"],
            "ctx": cfg["task_options"].get("max_len", cfg["task_options"].get("block_len")), "trainable": s["trainable_params"], "model_params": s["model_params"],
            "flops_total": s["flops"]["client_total"], "flops_per_client_round": s["flops"]["per_client_round"],
            "up_bytes": s["bytes"]["up_per_client_round"], "down_bytes": s["bytes"]["down_per_client_round"],
            "down_seed_only_bytes": client_stat(s["out"], "down_seed_only_bytes"),
            "down_seed_history_bytes": client_stat(s["out"], "down_seed_history_bytes"),
            **records_down(s["out"]),
            "rss_rise": mem["client_rss_rise_bytes"], "rss_peak": mem["client_rss_peak_bytes"],
            "accounted": mem["client_accounted_bytes"], "accounted_parts": mem["client_accounted_parts"],
            "lr": cfg["lr"], "options": cfg["method_options"], "wall_s": s["time"]["wall"],
            "client_s": s["time"]["client_compute"], "out": s["out"]})
    return runs


# --- the claims ----------------------------------------------------------------------------------
def judge(runs):
    """Every target of the issue, measured and judged; nothing here is tuned to pass."""
    out, notes = [], {}
    for t in sorted({r["task"] for r in runs if r["task"] != "probe"}):
        rs = {r["method_label"]: r for r in runs if r["task"] == t}
        zo = [r for r in rs.values() if r["role"] in ZO_ROLES]
        if not zo:
            continue
        hi = zo[0]["higher"]
        init = zo[0]["initial"]
        # common target: the best value that EVERY ZO run reaches (the worst of their bests)
        target = min(best(r["curve"], hi) for r in zo) if hi else max(best(r["curve"], hi) for r in zo)
        margin = MARGIN[zo[0]["metric"]]
        improves = (target > init + margin) if hi else (target < init * (1 - margin))
        notes[t] = {"target": target, "initial": init, "judgeable": improves,
                    "rule": "the worst of the ZO runs' best values (every ZO run reaches it); judged only if it beats "
                            "round 0 by more than " + ("2 pp" if hi else "0.5 %")}
        for r in rs.values():
            r["flops_to_target"] = flops_to(r["curve"], target, hi)
        sp = rs.get("FedSPZO")
        fmt = (lambda v: f"{v:.3f}") if hi else (lambda v: f"{v:.2f}")
        for base in ("FedZO", "DeComFL"):
            b = rs.get(base)
            if not (sp and b):
                continue
            if not improves:
                out.append({"task": t, "target": f"FedSPZO >= 2x fewer FLOPs than {base} to the target",
                             "measured": f"target {fmt(target)} is within the noise margin of round 0 ({fmt(init)})",
                             "verdict": "not judgeable"})
                continue
            a, c = sp["flops_to_target"], b["flops_to_target"]
            pair = min(best(sp["curve"], hi), best(b["curve"], hi)) if hi else max(best(sp["curve"], hi), best(b["curve"], hi))
            a2, c2 = flops_to(sp["curve"], pair, hi), flops_to(b["curve"], pair, hi)
            out.append({"task": t, "target": f"FedSPZO >= 2x fewer FLOPs than {base} to the target",
                        "measured": f"to {fmt(target)}: {c / max(a, 1):.2f}x ({a / 1e12:.2f} vs {c / 1e12:.2f} TFLOPs); "
                                    f"pairwise to {fmt(pair)}: {c2 / max(a2, 1):.2f}x",
                        "verdict": "met" if c >= 2 * a else f"missed ({c / max(a, 1):.2f}x < 2x)"})
        lo = rs.get("FedAvg+LoRA")
        if sp and lo:
            ratio = lo["up_bytes"] / sp["up_bytes"]
            K = sp["K"]
            P = sp["options"]["P1"] * (1 + 2 * sp["options"]["Ps"])           # scalars per step: P1 + P2
            out.append({"task": t, "target": "FedSPZO uplink >= 1,000x below FedAvg+LoRA",
                        "measured": f"{ratio:,.0f}x ({sp['up_bytes']:,.0f} B vs {lo['up_bytes']:,.0f} B per client per round; "
                                    f"K = {K} steps x {P} scalars)",
                        "verdict": "met" if ratio >= 1000 else
                        f"missed: the uplink grows with K; {lo['up_bytes'] / 1000:,.0f} B allows K <= "
                        f"{int((lo['up_bytes'] / 1000 - (sp['up_bytes'] - 4 * K * P)) // (4 * P))}"})
            if sp["accounted"] and lo["accounted"]:     # the runs' RSS rise is in the table only: their worker
                q = sp["accounted"] / lo["accounted"]    # processes are reused, so an earlier run's heap hides it
                out.append({"task": t, "target": f"FedSPZO peak memory <= 0.5x LoRA's (accounted tensors, run setting: "
                                                 f"batch {sp['batch']} x {sp['ctx']} tokens)",
                            "measured": f"{q:.2f}x ({human_bytes(sp['accounted'])} vs {human_bytes(lo['accounted'])}; "
                                        f"weights {human_bytes(sp['accounted_parts'].get('params', 0))} in both)",
                            "verdict": "met" if q <= 0.5 else "missed: at this short context the weights dominate"})
            ratio_c = sp["flops_total"] / lo["flops_total"]
            sp_best = best(sp["curve"], hi)
            sp_to, lo_to = flops_to(sp["curve"], sp_best, hi), flops_to(lo["curve"], sp_best, hi)
            if lo_to is None:
                to = "LoRA never reached it"
            elif not sp_to or not lo_to:
                to = "FedSPZO never beat round 0"
            else:
                to = f"{sp_to / lo_to:.1f}x ({sp_to / 1e12:.2f} vs {lo_to / 1e12:.3f} TFLOPs)"
            out.append({"task": t, "target": "compute vs FedAvg+LoRA (paper: ~17x MORE for FedSPZO; reported, not a target)",
                        "measured": f"whole runs: {ratio_c:.2f}x; to FedSPZO's best ({fmt(sp_best)}): {to}",
                        "verdict": "reported"})
            gap = (lo["final"] - sp["final"]) * (100 if hi else 1)
            out.append({"task": t, "target": "FedSPZO final accuracy within 1 pp of FedAvg+LoRA" if hi else
                        "FedSPZO final perplexity vs FedAvg+LoRA",
                        "measured": f"FedSPZO {fmt(sp['final'])} vs LoRA {fmt(lo['final'])}"
                                    + (f" (FedSPZO {gap:.1f} pp lower)" if hi and gap >= 0 else f" (FedSPZO {-gap:.1f} pp higher)" if hi else ""),
                        "verdict": ("met" if gap <= 1 else "missed") if hi else
                        ("FedSPZO better" if sp["final"] < lo["final"] else "LoRA better")})
        for abl in ("MeZO uniform P=2 (ablation)", "FedSPZO Ps=1 (ablation)", "FedSPZO independent (ablation)"):
            b = rs.get(abl)
            if sp and b and improves:
                a, c = sp["flops_to_target"], b["flops_to_target"]
                out.append({"task": t, "target": f"ablation: split + asymmetric budget beats {abl.replace(' (ablation)', '')}",
                            "measured": f"FLOPs to {fmt(target)}: {a / 1e12:.2f} vs {c / 1e12:.2f} TFLOPs ({c / max(a, 1):.2f}x)",
                            "verdict": "met" if a < c else "missed"})
    probe = {r["method_label"]: r for r in runs if r["task"] == "probe"}
    sp, lo = probe.get("FedSPZO"), probe.get("FedAvg+LoRA")
    if sp and lo:
        for what, key in (("accounted tensors", "accounted"), ("measured RSS rise", "rss_rise")):
            if sp[key] and lo[key]:
                q = sp[key] / lo[key]
                out.append({"task": "probe", "target": f"FedSPZO peak memory <= 0.5x LoRA's ({what}, one step at "
                                                       f"batch {sp['batch']} x ctx {sp['ctx']})",
                            "measured": f"{q:.2f}x ({human_bytes(sp[key])} vs {human_bytes(lo[key])})",
                            "verdict": "met" if q <= 0.5 else "missed"})
    return out, notes


# --- output --------------------------------------------------------------------------------------
def plot(runs, path):
    plt = common.pyplot()
    tasks = [t for t in TASKS if any(r["task"] == t for r in runs)]
    fig, axes = plt.subplots(1, len(tasks), figsize=(6.5 * len(tasks), 4.5), squeeze=False)
    for ax, t in zip(axes[0], tasks):
        rs = [r for r in runs if r["task"] == t]
        for r in rs:
            pts = [(x, y) for x, y in r["curve"] if x > 0]
            ls = "-" if r["role"] == "zo" else ("--" if r["role"] == "ablation" else ":")
            ax.plot([p[0] for p in pts], [p[1] for p in pts], ls, marker="o", ms=3, label=r["method_label"])
        ax.axhline(rs[0]["initial"], color="grey", lw=0.8, ls=":")
        if "target" in rs[0]:
            ax.axhline(rs[0]["target"], color="black", lw=0.8, ls="--")
        ax.set_xscale("log")
        ax.set_xlabel("cumulative client FLOPs (log; ZO: forwards only, FO: forward + backward)")
        ax.set_ylabel(rs[0]["metric"] + ("" if rs[0]["higher"] else " (lower is better)"))
        ax.set_title(f"{t}: grey = round 0, dashed = target")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    common.save(fig, path)


def run_rows(runs, notes):
    rows = []
    for r in runs:
        if "error" in r or r["task"] == "probe":
            continue
        hi = r["higher"]
        f = (lambda v: f"{v:.3f}") if hi else (lambda v: f"{v:.2f}")
        ft = r.get("flops_to_target")
        rows.append({"task": r["task"], "method": r["method_label"], "lr": f"{r['lr']:g}", "rounds": r["rounds"],
                     "trainable": f"{r['trainable']:,}",
                     "round 0 -> final (best)": f"{f(r['initial'])} -> {f(r['final'])} (best {f(best(r['curve'], hi))})",
                     "client TFLOPs": f"{r['flops_total'] / 1e12:.2f}",
                     "TFLOPs to target": "-" if not notes.get(r["task"], {}).get("judgeable") else
                     (f"{ft / 1e12:.2f}" if ft is not None else "not reached"),
                     "up B/client/round": f"{r['up_bytes']:,.0f}", "down B/client/round": f"{r['down_bytes']:,.0f}",
                     "down as records: B (downlinks)": "-" if not r.get("down_records_bytes") else
                     f"{r['down_records_bytes']:,.0f} ({r['down_records_share'][0]} of {r['down_records_share'][1]})",
                     "seed record B (1 round)": f"{r['down_seed_only_bytes']:,.0f}" if r["down_seed_only_bytes"] else "-",
                     "mem accounted": human_bytes(r["accounted"]), "RSS rise": human_bytes(r["rss_rise"]),
                     "client s": f"{r['client_s']:.0f}"})
    return rows


def probe_rows(runs):
    rows = []
    for r in runs:
        if r.get("task") != "probe" or "error" in r:
            continue
        parts = r["accounted_parts"] or {}
        rows.append({"method": r["method_label"], "accounted": human_bytes(r["accounted"]),
                     "parts": ", ".join(f"{k} {human_bytes(v)}" for k, v in parts.items()),
                     "above the weights": human_bytes((r["accounted"] or 0) - parts.get("params", 0)),
                     "RSS rise": human_bytes(r["rss_rise"]), "RSS peak": human_bytes(r["rss_peak"])})
    return rows


def calibrate(a):
    """The lr calibration behind ZO_LR: each ZO method centralised (1 client), 3 x 25 steps, per lr."""
    grid = []
    for label, method, opts, role in METHODS:
        if role not in ZO_ROLES:
            continue
        for lr in (1e-3, 3e-3):
            c = config_for("sentiment", label, a.quick)
            c.update(clients=1, fraction=1.0, rounds=1 if a.quick else 3, local_steps=2 if a.quick else 25, lr=lr)
            grid.append((f"{label}, lr {lr:g}", c))
    summaries = reuse_or_run(grid, a.workers, a.from_runs)
    rows = []
    for (label, c), s in zip(grid, summaries):
        if "error" in s:
            rows.append({"run": label, "train loss per round": s["error"]})
            continue
        recs = common.records(s["out"])[1:]
        losses = [c_["train_loss"] for r in recs for c_ in r["clients"]]
        rows.append({"run": label, "train loss per round": " -> ".join(f"{x:.3f}" for x in losses),
                     "accuracy": f"{s['initial']:.3f} -> {s['final']:.3f}",
                     "verdict": "diverged" if losses[-1] > losses[0] + 0.05 else "stable"})
    name = "fedspzo_calibrate" + ("_quick" if a.quick else "")
    md = [f"# FedSPZO claims: ZO learning-rate calibration ({time.strftime('%Y-%m-%d %H:%M')})", "",
          f"Command: `python benchmarks/fedspzo_claims.py --calibrate{' --quick' if a.quick else ''}`  ",
          "Centralised (1 client), sentiment, the benchmark's batch, length and trainable set. "
          "Rule: each ZO method uses the largest lr whose train loss does not rise.", "",
          markdown(rows, ["run", "train loss per round", "accuracy", "verdict"]), ""]
    write(name, {"meta": meta(md[2]), "runs": rows}, "\n".join(md))
    print("\n".join(md))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", default="sentiment,austen")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--calibrate", action="store_true")
    ap.add_argument("--no-probe", action="store_true")
    common.add_args(ap)
    a = ap.parse_args(argv)
    common.configure(a)
    if a.calibrate:
        return calibrate(a)
    if common.rerender(a, "fedspzo_claims" + ("_quick" if a.quick else ""), render):
        return
    tasks = [t for t in a.tasks.split(",") if t]
    grid, probes = grid_for(tasks, a.quick, probe=not a.no_probe)
    t0, reused = time.time(), sum(common.finished(label, c) is not None for label, c in common.placed(grid + probes))
    summaries = reuse_or_run(grid, a.workers, a.from_runs)
    if probes:          # each in a fresh process (its RSS rise not hidden by an earlier run's heap); quick: a smoke test
        summaries += reuse_or_run(probes, a.workers, a.from_runs, fresh_process=not a.quick)
    grid = grid + probes
    runs = collect(grid, summaries)
    ok = [r for r in runs if "error" not in r]
    verdicts, notes = judge(ok)
    for r in ok:
        if r["task"] in notes:
            r["target"] = notes[r["task"]]["target"]
    name = "fedspzo_claims" + ("_quick" if a.quick else "")
    cmd = ("python benchmarks/fedspzo_claims.py" + (" --quick" if a.quick else "")
           + (f" --tasks {a.tasks}" if a.tasks != "sentiment,austen" else "") + (" --no-probe" if a.no_probe else ""))
    data = {"meta": meta(cmd, tasks=TASKS, methods=METHODS, zo_trainable=ZO_TRAINABLE, zo_lr=ZO_LR, fo_lr=FO_LR,
                         rounds=ROUNDS, probe=PROBE, quick=a.quick, workers=a.workers, from_runs=a.from_runs,
                         wall_s=time.time() - t0, reused=reused),
            "runs": runs, "targets": verdicts, "notes": notes}
    write(name, data, render(data))
    if [r for r in ok if r["task"] != "probe"]:
        plot([r for r in ok if r["task"] != "probe"], HERE / "results" / f"{name}.png")
    print(render(data))


def render(data: dict) -> str:
    m, runs, verdicts, notes = data["meta"], data["runs"], data["targets"], data["notes"]
    ok = [r for r in runs if "error" not in r]
    tasks = [t for t in TASKS if any(r["task"] == t for r in runs)]
    quick, from_runs = m.get("quick"), m.get("from_runs", "--from-runs" in m["command"])
    wall = f"{m['wall_s'] / 60:.1f}" if "wall_s" in m else "?"
    md = [f"# FedSPZO claims ({m['date']})", "",
          f"Command: `{m['command']}`  ",
          ("Collected (--from-runs) from the runs of this grid that finished; they ran " if from_runs else "")
          + f"{m['workers']} runs side by side, 1 torch thread each"
          + (", on 2 cores shared with other benchmarks." if from_runs else f"; wall {wall} min.")
          + (f" {m['reused']} of {len(runs)} runs reused from the run store (made by the code at hand)." if m.get("reused") else ""), "",
          "Setting (see the module docstring for the protocol):", ""]
    for t in tasks:
        base = {**m["tasks"][t], **(QUICK[t] if quick else {})}
        md.append(f"- {t}: `{json.dumps(base)}`; ZO trainable = `{m['zo_trainable'][t]}` (every ZO method), z = fast")
    md += ["- methods: " + "; ".join(f"{l} = {me} {json.dumps(o)}" for l, me, o, _ in m["methods"]),
           "- rounds: " + json.dumps({t: m["rounds"][t] for t in tasks}) if not quick else f"- rounds: {json.dumps(QUICK_ROUNDS)} (quick)",
           "- start: the task's pretrained backbone + its seeded random head for every method (ZO starts at chance)",
           ""]
    for t in tasks:
        n = notes.get(t)
        if n:
            md.append(f"- {t} target: {n['target']:.4g} = {n['rule']}; round 0: {n['initial']:.4g}"
                      + ("" if n["judgeable"] else " -> NOT better than round 0: FLOPs-to-target claims not judgeable"))
    rows = run_rows(ok, notes)
    for t in tasks:
        tr = [r for r in rows if r["task"] == t]
        if tr:
            metric = next(r["metric"] for r in ok if r["task"] == t)
            md += ["", f"## {t}: {metric}{'' if metric != 'perplexity' else ' (lower is better)'}", "",
                   markdown(tr, [c for c in tr[0] if c != "task"]), ""]
    pr = probe_rows(ok)
    if pr:
        pcfg = {**m["probe"], **(QUICK_PROBE if quick else {})}
        md += [f"## Memory of one local update at batch {pcfg['batch_size']} x ctx {pcfg['task_options']['max_len']} "
               "(sentiment, MiniLM; one step)", "",
               markdown(pr, list(pr[0])), ""]
    md += ["## Targets", "", markdown(verdicts, ["task", "target", "measured", "verdict"]), ""]
    md += [f"FAILED: {r['label']}: {r['error']}" for r in runs if "error" in r]
    md += ["", "Notes: bytes are len() of the encoded messages (the upload includes the 4-byte `_n` sample count). "
           "Down B/client/round is the mean of what the engine sent each sampled client: FedSPZO, MeZO and DeComFL run "
           "with down = seeds, so a client that holds the global model of an earlier round it took part in gets one "
           "record per round since (round seed + K x P mean scalars) and replays them, and a first-time client gets "
           "the weights; `down as records` is the mean size of the downlinks sent as records and how many of all "
           "downlinks they were (with 10 clients and 2 a round most clients are first-timers in a short run); "
           "`seed record` is one round's record. Memory: `accounted` = parameters (all weights, frozen included) + gradients + optimizer state + "
           "saved activations (first order) or + the peak live activations of one forward + the cached f1 boundary + "
           "the largest perturbation (zeroth order); `RSS rise` = the process's resident-set high-water mark during "
           "the local update above its resident set before it: meaningful for the probes (one update in a fresh "
           "process; in --quick they share the pool), not for the runs (worker processes are reused, so memory an earlier run freed to the heap hides "
           "the rise; shown, not judged). At the runs' short sequences the weights dominate both; the probe shows the "
           "longer-context regime.", f"![accuracy vs FLOPs](fedspzo_claims{'_quick' if quick else ''}.png)"]
    return "\n".join(md) + "\n"


if __name__ == "__main__":
    main()
