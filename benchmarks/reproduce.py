"""Do the committed results still come out of this code? One cell of each claims script (and the main job), run
afresh and compared with the number committed for it, within the tolerance written beside the cell.

    python benchmarks/reproduce.py              # every cell (~1 h on one core) -> results/reproduce.{json,md}
    python benchmarks/reproduce.py --cells main,foundation
    python benchmarks/reproduce.py --quick      # the same cells on the tasks' tiny twins (a minute or two; CI runs it
                                                # in tests/test_reproduce.py), compared with results/reproduce_quick.json
    python benchmarks/reproduce.py --quick --record   # write that reference (after a change that moves a figure)

A cell reproduces when its final metric is within its tolerance of the committed one and its bytes per client per
round are the committed ones (same config, same seed, one torch thread as the grids run). Every run is made afresh
(--quick: in a temporary store). A difference is reported, never hidden; --quick exits 1 on one.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import common  # noqa: E402
from common import RESULTS, meta, write  # noqa: E402

RUNS = Path("runs/reproduce")


def _json(name):
    return json.loads((RESULTS / f"{name}.json").read_text())


# How far a cell's final metric may lie from the committed one: the same machine gives the same number (runs are
# deterministic on one thread); another CPU's kernels may round differently and flip an example or two of a test set.
TOL = {"main": 0.004, "foundation": 0.004, "flite_claims": 0.004, "flite_ablation": 0.004, "fedspzo_claims": 0.004,
       "robustness": 0.004, "zoflite_claims": 0.004, "flite_vision": 0.004,
       "flite_lm": 0.05}        # perplexity (~45): 0.05 is 0.1%
TOL_QUICK = 0.07            # the tiny twins' test sets are 32 examples: 0.07 is two of them
PERPLEXITY = {"flite_lm"}   # cells whose metric is a perplexity: on a twin, within TOL_QUICK_PPL of it
TOL_QUICK_PPL = 0.002
# What is known of a cell that differs from its committed figure (printed under the table when it does).
EXPLAINED = {
    "flite_claims": "seed 0's committed curve (flite_claims.json) and a run now agree through round 9 and part from round "
                    "10 on by 1-5 of 500 test tweets. The code of d130e75 (2026-12-02) gives the same curve as HEAD "
                    "through round 11 and bitwise the same state after round 2, so the difference is older than that "
                    "code and than this check's first pass (which compared finals only, 0.846 both): the committed run "
                    "(2026-12-01, two runs side by side) has no folder left to say how it ran. Not explained.",
    "flite_vision": "the cell starts from lightfed's fmnist ResNet-18 base, built on first use and cached per machine; "
                    "CPU pretraining is not bit-exact across machines (held out: 0.942, 0.939, 0.942 in three builds), "
                    "and the committed figure was made on the 0.939 build. The same config on a 0.942 build gave "
                    "0.8275 (flite_vision_rank.json, seed 0).",
}


def cell_main():
    from lightfed.cli import MAIN_JOB
    # the README's table (2026-12-01): FLITE 0.4500 -> 0.8000 at 7.66 KB up; FedAvg 0.4400 -> 0.8000 at 90.27 MB up
    want = {"flite": (0.8, 7656), "fedavg": (0.8, 90270225)}
    return [(f"main job: {m}", {**MAIN_JOB, "method": m, "progress": False}, want[m]) for m in want]


def cell_foundation():
    r = _json("foundation")["runs"][0]
    c = {k: v for k, v in r["config"].items() if k not in ("out", "progress")}
    return [(f"foundation: {r['method']} / {c['partition']}", {**c, "progress": False},
             (r["final"], r["bytes"]["up_per_client_round"]))]


def cell_flite_claims():
    import flite_claims
    label, c = flite_claims.grid_for(["sentiment"], [0], False, False)[0]
    row = next(r for r in _json("flite_claims")["rows"] if r["task"] == "sentiment" and r["partition"] == "iid"
               and r["method"] == "FLITE")
    return [(f"flite_claims: {label}", c, (row["finals"][0], row["up_bytes"][0]))]


def cell_flite_ablation():
    import flite_ablation
    _, grid = flite_ablation.configs(10, [0], False, {"FLITE r=6 int4 (the paper's map)"})
    label, c = grid[0]
    run = next(r for r in _json("flite_ablation")["runs"] if r["label"] == label)
    row = next(r for r in _json("flite_ablation")["rows"] if label.startswith(r["label"]))
    return [(f"flite_ablation: {label}", c, (run["final"], row["up_bytes"]))]


def cell_fedspzo():
    import fedspzo_claims
    grid, _ = fedspzo_claims.grid_for(["sentiment"], False, probe=False)
    label, c = next((l, c) for l, c in grid if l.endswith("| FedSPZO"))
    r = next(r for r in _json("fedspzo_claims")["runs"] if r["label"] == label)
    return [(f"fedspzo_claims: {label}", c, (r["final"], r.get("up_bytes")))]


def cell_robustness():
    import robustness
    label, c = next((l, c) for l, c in robustness.runs_grid("dropout", [0]) if "FLITE|no faults" in l)
    rows = _json("robustness")["dropout"]["rows"]
    return [(f"robustness: {label}", c, (rows["FLITE|no faults"]["finals"][0], None))]


def cell_zoflite():
    import zoflite_claims as Z
    S = Z.SETTINGS["probed"]
    probes, grid = Z.configs(S, [0], False, only=["decomfl"])
    res = _json("zoflite_claims")
    row = next(r for r in res["rows"] if r["method"] == "decomfl")
    probe_out = str(RUNS / "zoflite-probe-s0")
    (pl, pc), (gl, gc) = probes[0], grid[0]
    return [(f"zoflite_claims: {pl}", {**pc, "out": probe_out}, (res["probes"][0]["final"], None)),
            (f"zoflite_claims: {gl}", {**gc, "init": probe_out}, (row["finals"][0], row["up_bytes"]))]


def cell_flite_vision():
    import flite_vision as V
    res = _json("flite_vision")
    (label, c), = V.grid([0], False, res["config"]["lrs"], {"fedavg"}, {"iid"})
    r = res["rows"]["fedavg|iid"]
    return [(f"flite_vision: {label}", c, (r["finals"][0], r["up"]))]


def cell_flite_lm():
    import flite_lm
    res = _json("flite_lm")
    label, c = flite_lm.configs(False, res["lrs"], [0])[1]           # FLITE r = 20 int4, seed 0
    r = res["rows"]["flite"]
    return [(f"flite_lm: {label}", c, (dict(zip(r["seeds"], r["finals"]))[0], r["up"]))]


CELLS = {"main": cell_main, "foundation": cell_foundation, "flite_claims": cell_flite_claims,
         "flite_ablation": cell_flite_ablation, "fedspzo_claims": cell_fedspzo, "robustness": cell_robustness,
         "zoflite_claims": cell_zoflite, "flite_vision": cell_flite_vision, "flite_lm": cell_flite_lm}          # (a cell's folder is its place in this list: add new ones at the end)


def fednl_bytes() -> list[dict]:
    """fednl_claims' bytes part is exact (no training): the encoded uplink of one client, rebuilt."""
    import fednl_claims
    got = {r["label"]: r["up_bytes"] for r in fednl_claims.part_bytes({})["rows"]}
    want = {r["label"]: r["up_bytes"] for r in _json("fednl_claims")["bytes"]["rows"]}
    return [{"cell": f"fednl_claims bytes: {k}", "want": (None, want[k]), "got": (None, got.get(k)),
             "same": got.get(k) == want[k]} for k in want]


