"""FLITE on a language model (issue 47, item 5): Austen perplexity and prompted tweet sentiment on SmolLM2-135M against
FedAvg fp32, rank bought with bits at >= 8,000x fewer uplink bytes, every lr chosen on validation data.

    python benchmarks/flite_lm.py              # the lr sweeps (validation data, seed 0), then 3 seeds of every row
    python benchmarks/flite_lm.py --task psentiment    # results/flite_lm_psentiment.*
    python benchmarks/flite_lm.py --rows flite_delta   # run only these rows; the others as the store holds them
    python benchmarks/flite_lm.py --from-runs  # run nothing: report what finished
    python benchmarks/flite_lm.py --quick      # the tiny twin (a minute)

austen: flite_claims.py's austen grid (10 clients IID, 3 a round, 5 rounds of one local epoch, batch 4, 64-token
blocks; test: 36 blocks from the last 10% of each novel). Validation: the same task on the first 88% of each novel
(written once to ~/.cache/lightfed/austen-validation as a folder of .txt files, the task's `data` option), whose own
held-out blocks lie in the 79-88% of each novel: training text of the real task, never its test text.
psentiment: zoflite_claims.py's prompt setting for first-order methods (10 clients IID, 2 a round, 8 rounds of 5
local steps of 8 prompts, 1,000 training tweets, 500 test tweets: one is 0.2 pp), scored at round 0 (zero-shot) and
at the end. Validation: 500 tweets outside the task's train and test rows (the task's `validation` option).
Each task's central twins (one client with all its training data, the grid's steps in sequence: psentiment 80, austen
75; fp32 latents; each row its own sweep) say whether a shortfall is FLITE's map or the federation's.
Each row's lr is the best validation score of its sweep; one at a sweep's edge is flagged.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import common  # noqa: E402
from common import meta, verdict, write  # noqa: E402
from flite_claims import TASKS  # noqa: E402

BASE = {"austen": {**TASKS["austen"], "partition": "iid", "progress": False},
        "psentiment": {"task": "psentiment", "clients": 10, "fraction": 0.2, "rounds": 8, "local_steps": 5, "batch_size": 8,
                       "partition": "iid", "eval_every": 8, "progress": False,
                       "task_options": {"train_size": 1000, "test_size": 500, "max_len": 48}}}
QUICK = {"austen": {"rounds": 1, "task_options": {"tiny": True, "train_blocks": 30, "test_blocks": 12, "block_len": 32}},
         "psentiment": {"rounds": 1, "eval_every": 1, "task_options": {"tiny": True, "train_size": 40, "test_size": 20, "max_len": 16}}}
METRIC = {"austen": "perplexity", "psentiment": "accuracy"}
HIGHER = {"austen": False, "psentiment": True}          # accuracy: higher is better; perplexity: lower
TEST = {"austen": "{test_blocks} held-out blocks, the last 10% of each novel", "psentiment": "{test_size} held-out tweets, balanced"}
# (key, label, method, options). The default map (r = 20, int4: one scale per message) and rank at the budget's edge
# with a float32 scale per 32 latents (int4g: no latent rounds to 0): 22^2 x 211 Linear = 102,124 latents, ~64 KB.
# (A central twin at its federated row's lr does not isolate the averaging: FedAvg's vision lr, chosen for averaged
# steps, broke 1,000 sequential ones, flite_vision.py's fedavg_central; such a row needs its own sweep.)
ALLOC = {"vx": "v_proj:40,o_proj:24,up_proj:24,down_proj:24,*:0", "v": "v_proj:59,*:0"}     # rank_pattern, by layer name
ROWS = [("fedavg", "FedAvg fp32", "fedavg", {}),
        ("flite", "FLITE r = 20, int4 (lightfed's default map; 84,400 latents)", "flite", {}),
        ("flite_r22g", "FLITE r = 22, int4g (102,124 latents)", "flite", {"r": 22, "codec": "int4g"}),
        # the round's move uploaded instead of z (the same bytes): +2.5 pp in vision (flite_vision_delta.md)
        ("flite_delta", "FLITE r = 20, int4, the round's move uploaded (delta)", "flite", {"delta": True}),
        # rank bought with bits and the move uploaded together (psentiment: the move took r = 20 to -0.8 pp of FedAvg)
        ("flite_r22g_delta", "FLITE r = 22, int4g, the round's move uploaded (102,124 latents)", "flite",
         {"r": 22, "codec": "int4g", "delta": True}),
        # what rank buys federated, past the byte budget (centrally r = 64 met FedAvg's central twin on seed 0): does the
        # federation then cost FLITE what averaging gives FedAvg?
        ("flite_r64g_delta", "FLITE r = 64, int4g, the round's move uploaded (864,256 latents; past the 8,000x budget)",
         "flite", {"r": 64, "codec": "int4g", "delta": True}),
        # the central twins: one client with all the training data, the grid's steps in sequence, fp32 latents, each
        # its own sweep: is FLITE's shortfall its map's (central FLITE below central FedAvg) or the federation's?
        ("fedavg_central", "FedAvg fp32, centralised (1 client, the grid's steps)", "fedavg", {}),
        ("flite_central", "FLITE r = 20, fp32 latents, centralised (1 client, the grid's steps)", "flite", {"codec": "fp32"}),
        # what rank alone buys the map with no federation and no codec (austen's central FLITE stayed 4.6% above central
        # FedAvg at r = 20): past the 8,000x budget (r = 22 int4g), so the byte target's ceiling, not a candidate
        ("flite_central_r32", "FLITE r = 32, fp32 latents, centralised (216,064 latents)", "flite", {"r": 32, "codec": "fp32"}),
        ("flite_central_r64", "FLITE r = 64, fp32 latents, centralised (864,256 latents)", "flite", {"r": 64, "codec": "fp32"}),
        # the budget placed where r = 64's move counted (flite_lm_where.md, on validation text: v_proj alone gave 0.69 of
        # its gain, o/up/down 0.24-0.30 each, q/k/gate/lm_head <= 0.15), each pattern under int4g's 8,000x (~107,000)
        ("flite_central_vx", "FLITE v_proj r = 40, o/up/down_proj r = 24, nothing elsewhere (99,840 latents), fp32, "
         "centralised", "flite", {"codec": "fp32", "rank_pattern": ALLOC["vx"]}),
        ("flite_central_v", "FLITE v_proj r = 59, nothing elsewhere (104,430 latents), fp32, centralised", "flite",
         {"codec": "fp32", "rank_pattern": ALLOC["v"]}),
        # the placement validation preferred (vx: 44.76 vs v's 45.60), federated at the budget with the move uploaded
        ("flite_vx_delta", "FLITE v_proj r = 40, o/up/down_proj r = 24 (99,840 latents), int4g, the round's move uploaded",
         "flite", {"codec": "int4g", "delta": True, "rank_pattern": ALLOC["vx"]})]
# a round of the central twin: the steps of a federated round (psentiment: 2 clients x 5; austen: 3 clients x one
# epoch of 20 blocks at batch 4 = 3 x 5), so 8 x 10 and 5 x 15 steps in all
CENTRAL = {"psentiment": {"clients": 1, "fraction": 1.0, "local_steps": 10},
           "austen": {"clients": 1, "fraction": 1.0, "local_steps": 15}}
ROW_RUN = {"fedavg_central", "flite_central", "flite_central_r32", "flite_central_r64", "flite_central_vx", "flite_central_v"}
SWEEP = {"austen": {"fedavg": [2e-5, 5e-5, 1e-4, 2e-4], "flite": [3e-3, 1e-2, 3e-2, 1e-1], "flite_r22g": [3e-3, 1e-2, 3e-2, 1e-1],
                    "flite_delta": [3e-3, 1e-2, 3e-2, 1e-1], "fedavg_central": [1e-5, 2e-5, 5e-5, 1e-4],
                    "flite_central": [3e-3, 1e-2, 3e-2], "flite_central_r32": [3e-3, 1e-2, 3e-2],
                    "flite_central_r64": [1e-3, 3e-3, 1e-2, 3e-2], "flite_r64g_delta": [3e-3, 1e-2, 3e-2],
                    "flite_central_vx": [3e-3, 1e-2, 3e-2], "flite_central_v": [3e-3, 1e-2, 3e-2],
                    "flite_vx_delta": [3e-3, 1e-2, 3e-2, 1e-1]},
         "psentiment": {"fedavg": [1e-5, 3e-5, 1e-4, 3e-4], "flite": [1e-2, 3e-2, 1e-1], "flite_delta": [3e-3, 1e-2, 3e-2, 1e-1],
                        "fedavg_central": [3e-6, 1e-5, 3e-5, 1e-4], "flite_central": [3e-3, 1e-2, 3e-2],
                        "flite_r22g_delta": [3e-3, 1e-2, 3e-2], "flite_central_r64": [3e-4, 1e-3, 3e-3, 1e-2]}}   # centred on austen's choices;
# psentiment's FedAvg chose 3e-5 at its lower edge (0.818 vs 0.812 at 1e-4 on 500 validation tweets): 1e-5 added;
# flite_delta chose 0.01 at its lower edge (0.814 vs 0.756 at 0.03): 3e-3 added; austen's fedavg_central chose 2e-5 at its lower
# edge (44.10 vs 44.37 at 5e-5, 48.14 at 1e-4 on validation text): 1e-5 added, 2e-4 left out (past a rising 1e-4);
# its central FLITE sweep stops at 3e-2 (a central twin takes sequential steps: psentiment's chose a third of its
# federated lr); r = 64 chose 3e-3 at its lower edge (43.23 vs 45.01 at 1e-2): 1e-3 added; psentiment's r = 64 is
# centred a third below its r = 20 (austen's r = 64 chose a third of its r = 20's lr), and chose 1e-3 at its lower edge on
# a tie with 3e-3 (0.816 both): 3e-4 added; the placed rows chose 1e-2 at their top edge (vx 44.76 vs 46.67 at 3e-3,
# v 45.60 vs 47.42): 3e-2 added (both scored under 1e-2); the federated placed row chose 3e-2 at its top edge (45.43 vs
# 46.35 at 1e-2): 0.1 added
SWEEP_RUN = {"austen": {}, "psentiment": {"eval_start": False}}    # a sweep run is judged by its last round alone
CUT = 0.88              # the validation corpus: the first 88% of each novel's characters
TARGET_X = 8000         # uplink at least this many times below FedAvg's, by len() of the messages


def validation_corpus() -> str:
    """A folder of the six novels' first CUT of text (made once): the task's `data` on it holds out its own last 10%."""
    from lightfed import assets
    from lightfed.data import datasets
    d = Path(assets.cache_dir()) / "austen-validation"
    if not d.is_dir():
        tmp = d.with_suffix(".tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        for title, text in datasets.load_austen().items():
            (tmp / f"{title}.txt").write_text(text[: int(len(text) * CUT)], encoding="utf-8")
        tmp.rename(d)
    return str(d)


def grid_base(quick: bool, task: str = "austen") -> dict:
    b, q = BASE[task], QUICK[task]
    return {**b, **q, "task_options": {**b["task_options"], **q["task_options"]}} if quick else b


def configs(quick: bool, lrs: dict | None, seeds: list[int], task: str = "austen") -> list[tuple[str, dict]]:
    """The sweep's runs (lrs None: seed 0 on the validation data) or the grid's (each row at its chosen lr)."""
    base, g = grid_base(quick, task), []
    to = None if lrs is not None else {**base["task_options"], **({"data": validation_corpus()} if task == "austen" else {"validation": True})}
    for key, _, m, mo in ROWS:
        if key not in SWEEP[task]:
            continue
        run = CENTRAL[task] if key in ROW_RUN else {}
        if lrs is None:
            g += [(f"{key} lr {lr:g}", {**base, **run, "method": m, "method_options": mo, "lr": lr, "seed": 0,
                                        "task_options": to, **SWEEP_RUN[task]}) for lr in SWEEP[task][key]]
        elif lrs.get(key) is not None:                           # None: its sweep has not finished
            g += [(f"{key} s{s}", {**base, **run, "method": m, "method_options": mo, "lr": lrs[key], "seed": s})
                  for s in seeds]
    return g


def choose(cal: list[tuple[str, dict]], sums: list[dict], task: str = "austen") -> tuple[dict, list[dict]]:
    """Each row's lr (the best validation score; None until its sweep finished) and the sweep's table rows."""
    table, lrs, sign = [], {}, -1 if HIGHER[task] else 1
    for key, sweep in SWEEP[task].items():
        pts = [(c["lr"], s.get("final"), s.get("error")) for (label, c), s in zip(cal, sums) if label.split(" ")[0] == key]
        done = [(lr, f) for lr, f, e in pts if e is None]
        best = min(done, key=lambda p: sign * p[1])[0] if len(done) == len(pts) else None
        lrs[key] = best
        table += [{"row": key, "lr": lr, METRIC[task]: f, "error": e, "chosen": lr == best,
                   "edge": lr == best and lr in (min(sweep), max(sweep))} for lr, f, e in pts]
    return lrs, table


def claims(rows: dict, task: str = "austen") -> list[tuple[str, str]]:
    fa = rows.get("fedavg")
    out = []
    for key, label, *_ in ROWS[1:]:
        r = rows.get(key)
        if key in ROW_RUN or not (r and fa and r["finals"] and fa["finals"]):
            continue
        x = fa["up"] / r["up"]      # exact (no seeds): under the target, the claim is missed whatever the score
        a, b = np.mean(r["finals"]), np.mean(fa["finals"])
        if HIGHER[task]:            # accuracy within 1 pp: FLITE's range above FedAvg's - 1 pp
            what, v = "accuracy within 1 pp of", verdict(r["finals"], [y - 0.01 for y in fa["finals"]], False)
            diff = f"means {a:.4f} vs {b:.4f}, {100 * (a - b):+.1f} pp"
        else:
            what, v = "perplexity within 1% of", verdict(r["finals"], [1.01 * y for y in fa["finals"]], True)
            diff = f"means {a:.2f} vs {b:.2f}, {100 * (a / b - 1):+.1f}%"
        out.append((f"{label}: {what} FedAvg fp32's at >= {TARGET_X:,}x fewer uplink bytes",
                    (v if x >= TARGET_X else "missed") + f" ({diff}; uplink {x:,.0f}x below FedAvg's: "
                    f"{'at least' if x >= TARGET_X else 'under'} {TARGET_X:,}x)"))
    fin = {k: r["finals"] for k, r in rows.items() if r and r["finals"]}
    better, within = ("above", "1 pp") if HIGHER[task] else ("below", "1%")
    for a, b, margin, what in (   # a better than b, within margin (accuracy: b - 1 pp; perplexity: b + 1%)
            ("flite_central", "fedavg_central", True, f"FLITE's map centrally (fp32 latents) within {within} of FedAvg centrally"),
            ("flite_central_r32", "fedavg_central", True, f"FLITE's map at r = 32 centrally within {within} of FedAvg centrally"),
            ("flite_central_r64", "fedavg_central", True, f"FLITE's map at r = 64 centrally within {within} of FedAvg centrally"),
            ("flite_central_vx", "fedavg_central", True, f"FLITE's latents placed (vx, 99,840) centrally within {within} of "
             "FedAvg centrally"),
            ("flite_central_vx", "flite_central_r32", False, f"placing the latents: vx (99,840) centrally {better} r = 32 "
             "spread over every layer (216,064)"),
            ("flite_central", "flite", False, f"what the federation (averaging + int4 z) costs FLITE: central {better} federated"),
            ("flite_central", "flite_delta", False, f"what the federation (averaging + int4 moves) costs FLITE: central {better} federated"),
            ("fedavg_central", "fedavg", False, f"what averaging costs FedAvg: central {better} federated")):
        if a in fin and b in fin:
            ma, mb = np.mean(fin[a]), np.mean(fin[b])
            if HIGHER[task]:
                v = verdict(fin[a], [y - 0.01 * margin for y in fin[b]], False)
                diff = f"means {ma:.4f} vs {mb:.4f}, {100 * (ma - mb):+.1f} pp"
            else:
                v = verdict(fin[a], [y * (1 + 0.01 * margin) for y in fin[b]], True)
                diff = f"means {ma:.2f} vs {mb:.2f}, {100 * (ma / mb - 1):+.1f}%"
            out.append((what, f"{v} ({diff})"))
    return out


def render(res: dict) -> str:
    task = res.get("task", "austen")
    metric, nd = METRIC[task], 4 if HIGHER[task] else 2
    title = {"austen": "Austen perplexity", "psentiment": "prompted tweet sentiment (psentiment)"}[task]
    L = [f"# FLITE on a language model: {title} (SmolLM2-135M)\n",
         f"Command: `{res['meta']['command']}`  \nDate {res['meta']['date']}, code {res['meta']['code']}. "
         f"Setting: {res['setting']}. A figure marked † was made by other code than this file's (its provenance is in "
         "the JSON).\n", f"## lrs, chosen on validation data (seed 0; the {'highest' if HIGHER[task] else 'lowest'} {metric})\n",
         f"| row | lr | validation {metric} | |", "|---|---|---|---|"]
    for t in res["sweep"]:
        f = f"{t[metric]:.{nd}f}" if t[metric] is not None else common.why(t["error"])
        L.append(f"| {t['row']} | {t['lr']:g} | {f} | {'chosen' + (' (at the sweep edge)' if t['edge'] else '') if t['chosen'] else ''} |")
    L += ["", f"## Test {metric} ({TEST[task].format(**res['setting']['task_options'])})\n",
          f"| row | lr | {metric} (mean ± sd) | seeds | round 0 | up B / client / round | x fewer than FedAvg |", "|---|---|---|---|---|---|---|"]
    fa = res["rows"].get("fedavg", {}).get("up")
    for key, label, *_ in ROWS:
        r = res["rows"].get(key)
        if r is None:
            continue
        if not r["finals"]:
            L.append(f"| {label} | | {common.why(r['errors'][0] if r['errors'] else 'not run')} | | | | |")
            continue
        x = f"{fa / r['up']:,.0f}x" if fa else "-"
        L.append(f"| {label} | {r['lr']:g} | {common.marked(common.pm(r['finals'], nd), r['provenance'])} | "
                 f"{', '.join(map(str, r['seeds']))} | {np.mean(r['initials']):.{nd}f} | {r['up']:,} | {x} |")
    L += ["", "## Claims (3 seeds; met only where the seeds' ranges separate)\n", "| claim | verdict |", "|---|---|"]
    L += [f"| {k} | {v} |" for k, v in res["claims"]]
    L += ["", f"![{metric} by round and against the uplink]({res['name']}.png)"]
    return "\n".join(L) + "\n"


# --where: where FLITE's r = 64 central move counts (issue 47: what a per-layer allocation of the latents would keep)
GROUPS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")
BANDS = ((0, 10), (10, 20), (20, 30))     # SmolLM2-135M's 30 decoder layers, in thirds


def where(out: str) -> dict:
    """A finished central FLITE run's final z, kept on one group of layers at a time (the others' latents set to 0) and
    taken off it, scored on the validation text (never the test blocks): which layers carry the gain over z = 0."""
    import re
    import torch
    from lightfed import config as C
    from lightfed.engine import local
    from lightfed.models import latent
    S, _ = local.final_model(out)
    z = S.model.z.detach().clone()                      # (K,) the run's final latents
    cfg = C.from_dict({**json.loads((Path(out) / "config.json").read_text()), "out": ""})
    cfg.task_options = {**cfg.task_options, "data": validation_corpus()}
    V = local.build(cfg).task                           # the validation text's held-out blocks
    layers = latent.latent_layers(S.model)

    def ppl(mask: torch.Tensor) -> float:
        with torch.no_grad():
            S.model.z.copy_(z * mask)
        return local.evaluate(V, S.model)[METRIC["austen"]]

    def mask_of(pick) -> torch.Tensor:
        m = torch.zeros_like(z)
        for name, L in layers:
            if pick(name):
                m[L.lo:L.hi] = 1
        return m

    depth = lambda n: int(re.search(r"layers\.(\d+)\.", n).group(1)) if "layers." in n else None   # noqa: E731
    picks = {g: (lambda n, g=g: n.endswith(g)) for g in GROUPS}
    picks |= {f"layers {a}-{b - 1}": (lambda n, a=a, b=b: depth(n) is not None and a <= depth(n) < b) for a, b in BANDS}
    out_ = {"all": ppl(torch.ones_like(z)), "none": ppl(torch.zeros_like(z)), "groups": {}}
    for g, pick in picks.items():
        m = mask_of(pick)
        out_["groups"][g] = {"latents": int(m.sum()), "z_share": float((z * m).pow(2).sum() / z.pow(2).sum()),
                             "only": ppl(m), "without": ppl(1 - m) if g in GROUPS else None}
    return out_


def render_where(res: dict) -> str:
    seeds = res["seeds"]
    w = res["runs"]
    L = ["# Where FLITE's move counts on Austen (r = 64, central)\n",
         f"Command: `{res['meta']['command']}`  \nDate {res['meta']['date']}, code {res['meta']['code']}. The central r = 64 "
         "runs of flite_lm.md (fp32 latents, one client, the grid's 75 steps; seeds " + ", ".join(map(str, seeds)) + "): each "
         "run's final z kept on one group of layers (every other latent set to 0), or taken off it, and scored on the "
         "validation text's held-out blocks (the first 88% of each novel: never the test blocks). A group's gain: how much "
         "of the run's fall in perplexity from z = 0 it gives alone.\n",
         "| z kept on | latents | share of ‖z‖² | perplexity, only this group | share of the gain alone | perplexity without it |",
         "|---|---|---|---|---|---|"]
    L.append("| every layer (the run) | " + f"{w[0]['latents']:,} | 1.00 | " + common.pm([x["all"] for x in w], 2) + " | 1.00 | - |")
    L.append("| none (z = 0: the base) | 0 | 0 | " + common.pm([x["none"] for x in w], 2) + " | 0 | - |")
    for g in [g for g in (*GROUPS, *(f"layers {a}-{b - 1}" for a, b in BANDS)) if g in w[0]["groups"]]:
        gs = [x["groups"][g] for x in w]
        gain = [(x["none"] - x["groups"][g]["only"]) / (x["none"] - x["all"]) for x in w]
        L.append(f"| {g} | {gs[0]['latents']:,} | {common.pm([x['z_share'] for x in gs], 2)} | "
                 f"{common.pm([x['only'] for x in gs], 2)} | {common.pm(gain, 2)} | "
                 f"{common.pm([x['without'] for x in gs], 2) if gs[0]['without'] is not None else '-'} |")
    L += ["", "Mean ± sd over the seeds. Shares of the gain need not add to 1: the groups' moves act together."]
    return "\n".join(L) + "\n"


def main_where(a, argv) -> None:
    seeds = [int(s) for s in a.seeds.split(",")]
    lrs = json.loads((common.RESULTS / "flite_lm.json").read_text())["lrs"]      # the lrs its sweeps chose
    runs = []
    for label, c in common.placed(configs(False, lrs, seeds)):     # the grid's r = 64 central runs
        if not label.startswith("flite_central_r64 "):
            continue
        if not (Path(c["out"]) / "ckpt" / "latest.json").exists():
            raise SystemExit(f"--where: {label} is not in the store here ({c['out']}): run it first "
                             "(python benchmarks/flite_lm.py --rows flite_central_r64 --allow-missing)")
        r = common.derived(c, "where", lambda c: where(c["out"]), where, key={"validation": CUT})
        runs.append({**r, "latents": sum(x["latents"] for k, x in r["groups"].items() if k in GROUPS)})
    res = {"meta": meta("python benchmarks/flite_lm.py " + " ".join(sys.argv[1:] if argv is None else argv)),
           "seeds": seeds, "runs": runs}
    print(write("flite_lm_where", res, render_where(res)))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--task", default="austen", choices=list(BASE))
    ap.add_argument("--rows", default="", help="comma-separated row keys that may run (default: all); the others are "
                    "reported as the store holds them, whatever code made them (marked)")
    ap.add_argument("--where", action="store_true", help="which layers carry the central r = 64 runs' gain "
                    "(results/flite_lm_where.*; from the store's runs, scored on validation text)")
    common.add_args(ap)
    a = ap.parse_args(argv)
    common.configure(a)
    if a.where:
        return common.rerender(a, "flite_lm_where", render_where) or main_where(a, argv)
    seeds, task = [int(s) for s in a.seeds.split(",")], a.task
    cal = common.placed(configs(a.quick, None, seeds, task))
    keys = set(a.rows.split(",")) if a.rows else None

    def mine(g):                    # the labels of g this command may run (None: all)
        return None if keys is None else {label for label, _ in g if label.split(" ")[0] in keys}
    lrs, sweep = choose(cal, common.reuse_or_run(cal, a.workers, a.from_runs, only=mine(cal)), task)
    grid = common.placed(configs(a.quick, lrs, seeds, task))
    rows = {key: {"finals": [], "initials": [], "seeds": [], "provenance": [], "errors": [], "lr": lrs[key]}
            for key, *_ in ROWS if key in SWEEP[task]}
    for (label, c), s in zip(grid, common.reuse_or_run(grid, a.workers, a.from_runs, only=mine(grid))):
        r = rows[label.split(" ")[0]]
        if not common.add_seed(r, c, s):
            continue
        r["up"] = int(s["bytes"]["up_per_client_round"])
        r["latent"] = (s.get("method_info") or {}).get("latent")         # FLITE's latents (None for FedAvg)
        r.setdefault("curves", []).append([[h["round"], h[s["metric"]]] for h in s["history"]])
    res = {"meta": meta("python benchmarks/flite_lm.py " + " ".join(sys.argv[1:] if argv is None else argv)),
           "name": "flite_lm" + ("" if task == "austen" else f"_{task}") + ("_quick" if a.quick else ""),
           "setting": {k: v for k, v in grid_base(a.quick, task).items() if k not in ("progress", "lr")},
           "validation_data": validation_corpus() if task == "austen" else "task option validation: tweets outside the "
           "train and test rows", "sweep": sweep, "lrs": lrs, "rows": rows}
    if task != "austen":            # the austen results name no task (they came first)
        res["task"] = task
    res["claims"] = claims(rows, task)
    name = res["name"]
    plot(res, name)
    print(write(name, res, render(res)))


def plot(res: dict, name: str) -> None:
    """The test metric by round (mean, band: min..max over seeds) and the final one against the uplink bytes."""
    task = res.get("task", "austen")
    metric = METRIC[task]
    plt = common.pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for key, label, *_ in ROWS:
        r = res["rows"].get(key) or {}
        if not r.get("curves"):
            continue
        x = [p[0] for p in r["curves"][0]]
        y = np.array([[p[1] for p in c] for c in r["curves"]])
        line, = a.plot(x, y.mean(0), label=label)
        a.fill_between(x, y.min(0), y.max(0), color=line.get_color(), alpha=0.2)
        b.errorbar(r["up"], np.mean(r["finals"]), yerr=[[np.mean(r["finals"]) - min(r["finals"])],
                   [max(r["finals"]) - np.mean(r["finals"])]], fmt="o", color=line.get_color(), capsize=3)
    a.set(xlabel="round", ylabel=f"test {metric}", title=f"{task}, SmolLM2-135M")
    b.set(xscale="log", xlabel="uplink bytes per client per round (log)", ylabel=f"final test {metric} (bars: min..max)")
    a.legend(fontsize=7)
    for ax in (a, b):
        ax.grid(alpha=0.3)
    fig.text(0.01, 0.01, f"benchmarks/flite_lm.py, code {res['meta']['code']}", fontsize=6, alpha=0.6)
    common.save(fig, common.RESULTS / f"{name}.png")


if __name__ == "__main__":
    main()
