"""The benchmark layer every claims script uses: a grid of run configs, run (in worker processes, one torch thread
each, so that runs side by side see the same machine) or reused, statistics and verdicts, and the results files.

    grid = [(label, config dict), ...]                 a script's own definition of what it measures
    summaries = reuse_or_run(grid, workers, from_runs)  a finished run is reused only if its config is the same AND
                                                        the code it executed is unchanged (bench.json "code_used":
                                                        lightfed.provenance's fingerprint of every function the run
                                                        ran; runs recorded without one: summary "code", the hash of
                                                        all of src/lightfed)
    a config without "out" lives in the run store: runs/store/<task>-<method>-<hash of the config>, so that a row
    whose settings change gets a new folder and the old run stays what it was; its record (records/<folder>.json,
    committed: the summary and bench.json) stands in for the folder on a machine that lacks it
    derived(c, name, fn, *modules, key=)                a value computed from a store run's checkpoint, kept in its
                                                        record beside the source of fn and the modules it scores with
    provenance(summary) / marked(text, prov)           who made a figure (code, commit, date, command) and whether
                                                        it is the code at hand; a figure that is not gets a dagger
    ms(xs) / verdict(a, b, a_lower) / wilson(k, n)      statistics; "met" only over >= 3 seeds that separate
    write(name, data, md)                               results/<name>.{json,md} (+ the script's own plot)
"""
from __future__ import annotations

import json
import math
import multiprocessing as mp
import platform
import shutil
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
STORE = Path("runs/store")
RECORDED = STORE                              # the store whose runs are recorded in RECORDS
RECORDS = Path(__file__).parent / "records"   # committed: each finished store run's summary, who made it, and what was
                                              # derived from its checkpoint (the store's folders do not outlive a machine)
PLACE: dict = {}             # set by --device / --dtype: where every run of the grid computes (recorded in its config)


def mark_start(cfg_dict: dict) -> None:
    """Record the config and code a run begins with (<out>/bench_start.json)."""
    out = Path(cfg_dict["out"])
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out / "ckpt", ignore_errors=True)     # another run's: resumable() would take it for this one's
    (out / "bench_start.json").write_text(json.dumps({"config": cfg_dict, "code": code()}))


def resumable(cfg_dict: dict) -> bool:
    """An interrupted run resumes from its checkpoint only if it began with this config and this code."""
    out = Path(cfg_dict["out"])
    started = out / "bench_start.json"
    return (started.is_file() and (out / "ckpt" / "latest.json").is_file() and not (out / "summary.json").exists()
            and json.loads(started.read_text()) == {"config": cfg_dict, "code": code()})


def _run_one(args):
    label, cfg_dict = args
    import torch
    torch.set_num_threads(1)
    from lightfed import config as C, provenance
    from lightfed.engine import local
    from lightfed.engine.lock import hold

    cfg = C.from_dict(cfg_dict)
    t = time.time()
    out = Path(cfg_dict["out"])
    used = None                      # a resumed run: its first rounds ran untraced (the whole-source hash decides)
    try:
        with hold(out):              # a process still running in the folder (a killed benchmark's worker) refuses this one
            resume = resumable(cfg_dict)
            print(f"[bench] {'resume' if resume else 'start'} {label}", file=sys.stderr, flush=True)
            if resume:
                s = local.run(resume=out, log=lambda *a: None)
            else:
                mark_start(cfg_dict)
                with provenance.Trace() as tr:
                    s = local.run(cfg, log=lambda *a: None)
                used = tr.fingerprint()
            s["bench"] = record(cfg_dict, used)
    except Exception as e:  # a failed run is reported, not hidden
        print(f"[bench] FAILED {label}: {e!r}", file=sys.stderr, flush=True)
        return {"label": label, "error": repr(e), "config": cfg_dict}
    s["label"] = label
    print(f"[bench] done {label}: {s['metric']} {'-' if s['initial'] is None else format(s['initial'], '.4f')} -> {s['final']:.4f} in {time.time() - t:.0f} s",
          file=sys.stderr, flush=True)
    return s