def tiny(c: dict) -> dict:
    """A cell's config on its task's tiny twin (lightfed.tasks.TINY), two rounds at most."""
    from lightfed.tasks import TINY
    mo = dict(c.get("method_options", {}))
    if "trainable" in mo:                # layers the real backbone has: the twin's (2 layers) last one instead
        mo["trainable"] = "layer.1."
    return {**c, "rounds": min(c.get("rounds", 1), 2), "method_options": mo,
            "task_options": {**c.get("task_options", {}), **TINY[c["task"]]}}


def main(argv=None):
    """The check; the benchmarks' run store and this module's folder as they were after it (a test that runs it leaves
    no other test pointed at a temporary store)."""
    global RUNS
    store, runs = common.STORE, RUNS
    try:
        return _main(argv)
    finally:
        common.STORE, RUNS = store, runs


def render(res: dict, quick: bool = False) -> str:
    rows = res["rows"]
    L = ["# Do the committed results come out of this code?\n", f"Command: `{res['meta']['command']}`; code "
         f"{res['meta']['code']}, commit {res['meta']['commit']}; {res['wall_s'] / 60:.0f} min. One cell of each claims "
         "script (and the main job), run afresh (one torch thread) and compared with the committed number: the final "
         "metric within the tolerance, the bytes exactly.\n",
         "| cell | committed (final, up B) | now | tolerance | the same |", "|---|---|---|---|---|"]
    L += [f"| {r['cell'].replace(' | ', ' / ').replace('|', '/')} | {tuple(r['want'])} | "
          f"{tuple(r['got']) if not r.get('error') else r['error'][:80]} | {r['tolerance']} | {'yes' if r['same'] else '**no**'} |"
          for r in rows]
    differ = sorted({r["cell"].split(":")[0] for r in rows if not r["same"]})
    L += [""] + [f"- {n}: {EXPLAINED.get(n, 'not explained yet.')}" for n in differ] if differ and not quick else []
    return "\n".join(L) if quick else "\n".join(L) + "\n"


