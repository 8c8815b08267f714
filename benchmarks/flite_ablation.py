"""FLITE's map, ablated on the real architecture (issue #11): which choice closes the gap to FedAvg, at what bytes.

    python benchmarks/flite_ablation.py                         # sentiment on real MiniLM, 10 rounds, seeds 0,1,2
    python benchmarks/flite_ablation.py --rounds 30             # the issue's 30 rounds (GPU-sized on this CPU)
    python benchmarks/flite_ablation.py --quick                 # smoke test at tiny sizes (minutes)
    python benchmarks/flite_ablation.py --render                # the table and plot again from the JSON

Every variant is a full federated run through the in-process engine (10 clients, half per round, IID),
evaluated on the model the clients receive (after the codec), with 500 test tweets (one example = 0.2 pp).
Bytes are the encoded messages' len() from each run's summary. Variants (FLITE's lr is its own default):
- the paper's map (r = 6, random factors, fan-in scale, frozen orthogonal head), int4 on the wire;
- rank bought with bits: r = 20 at int4 next to r = 7 at fp32 (about the same bytes);
- factors from theta_pre (basis = svd: each weight's top-r singular subspaces; costs no bytes);
- per-layer scale (scale = weight: a unit of z moves each layer by the same fraction of its weight's rms);
- the head: trained and sent (its bytes in the ratio), or fitted first by the federated closed-form probe
  (methods/probe.py, one round, its bytes reported) and kept frozen (LP then FLITE);
- the paper's from-scratch ablation on MiniLM's real architecture with random weights, FLITE and FedAvg.
Allocating the latent budget across layers by sensitivity is not in this table (not built).
Claims (3 seeds; "met" only where the seeds' ranges separate, see common.verdict):
- a variant within 1 pp of FedAvg fp32: min(variant) > max(FedAvg) - 1 pp;
- FLITE needs a pretrained base (the paper: from scratch it fails): random-backbone FLITE below pretrained FLITE.
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
from common import RESULTS, meta, verdict, write  # noqa: E402

from lightfed.report import human_bytes  # noqa: E402

BASE = {"task": "sentiment", "clients": 10, "fraction": 0.5, "batch_size": 16, "lr": 5e-5, "local_epochs": 1.0,
        "partition": "iid", "task_options": {"train_size": 800, "test_size": 500, "max_len": 32}, "progress": False}
QUICK = {"task_options": {"train_size": 80, "test_size": 40, "max_len": 16}}
R20 = {"codec": "int4", "r": 20, "head": "orthogonal"}      # every map option explicit: FLITE's defaults moved
# (label, method, method options, extra: task_options / probe)
VARIANTS = [
    ("FedAvg fp32", "fedavg", {}, {}),
    ("FLITE r=6 int4 (the paper's map)", "flite", {"codec": "int4", "r": 6, "head": "orthogonal"}, {}),
    ("FLITE r=7 fp32 (~ r=20 int4's bytes)", "flite", {"codec": "fp32", "r": 7, "head": "orthogonal"}, {}),
    ("FLITE r=20 int4", "flite", R20, {}),
    ("FLITE r=20 int4, basis=svd", "flite", {**R20, "basis": "svd"}, {}),
    ("FLITE r=20 int4, scale=weight", "flite", {**R20, "scale": "weight"}, {}),
    ("FLITE r=20 int4, trainable head", "flite", {**R20, "head": "trainable"}, {}),
    ("FLITE r=20 int4, probed head (LP then FLITE)", "flite", {**R20, "head": "keep"}, {"probe": True}),
    ("FLITE r=20 int4, random backbone", "flite", R20, {"task_options": {"pretrained": False}}),
    ("FedAvg fp32, random backbone", "fedavg", {}, {"task_options": {"pretrained": False}}),
]
REF = "FedAvg fp32"
FLITE_LR = 1e-2          # FLITE's recommended latent lr (BASE's lr is full fine-tuning's)


def configs(rounds: int, seeds: list[int], quick: bool, only: set | None) -> tuple[list, list]:
    """(probe runs, variant runs), each [(label, config)]; a probed variant starts from its seed's probe."""
    probes, grid = [], []
    for seed in seeds:
        base = {**BASE, "rounds": rounds, "seed": seed}
        if quick:
            base = {**base, **QUICK, "task_options": {**BASE["task_options"], **QUICK["task_options"]}}
        for label, m, opts, extra in VARIANTS:
            if only and label not in only:
                continue
            c = {**base, "method": m, "method_options": opts, "lr": FLITE_LR if m == "flite" else base["lr"],
                 "task_options": {**base["task_options"], **extra.get("task_options", {})}}
            if extra.get("probe"):          # starts from its seed's probe (common.chained: the probe's store folder)
                c["init"] = f"probe s{seed}"
                if not any(p[0] == c["init"] for p in probes):
                    probes.append((c["init"], {**base, "method": "probe", "rounds": 1, "lr": 0.0}))
            grid.append((f"{label} s{seed}", c))
    return probes, grid