def record(cfg_dict: dict, used: dict | None) -> dict:
    """<out>/bench.json of a finished run: the config the benchmark asked for, and who made it (the functions it ran:
    lightfed.provenance's fingerprint; its commit, command and date)."""
    bench = {"config": cfg_dict, "code_used": used, "commit": commit(), "command": " ".join(sys.argv),
             "date": time.strftime("%Y-%m-%d %H:%M")}
    (Path(cfg_dict["out"]) / "bench.json").write_text(json.dumps(bench))
    return bench


def run_grid(grid: list[tuple[str, dict]], workers: int = 2, runner=None, fresh_process: bool = False) -> list[dict]:
    """grid: [(label, config dict)] -> summaries in the same order (every config validated before any run starts).
    runner: a module-level function (label, config) -> summary that writes bench.json (default: a plain run);
    fresh_process: one process per run (a runner that patches classes)."""
    from lightfed import config as C
    from lightfed.cli import warn_slow_bf16
    from lightfed.engine import local
    runner = runner or _run_one
    if runner is _run_one:
        cfgs = [C.from_dict(c) for _, c in grid]
        for c in cfgs:
            local.check(c)
        warn_slow_bf16(cfgs)                  # runs in bf16 on a CPU without native bf16 matmuls
    if workers <= 1 and not fresh_process:
        return [runner(g) for g in grid]
    with mp.get_context("spawn").Pool(workers, maxtasksperchild=1 if fresh_process else None) as pool:
        return pool.map(runner, grid, chunksize=1)


def code() -> str:
    from lightfed.engine.files import source_hash
    return source_hash()


def commit() -> str:
    """The git commit of the checkout (+ "+dirty" where the code, src/ or the benchmarks' scripts, differs from it;
    results being written do not count), or "" outside git."""
    import subprocess
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "src", "benchmarks/*.py"], capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""
    return head[:12] + ("+dirty" if dirty else "")


def store_folder(c: dict) -> str:
    """A run's folder in the store, named by its whole config (what a result depends on, "progress" aside)."""
    import hashlib
    key = json.dumps({k: v for k, v in c.items() if k not in ("out", "progress")}, sort_keys=True)
    return str(STORE / f"{c['task']}-{c['method']}-{hashlib.sha256(key.encode()).hexdigest()[:12]}")


def _bench(out: Path) -> dict | None:
    """<out>/bench.json as {"config", "code_used", ...}; the bare config dict older runs wrote is read as such."""
    p = out / "bench.json"
    if not p.exists():
        return None
    b = json.loads(p.read_text())
    return b if "config" in b and "code_used" in b else {"config": b, "code_used": None}


def at_hand(s: dict) -> bool:
    """Was this finished run made by the code at hand? By the functions it ran where they were recorded, else by the
    hash of all of src/lightfed."""
    from lightfed import provenance
    used = (s.get("bench") or {}).get("code_used")
    return provenance.changed(used) == [] if used else s.get("code") == code()


def provenance(s: dict) -> dict:
    """One seed's provenance record: the code that made it, its commit, date and command, and whether it is the code
    at hand (results JSON rows keep a list of these, one per seed)."""
    b = s.get("bench") or {}
    return {"code": s.get("code"), "commit": b.get("commit", ""), "date": b.get("date", ""),
            "command": b.get("command", ""), "at_hand": at_hand(s)}


def add_seed(r: dict, c: dict, s: dict) -> bool:
    """One run (config c, summary s) into its results row: its seed's final and initial metric, seed and provenance, or
    its error. -> whether it finished."""
    if "error" in s:
        r.setdefault("errors", []).append(s["error"])
        return False
    for k, v in (("finals", s["final"]), ("initials", s["initial"]), ("seeds", c["seed"]), ("provenance", provenance(s))):
        r.setdefault(k, []).append(v)
    return True