def _main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", default=",".join(list(CELLS) + ["fednl_bytes"]))
    ap.add_argument("--quick", action="store_true", help="the cells on tiny twins, against results/reproduce_quick.json")
    ap.add_argument("--record", action="store_true", help="with --quick: write that reference instead of comparing")
    common.add_args(ap)
    a = ap.parse_args(argv)
    common.configure(a)
    if not a.quick and common.rerender(a, "reproduce", render):
        return 0
    global RUNS
    if a.quick:                                   # afresh every time: nothing reused from an earlier check
        RUNS = Path(tempfile.mkdtemp(prefix="lightfed-reproduce-"))
    common.STORE = RUNS / "store"                 # its own store: never a benchmark's runs
    t0 = time.time()
    names = a.cells.split(",")
    cells = [(n, *x) for n in names if n in CELLS for x in CELLS[n]()]
    quick_want = json.loads((RESULTS / "reproduce_quick.json").read_text())["want"] if a.quick and not a.record else {}
    grid = []
    for n, label, c, _ in cells:
        c = tiny(c) if a.quick else c
        if not str(c.get("out", "")).startswith(str(RUNS)):      # in the store, unless a chained cell's init names it
            c = {k: v for k, v in c.items() if k != "out"}
        grid.append((label, c))
    first = [g for g in grid if "init" not in g[1]]          # a cell that starts from another run's model goes after it
    done = dict(zip([l for l, _ in first], common.reuse_or_run(first, a.workers, a.from_runs)))
    rest = [g for g in grid if "init" in g[1]]
    done.update(zip([l for l, _ in rest], common.reuse_or_run(rest, a.workers, a.from_runs) if rest else []))
    rows = []
    for (n, label, _, (f_want, up_want)), (_, c) in zip(cells, grid):
        s = done[label]
        got = (s.get("final"), s.get("bytes", {}).get("up_per_client_round"))
        if a.quick:
            f_want, up_want = quick_want.get(label, (None, None)) if not a.record else got
        tol = TOL_QUICK if a.quick else TOL[n]
        if a.quick and n in PERPLEXITY and f_want:          # the twin's perplexity is ~5e4: a share of it, not 0.07
            tol = TOL_QUICK_PPL * f_want
        same = (f_want is not None and got[0] is not None and abs(got[0] - f_want) <= tol
                and (up_want is None or got[1] == up_want))
        rows.append({"cell": label, "want": (f_want, up_want), "got": got, "tolerance": tol, "same": same,
                     "error": s.get("error"), "provenance": common.provenance(s) if "error" not in s else None})
    if "fednl_bytes" in names and not a.quick:
        rows += [{**r, "tolerance": 0} for r in fednl_bytes()]
    cmd = "python benchmarks/reproduce.py " + " ".join(sys.argv[1:] if argv is None else argv)
    res = {"meta": meta(cmd.strip(), commit=common.commit()), "rows": rows, "wall_s": time.time() - t0}
    if a.quick and a.record:
        (RESULTS / "reproduce_quick.json").write_text(json.dumps(
            {"meta": res["meta"], "want": {r["cell"]: r["got"] for r in rows}}, indent=1))
    print(render(res, quick=True) if a.quick else write("reproduce", res, render(res)))
    return 0 if (a.quick and a.record) or all(r["same"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