def summarize(summaries: list[dict], probes: list[dict]) -> dict:
    by = {}
    for s in summaries:
        label = s["label"].rsplit(" s", 1)[0]
        by.setdefault(label, []).append(s)
    ref = [s["final"] for s in by.get(REF, []) if "error" not in s]
    ref_up = np.mean([s["bytes"]["up_per_client_round"] for s in by.get(REF, []) if "error" not in s]) if ref else None
    pre = [s["final"] for s in by.get("FLITE r=20 int4", []) if "error" not in s]
    rows = []
    for label, *_ in VARIANTS:
        ss = [s for s in by.get(label, []) if "error" not in s]
        if not ss:
            continue
        fin = [s["final"] for s in ss]
        up = float(np.mean([s["bytes"]["up_per_client_round"] for s in ss]))
        row = {"label": label, "seeds": [s["config"]["seed"] for s in ss], "finals": fin, "initial": [s["initial"] for s in ss],
               "mean": float(np.mean(fin)), "std": float(np.std(fin)), "min": min(fin), "max": max(fin),
               "up_bytes": up, "down_bytes": float(np.mean([s["bytes"]["down_per_client_round"] for s in ss])),
               "x_fewer_than_fedavg": ref_up / up if ref_up else None, "method_info": ss[0].get("method_info"),
               "init": ss[0].get("init"), "seconds": float(np.mean([s["time"]["wall"] for s in ss])),
               "errors": [s["error"] for s in by.get(label, []) if "error" in s]}
        if label != REF and ref and "random backbone" not in label:
            row["within_1pp_of_fedavg"] = verdict(fin, [x - 0.01 for x in ref], a_lower=False)
        if label == "FLITE r=20 int4, random backbone" and pre:
            row["needs_pretrained"] = verdict(fin, pre, a_lower=True)
        rows.append(row)
    return {"rows": rows, "probes": [{"seed": p["config"]["seed"], "final": p.get("final"), "up_bytes": p["bytes"]["up_per_client_round"],
                                      "client_flops": p["flops"]["client_total"]} for p in probes if "error" not in p]}