DAGGER = ("A figure marked † was made by other code than the command's, scored by another evaluator, or kept without a "
          "record of the code that made it (the JSON's provenance says which).")


def marked(text: str, provs: list[dict] | None) -> str:
    """A table cell: the figure as it is where every seed behind it was made by the code at hand, else with a dagger
    (the results file says which code made it); a figure with no provenance at all (kept before it was recorded) is
    not known to be the code at hand's, so it is marked too."""
    return text if provs and all(p["at_hand"] for p in provs) else f"{text}†"


def source_of(*objs) -> str:
    """12 hex digits of sha256 over the source of these modules and functions: the code that can change an evaluation,
    so that a cache keyed on it is redone when its scorer changes (and kept when anything else does)."""
    import hashlib
    import inspect
    h = hashlib.sha256()
    for o in objs:
        h.update(inspect.getsource(o).encode() + b"\0")
    return h.hexdigest()[:12]


def finished(label: str, c: dict, stale: bool = False) -> dict | None:
    """The summary of a run already made with config c (in c["out"], or its record when that folder is gone) by the
    code at hand (stale: or by other code; its provenance says which), or None."""
    p, b, rec = Path(c["out"]) / "summary.json", _bench(Path(c["out"])), record_path(c)
    if p.exists() and b is not None:
        s = json.loads(p.read_text())
    elif rec and rec.exists():
        s = json.loads(rec.read_text())
        b = s["bench"]
    else:
        return None
    if b["config"] != c or not (stale or at_hand({**s, "bench": b})):     # another config asked, or made by other code
        return None
    return {**s, "bench": b, "label": label}


def record_path(c: dict) -> Path | None:
    """The record of a run in the benchmarks' own store (None elsewhere: a named "out", reproduce's or a test's store;
    and for a tiny twin's run, a --quick grid's, which measures nothing worth keeping)."""
    if (c.get("task_options") or {}).get("tiny"):
        return None
    return RECORDS / f"{Path(c['out']).name}.json" if Path(c["out"]).parent == STORE == RECORDED else None


def keep(s: dict) -> None:
    """Write the record of a finished store run: its summary with bench.json and its rounds (metrics.jsonl), the values
    derived from it so far kept."""
    out = s["bench"]["config"]["out"]
    p = record_path(s["bench"]["config"])
    old = json.loads(p.read_text()) if p.exists() else {}
    new = {k: v for k, v in s.items() if k not in ("label", "derived", "rounds")}
    whole = (Path(out) / "summary.json").exists() and _bench(Path(out)) == s["bench"]   # the folder holds this run,
    new["rounds"] = records(out) if whole else old.get("rounds")     # not a restart of it that has not finished
    if {k: v for k, v in old.items() if k != "derived"} != new:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps({**new, "derived": old.get("derived", {}) if old.get("bench") == new["bench"] else {}},
                                indent=0, sort_keys=True))


def derived(c: dict, name: str, fn, *code, key=None):
    """fn(c): a value computed from a finished store run's checkpoint, kept in the run's record beside the source of fn
    and of `code` (the modules it scores with) and `key` (what else it depends on: an evaluation's size), so that a
    checkout without the run's folder still has it. Redone when they change; None where they did and the checkpoint
    is gone, or where the run never finished (a None value is not kept)."""
    p, code = record_path(c), source_of(fn, *code)
    rec = json.loads(p.read_text()) if p and p.exists() else None
    d = (rec or {}).get("derived", {}).get(name)
    if d is not None and d["code"] == code and d.get("key") == key:
        return d["value"]
    if not (Path(c["out"]) / "ckpt" / "latest.json").exists():
        return None
    v = fn(c)
    if rec is not None and v is not None:
        rec.setdefault("derived", {})[name] = {"code": code, "key": key, "value": v}
        p.write_text(json.dumps(rec, indent=0, sort_keys=True))
    return v


