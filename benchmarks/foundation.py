"""Foundation baselines on `sentiment` (real MiniLM-L6, real tweets): FedAvg vs FedProx vs FedAvg+LoRA,
10 clients, IID and Dirichlet(0.1), side by side in one process.

Reports, per run: final accuracy, bytes per client per round (both directions, from the encoded
messages), peak client memory (measured RSS high-water mark and the tensor accounting), client
FLOPs, and the engine's overhead as a share of client compute (target: < 5%).

    .venv/bin/python benchmarks/foundation.py            # writes benchmarks/results/foundation.{json,md,png}
    .venv/bin/python benchmarks/foundation.py --quick    # a smoke run of the same grid (tiny sizes)
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import common  # noqa: E402


from lightfed.report import human_bytes, markdown  # noqa: E402

HERE = Path(__file__).parent
# lr per method: full-weight fine-tuning wants a small AdamW lr; LoRA's adapters a 10x larger one (as usual).
METHODS = {"fedavg": {"lr": 5e-5}, "fedprox": {"lr": 5e-5, "method_options": {"mu": 0.01}}, "lora": {"lr": 5e-4}}
PARTITIONS = ["iid", "dirichlet:0.1"]


def render(res: dict) -> str:
    """The markdown of a results JSON (the committed one renders to the committed file)."""
    meta, runs = res["meta"], res["runs"]
    rows = []
    for s in runs:
        t, mem = s["time"], s["memory"]
        rows.append({"partition": s["config"]["partition"], "method": s["method"],
                     "accuracy (round 0 -> final)": common.marked(f"{s['initial']:.3f} -> {s['final']:.3f}", s["provenance"]),
                     "trainable": f"{s['trainable_params']:,}",
                     "up B/client/round": f"{s['bytes']['up_per_client_round']:,.0f}",
                     "down B/client/round": f"{s['bytes']['down_per_client_round']:,.0f}",
                     "peak RSS (rise)": f"{human_bytes(mem['client_rss_peak_bytes'])} ({human_bytes(mem['client_rss_rise_bytes'])})",
                     "accounted memory": human_bytes(mem["client_accounted_bytes"]),
                     "client GFLOPs/round": f"{s['flops']['per_client_round'] / 1e9:.1f}",
                     "client s": f"{t['client_compute']:.1f}", "server s": f"{t['server_compute']:.1f}",
                     "engine s": f"{t['engine_overhead']:.2f}",
                     "engine / client": f"{100 * t['engine_overhead_share']:.2f}%"})
    worst = max((s["time"]["engine_overhead_share"] for s in runs), default=None)
    md = [f"# Foundation baselines on sentiment ({meta['date']})", "",
          f"Command: `{meta['command']}` (code {meta['code']}, commit {meta['commit']})  ", f"Config: {json.dumps(meta['config'])}  ", f"Per-method settings: {json.dumps(meta['methods'])}  ",
          f"torch {meta['torch']}, {meta['runs_side_by_side']} runs side by side with 1 torch thread each, {meta['machine']}; wall {meta['wall_seconds'] / 60:.1f} min", "",
          markdown(rows, list(rows[0])) if rows else "", "",
          *[f"FAILED: {r['label']}: {r['error']}" for r in res.get("failed", [])],
          *([f"† made by other code than this file's ({meta['code']}): "
             + "; ".join(f"{s['method']} / {s['config']['partition']}: code {p['code']}, commit {p['commit']}, {p['date']}"
                         for s in runs for p in s["provenance"] if not p["at_hand"]), ""]
            if any(not p["at_hand"] for s in runs for p in s["provenance"]) else []),
          "Every run from the run store (runs/store/<task>-<method>-<config hash>), reused while the lightfed code it "
          "ran is unchanged; each run's provenance (code, commit, date, command) is in the JSON.",
          f"Engine overhead (what the simulator adds: client sampling, data slicing, measurement, progress, "
          f"checkpoints, results) is at most {100 * worst:.2f}% of client compute "
          f"(target < 5%: {'met' if worst < 0.05 else 'MISSED'})." if worst is not None else "No run finished.",
          "Server compute (encoding the broadcast, decoding + validating every upload, aggregating) is protocol "
          "work a real server does too, so it is reported on its own, not as engine overhead. "
          "Bytes are len() of the encoded messages; the upload includes the 4-byte `_n` sample count. "
          "Peak RSS is the process high-water mark during one local update (the model and data of the simulator "
          "included); 'rise' is its increase over the RSS before the update. Accounted memory = parameters + "
          "gradients + optimizer state + activations saved for backward, counted from the tensors. FLOPs: torch "
          "FlopCounterMode (matmul/conv/attention, forward+backward)."]
    return "\n".join(md) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(HERE / "results"))
    common.add_args(ap)
    a = ap.parse_args(argv)
    common.configure(a)
    name = "foundation_quick" if a.quick else "foundation"
    if common.rerender(a, name, render, folder=Path(a.out)):
        return
    base = {"task": "sentiment", "clients": 10, "rounds": a.rounds, "fraction": 0.5, "batch_size": 16,
            "local_epochs": 1.0, "seed": 0, "progress": False,
            "task_options": {"train_size": 1000, "test_size": 500, "max_len": 32}}
    if a.quick:
        base.update(rounds=1, task_options={"train_size": 200, "test_size": 100, "max_len": 16})
    t0 = time.time()
    grid = [(f"{m} / {part}", {**base, "method": m, "partition": part, **extra})        # runs in the run store
            for part in PARTITIONS for m, extra in METHODS.items()]
    runs = common.reuse_or_run(grid, a.workers, a.from_runs)
    failed = [r for r in runs if "error" in r]
    runs = [{**{k: v for k, v in r.items() if k != "bench"}, "provenance": [common.provenance(r)]}
            for r in runs if "error" not in r]
    cmd = "python benchmarks/foundation.py" + (" --quick" if a.quick else "")
    meta = {"command": cmd, "config": base, "methods": METHODS, "partitions": PARTITIONS,
            "torch": torch.__version__, "threads_per_run": 1, "runs_side_by_side": a.workers,
            "machine": platform.machine(), "code": common.code(), "commit": common.commit(),
            "wall_seconds": time.time() - t0, "date": time.strftime("%Y-%m-%d %H:%M")}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = {"meta": meta, "runs": runs, "failed": [{k: r[k] for k in ("label", "error")} for r in failed]}
    (out / f"{name}.json").write_text(json.dumps(res, indent=1))
    (out / f"{name}.md").write_text(render(res))
    from lightfed.report import plot_history
    for s in runs:
        s["label"] = f"{s['method']} ({s['config']['partition']})"
    plot_history(runs, out / f"{name}.png", "sentiment, 10 clients: accuracy per round")
    print(render(res))


if __name__ == "__main__":
    main()