def render(res: dict) -> str:
    c = res["config"]
    L = [f"# FLITE's map, ablated on real MiniLM ({res['meta']['date']})\n",
         f"Command: `{res['meta']['command']}`  ",
         (f"Collected (--from-runs) from the runs of the grid that finished; they ran {c['workers']} at a time, 1 torch "
          "thread each, on 2 cores shared with another benchmark.\n" if c.get("from_runs") else
          f"{c['runs']} runs, {c['workers']} side by side, 1 torch thread each; wall {res['wall_s'] / 60:.1f} min.\n"),
         f"Setting: `{json.dumps({k: v for k, v in c['base'].items() if k != 'progress'})}`, {c['rounds']} rounds, seeds {c['seeds']}. "
         "Accuracy of the model the clients receive (after the codec); bytes = len() of the encoded messages per client per round.\n",
         "| variant | accuracy (mean ± std over seeds) | min / max | up B/client/round | x fewer than FedAvg fp32 | "
         "within 1 pp of FedAvg fp32 |", "|---|---|---|---|---|---|"]
    for r in res["rows"]:
        x = f"{r['x_fewer_than_fedavg']:,.0f}x" if r["x_fewer_than_fedavg"] else "-"
        L.append(f"| {r['label']} | {r['mean']:.4f} ± {r['std']:.4f} (n = {len(r['finals'])}) | {r['min']:.4f} / {r['max']:.4f} | "
                 f"{r['up_bytes']:,.0f} ({human_bytes(r['up_bytes'])}) | {x} | {r.get('within_1pp_of_fedavg', '-')} |")
    L.append("")
    for r in res["rows"]:
        if "needs_pretrained" in r:
            L.append(f"- The paper's from-scratch ablation (FLITE fails without a pretrained base): random-backbone FLITE "
                     f"{r['mean']:.4f} vs pretrained {next(x['mean'] for x in res['rows'] if x['label'] == 'FLITE r=20 int4'):.4f}: "
                     f"**{r['needs_pretrained']}** (FLITE below the pretrained run).")
    missing = {}
    for r in res["runs"]:
        if r.get("error"):
            missing.setdefault(r["label"].rsplit(" s", 1)[0], []).append(r["label"].rsplit(" s", 1)[1])
    for label, ss in missing.items():
        L.append(f"- {label}: seed(s) {', '.join(ss)} missing "
                 f"({next(r['error'] for r in res['runs'] if r.get('error') and r['label'].startswith(label))[:120]}).")
    if res["probes"]:
        p = res["probes"]
        accs = ", ".join(f"{x['final']:.4f}" for x in p)
        L.append(f"- The probed head: one round of methods/probe.py per seed, accuracy {accs}, "
                 f"{human_bytes(p[0]['up_bytes'])} up per client, once; not in the per-round bytes above.")
    L += ["", "![accuracy vs bytes](flite_ablation.png)", ""]
    return "\n".join(L)


def plot(res: dict, path: Path) -> None:
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    for r in res["rows"]:
        ax.errorbar(r["up_bytes"], r["mean"], yerr=[[r["mean"] - r["min"]], [r["max"] - r["mean"]]], fmt="o", capsize=3)
        ax.annotate(r["label"], (r["up_bytes"], r["mean"]), fontsize=7, xytext=(4, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("upload bytes per client per round (log)")
    ax.set_ylabel("accuracy (mean, bars: min..max over seeds)")
    ax.set_title("FLITE's map choices vs FedAvg fp32 (sentiment, real MiniLM)")
    ax.grid(alpha=0.3, which="both")
    common.save(fig, path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--only", default="", help="comma-free: labels separated by ';' (default: every variant)")
    ap.add_argument("--quick", action="store_true")
    common.add_args(ap)
    a = ap.parse_args()
    common.configure(a)
    name = "flite_ablation" + ("_quick" if a.quick else "")
    if a.render:
        res = json.loads((RESULTS / f"{name}.json").read_text())
    else:
        seeds = [int(s) for s in a.seeds.split(",")]
        rounds = 1 if a.quick else a.rounds
        probes, grid = configs(rounds, seeds, a.quick, set(a.only.split(";")) if a.only else None)
        t = time.time()
        ps, ss = common.chained(probes, grid, a.workers, a.from_runs)
        res = {"meta": meta("python benchmarks/flite_ablation.py " + " ".join(sys.argv[1:])),
               "config": {"base": BASE if not a.quick else {**BASE, **QUICK}, "rounds": rounds, "seeds": seeds,
                          "workers": a.workers, "runs": len(ps) + len(ss), "from_runs": a.from_runs},
               "wall_s": time.time() - t, **summarize(ss, ps), "runs": [{k: s.get(k) for k in ("label", "final", "initial", "error", "out")} for s in ss]}
    md = render(res)
    plot(res, RESULTS / f"{name}.png")
    print(write(name, res, md))


if __name__ == "__main__":
    main()