def placed(grid: list[tuple[str, dict]]) -> list[tuple[str, dict]]:
    """The grid as it runs: --device / --dtype applied, each config in its store folder unless it names an "out"."""
    grid = [(label, {**c, **PLACE}) for label, c in grid]
    return [(label, c if "out" in c else {**c, "out": store_folder(c)}) for label, c in grid]


def reuse_or_run(grid: list[tuple[str, dict]], workers: int, from_runs: bool = False, runner=None,
                 fresh_process: bool = False, only=None, redo=()) -> list[dict]:
    """Runs that finished with the same config and code are reused; from_runs: nothing runs, a run made by other code
    is reported as it is (its provenance marks its figures), the rest are listed as not run; only (a set of labels):
    only those may run, the others are reported as from_runs reports them; redo (labels): made again whatever is kept
    of them.
    runner / fresh_process: as run_grid's."""
    grid = placed(grid)
    done = {label: None if label in redo else finished(label, c) for label, c in grid}
    for label, c in grid:       # a row this command may not run: as the store holds it, whatever code made it (marked)
        if done[label] is None and only is not None and label not in only:
            done[label] = finished(label, c, stale=True) or {"label": label, "error": "not run: not asked for by this command, and not in the store"}
    todo = [(label, c) for label, c in grid if done[label] is None]
    if from_runs:
        ran = {label: finished(label, c, stale=True) or {"label": label, "error": "not run: the grid was stopped before it"}
               for label, c in todo}
    else:
        ran = dict(zip([label for label, _ in todo], run_grid(todo, workers, runner, fresh_process))) if todo else {}
    out = [done[label] or ran[label] for label, _ in grid]
    unmade([(label, c) for (label, c), s in zip(grid, out) if "error" in s and s["error"].startswith("not run")])
    for (_, c), s in zip(grid, out):
        if "error" not in s and "bench" in s and record_path(c):
            keep(s)
    return out


ALLOW_MISSING = False       # --allow-missing: a report may list runs that are nowhere as not run


def unmade(missing: list[tuple[str, dict]]) -> None:
    """Stop a report before it writes anything when runs it would list as "not run" are in neither the store nor the
    records: on a machine without the store that made a results file, its report command would otherwise overwrite the
    committed figures with blanks. --allow-missing (ALLOW_MISSING) reports them as not run."""
    if missing and not ALLOW_MISSING:
        label, c = missing[0]
        raise SystemExit(f"benchmarks: {len(missing)} run(s) of this report are in neither {STORE} nor {RECORDS.name}/ "
                         f"(e.g. {label!r}: {c['out']}); reporting them as not run would overwrite what the committed "
                         "results say of them. Make them (the command without --from-runs / --rows), or pass "
                         "--allow-missing to report them as not run.")


def with_starts(starts: list[tuple[str, dict]], grid: list[tuple[str, dict]]) -> list[tuple[str, dict]]:
    """The grid as chained runs it: each config's "init" (a label of `starts`) replaced by that start's store folder,
    every run placed."""
    folder = {label: c["out"] for label, c in placed(starts)}
    return placed([(label, {**c, "init": folder[c["init"]]} if c.get("init") else c) for label, c in grid])


def chained(starts: list[tuple[str, dict]], grid: list[tuple[str, dict]], workers: int, from_runs: bool = False,
            only=None, **run) -> tuple[list[dict], list[dict]]:
    """Store runs that start from another store run's checkpoint (a probe's head): a config of `grid` whose "init" is
    a label of `starts` starts from that run's folder. A start whose folder is gone (only its record is left) is made
    again where a run of the grid that may run has not finished. run: reuse_or_run's runner / fresh_process for the
    grid. -> (the starts' summaries, the grid's)."""
    starts, grid = placed(starts), with_starts(starts, grid)
    wanted = {c["init"] for label, c in grid if c.get("init") and (only is None or label in only)
              and finished(label, c) is None}
    redo = () if from_runs else {label for label, c in starts if c["out"] in wanted
                                 and not (Path(c["out"]) / "ckpt" / "latest.json").exists()}
    return reuse_or_run(starts, workers, from_runs, redo=redo), reuse_or_run(grid, workers, from_runs, only=only, **run)


