"""FLITE's generator, against the plain model: memory of the factors and cost per forward (and per
training step), for the two modes of models/latent.py: `cache` (factors held in memory) and `regen`
(factors drawn again from the seed in every forward: no factor memory, more compute).

Side by side in one process, one torch thread, repetitions interleaved (plain, cache, regen, plain,
...) so that machine noise hits every variant alike; medians and ratios to the plain model.

    .venv/bin/python benchmarks/flite_generator.py              # sentiment (MiniLM) + austen (SmolLM2)
    .venv/bin/python benchmarks/flite_generator.py --reps 3 --tasks sentiment
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import common  # noqa: E402
from common import meta, write  # noqa: E402

from lightfed import config as C  # noqa: E402
from lightfed import methods, tasks  # noqa: E402
from lightfed.data.tensors import subset  # noqa: E402
from lightfed.models import latent  # noqa: E402
from lightfed.measure import count_flops, tensor_bytes  # noqa: E402
from lightfed.report import human_bytes, markdown  # noqa: E402

SETTINGS = {  # the batch each forward sees: flite_claims' batch size and length
    "sentiment": ({"train_size": 64, "test_size": 16, "max_len": 32}, 16),
    "austen": ({"train_blocks": 12, "test_blocks": 6, "block_len": 64}, 4),
}


def variants(name: str, opts: dict):
    task = tasks.build(name, opts, 0)
    out = {"plain": task.model}
    for mode in ("cache", "regen"):
        cfg = C.from_dict({"task": name, "method": "flite", "method_options": {"mode": mode}, "task_options": opts})
        out[f"FLITE {mode}"] = methods.build(cfg).prepare(copy.deepcopy(task.model))
    return task, out


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", default="sentiment,austen")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--render", action="store_true", help="run nothing: the markdown again from the results JSON")
    a = ap.parse_args(argv)
    if common.rerender(a, "flite_generator", render):
        return
    torch.set_num_threads(1)
    rows, data = [], {}
    for name in a.tasks.split(","):
        opts, bs = SETTINGS[name]
        task, models = variants(name, opts)
        batch = subset(task.train, range(bs))
        weights = tensor_bytes(list(task.model.parameters()), list(task.model.buffers()))
        res = {}
        for label, m in models.items():
            m.eval()
            with torch.no_grad():
                _, flops = count_flops(lambda: task.loss(m, batch))
            res[label] = {"fwd_s": [], "step_s": [], "fwd_flops": flops,
                          "factor_bytes": latent.factor_bytes(m) if label != "plain" else 0}
        for _ in range(a.reps):                      # interleaved: noise falls on every variant alike
            for label, m in models.items():
                m.train()
                with torch.no_grad():
                    res[label]["fwd_s"].append(timed(lambda: task.loss(m, batch)))
                res[label]["step_s"].append(timed(lambda: task.loss(m, batch).backward()))
                m.zero_grad(set_to_none=True)
        base = res["plain"]
        for label, r in res.items():
            fwd, step = statistics.median(r["fwd_s"]), statistics.median(r["step_s"])
            rows.append({"task": name, "model": label, "factor memory": human_bytes(r["factor_bytes"]),
                         "factors / weights": f"{r['factor_bytes'] / weights:.3f}",
                         "forward ms": f"{fwd * 1e3:.0f}",
                         "forward vs plain": f"{fwd / statistics.median(base['fwd_s']):.2f}x",
                         "fwd+bwd ms": f"{step * 1e3:.0f}",
                         "fwd+bwd vs plain": f"{step / statistics.median(base['step_s']):.2f}x",
                         "forward GFLOPs": f"{r['fwd_flops'] / 1e9:.2f}",
                         "FLOPs vs plain": f"{r['fwd_flops'] / base['fwd_flops']:.3f}x"})
        data[name] = {"batch": bs, "task_options": opts, "weights_bytes": weights, "latent": latent.info(models["FLITE cache"]),
                      "results": res}
    cmd = f"python benchmarks/flite_generator.py --tasks {a.tasks} --reps {a.reps}"
    write("flite_generator", res := {"meta": meta(cmd), "tasks": data, "rows": rows}, render(res))
    print(render(res))


def render(res: dict) -> str:
    reps = len(next(iter(next(iter(res["tasks"].values()))["results"].values()))["fwd_s"])
    md = ["# FLITE's generator vs the plain model", "", f"Command: `{res['meta']['command']}`  ",
          f"One process, 1 torch thread, {reps} interleaved repetitions, medians; batch: sentiment 16 x 32 tokens "
          "(MiniLM-L6), austen 4 x 64 tokens (SmolLM2-135M); rank 6, matrix form, every Linear/Conv layer. "
          "`factor memory`: the A_l, B_l factors held (cache) or 0 (regen: drawn from the seed in each forward). "
          "FLOPs: FlopCounterMode per forward (the generator's A Z B^T products included; the draws are not FLOPs). "
          "fwd+bwd: the plain model's backward computes every weight's gradient (full fine-tuning); FLITE's only "
          "z's, through the generator, so a FLITE training step costs less than a full fine-tuning step.", "",
          markdown(res["rows"], list(res["rows"][0])), ""]
    return "\n".join(md) + "\n"


if __name__ == "__main__":
    main()
