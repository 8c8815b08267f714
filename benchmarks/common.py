"""Shared by the benchmark scripts: run a grid of configs (in parallel worker processes, one torch
thread each, so that runs side by side see the same machine), and write results/<name>.{json,md}."""
from __future__ import annotations

import json
import multiprocessing as mp
import platform
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def _run_one(args):
    label, cfg_dict = args
    import torch
    torch.set_num_threads(1)
    from lightfed import config as C
    from lightfed.engine import local

    cfg = C.from_dict(cfg_dict)
    t = time.time()
    print(f"[bench] start {label}", file=sys.stderr, flush=True)
    try:
        s = local.run(cfg, log=lambda *a: None)
    except Exception as e:  # a failed run is reported, not hidden
        print(f"[bench] FAILED {label}: {e!r}", file=sys.stderr, flush=True)
        return {"label": label, "error": repr(e), "config": cfg_dict}
    s["label"] = label
    print(f"[bench] done {label}: {s['metric']} {s['initial']:.4f} -> {s['final']:.4f} in {time.time() - t:.0f} s",
          file=sys.stderr, flush=True)
    return s


def run_grid(grid: list[tuple[str, dict]], workers: int = 2) -> list[dict]:
    """grid: [(label, config dict)] -> summaries in the same order."""
    for label, c in grid:      # every config is validated before any run starts
        from lightfed import config as C
        from lightfed.engine import local
        local.check(C.from_dict(c))
    if workers <= 1:
        return [_run_one(g) for g in grid]
    with mp.get_context("spawn").Pool(workers) as pool:
        return pool.map(_run_one, grid, chunksize=1)


def meta(command: str, **extra) -> dict:
    import torch
    return {"command": command, "date": time.strftime("%Y-%m-%d %H:%M"), "torch": torch.__version__,
            "machine": platform.machine(), "python": platform.python_version(), **extra}


def write(name: str, data: dict, md: str) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(data, indent=1))
    (RESULTS / f"{name}.md").write_text(md)
    return RESULTS / f"{name}.md"


def verdict(a: list[float], b: list[float], a_lower: bool) -> str:
    """Is a below b (a_lower) or above it? "met" only with >= 3 seeds each whose ranges separate the
    claimed way; "missed" where they separate the other way; else "inconclusive"."""
    if len(a) < 3 or len(b) < 3:
        return f"inconclusive (seeds: {len(a)} vs {len(b)}; a claim needs 3 each)"
    lo_a, hi_a, lo_b, hi_b = min(a), max(a), min(b), max(b)
    if (hi_a < lo_b) if a_lower else (lo_a > hi_b):
        return "met"
    if (lo_a > hi_b) if a_lower else (hi_a < lo_b):
        return "missed"
    return "inconclusive (the seeds' ranges overlap)"