def add_args(ap) -> None:
    """The flags every claims script takes."""
    ap.add_argument("--workers", type=int, default=2, help="runs side by side (one torch thread each)")
    ap.add_argument("--from-runs", action="store_true", help="run nothing: report the finished runs, list the others")
    ap.add_argument("--allow-missing", action="store_true", help="report runs that are in neither the store nor the "
                    "records as not run (without it such a report stops before it writes anything)")
    ap.add_argument("--device", default="", help="where every run computes: auto | cpu | cuda | cuda:N (default: each "
                    "config's own, the CPU unless it says)")
    ap.add_argument("--dtype", default="", help="fp32 | bf16 for every run (default: each config's own)")
    ap.add_argument("--render", action="store_true", help="run nothing: write the markdown (and plots) again from the "
                    "results JSON")


def configure(a) -> None:
    global ALLOW_MISSING
    ALLOW_MISSING = getattr(a, "allow_missing", False)
    PLACE.clear()
    PLACE.update({k: getattr(a, k) for k in ("device", "dtype") if getattr(a, k, "")})
    if PLACE:
        from lightfed import device
        device.check(PLACE.get("device", "cpu"), PLACE.get("dtype", "fp32"))


def meta(command: str, **extra) -> dict:
    import torch
    return {"command": command, "date": time.strftime("%Y-%m-%d %H:%M"), "torch": torch.__version__,
            "machine": platform.machine(), "python": platform.python_version(), "code": code(),
            **extra}


def write(name: str, data: dict, md: str) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(data, indent=1))
    (RESULTS / f"{name}.md").write_text(md)
    return RESULTS / f"{name}.md"


def rerender(a, name: str, render, plot=None, folder: Path | None = None) -> bool:
    """--render: <name>.md (and the plot) written again from <name>.json by the script's own render(res); False
    without --render."""
    if not getattr(a, "render", False):
        return False
    folder = folder or RESULTS
    res = json.loads((folder / f"{name}.json").read_text())
    (folder / f"{name}.md").write_text(render(res))
    if plot:
        plot(res)
    print(folder / f"{name}.md")
    return True


def why(error: str, n: int = 60) -> str:
    """A table cell for a row with no result: "not run ..." whole, or "failed: " and the error's first n characters."""
    return error if error.startswith("not run") else f"failed: {error[:n]}"


def ms(xs) -> tuple[float, float, int]:
    """(mean, sample sd, n) of the values that are not None."""
    xs = [x for x in xs if x is not None]
    if not xs:
        return (float("nan"), float("nan"), 0)
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return (m, sd, len(xs))


def wilson(k: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson interval of a proportion k / n (one seed's accuracy from its test sample alone)."""
    if n == 0:
        return (float("nan"), float("nan"))
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (c - h, c + h)


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


def pm(xs, nd: int = 3) -> str:
    """A table cell "mean ± sample sd" over the values that are not None, or "-" where there are none."""
    import numpy as np
    xs = [x for x in xs if x is not None]
    return f"{np.mean(xs):.{nd}f} ± {np.std(xs, ddof=1) if len(xs) > 1 else 0:.{nd}f}" if xs else "-"


def records(out) -> list[dict]:
    """A run's <out>/metrics.jsonl, one record a line (round 0 first); where the folder is gone, as its store record
    kept them."""
    p = Path(out) / "metrics.jsonl"
    rec = record_path({"out": str(out)})
    if not p.exists() and rec and rec.exists():
        return json.loads(rec.read_text())["rounds"]
    return [json.loads(x) for x in p.read_text().splitlines()]


def pyplot():
    """matplotlib.pyplot on the Agg backend (the scripts write files, never windows)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save(fig, path, dpi: int = 120) -> None:
    """Lay a figure out, write it and close it."""
    import matplotlib.pyplot as plt
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
