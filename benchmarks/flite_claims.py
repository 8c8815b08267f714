"""FLITE's claims over 3 seeds (issue #11): lightfed's default FLITE (r = 20, int4 both ways, the head trained
and sent; see benchmarks/results/flite_ablation.md) against full-weight FedAvg fp32, on every task, IID and
Dirichlet(0.1); and, on one seed, the other payload methods for the Pareto of accuracy against bytes.

    python benchmarks/flite_claims.py                         # sentiment, fmnist, austen: 3 seeds each
    python benchmarks/flite_claims.py --tasks sentiment       # run one task's grid (the file reports every task's,
                                                              #   from the run store and its records)
    python benchmarks/flite_claims.py --baselines             # also run VeRA, LoRA, top-k, PowerSGD, FedAvg int4,
                                                              #   the paper's FLITE map: one seed, sentiment IID
    python benchmarks/flite_claims.py --from-runs             # run nothing: report the runs that finished
    python benchmarks/flite_claims.py --quick                 # smoke test at tiny sizes (minutes)

Runs that finished with the same config (the run store, common.py) are reused, so a grid stopped by a time
limit goes on where it stopped. Accuracy is that of the model the clients receive (after the codec); bytes are
len() of the encoded messages, per client per round, both directions. Claims ("met" only where the 3 seeds'
ranges separate the claimed way, see common.verdict):
- FLITE's uplink >= 10,000x below FedAvg fp32's (sentiment; reported on the other tasks);
- FLITE within 1 pp of FedAvg fp32 (IID), and no worse than FedAvg - 1 pp under Dirichlet(0.1):
  min(FLITE) > max(FedAvg) - 1 pp; the issue's stronger goal under Dirichlet(0.1), FLITE >= FedAvg, reported too;
- austen (perplexity): FLITE's against FedAvg's, the lower the better.
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
from common import RESULTS, finished, meta, reuse_or_run, verdict, write  # noqa: E402

from lightfed.report import human_bytes  # noqa: E402

# Per task: run settings (lr is full fine-tuning's; FLITE and VeRA train at OWN_LR), rounds, partitions.
TASKS = {
    "sentiment": {"task": "sentiment", "clients": 10, "rounds": 30, "fraction": 0.5, "batch_size": 16, "lr": 5e-5,
                  "local_epochs": 1.0, "task_options": {"train_size": 800, "test_size": 500, "max_len": 32}},
    "fmnist": {"task": "fmnist", "clients": 10, "rounds": 10, "fraction": 0.5, "batch_size": 32, "lr": 1e-3,
               "local_epochs": 1.0, "task_options": {"arch": "small", "train_size": 3000, "test_size": 1000}},
    "austen": {"task": "austen", "clients": 10, "rounds": 5, "fraction": 0.3, "batch_size": 4, "lr": 5e-5,
               "local_epochs": 1.0, "task_options": {"train_blocks": 200, "test_blocks": 36, "block_len": 64}},
}
PARTITIONS = {"sentiment": ["iid", "dirichlet:0.1"], "fmnist": ["iid", "dirichlet:0.1"], "austen": ["iid"]}
QUICK = {"sentiment": {"rounds": 2, "task_options": {"train_size": 80, "test_size": 40, "max_len": 16}},
         "fmnist": {"rounds": 2, "task_options": {"train_size": 100, "test_size": 50}},
         "austen": {"rounds": 1, "task_options": {"train_blocks": 30, "test_blocks": 12, "block_len": 32}}}
METHODS = [("FLITE", "flite", {}, {}), ("FedAvg fp32", "fedavg", {}, {})]     # FLITE: its defaults
# one seed, sentiment IID, BASELINE_ROUNDS rounds: the other points of the payload / accuracy Pareto
BASELINE_ROUNDS = 10
BASELINES = [
    ("FLITE, the paper's map (r=6, frozen orthogonal head, int4)", "flite", {"r": 6, "head": "orthogonal"}, {}),
    ("VeRA", "vera", {}, {}),
    ("FedAvg+LoRA", "lora", {}, {"lr_times": 10}),          # adapters: 10x the full fine-tuning lr
    ("top-k 1% (EF)", "topk", {"ratio": 0.01}, {}),
    ("PowerSGD r4 (EF, shared factors)", "powersgd", {"rank": 4}, {}),
    ("FedAvg int4", "fedavg", {"codec": "int4"}, {}),
]
OWN_LR = {"flite": 1e-2, "vera": 5e-3}          # their recommended lrs (methods/flite.py, vera.py), set explicitly
LOWER_IS_BETTER = {"austen"}
CHANCE = 0.5                                     # sentiment: 2 classes


def grid_for(tasks: list[str], seeds: list[int], quick: bool, baselines: bool) -> list[tuple[str, dict]]:
    """[(label "task | partition | method | s<seed>", config)]: every run in the store."""
    grid = []
    for t in tasks:
        base = {**TASKS[t], "progress": False}
        if quick:
            base = {**base, **QUICK[t], "task_options": {**TASKS[t]["task_options"], **QUICK[t]["task_options"]}}
        for part in PARTITIONS[t]:
            for label, m, opts, _ in METHODS:
                for s in seeds:
                    grid.append((f"{t} | {part} | {label} | s{s}",
                                 {**base, "method": m, "method_options": opts, "partition": part, "seed": s,
                                  "lr": OWN_LR.get(m, base["lr"])}))
    if baselines and "sentiment" in tasks:
        base = {**TASKS["sentiment"], "progress": False, "rounds": BASELINE_ROUNDS, "partition": "iid", "seed": seeds[0]}
        if quick:
            base = {**base, **QUICK["sentiment"], "task_options": {**TASKS["sentiment"]["task_options"],
                                                                   **QUICK["sentiment"]["task_options"]}}
        ref = [("FLITE", "flite", {}, {}), ("FedAvg fp32", "fedavg", {}, {})]   # the same rounds, side by side
        for label, m, opts, extra in ref + BASELINES:
            c = {**base, "method": m, "method_options": opts, "lr": OWN_LR.get(m, base["lr"])}
            if "lr_times" in extra:
                c["lr"] = base["lr"] * extra["lr_times"]
            grid.append((f"pareto | iid | {label} | s{seeds[0]}", c))
    return grid


def _row(ss: list[dict]) -> dict:
    fin = [s["final"] for s in ss]
    s0 = ss[0]
    info = s0.get("method_info") or {}
    return {"seeds": [s["config"]["seed"] for s in ss], "finals": fin, "initials": [s["initial"] for s in ss],
            "mean": float(np.mean(fin)), "std": float(np.std(fin)), "min": min(fin), "max": max(fin),
            "up_bytes": [s["bytes"]["up_per_client_round"] for s in ss],
            "down_bytes": [s["bytes"]["down_per_client_round"] for s in ss],
            "trainable": s0["trainable_params"], "metric": s0["metric"],
            "client_flops_per_round": s0["flops"]["per_client_round"],
            "client_rss_peak": max(s["memory"]["client_rss_peak_bytes"] or 0 for s in ss),
            "latent": info.get("latent"), "live": info.get("live"), "factor_bytes": info.get("factor_bytes"),
            "one_time": info.get("one_time"), "head": info.get("head"),
            "curves": [[e[s0["metric"]] for e in s["history"]] for s in ss],
            "wall_s": float(np.mean([s["time"]["wall"] for s in ss]))}


def summarize(grid: list[tuple[str, dict]], summaries: list[dict]) -> dict:
    groups: dict[tuple, list] = {}
    missing = []
    for (label, cfg), s in zip(grid, summaries):
        t, part, m, seed = [x.strip() for x in label.split("|")]
        if "error" in s:
            missing.append({"label": label, "error": s["error"]})
            continue
        groups.setdefault((t, part, m), []).append(s)
    rows = [{"task": t, "partition": p, "method": m, **_row(ss)} for (t, p, m), ss in groups.items()]
    get = {(r["task"], r["partition"], r["method"]): r for r in rows}
    targets = []
    for r in rows:
        fa = get.get((r["task"], r["partition"], "FedAvg fp32"))
        if fa:
            r["x_fewer_up_than_fedavg"] = min(fa["up_bytes"]) / max(r["up_bytes"])
    for t in dict.fromkeys(r["task"] for r in rows if r["task"] != "pareto"):
        for part in PARTITIONS[t]:
            fl, fa = get.get((t, part, "FLITE")), get.get((t, part, "FedAvg fp32"))
            if not (fl and fa):
                continue
            spread = f"FLITE {fl['mean']:.4f} ± {fl['std']:.4f} [{fl['min']:.4f}, {fl['max']:.4f}] vs FedAvg {fa['mean']:.4f} ± {fa['std']:.4f} [{fa['min']:.4f}, {fa['max']:.4f}]"
            if part == "iid":
                x = fl["x_fewer_up_than_fedavg"]
                targets.append({"task": t, "partition": part, "target": "FLITE's uplink >= 10,000x below FedAvg fp32's",
                                "measured": f"{x:,.0f}x ({max(fl['up_bytes']):,.0f} B vs {min(fa['up_bytes']):,.0f} B per client per round)",
                                "verdict": ("met" if x >= 1e4 else "missed") if t == "sentiment" else f"reported ({'>=' if x >= 1e4 else '<'} 10,000x)"})
            if t in LOWER_IS_BETTER:
                targets.append({"task": t, "partition": part, "target": "FLITE's perplexity below FedAvg fp32's",
                                "measured": spread, "verdict": verdict(fl["finals"], fa["finals"], a_lower=True)})
                continue
            targets.append({"task": t, "partition": part,
                            "target": "FLITE within 1 pp of FedAvg fp32" if part == "iid" else "FLITE no worse than FedAvg fp32 - 1 pp",
                            "measured": spread, "verdict": verdict(fl["finals"], [x - 0.01 for x in fa["finals"]], a_lower=False)})
            if part != "iid":
                targets.append({"task": t, "partition": part, "target": "FLITE at least FedAvg fp32's accuracy (above it)",
                                "measured": spread, "verdict": verdict(fl["finals"], fa["finals"], a_lower=False)})
    a4, fa = get.get(("pareto", "iid", "FedAvg int4")), get.get(("pareto", "iid", "FedAvg fp32"))
    if a4 and fa:       # the paper: int4 full weights collapse; collapsed = at chance (+ 2 pp) or non-finite
        f = a4["max"]
        bad = not np.isfinite(f) or f <= CHANCE + 0.02
        targets.append({"task": "sentiment", "partition": "iid", "target": "full-weight FedAvg at int4 collapses (one seed)",
                        "measured": f"{f:.4f} (round 0: {a4['initials'][0]:.4f}; fp32: {fa['max']:.4f}; chance {CHANCE})",
                        "verdict": "collapsed (at chance)" if bad else "did not collapse"})
    return {"rows": rows, "targets": targets, "missing": missing}


def fmt(v, metric):
    return f"{v:.2f}" if metric == "perplexity" else f"{v:.4f}"


def render(res: dict) -> str:
    c = res["config"]
    L = [f"# FLITE's claims over {len(c['seeds'])} seeds ({res['meta']['date']})\n",
         f"Command: `{res['meta']['command']}`  ",
         (f"Collected (--from-runs) from the runs that finished; they ran {c['workers']} at a time, 1 torch thread each, "
          "on 2 cores.\n" if c["from_runs"] else
          f"{c['runs']} runs ({c['reused']} reused from an earlier invocation), {c['workers']} side by side, 1 torch thread each; "
          f"wall {res['wall_s'] / 60:.1f} min.\n"),
         "FLITE is lightfed's default (r = 20, int4 latents both ways, the head trained and sent; "
         "benchmarks/results/flite_ablation.md). Accuracy is that of the model the clients receive (after the codec); "
         "bytes are len() of the encoded messages per client per round. Settings per task:\n"]
    for t in c["tasks"]:
        L.append(f"- {t}: `{json.dumps(c['settings'][t])}`, partitions {', '.join(PARTITIONS[t])}")
    L += ["", "## Targets", "", "| task | partition | target | measured | verdict |", "|---|---|---|---|---|"]
    L += [f"| {x['task']} | {x['partition']} | {x['target']} | {x['measured']} | **{x['verdict']}** |" for x in res["targets"]]
    L += ["", "## Every run group", "",
          "| task | partition | method | metric (mean ± std over seeds) | min / max | round 0 | up B/client/round | down B/client/round | x fewer up than FedAvg | trainable | client peak RSS |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        m = r["metric"]
        x = f"{r['x_fewer_up_than_fedavg']:,.0f}x" if r.get("x_fewer_up_than_fedavg") else "-"
        L.append(f"| {r['task']} | {r['partition']} | {r['method']} | {m} {fmt(r['mean'], m)} ± {fmt(r['std'], m)} (n = {len(r['finals'])}) | "
                 f"{fmt(r['min'], m)} / {fmt(r['max'], m)} | {fmt(np.mean(r['initials']), m)} | {max(r['up_bytes']):,.0f} ({human_bytes(max(r['up_bytes']))}) | "
                 f"{max(r['down_bytes']):,.0f} | {x} | {r['trainable']:,} | {human_bytes(r['client_rss_peak'])} |")
    fl = [r for r in res["rows"] if r["method"] == "FLITE" and r["latent"]]
    if fl:
        L += ["", "FLITE's map per task (from each run's method_info; the one-time cost is what a client must hold "
              "before round 1: the pretrained weights, and the 8-byte factor seed):", "",
              "| task | latents | live | factor memory (cached) | head | pretrained bytes every party holds | factor seed |", "|---|---|---|---|---|---|---|"]
        for r in fl:
            if r["partition"] == "iid" or r["task"] == "pareto":
                ot = r["one_time"] or {}
                L.append(f"| {r['task']} | {r['latent']:,} | {r['live']:,} | {human_bytes(r['factor_bytes'])} | {r['head']} | "
                         f"{human_bytes(ot.get('pretrained_bytes_held_by_every_party', 0))} | {ot.get('factor_seed_bytes')} B |")
    if res["missing"]:
        L += ["", "Not run or failed:", ""] + [f"- {x['label']}: {x['error'][:160]}" for x in res["missing"]]
    L += ["", f"The `pareto` rows (if any) are one seed, sentiment IID, {BASELINE_ROUNDS} rounds: the other payload methods "
          "beside FLITE and FedAvg run the same way.", "", f"![accuracy vs bytes]({res['name']}.png)", "",
          f"![curves]({res['name']}_curves.png)", ""]
    return "\n".join(L)


def plots(res: dict, name: str) -> None:
    plt = common.pyplot()
    panels = list(dict.fromkeys(r["task"] for r in res["rows"]))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.5), squeeze=False)
    for ax, t in zip(axes[0], panels):
        for r in (r for r in res["rows"] if r["task"] == t):
            x = max(r["up_bytes"])
            ax.errorbar(x, r["mean"], yerr=[[r["mean"] - r["min"]], [r["max"] - r["mean"]]],
                        fmt="o" if r["partition"] == "iid" else "^", capsize=3)
            ax.annotate(f"{r['method']} ({r['partition']})", (x, r["mean"]), fontsize=7, xytext=(4, 3), textcoords="offset points")
        ax.set_xscale("log")
        ax.set_xlabel("upload bytes per client per round (log)")
        ax.set_ylabel(res["rows"][[r["task"] for r in res["rows"]].index(t)]["metric"] + " (mean, bars: min..max)")
        ax.set_title(t)
        ax.grid(alpha=0.3, which="both")
    common.save(fig, RESULTS / f"{name}.png")
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.5), squeeze=False)
    for ax, t in zip(axes[0], panels):
        for r in (r for r in res["rows"] if r["task"] == t):
            n = min(len(c) for c in r["curves"])
            y = np.array([c[:n] for c in r["curves"]])
            ls = "-" if r["partition"] == "iid" else "--"
            line, = ax.plot(range(n), y.mean(0), ls=ls, label=f"{r['method']} ({r['partition']})")
            ax.fill_between(range(n), y.min(0), y.max(0), color=line.get_color(), alpha=0.15)
        ax.set_xlabel("round")
        ax.set_ylabel(next(r["metric"] for r in res["rows"] if r["task"] == t) + " (mean; band: min..max over seeds)")
        ax.set_title(t)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    common.save(fig, RESULTS / f"{name}_curves.png")


def asked(grid: list[tuple[str, dict]], tasks: list[str], baselines: bool) -> set[str]:
    """The runs a command may make: its tasks' (and, with --baselines, the Pareto's); the file reports every task."""
    return {label for label, _ in grid if label.split(" | ")[0] in tasks or (baselines and label.startswith("pareto"))}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", default="sentiment,fmnist,austen")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--baselines", action="store_true", help="+ the other payload methods, one seed, sentiment IID")
    ap.add_argument("--quick", action="store_true")
    common.add_args(ap)
    a = ap.parse_args(argv)
    common.configure(a)
    tasks, seeds = a.tasks.split(","), [int(s) for s in a.seeds.split(",")]
    for t in tasks:
        if t not in TASKS:
            raise SystemExit(f"unknown task {t!r}: use {', '.join(TASKS)}")
    name = "flite_claims" + ("_quick" if a.quick else "")
    grid = grid_for(list(TASKS), seeds, a.quick, True)
    t0 = time.time()
    if "fmnist" in tasks and not a.from_runs:   # our fmnist base, built once before the workers
        from lightfed.tasks import fmnist
        fmnist.pretrained_base("small", fmnist.ARCHS["small"][3])
    reused = sum(finished(label, c) is not None for label, c in common.placed(grid))   # as they will run (--device)
    summaries = reuse_or_run(grid, a.workers, a.from_runs, only=asked(grid, tasks, a.baselines))
    settings = {t: {**TASKS[t], **(QUICK[t] if a.quick else {})} for t in TASKS}
    res = {"meta": meta("python benchmarks/flite_claims.py " + " ".join(sys.argv[1:] if argv is None else argv)),
           "name": name, "config": {"tasks": list(TASKS), "ran": tasks, "seeds": seeds, "settings": settings, "workers": a.workers,
                                    "runs": len(grid), "reused": reused, "from_runs": a.from_runs,
                                    "methods": METHODS, "baselines": BASELINES},
           "wall_s": time.time() - t0, **summarize(grid, summaries)}
    md = render(res)
    if res["rows"]:
        plots(res, name)
    print(write(name, res, md))
    print(md)


if __name__ == "__main__":
    main()
