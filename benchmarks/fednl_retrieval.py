"""FedNL's retrieval: the parts `recipe`, `passkey` and `templates` of benchmarks/fednl_claims.py (fednl_claims.json).

    python benchmarks/fednl_claims.py --parts recipe                      # centralised calibration (validation streams)
    python benchmarks/fednl_claims.py --parts passkey --seeds 0,1,2       # the federated passkey grid
    python benchmarks/fednl_claims.py --parts templates --seeds 0,1,2     # seven templates, a client each; one unseen
    python benchmarks/fednl_claims.py --parts passkey,templates --size smoke   # every row at toy size

Setting (task `passkey`, tasks/passkey.py): SmolLM2-135M, streams of 64-token chunks with attention local to each
chunk, a 7-digit pass key hidden in one chunk of an Austen haystack, the question in the last chunk; exact match of
the 7 digits. Training streams are 4 chunks, the needle in any chunk but the question's. Evaluation: 4, 8, 16 and
32 chunks (256-2,048 tokens), needles at depths 0, 0.25, 0.5, 0.75 (outside the question's chunk) and 1.0 (inside
it, reported apart), 20 streams a cell; evaluation needles and haystack never met in training. The targets (>= 0.9 at
4 chunks, >= 0.5 at 16, the reset control <= 0.1) are decided on their own test set, JUDGE: 500 streams a length at 4
and 16 chunks (one stream 0.2 pp), for the row they name (FedNL), its reset twin and the frozen backbone. Why FedNL's
score at 4 chunks is what it is: the same streams with the needle's chunk moved next to the question, and alone (`WHY`).
Why a FedNL row's carried CE rises along 16K tokens: the same model with its memory emptied every 4 chunks, the length
of its training streams (`ce_bounded`).

recipe: one client trains FedNL alone (the same batches for every row) and is scored on validation streams (the
training split's haystack and passkeys, other draws): what each choice of the recipe buys, and its cost a step.
templates: the pass key and six RULER templates at 128-token chunks, one client per template (domain partition), FedNL,
its memory-reset twin, FedNL with one template's client never trained (the unseen client, scored by the global rules),
the backbone windowed and with full attention, FedALA with full attention (as its paper ran).
passkey: rows FedNL (federated, 4 clients IID, 2 a round), FedNL with its memory reset at every chunk (the same
trained models), the frozen backbone windowed and with full attention (the reference a user would otherwise run:
its KV cache grows with the input), and the LoRA baselines trained in both settings.
"""
from __future__ import annotations

import functools
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import common  # noqa: E402
from common import pm, pyplot, records, reuse_or_run, save, source_of, verdict, why, wilson  # noqa: E402
from lightfed.data.passkey import needle_alone, needle_moved  # noqa: E402  (WHY's stream edits)

RUNS = Path("runs/fednl_retrieval")
UNIT = 64
TASK = {"unit": UNIT, "window": UNIT, "train_chunks": 4, "train_size": 256, "lengths": "4,8,16,32",
        "depths": "0,0.25,0.5,0.75,1", "test_per_cell": 20}
SMOKE_TASK = {**TASK, "train_size": 16, "lengths": "4,8", "depths": "0,1", "test_per_cell": 2}
# the targets' own test set (the grid's cells hold 20 streams, one 1.25 pp of a length's score): the lengths the targets
# name, the depths outside the question's chunk, 125 streams each (500 a length: one stream 0.2 pp), from the same
# evaluation split with other draws (data_seed 1), so not the grid's streams
JUDGE = {**TASK, "lengths": "4,16", "depths": "0,0.25,0.5,0.75", "test_per_cell": 125, "data_seed": 1}
# the recipe's rows: (label, method options, task options[, run settings]); each against the row it differs from
RECIPE = [
    ("memory in 5 layers spread evenly (5,11,17,23,29), gate 0 (the old default)", {"layers": "auto", "n_layers": 5}, {}),
    ("memory in 3 late layers (17,23,29), gate 0", {"layers": "17,23,29"}, {}),
    ("3 late layers, gate 0.1", {"layers": "17,23,29", "gate": 0.1}, {}),
    ("3 late layers, gate 0.1, gate lr 10x", {"layers": "17,23,29", "gate": 0.1, "gate_lr": 0.1}, {}),
    ("3 late layers, gate 0.1, beta bias -2 (slower writes)", {"layers": "17,23,29", "gate": 0.1, "beta_bias": -2.0}, {}),
    ("3 late layers, gate 0.1, key rank 32", {"layers": "17,23,29", "gate": 0.1, "r_k": 32}, {}),
    ("5 layers spread evenly, gate 0.1", {"layers": "auto", "n_layers": 5, "gate": 0.1}, {}),
    ("5 layers spread evenly, gate 0.1, gate lr 10x", {"layers": "auto", "n_layers": 5, "gate": 0.1, "gate_lr": 0.1}, {}),
    ("3 late layers, gate 0.1, 8-chunk training streams", {"layers": "17,23,29", "gate": 0.1}, {"train_chunks": 8}),
    # the recipe's layers and gate with longer training streams: 8 chunks throughout, and a curriculum over the number of
    # chunks (rounds 1-2: 2 chunks, 3-4: 4, 5-6: 8; RMT's and ARMT's schedule, the task's `curriculum` option)
    ("5 layers spread evenly, gate 0, 8-chunk training streams", {"layers": "auto", "n_layers": 5}, {"train_chunks": 8}),
    ("5 layers spread evenly, gate 0, curriculum 2 -> 4 -> 8 chunks", {"layers": "auto", "n_layers": 5},
     {"train_chunks": 8, "curriculum": "2,4,8"}),
    # a 4th entry sets the run's own lr / schedule. The grid's schedule, chosen here on validation streams (issue 46):
    ("5 layers spread evenly, gate 0, lr 1e-2 cosine", {"layers": "auto", "n_layers": 5}, {}, {"lr_decay": "cosine"}),
    # FedNL's rules as FLITE latents (issue 48): theta = theta_0 + map(z), z int4 the only upload; z's lr swept here
    *[(f"5 layers spread evenly, gate 0, rules as FLITE latents (latent_r 8, int4), lr {lr:g} cosine",
       {"layers": "auto", "n_layers": 5, "latent_r": 8, "codec": "int4"}, {}, {"lr": lr, "lr_decay": "cosine"})
      for lr in (1e-2, 1e-1, 1.0)],
    # all three retrieved nothing outside the question's chunk (fednl_recipe.md): the codec (absolute int4 cost FLITE
    # 9 pp in vision) and the rank, apart, at lr 0.1 (the lowest last-round training loss of the three: 0.77 vs 1.88 at 0.01 and 2.33 at 1)
    *[(f"5 layers spread evenly, gate 0, rules as FLITE latents (latent_r {r}, {codec}), lr 0.1 cosine",
       {"layers": "auto", "n_layers": 5, "latent_r": r, "codec": codec}, {}, {"lr": 0.1, "lr_decay": "cosine"})
      for r, codec in ((8, "fp32"), (16, "int4g"))],
    # r = 16 int4g retrieved 0.33 where theta sent whole retrieved 0.90: rank at the budget's edge (r = 18 int4g, 11,520
    # latents, ~7.2 KB), and past it (r = 32 fp32, 36,160 latents: not a candidate for the grid's row, which must stay
    # under 8 KB; it says whether rank alone closes the gap)
    ("5 layers spread evenly, gate 0, rules as FLITE latents (latent_r 18, int4g), lr 0.1 cosine",
     {"layers": "auto", "n_layers": 5, "latent_r": 18, "codec": "int4g"}, {}, {"lr": 0.1, "lr_decay": "cosine"}),
    ("5 layers spread evenly, gate 0, rules in latents past the 8 KB budget (latent_r 32, fp32), lr 0.1 cosine",
     {"layers": "auto", "n_layers": 5, "latent_r": 32, "codec": "fp32"}, {}, {"lr": 0.1, "lr_decay": "cosine"}),
]
SIZES = {   # steps of the centralised recipe rows; the federated grid
    "cpu": {"recipe": {"rounds": 6, "local_steps": 30}, "rounds": 10, "local_steps": 20, "task": TASK,
            "ce_tokens": 16384, "ce_bucket": 1024, "judge": JUDGE,
            "recipe_task": {**TASK, "lengths": "4,8", "depths": "0,0.5,1", "test_per_cell": 24, "validation": True}},
    "smoke": {"recipe": {"rounds": 1, "local_steps": 2}, "rounds": 1, "local_steps": 1, "task": SMOKE_TASK, "runs": "smoke",
              "ce_tokens": 512, "ce_bucket": 128, "judge": {**SMOKE_TASK, "lengths": "4", "depths": "0", "test_per_cell": 3, "data_seed": 1},
              "recipe_task": {**SMOKE_TASK, "validation": True}},
}
BASE = {"task": "passkey", "batch_size": 8, "lr": 1e-2, "dtype": "bf16", "progress": False}
# the baselines as their papers set them (label, method, options, folder slug):
#   FedProx: mu = 1, the largest of its paper's grid {0.001, 0.01, 0.1, 0.5, 1} (0.01 left LoRA's adapters where FedAvg's were);
#   FedALA: p over every layer's adapters (all of them are what a client personalises here; the paper's p = 1 adapted 1 of 30);
#   FedSSI: xi relative to the task's moves, the penalty from earlier rounds' importance only (methods/fedssi.py).
BASELINES = [("FedAvg+LoRA", "lora", {}, "lora"), ("FedProx (LoRA, mu 1)", "lora", {"mu": 1.0}, "fedprox"),
             ("FedALA (p = every layer)", "fedala", {"top": 0}, "fedala"), ("FedSSI", "fedssi", {}, "fedssi")]
INTERNALS = {"fedprox": ("penalty_share",), "fedala": ("ala_one_minus_w",), "fedssi": ("omega_mean", "penalty_share")}
LORA_LR = 1e-3
# FedNL's rows (label, lr_decay, folder slug, task options added, method options added, controls: the model
# evaluated with its memory reset per chunk, and its CE curves[, run settings: its own lr]). "stream LM loss" adds the haystack's next-token NLL
# (lm_weight 1); "forgetting gate" starts Gated DeltaNet's a_t at 1 - 1e-3 (a write fades to e^-1 in ~16 chunks, the
# length the retrieval target asks 0.5 at; not tuned).
FEDNL_ROWS = [("FedNL", "cosine", "fednl-cos", {}, {}, True), ("FedNL, constant lr", "none", "fednl", {}, {}, False),
              ("FedNL, stream LM loss", "cosine", "fednl-lm", {"lm_weight": 1.0}, {}, True),
              ("FedNL, stream LM loss, forgetting gate", "cosine", "fednl-lm-forget", {"lm_weight": 1.0}, {"forget": 1e-3}, True),
              # issue 48: theta = theta_0 + map(z), z the only upload, with the latent options and lr the recipe's latent
              # rows chose on validation streams ("latent": latent_choice; the row waits until they all finished); no
              # round-0 evaluation (z = 0 is theta_0, FedNL's own round 0: a quarter of the row's ~140 core-minutes a seed)
              ("FedNL in FLITE latents", "cosine", "fednl-latent", {}, {}, False, {"lr": "latent", "eval_start": False})]
CONTROLLED = {r[0] for r in FEDNL_ROWS if r[5]}


LATENT_ROWS = [r for r in RECIPE if "rules as FLITE latents" in r[0]]


def latent_choice(size: dict) -> tuple[dict, float] | None:
    """The rules-as-latents recipe: (method options, lr) of the recipe's latent row with the highest validation exact
    match outside the question's chunk (ties: the first row); None until each of those rows has finished."""
    got = []
    for i, (label, c) in enumerate(recipe_grid(size, LATENT_ROWS)):
        s = common.finished(label, c)
        if s is None:
            return None
        got.append((float(np.mean([v for k, v in s["cells"]["passkey"].items() if not k.endswith("/1")])), -i,
                    c["method_options"], c["lr"]))
    return max(got, key=lambda g: g[:2])[2:]


def recipe_grid(size: dict, rows=RECIPE) -> list[tuple[str, dict]]:
    return common.placed([(label, {**BASE, "method": "fednl", "clients": 1, "fraction": 1.0, "seed": 0, "lr_decay": "none",
                                   **size["recipe"], "eval_every": size["recipe"]["rounds"], "method_options": mo,
                                   "task_options": {**size["recipe_task"], **to}, **(run[0] if run else {})})
                          for label, mo, to, *run in rows])


def step_costs(size: dict) -> dict:
    """Seconds per training step of FedNL (the recipe's layers) with and without the frozen-prefix cache and the early
    stop of earlier chunks, fp32 and bf16, measured side by side in this process (one thread)."""
    import torch
    from lightfed import config as C, device
    from lightfed.data.tensors import batches
    from lightfed.engine import local
    from lightfed.models import lm, streaming
    torch.set_num_threads(1)
    out = {}
    for dtype in ("fp32", "bf16"):
        cfg = C.from_dict({**BASE, "dtype": dtype, "method": "fednl", "clients": 1,
                           "method_options": {"layers": "17,23,29", "gate": 0.1}, "task_options": {**size["task"], "test_per_cell": 1}})
        S = local.build(cfg)
        model, T = S.model, S.task
        b = next(batches(T.train, 8, torch.Generator().manual_seed(0)))
        for label, cache, early in (("plain (every layer of every chunk)", False, False), ("early stop", False, True),
                                    ("early stop + prefix cache (warm)", True, True)):
            model.prefix_cache = streaming.PrefixCache() if cache else None
            times = []
            for k in range(4):
                t = time.perf_counter()
                with device.using("cpu", dtype):
                    loss = lm.target_nll(model, b["input_ids"], b["target_mask"], UNIT) if early else _plain_loss(model, b)
                loss.backward()
                model.zero_grad(set_to_none=True)
                times.append(time.perf_counter() - t)
            out[f"{dtype}, {label}"] = float(np.median(times[1:]))
    return out


def _plain_loss(model, b):
    """The loss with every chunk through every layer (streaming.hidden without targets: no early stop)."""
    import torch.nn.functional as F
    from lightfed.models import streaming
    h = streaming.hidden(model, b["input_ids"], UNIT)
    sel = b["target_mask"][:, 1:]
    return F.cross_entropy(model.lm_head(h[:, :-1][sel]).float(), b["input_ids"][:, 1:][sel])


def part_recipe(size_name: str, workers: int, labels: set[str] | None = None, from_runs: bool = False) -> dict:
    """labels: the rows this command may run (default: all); every row of RECIPE is reported, from the store
    (from_runs: nothing runs)."""
    size = SIZES[size_name]
    bad = sorted((labels or set()) - {r[0] for r in RECIPE})
    if bad:
        raise ValueError(f"recipe: unknown rows {bad}; rows: {[r[0] for r in RECIPE]}")
    grid = recipe_grid(size)
    sums = reuse_or_run(grid, workers, from_runs, only=labels)
    rows = []
    for (label, c), s in zip(grid, sums):
        if "error" in s:
            rows.append({"label": label, "error": s["error"]})
            continue
        loss = common.derived(c, "train_loss", lambda c: [cl["train_loss"] for r in records(c["out"])[1:] for cl in r["clients"]])
        steps = common.derived(c, "steps", lambda c: sum(cl["steps"] for r in records(c["out"])[1:] for cl in r["clients"]))
        cells = s["cells"]["passkey"]
        out_q = [v for k, v in cells.items() if not k.endswith("/1")]
        rows.append({"label": label, "options": c["method_options"], "task_options": c["task_options"], "steps": steps,
                     "lr": c["lr"], "lr_decay": c["lr_decay"],
                     "s_per_step": s["time"]["client_compute"] / steps if steps else None, "cells": cells,
                     "outside_question_chunk": float(np.mean(out_q)), "initial": s["initial"], "final": s["final"],
                     "train_loss": loss, "provenance": [common.provenance(s)]})
    return {"rows": rows, "costs": None if from_runs else step_costs(size), "setting": {"size": size_name, **size["recipe"], "task": size["recipe_task"]}}


def retrieval_grid(size: dict, seeds, recipe: dict, methods: set[str] | None = None, baseline_seeds=None) -> list[tuple[str, dict]]:
    """FedNL over `seeds`; the baselines over `baseline_seeds` (default: the same); `methods`: the row labels kept.
    Every run in the store (common.placed)."""
    fed = {**BASE, "clients": 4, "fraction": 0.5, "rounds": size["rounds"], "local_steps": size["local_steps"],
           "eval_every": size["rounds"], "partition": "iid"}
    g, best = [], latent_choice(size)           # read from the store once, not per seed
    for seed in seeds:
        for name, decay, slug, extra, mo, _, *run in FEDNL_ROWS:
            if run and run[0].get("lr") == "latent":
                run, mo = ([{**run[0], "lr": best[1]}], {**mo, **best[0]}) if best else (None, mo)
            if run is not None and (methods is None or name in methods):
                g.append((f"{name} s{seed}", {**fed, "method": "fednl", "seed": seed, "method_options": {**recipe, **mo},
                                              "lr_decay": decay, "task_options": {**size["task"], **extra},
                                              **(run[0] if run else {})}))
        for label, m, mo, slug in (BASELINES if baseline_seeds is None or seed in baseline_seeds else []):
            for setting, window in (("windowed", UNIT), ("full attention", 0)):
                name = f"{label}, {setting}"
                if methods is not None and name not in methods:
                    continue
                g.append((f"{name} s{seed}", {**fed, "method": m, "seed": seed, "lr": LORA_LR, "method_options": mo,
                                               "task_options": {**size["task"], "window": window}}))
    return common.placed(g)


def add_run(rows: dict, name: str, c: dict, s: dict, cells) -> dict | None:
    """Add one run's summary `s` (config c) to its row: its seed and cells(s), or its error (-> None)."""
    r = rows.setdefault(name, {"seeds": [], "cells": [], "errors": []})
    if "error" in s:
        r["errors"].append(s["error"])
        return None
    r["seeds"].append(c["seed"])
    r["cells"].append(cells(s))
    if "bench" in s:                    # who made it (a run of other code marks the row's figures)
        r.setdefault("provenance", []).append(common.provenance(s))
    return r


@functools.cache
def evaluator() -> str:
    """The code that scores a finished run: the streaming and memory modules, the pass-key and NIAH data and scorers,
    and this file's scoring functions (a cached evaluation is redone when any of them changes)."""
    from lightfed.data import niah, passkey as data_passkey
    from lightfed.models import delta_memory, lm, streaming
    from lightfed.tasks import niah as task_niah, passkey as task_passkey
    return source_of(data_passkey, niah, delta_memory, lm, streaming, task_niah, task_passkey, template_scores,
                     template_cells, evaluate_model, heldout_austen_ids, ce_curve)


# --from-runs evaluates again nothing that is kept: an evaluation kept by other code (another evaluator, or a backbone
# loaded by other code) is reported as it is, its figures marked (STALE names it); only one never made is computed.
# Set by the parts' from_runs.
REPORT_ONLY = False
STALE: list[str] = []          # the evaluations reported that another evaluator or other code made


def backbone_key() -> str:
    """The code that loads the frozen backbone (an evaluation of it is redone when that or the evaluator changes)."""
    from lightfed.models import backbones, lm
    return source_of(backbones, lm)


def cached(path: Path, key: dict, fn):
    """fn()'s value, kept in `path` beside what made it (key): an evaluation of a finished run is not redone when the
    grid is collected again; a different key (task, CE size, the backbone's code) or another evaluator() computes it
    afresh."""
    return cached_pair((path, None), key, lambda: (fn(),))[0]


def cached_pair(paths: tuple[Path, Path | None], key: dict, fn) -> list:
    """cached() for an evaluation whose one pass gives two values (fn() -> (a, b)), each kept in its own file; paths[1]
    None: only a is asked. What is missing is computed once for both; a value already on disk is kept as it is."""
    key = {**key, "evaluator": evaluator()}
    want = [p for p in paths if p is not None]
    got = [json.loads(p.read_text()) if p.is_file() else None for p in want]
    if REPORT_ONLY:                     # kept by other code: reported as it is (marked)
        STALE.extend(str(p) for p, g in zip(want, got) if g is not None and g.get("key") != key)
    else:
        got = [g if g is not None and g.get("key") == key else None for g in got]     # made by something else: missing
    if any(g is None for g in got):
        for i, (p, x) in enumerate(zip(want, fn())):
            if got[i] is None:
                got[i] = {"key": key, "value": x}
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_text(json.dumps(got[i]))
    return [g["value"] for g in got]


def evaluated(c: dict, name: str, fn, **key):
    """fn(): an evaluation of the finished store run c, kept in its record (common.derived) beside the evaluator's code
    and `key` (the evaluation's task and size): redone when either changes, read from the record where the run's
    folder is gone. REPORT_ONLY: a value kept by other code is reported as it is (named in STALE), not made again."""
    p = common.record_path(c)
    d = json.loads(p.read_text()).get("derived", {}).get(name) if REPORT_ONLY and p and p.exists() else None
    if d is not None:
        v = _derived(c, name, lambda: None, key)        # None: not the code at hand's (derived keeps no None)
        if v is None:
            STALE.append(f"{Path(c['out']).name}: {name}")
        return d["value"] if v is None else v
    return _derived(c, name, fn, key)


def _derived(c: dict, name: str, fn, key: dict):
    # this line's text is part of every kept evaluation's code key (common.derived hashes the lambda's source line)
    return common.derived(c, name, lambda c: fn(), key={**key, "evaluator": evaluator()})


def marks(row: dict, n_stale: int) -> None:
    """Mark a row if an evaluation reported for it (those in STALE past its first n_stale) was made by other code: its
    provenance gets a record that is not at hand, naming them (common.marked then daggers the row's figures)."""
    if len(STALE) > n_stale:
        row.setdefault("provenance", []).append({"at_hand": False, "evaluations": STALE[n_stale:]})


def evaluate_model(model, task_opts: dict, window: int, reset: bool = False, edit=None) -> dict:
    """{cell: exact match} on the pass key's test streams (edit: as template_scores')."""
    return template_scores(model, {**task_opts, "templates": "passkey"}, window, reset, edit)[0]["passkey"]


WHY = {"needle moved next to the question": needle_moved, "needle's chunk alone before the question": needle_alone}


def final_model(summary: dict, dtype: str = "bf16"):
    """The run's final global model on the CPU, its frozen weights in `dtype` (the grids evaluate in bf16)."""
    from lightfed.engine import local
    return local.final_model(summary["out"], "cpu", dtype)[0].model


def internals(summary: dict, slug: str) -> dict[str, float]:
    """A baseline's own mechanism at work: the mean over clients and rounds of its stats (INTERNALS)."""
    recs = records(summary["out"])
    out = {}
    for k in INTERNALS.get(slug, ()):
        xs = [cl[k] for r in recs for cl in r.get("clients", []) if k in cl]
        out[k] = float(np.mean(xs)) if xs else None
    return out


def adapter_distance(a: dict, b: dict) -> float:
    """||theta_a - theta_b|| / ||theta_b|| over the final global adapters of two runs (the tensors both hold)."""
    from lightfed.engine import local
    _, sa, _, _ = local.load_checkpoint(Path(a["out"]))
    _, sb, _, _ = local.load_checkpoint(Path(b["out"]))
    keys = [k for k in sb if k in sa]
    num = sum(((sa[k].double() - sb[k].double()) ** 2).sum().item() for k in keys)
    den = sum((sb[k].double() ** 2).sum().item() for k in keys)
    return float(np.sqrt(num / den)) if den > 0 else float("nan")


def heldout_austen_ids(n: int):
    """(1, n) SmolLM2 token ids: the start of Austen's held-out split (never a haystack or a training block)."""
    import torch
    from lightfed.data import datasets, niah
    from lightfed.models import backbones
    tok = backbones.smollm2_tokenizer()
    tok.model_max_length = 10**9
    text = niah.haystack_split(datasets.load_austen(), "eval")
    return torch.tensor([tok(text[: n * 8], add_special_tokens=False)["input_ids"][:n]])


def ce_curve(model, size: dict, carry: bool, reset_every: int = 0) -> list[float]:
    """CE per bucket along the first `ce_tokens` held-out Austen tokens, 64-token chunks, in bf16."""
    import torch
    from lightfed import device
    from lightfed.models import streaming
    model.eval()
    with device.using("cpu", "bf16"), torch.no_grad():
        return streaming.ce_buckets(model, heldout_austen_ids(size["ce_tokens"]), UNIT, size["ce_bucket"], carry,
                                    reset_every)


def by_length(cells: dict) -> dict[str, float]:
    """Exact match per length over the depths outside the question's chunk."""
    out: dict[str, list[float]] = {}
    for k, v in cells.items():
        L, d = k.split("/")
        if float(d) < 1:
            out.setdefault(L, []).append(v)
    return {L: float(np.mean(v)) for L, v in sorted(out.items(), key=lambda x: int(x[0]))}


def grid_retrieval(rows: dict, lengths: list[int]) -> dict:
    """{row: {"<chunks>": [exact match outside the question's chunk, per seed]}} on the grid's cells, for the rows that
    have cells."""
    return {name: {str(L): [by_length(c)[str(L)] for c in r["cells"]] for L in lengths} for name, r in rows.items() if r["cells"]}


def trends(curves: dict) -> dict:
    """{model: [CE of the last bucket over the first's, minus 1, per seed]}."""
    return {k: [v[-1] / v[0] - 1 for v in vs] for k, vs in curves.items()}


def judged_retrieval(rows: dict) -> dict:
    """{row: {"<chunks>": [exact match outside the question's chunk, per seed in the row's order]}} on the targets' own
    test set (JUDGE), for the rows evaluated on it."""
    out = {}
    for name, r in rows.items():
        per = [by_length(r["judged"][str(seed)]) for seed in r["seeds"] if str(seed) in r.get("judged", {})]
        if per:
            out[name] = {L: [p[L] for p in per] for L in per[0]}
    return out


def part_retrieval(size_name: str, seeds, workers: int, recipe: dict, methods: set[str] | None = None,
                   baseline_seeds=None, from_runs: bool = False) -> dict:
    """methods: the rows this command may run (default: all); the report holds every row of the grid, from the store."""
    import torch
    from lightfed.models import backbones, delta_memory
    global REPORT_ONLY
    REPORT_ONLY = from_runs
    torch.set_num_threads(workers)
    size = SIZES[size_name]
    grid = retrieval_grid(size, seeds, recipe, None, baseline_seeds)
    sums = reuse_or_run(grid, workers, from_runs, only=None if methods is None else
                        {label for label, _ in grid if label.rsplit(" s", 1)[0] in methods})
    slugs = {name: slug for name, _, slug, *_ in FEDNL_ROWS} | {f"{label}, {w}": slug for label, _, _, slug in BASELINES
                                                                 for w in ("windowed", "full attention")}
    rows: dict[str, dict] = {name: {"seeds": [], "cells": [], "errors": ["not run: its lr is not chosen on validation "
                                                                        "streams yet (the recipe's latent rows)"]}
                             for name, *_, run in FEDNL_ROWS if run == {"lr": "latent"}
                             and not any(label.rsplit(" s", 1)[0] == name for label, _ in grid)}   # the grid left it out
    ce: dict[str, list] = {}
    for (label, c), s in zip(grid, sums):
        name = label.rsplit(" s", 1)[0]
        r = add_run(rows, name, c, s, lambda s: s["cells"]["passkey"])
        if r is None:
            continue
        r.setdefault("up_bytes", s["bytes"]["up_per_client_round"])
        r.setdefault("trainable", s["trainable_params"])
        r.setdefault("lr", f"{c['lr']:g} {c.get('lr_decay') or 'none'}")      # the row's own lr and schedule, as run
        if slugs[name] in INTERNALS:
            r.setdefault("internals", []).append(common.derived(c, "internals", lambda c, k=slugs[name]: internals(c, k)))
        if name in CONTROLLED:              # the control: the same trained model, its memory emptied at every chunk
            n_stale = len(STALE)
            key = {"task": size["task"], "ce": [size["ce_tokens"], size["ce_bucket"]]}
            model = functools.cache(lambda c=c: final_model(c))   # loaded once, only if an evaluation is not kept
            ev = functools.partial(evaluated, c)
            rr = add_run(rows, f"{name}, memory reset per chunk", c, s,
                         lambda s: ev("eval-reset", lambda: evaluate_model(model(), size["task"], UNIT, reset=True), **key))
            if name == "FedNL":         # the row the targets name: their own test set, and why its score at 4 chunks
                for row, reset, f in ((rows[name], False, "eval-judge"), (rr, True, "eval-judge-reset")):
                    row.setdefault("judged", {})[str(c["seed"])] = ev(
                        f, lambda reset=reset: evaluate_model(model(), size["judge"], UNIT, reset=reset), task=size["judge"])
                wtask = {**size["judge"], "lengths": size["judge"]["lengths"].split(",")[0]}
                rows[name].setdefault("why", {})[str(c["seed"])] = ev(
                    "eval-judge-why", lambda: {k: evaluate_model(model(), wtask, UNIT, edit=f) for k, f in WHY.items()},
                    task=wtask, edits=list(WHY))
            rows[name]["state_bytes"] = ev("state-bytes", lambda: sum(
                b.Hkv * b.dh * b.dh * 4 for b in delta_memory.branches(model())), **key)
            ce.setdefault(name, []).append(ev("ce-carry", lambda: ce_curve(model(), size, carry=True), **key))
            ce.setdefault(f"{name}, memory reset per chunk", []).append(
                ev("ce-reset", lambda: ce_curve(model(), size, carry=False), **key))
            k = c["task_options"]["train_chunks"]     # why its CE trend: the memory never holding more than it trained on
            rows[name].setdefault("ce_bounded", {})[str(c["seed"])] = {"reset_every": k, "curve": ev(
                "ce-bounded", lambda: ce_curve(model(), size, True, k), **key, reset_every=k)}
            for row in (rows[name], rr):
                if row is not None:
                    marks(row, n_stale)
    by_label = {label: sm for (label, _), sm in zip(grid, sums) if "error" not in sm}
    for label, sm in by_label.items():             # each baseline's distance from FedAvg+LoRA's final adapters
        name, seed = label.rsplit(" s", 1)
        base, setting = name.rsplit(", ", 1) if ", " in name else (name, "")
        ref = by_label.get(f"FedAvg+LoRA, {setting} s{seed}")
        if ref is not None and base != "FedAvg+LoRA" and sm["config"]["method"] != "fednl":
            rows[name].setdefault("distance_from_fedavg_lora", []).append(common.derived(
                sm["bench"]["config"], "distance_from_fedavg_lora", lambda c: adapter_distance(c, ref), key=Path(ref["out"]).name))
    back, where = backbones.smollm2(False, 0), RUNS / size.get("runs", "")
    key = {"task": size["task"], "ce": [size["ce_tokens"], size["ce_bucket"]], "backbone": backbone_key()}
    for name, window in (("backbone, windowed", UNIT), ("backbone, full attention", 0)):
        n_stale = len(STALE)
        if window:
            ce[name] = [cached(where / "backbone-ce.json", key, lambda: ce_curve(back, size, carry=True))]
        cells = cached(where / f"backbone-{window}.json", key, lambda: evaluate_model(back, size["task"], window))
        judged = cached(where / f"backbone-{window}-judge.json", {**key, "task": size["judge"]},
                        lambda: evaluate_model(back, size["judge"], window))
        rows[name] = {"seeds": ["-"], "cells": [cells], "judged": {"-": judged}, "errors": [],
                      "note": "no training: one evaluation (seed-free)", "provenance": [{"at_hand": True, "evaluator": evaluator(), "backbone": backbone_key()}]}
        marks(rows[name], n_stale)
    cfg = back.config
    kv_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads) * 4
    lengths = [int(x) for x in size["task"]["lengths"].split(",")]
    return {"rows": rows, "retrieval": grid_retrieval(rows, lengths), "retrieval_judged": judged_retrieval(rows),
            "uplink_bytes": {name: r["up_bytes"] for name, r in rows.items() if r.get("up_bytes")},   # per client per round
            "recipe": recipe, "setting": {"size": size_name, **{k: size[k] for k in ("rounds", "local_steps")},
            "task": size["task"], "judge": size["judge"], "clients": 4, "per_round": 2, "batch": BASE["batch_size"], "lr": {"fednl": BASE["lr"], "lora-family": LORA_LR},
            "lr_decay": {"FedNL": "cosine", "others": "none"}},
            "ce": {"tokens": size["ce_tokens"], "bucket": size["ce_bucket"], "window": UNIT, "curves": ce,
                   "trend_last_vs_first": trends(ce)},
            "inference_bytes": {"kv_cache_fp32_per_token": kv_per_token,
                                "kv_cache_fp32": {str(L): kv_per_token * L * UNIT for L in lengths},
                                "fednl_state_fp32": next((r["state_bytes"] for r in rows.values() if "state_bytes" in r), None),
                                "window_kv_fp32": kv_per_token * UNIT}}


# --- report -------------------------------------------------------------------------------------
def markdown_recipe(r: dict) -> list[str]:
    L = ["## FedNL's recipe, measured (centralised, validation streams)\n",
         f"One client, {r['setting']['rounds']} rounds x {r['setting']['local_steps']} steps of 8 streams of "
         f"{r['setting']['task']['train_chunks'] * UNIT} tokens (a row's own length where its label names one), lr 1e-2 "
         "constant (AdamW; a row's own lr and schedule where its label names them), bf16 forwards, one seed; exact match on validation streams (the training split's haystack and "
         f"passkeys, other draws, {r['setting']['task']['test_per_cell']} a cell) at 4 and 8 chunks. Column 'outside' = "
         "the mean over depths outside the question's chunk, with its 95% Wilson interval from the validation sample "
         f"alone (it says nothing of the spread over seeds). {common.DAGGER}\n",
         "| recipe row | outside the question's chunk | 95% interval | cells (chunks/depth: exact match) | s / step |",
         "|---|---|---|---|---|"]
    n_cell = r["setting"]["task"]["test_per_cell"]
    for row in r["rows"]:
        if "error" in row:
            L.append(f"| {row['label']} | {why(row['error'], 80)} | | | |")
            continue
        cells = ", ".join(f"{k}: {v:.2f}" for k, v in row["cells"].items())
        out = [v for k, v in row["cells"].items() if not k.endswith("/1")]
        lo, hi = wilson(round(sum(out) * n_cell), len(out) * n_cell)
        out_mean = common.marked(f"{row['outside_question_chunk']:.3f}", row.get("provenance", []))
        L.append(f"| {row['label']} | {out_mean} | [{lo:.2f}, {hi:.2f}] | {cells} | {row['s_per_step']:.2f} |")
    if r["costs"]:                          # measured by a command that ran (--from-runs measures nothing)
        L += ["", "Cost of one training step (batch 8 x 256 tokens, memory in 17, 23, 29; median of 3, one thread, side by side):",
              "", "| path | s / step |", "|---|---|"] + [f"| {k} | {v:.2f} |" for k, v in r["costs"].items()]
    return L + [""]


def threshold_target(xs: list[float], thr: float) -> str:
    """A target 'every seed reaches thr': met when all of >= 3 seeds do, missed when none does, else not met on every
    seed (with how many did and, when the mean is below, by how much); the per-seed values follow."""
    n_ok = sum(x >= thr for x in xs)
    word = ("inconclusive (fewer than 3 seeds)" if len(xs) < 3 else "met" if n_ok == len(xs) else "missed" if n_ok == 0
            else f"not met on every seed ({n_ok} of {len(xs)}; the mean {np.mean(xs):.2f} is {thr - np.mean(xs):.2f} short)"
            if np.mean(xs) < thr else f"not met on every seed ({n_ok} of {len(xs)})")
    return f"{word} ({', '.join(f'{x:.2f}' for x in xs)})"


def markdown_why(row: dict) -> list[str]:
    """FedNL's judged streams at their shortest length per depth: as drawn, and edited (WHY), per seed; and what the
    edit changed, in the mean over depths and at the needle furthest back."""
    from lightfed.data.passkey import chunk_of
    why_ = {k: v for k, v in row.get("why", {}).items() if k in row.get("judged", {})}
    if not why_:
        return []
    cells = {seed: {"as drawn": row["judged"][seed], **v} for seed, v in why_.items()}
    ks = sorted(next(iter(next(iter(why_.values())).values())), key=lambda c: float(c.split("/")[1]))   # the edits' cells
    n = int(ks[0].split("/")[0])
    back = [n - 1 - chunk_of(n, float(c.split("/")[1])) for c in ks]     # chunks from the needle's to the question's
    mean = lambda cs: np.mean([cs[c] for c in ks])                       # noqa: E731
    L = [f"Why FedNL scores what it does at {n} chunks: the same streams of the targets' test set with the needle's chunk "
         "moved to just before the question's (the haystack chunks written after the needle are written before it "
         "instead; attention is local to a chunk, so only the memory's writes move), and with the needle's chunk alone "
         f"before the question (a 2-chunk stream, shorter than any trained on). Exact match per depth, FedNL's final "
         "models:", "", "| seed | streams | " + " | ".join(f"depth {c.split('/')[1]} ({b} back)" for c, b in zip(ks, back))
         + " | mean |", "|---|---|" + "---|" * (len(ks) + 1)]
    for seed, v in cells.items():
        for name, cs in v.items():
            L.append(f"| {seed} | {name} | " + " | ".join(f"{cs[c]:.3f}" for c in ks) + f" | {mean(cs):.3f} |")
    far = ks[int(np.argmax(back))]
    for name in list(WHY):
        d = [mean(v[name]) - mean(v["as drawn"]) for v in cells.values()]
        dfar = [v[name][far] - v["as drawn"][far] for v in cells.values()]
        L.append(f"\n{name}, against as drawn (per seed {', '.join(cells)}): the mean over depths "
                 f"{', '.join(f'{x:+.3f}' for x in d)}; at depth {far.split('/')[1]} ({max(back)} chunks back) "
                 f"{', '.join(f'{x:+.3f}' for x in dfar)}.")
    return L + [""]


def markdown_ce_bounded(rows: dict, curves: dict) -> list[str]:
    """Why a row's carried CE rises along the stream: the same model with its memory emptied every k chunks (its
    training streams' length: the memory never holds more than it trained on) beside carried and emptied every chunk,
    per seed: mean CE and trend (last bucket over first, minus 1)."""
    L = []
    for name, row in rows.items():
        b = row.get("ce_bounded", {})
        have = [(seed, row["seeds"].index(int(seed))) for seed in b if int(seed) in row["seeds"]]
        if not have or name not in curves:
            continue
        k = b[have[0][0]]["reset_every"]
        cell = lambda v: f"{np.mean(v):.3f}, {v[-1] / v[0] - 1:+.3f}"       # noqa: E731
        L += ["", f"Why the CE trend ({name}): its memory emptied every {k} chunks (its training streams' length, so it "
              "never holds more context than it trained on), beside carried and emptied every chunk; mean CE, trend:", "",
              f"| seed | carried | emptied every {k} chunks | emptied every chunk |", "|---|---|---|---|"]
        for seed, i in have:
            L.append(f"| {seed} | {cell(curves[name][i])} | {cell(b[seed]['curve'])} | "
                     f"{cell(curves[f'{name}, memory reset per chunk'][i])} |")
    return L


def markdown_retrieval(r: dict) -> list[str]:
    s = r["setting"]
    lens = sorted({k.split("/")[0] for row in r["rows"].values() for c in row["cells"] for k in c}, key=int)
    L = ["## Retrieval: the pass key outside the attention window (federated)\n",
         f"Task passkey ({s['task']}), {s['clients']} clients IID, {s['per_round']} a round, {s['rounds']} rounds x "
         f"{s['local_steps']} local steps of {s['batch']} streams; FedNL's recipe {r['recipe']}; lrs {s['lr']}, lr decay over the rounds "
         f"{s.get('lr_decay', 'none')} (FedNL, constant lr: the first grid, its lr the same in every round). Exact match of "
         "the 7 digits, mean ± sd over seeds, over the depths outside the question's chunk; the last column: the needle in "
         f"the question's own chunk. {common.DAGGER}\n",
         "| row | " + " | ".join(f"{L_} chunks ({int(L_) * UNIT} tok)" for L_ in lens) + " | in the question's chunk | seeds | lr, decay | up B / client / round |",
         "|---|" + "---|" * (len(lens) + 4)]
    for name, row in r["rows"].items():
        if not row["cells"]:
            L.append(f"| {name} | " + " | ".join("-" for _ in lens) + f" | - | {why(row['errors'][0]) if row['errors'] else 'failed'} | | |")
            continue
        per = [by_length(c) for c in row["cells"]]
        inq = [np.mean([v for k, v in c.items() if k.endswith("/1")]) for c in row["cells"]]
        prov = row.get("provenance", [])
        L.append(f"| {name} | " + " | ".join(common.marked(pm([p.get(L_) for p in per]), prov) for L_ in lens)
                 + f" | {common.marked(pm(inq), prov)} | {', '.join(map(str, row['seeds']))} | {row.get('lr', '-')} | "
                 + (f"{row['up_bytes']:,.0f} |" if row.get("up_bytes") else "- |"))
    base = [(n, row) for n, row in r["rows"].items() if row.get("internals") or row.get("distance_from_fedavg_lora")]
    if base:
        L += ["", "The baselines' own mechanisms (mean over clients, rounds and seeds): FedProx's and FedSSI's penalty share "
              "of the loss, FedALA's mean 1 - W (0: the global adapters taken whole), FedSSI's Omega scale; and the "
              "relative L2 distance of the final global adapters from FedAvg+LoRA's (same seed, same setting). A row "
              "whose every cell equals FedAvg+LoRA's is marked: it is one baseline with FedAvg+LoRA there.", "",
              "| baseline | internals | distance from FedAvg+LoRA | cells equal to FedAvg+LoRA's |", "|---|---|---|---|"]
        for n, row in base:
            ks = sorted({k for d in row.get("internals", []) for k in d})
            ins = ", ".join(f"{k} {np.mean([d[k] for d in row['internals'] if d.get(k) is not None]):.3g}" for k in ks
                            if any(d.get(k) is not None for d in row["internals"])) or "-"
            dist = pm(row.get("distance_from_fedavg_lora", []))
            ref = r["rows"].get("FedAvg+LoRA, " + n.rsplit(", ", 1)[1]) if ", " in n else None
            same = ("yes (coincides)" if ref and ref["cells"] and ref["cells"] == row["cells"] else "no") if ref else "-"
            L.append(f"| {n} | {ins} | {dist} | {same} |")
    ib = r["inference_bytes"]
    state = (f"{ib['fednl_state_fp32']:,} B at every length" if ib["fednl_state_fp32"] is not None   # None: no FedNL row ran
             else "- (no FedNL row in this grid)")
    L += ["", f"Inference memory held for the context (exact bytes, fp32): FedNL's memory state {state}, plus the "
          f"{UNIT}-token window's KV cache ({ib['window_kv_fp32']:,} B); full attention's KV cache: "
          + ", ".join(f"{int(k) * UNIT} tokens {v / 2**20:.1f} MB" for k, v in ib["kv_cache_fp32"].items()) + ".", ""]
    ret = r["retrieval"]
    jd = {k: v for k, v in r.get("retrieval_judged", {}).items() if k in r["rows"]}
    if jd:
        j, jl = s["judge"], s["judge"]["lengths"].split(",")
        n = len(j["depths"].split(",")) * j["test_per_cell"]
        L += [f"The targets' own test set: {n} streams a length ({j['test_per_cell']} at each of the depths {j['depths']}, "
              f"all outside the question's chunk; one stream {100 / n:.2f} pp), other draws of the evaluation split "
              f"(data_seed {j['data_seed']}), the rows' final models. Exact match per seed:", "",
              "| row | " + " | ".join(f"{L_} chunks" for L_ in jl) + " | seeds |", "|---|" + "---|" * (len(jl) + 1)]
        for name, v in jd.items():
            seeds = [x for x in r["rows"][name]["seeds"] if str(x) in r["rows"][name]["judged"]]
            L.append(f"| {name} | " + " | ".join(", ".join(f"{x:.3f}" for x in v[L_]) for L_ in jl)
                     + f" | {', '.join(map(str, seeds))} |")
        L += [""] + markdown_why(r["rows"].get("FedNL", {}))
    if "FedNL" in ret:
        f = ret["FedNL"]
        # the thresholds are decided on the targets' own test set where the FedNL row has it, else on the grid's cells
        src, on = ((jd, "the targets' test set") if "FedNL" in jd
                   else (ret, f"the grid's cells ({s['task']['test_per_cell']} streams each)"))
        def tgt(L_, thr):
            return threshold_target(src["FedNL"].get(str(L_), []), thr)
        L += [f"Targets (the thresholds on {on}; the comparisons with other rows on the grid's cells, which every row "
              "has, and on the targets' test set where both rows have it):", "", "| target | verdict (per seed) |", "|---|---|",
              f"| FedNL >= 0.9 at 4 chunks | {tgt(4, 0.9)} |", f"| FedNL >= 0.5 at 16 chunks | {tgt(16, 0.5)} |"]
        reset = src.get("FedNL, memory reset per chunk", {})
        if reset:
            xs = [x for v in reset.values() for x in v]
            n = min(len(v) for v in reset.values())
            L.append(f"| the reset control <= 0.1 at every length | "
                     f"{('met' if max(xs) <= 0.1 else 'missed') if n >= 3 else f'inconclusive ({n} seed(s))'} (max {max(xs):.2f}) |")
        full, jfull = ret.get("backbone, full attention"), jd.get("backbone, full attention") if "FedNL" in jd else None
        if full:
            for L_ in sorted(f, key=int):
                L.append(f"| FedNL vs full attention at {int(L_) * UNIT} tokens | {np.mean(f[L_]):.2f} vs {full[L_][0]:.2f} "
                         f"(memory {ib['fednl_state_fp32'] / 2**20:.2f} MB vs KV {ib['kv_cache_fp32'][L_] / 2**20:.1f} MB) |")
        for L_ in sorted(jfull or {}, key=int):     # the same comparison on the targets' test set
            L.append(f"| FedNL vs full attention at {int(L_) * UNIT} tokens, the targets' test set | "
                     f"{np.mean(jd['FedNL'][L_]):.3f} vs {jfull[L_][0]:.3f} |")
        for other in ("FedNL, constant lr", "FedAvg+LoRA, windowed", "FedAvg+LoRA, full attention"):
            if other in ret:
                for L_ in sorted(f, key=int):
                    if len(ret[other].get(L_, [])) >= 3:
                        L.append(f"| FedNL above {other} at {L_} chunks | {verdict(f[L_], ret[other][L_], False)} |")
    ce = r.get("ce")
    if ce and ce["curves"]:
        tr = ce["trend_last_vs_first"]
        L += ["", f"Next-token CE along {ce['tokens']:,} tokens of Austen's held-out text (never a haystack in training), "
              f"attention local to {ce['window']}-token chunks, the passkey-trained models; trend = CE of the last "
              f"{ce['bucket']}-token bucket over the first's, minus 1 (negative: the CE falls as the context grows).", "",
              "| model | mean CE (per seed) | trend last vs first (per seed) |", "|---|---|---|"]
        for k, vs in ce["curves"].items():
            L.append(f"| {k} | {', '.join(f'{np.mean(v):.3f}' for v in vs)} | {', '.join(f'{t:+.3f}' for t in tr[k])} |")
        for nm in (n for n, *_ in FEDNL_ROWS if n in CONTROLLED):
            a_, b_ = tr.get(nm, []), tr.get(f"{nm}, memory reset per chunk", [])
            if a_ and b_:
                ok = all(x < y for x, y in zip(a_, b_))
                L += ["", f"Target, the carried memory's CE trend below the reset model's on every seed ({nm}): "
                      f"{('met' if ok else 'missed') if len(a_) >= 3 else f'inconclusive ({len(a_)} seed(s))'} "
                      f"({', '.join(f'{x:+.3f} vs {y:+.3f}' for x, y in zip(a_, b_))})."]
        L += markdown_ce_bounded(r["rows"], ce["curves"])
    return L + ["", "![depth x length heat maps and exact match against inference memory](fednl_claims_retrieval.png)", ""]


def annotate(ax, grid) -> None:
    """Each cell's value written on a 0..1 heat map (NaN: left blank)."""
    for (i, j), v in np.ndenumerate(grid):
        if not np.isnan(v):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6, color="white" if v < 0.5 else "black")


def plot_retrieval(r: dict, path) -> None:
    """Depth x length heat maps per row (mean over seeds) and exact match against inference memory."""
    plt = pyplot()
    rows = {k: v for k, v in r["rows"].items() if v["cells"]}
    lens = sorted({int(k.split("/")[0]) for v in rows.values() for c in v["cells"] for k in c})
    deps = sorted({float(k.split("/")[1]) for v in rows.values() for c in v["cells"] for k in c})
    ncol = 4
    ce = r.get("ce") or {}
    extra = 2 if ce.get("curves") else 1
    nrow = -(-(len(rows) + extra) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(3.6 * ncol, 3.2 * nrow), squeeze=False)
    axes = axes.ravel()
    for ax in axes[len(rows) + extra:]:
        ax.axis("off")
    for ax, (name, v) in zip(axes, rows.items()):
        grid = np.array([[np.mean([c.get(f"{L}/{d:g}", np.nan) for c in v["cells"]]) for L in lens] for d in deps])
        ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto", origin="lower")
        ax.set_xticks(range(len(lens)), [str(L * UNIT) for L in lens], fontsize=7)
        ax.set_yticks(range(len(deps)), [f"{d:g}" for d in deps], fontsize=7)
        annotate(ax, grid)
        ax.set_title(f"{name} (n={len(v['cells'])})", fontsize=7)
        ax.set_xlabel("tokens", fontsize=7)
    axes[0].set_ylabel("needle depth (1: the question's chunk)", fontsize=7)
    ax = axes[len(rows)]
    ib = r["inference_bytes"]
    for i, (name, v) in enumerate(rows.items()):
        per = [by_length(c) for c in v["cells"]]
        ys = [np.mean([p[str(L)] for p in per]) for L in lens]
        if name == "backbone, full attention" or "full attention" in name:
            xs = [ib["kv_cache_fp32"][str(L)] / 2**20 for L in lens]
        elif name.startswith("FedNL") and ib.get("fednl_state_fp32"):
            xs = [(ib["fednl_state_fp32"] + ib["window_kv_fp32"]) / 2**20] * len(lens)
        else:
            xs = [ib["window_kv_fp32"] / 2**20] * len(lens)
        ax.plot(xs, ys, "o-", color=plt.cm.tab20(i % 20), label=name)     # 20 colours: a row each
        for x, y, L in zip(xs, ys, lens):
            ax.annotate(str(L * UNIT), (x, y), fontsize=5)
    ax.set_xscale("log")
    ax.set(xlabel="inference memory for the context (MB, fp32)", ylabel="exact match, needles outside the question's chunk")
    spare = iter(axes[len(rows) + extra:])      # the grid's unused cells hold the legends, off the data

    def legend(ax, title):
        where = next(spare, None)
        if where is None:
            ax.legend(fontsize=5)
        else:
            where.legend(*ax.get_legend_handles_labels(), fontsize=6, loc="upper left", title=title, title_fontsize=7)
    legend(ax, "exact match vs memory")
    if extra == 2:
        ax = axes[len(rows) + 1]
        for i, (name, vs) in enumerate(ce["curves"].items()):
            for j, v in enumerate(vs):
                xs = [(k + 1) * ce["bucket"] for k in range(len(v))]
                ax.plot(xs, v, "-", color=f"C{i}", alpha=0.8, label=name if j == 0 else None)
        ax.set(xlabel="position in the stream (tokens)", ylabel="next-token CE (per bucket)")
        ax.set_title(f"CE along {ce['tokens']:,} tokens, {ce['window']}-token chunks", fontsize=7)
        legend(ax, "CE along the stream")
    save(fig, path, 110)


# --- templates: the pass key and six RULER templates, a client each; an unseen template ---------------------------
TUNIT = 128     # RULER's questions need a 128-token chunk (the multi-query question and answer: up to 116 tokens)
# depths: all outside the question's chunk (0.9: the chunk before it), which cannot hold multiquery's question
# and answer beside its needle (the task refuses depth 1 for it and single_3). Lengths 4 and 8 chunks: evaluating the
# seven templates takes 6-12 min on a busy core (16 chunks would double it), and a run evaluates twice.
TEMPLATES_TASK = {"templates": "all", "unit": TUNIT, "window": TUNIT, "train_chunks": 4, "train_size": 64,
                  "lengths": "4,8", "depths": "0,0.5,0.9", "test_per_cell": 20}
TEMPLATES_SIZES = {
    "cpu": {"rounds": 10, "local_steps": 15, "per_round": 3, "task": TEMPLATES_TASK},     # 450 steps of 512 tokens
    "smoke": {"rounds": 1, "local_steps": 1, "per_round": 2, "runs": "smoke",
              "task": {**TEMPLATES_TASK, "train_size": 2, "lengths": "4", "depths": "0,0.5", "test_per_cell": 1}},
}
UNSEEN = "single_3"     # the held-out template: clients hold the templates in sorted order (partition.by_domain)


def templates_grid(size: dict, seeds, recipe: dict, rows: set[str] | None = None) -> list[tuple[str, dict]]:
    """FedNL on the seven templates (one client each) and with UNSEEN's client held out; FedALA as its paper ran it
    (full attention within the backbone's context), over `seeds`."""
    from lightfed.tasks import passkey
    names = sorted(passkey.TEMPLATES7)
    fed = {**BASE, "clients": len(names), "fraction": size["per_round"] / len(names), "partition": "domain",
           "rounds": size["rounds"], "local_steps": size["local_steps"], "eval_every": size["rounds"]}
    g = []
    for seed in seeds:
        for name, c in (("FedNL", {"method": "fednl", "lr_decay": "cosine", "method_options": recipe,
                                   "task_options": size["task"]}),
                        (f"FedNL, {UNSEEN} unseen", {"method": "fednl", "lr_decay": "cosine", "method_options": recipe,
                                                      "holdout": str(names.index(UNSEEN)), "task_options": size["task"]}),
                        ("FedALA (p = every layer), full attention", {"method": "fedala", "lr": LORA_LR, "method_options": {"top": 0},
                                                                      "task_options": {**size["task"], "window": 0}})):
            if rows is None or name in rows:
                g.append((f"{name} s{seed}", {**fed, **c, "seed": seed}))
    return common.placed(g)


def template_scores(model, task_opts: dict, window: int, reset: bool = False, edit=None) -> tuple[dict, dict]:
    """tasks/passkey.by_cell in bf16 on the CPU: ({template: {cell: exact match}}, {template: {cell: golds found}})."""
    from lightfed import device
    from lightfed.models import backbones
    from lightfed.tasks import passkey
    tok = backbones.smollm2_tokenizer()
    tok.model_max_length = 10**9
    with device.using("cpu", "bf16"):
        return passkey.by_cell(model, passkey.Options(**task_opts), tok, window, reset, edit)


def template_cells(model, task_opts: dict, window: int, reset: bool = False, golds: bool = False) -> dict:
    """{template: {cell: exact match}} (golds: the golds found instead); see template_scores."""
    return template_scores(model, task_opts, window, reset)[golds]


def part_templates(size_name: str, seeds, workers: int, recipe: dict, rows: set[str] | None = None,
                   from_runs: bool = False, golds: bool = False) -> dict:
    """Rows: FedNL (seven clients, a template each), its memory reset per chunk (the same models), FedNL with UNSEEN's
    client never trained, the frozen backbone windowed and with full attention, FedALA with full attention.
    Each: {template: {cell: exact match}} per seed; golds: also the golds found ("gold_cells", kept beside each model;
    from the same forward as exact match where that is not on disk yet, else one more)."""
    import torch
    from lightfed.models import backbones
    global REPORT_ONLY
    REPORT_ONLY = from_runs
    torch.set_num_threads(workers)
    size = TEMPLATES_SIZES[size_name]
    grid = templates_grid(size, seeds, recipe)
    sums = reuse_or_run(grid, workers, from_runs, only=None if rows is None else
                        {label for label, _ in grid if label.rsplit(" s", 1)[0] in rows})
    out: dict[str, dict] = {}
    for (label, c), s in zip(grid, sums):
        name = label.rsplit(" s", 1)[0]
        r = add_run(out, name, c, s, lambda s: s["cells"])
        if r is None:
            continue
        r.setdefault("up_bytes", s["bytes"]["up_per_client_round"])
        n_stale = len(STALE)
        if golds:
            r.setdefault("gold_cells", []).append(evaluated(c, "eval-golds", lambda c=c: template_cells(
                final_model(c), size["task"], c["task_options"]["window"], golds=True), task=size["task"]))
        if name == "FedNL":             # exact match and golds found from one pass, both kept
            got = evaluated(c, "eval-reset", lambda c=c: template_scores(final_model(c), size["task"], TUNIT, reset=True),
                            task=size["task"])
            rr = out.setdefault("FedNL, memory reset per chunk", {"seeds": [], "cells": [], "errors": []})
            rr["seeds"].append(c["seed"])
            rr["cells"].append(got[0])
            if golds:
                rr.setdefault("gold_cells", []).append(got[1])
            rr.setdefault("provenance", []).extend(r.get("provenance", [])[-1:])   # the same run's
            marks(rr, n_stale)
        marks(r, n_stale)
    back, where = backbones.smollm2(False, 0), RUNS / size.get("runs", "") / "templates"
    key = {"task": size["task"], "backbone": backbone_key()}
    for name, window in (("backbone, windowed", TUNIT), ("backbone, full attention", 0)):
        n_stale = len(STALE)
        got = cached_pair((where / f"backbone-{window}.json", where / f"backbone-golds-{window}.json" if golds else None),
                          key, lambda: template_scores(back, size["task"], window))
        out[name] = {"seeds": ["-"], "cells": [got[0]], "errors": [], "note": "no training: one evaluation (seed-free)",
                     "provenance": [{"at_hand": True, "evaluator": evaluator(), "backbone": backbone_key()}]}
        marks(out[name], n_stale)
        if golds:
            out[name]["gold_cells"] = [got[1]]
    # {row: {template: [per seed: mean exact match over the lengths and depths outside the question's chunk]}}
    def summary(k):
        return {name: {t: [float(np.mean(list(by_length(c[t]).values()))) for c in r[k]] for t in r[k][0]}
                for name, r in out.items() if r.get(k)}
    return {"rows": out, "by_template": summary("cells"), **({"by_template_golds": summary("gold_cells")} if golds else {}),
            "unseen": UNSEEN, "recipe": recipe, "setting": {"size": size_name, **size, "lr": {
        "fednl": BASE["lr"], "fedala": LORA_LR}, "lr_decay": {"FedNL": "cosine", "FedALA": "none"}}}


def _templates_table(r: dict, ts: list[str], by: str, cells: str) -> list[str]:
    L = ["| row | " + " | ".join(ts) + " | mean over templates | seeds |", "|---|" + "---|" * (len(ts) + 2)]
    for name, row in r["rows"].items():
        if not row.get(cells):
            gone = why(row["errors"][0]) if row["errors"] else "failed" if cells == "cells" else "not evaluated"
            L.append(f"| {name} | " + " | ".join("-" for _ in ts) + f" | - | {gone} |")
            continue
        bt = r[by][name]
        mean = [float(np.mean([bt[t][i] for t in ts if t in bt])) for i in range(len(row[cells]))]
        prov = row.get("provenance", [])
        L.append(f"| {name} | " + " | ".join(common.marked(pm(bt.get(t, [])), prov) for t in ts)
                 + f" | {common.marked(pm(mean), prov)} | "
                 f"{', '.join(map(str, row['seeds']))} |")
    return L


def markdown_templates(r: dict) -> list[str]:
    s = r["setting"]
    ts = sorted({t for row in r["by_template"].values() for t in row})
    L = ["## Seven templates at 128-token chunks: a client each, one never trained\n",
         f"Task passkey with templates = all ({s['task']}): the pass key and six RULER templates (niah.md; multikey_3 left "
         f"out: its question and answer take up to 137 tokens, more than a chunk), one client each ({len(ts)} clients, "
         f"{s['per_round']} a round, {s['rounds']} rounds x {s['local_steps']} local steps of {BASE['batch_size']} streams); "
         f"lrs {s['lr']}, lr decay {s['lr_decay']}. Exact match of the answer (teacher forced), mean over the lengths and the "
         f"depths outside the question's chunk, mean ± sd over seeds. '{r['unseen']}' is the template whose client the "
         f"unseen run never trains. {common.DAGGER}\n",
         *_templates_table(r, ts, "by_template", "cells")]
    if "by_template_golds" in r:
        L += ["", "Golds found (RULER's string-match-all, teacher forced: the fraction of a stream's gold values whose every "
                  "token is the argmax; it differs from exact match only where a stream asks several values: multivalue "
                  "and multiquery ask 4, whose golds other than the first lie anywhere, the question's chunk included, so a "
                  "window alone can find some):", "", *_templates_table(r, ts, "by_template_golds", "gold_cells")]
    bt = r["by_template"]
    un = f"FedNL, {r['unseen']} unseen"
    if un in bt and r["unseen"] in bt[un]:
        seen = [float(np.mean([bt[un][t][i] for t in ts if t != r["unseen"]])) for i in range(len(bt[un][r["unseen"]]))]
        L += ["", f"The unseen template beside the seen ones (the run that never trains {r['unseen']}): "
              f"{pm(bt[un][r['unseen']])} on it vs {pm(seen)} over the six it trained on."]
    if "FedNL" in bt and "FedALA (p = every layer), full attention" in bt:
        a = [float(np.mean([bt["FedNL"][t][i] for t in ts])) for i in range(len(bt["FedNL"][ts[0]]))]
        b = [float(np.mean([bt["FedALA (p = every layer), full attention"][t][i] for t in ts]))
             for i in range(len(bt["FedALA (p = every layer), full attention"][ts[0]]))]
        L += ["", f"FedNL's mean over templates (attention local to {TUNIT}-token chunks, memory carried) against FedALA's "
              f"(full attention over the whole stream, its KV cache growing with it): {pm(a)} vs {pm(b)}; "
              f"FedNL above FedALA: {verdict(a, b, False) if min(len(a), len(b)) >= 3 else 'inconclusive (fewer than 3 seeds)'}."]
        steps = s["rounds"] * s["per_round"] / len(ts) * s["local_steps"]
        L += ["", f"How much FedNL trained on each template here (a likely cause of its low scores, not isolated by a run): "
              f"each template's client about {steps:.0f} local steps over the run ({s['rounds']} rounds x {s['per_round']} "
              f"of {len(ts)} clients a round x {s['local_steps']} steps), each round averaging {s['per_round']} clients' "
              "updates, each on another template; in the Retrieval part, where FedNL reaches about 0.9 at 4 chunks, "
              "every client trains the pass key in every round."]
    return L + [""]


def plot_templates(r: dict, path) -> None:
    """Exact match outside the question's chunk, per row (mean over seeds) and template."""
    plt = pyplot()
    bt = r["by_template"]
    ts = sorted({t for row in bt.values() for t in row})
    names = list(bt)
    grid = np.array([[np.mean(bt[n][t]) if bt[n].get(t) else np.nan for t in ts] for n in names])
    fig, ax = plt.subplots(figsize=(1.1 * len(ts) + 3, 0.5 * len(names) + 1.5))
    ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto")
    ax.set_xticks(range(len(ts)), [t + (" (held out in\nthe unseen run)" if t == r["unseen"] else "") for t in ts], rotation=30, fontsize=7, ha="right")
    ax.set_yticks(range(len(names)), names, fontsize=7)
    annotate(ax, grid)
    ax.set_title(f"exact match outside the question's chunk ({TUNIT}-token chunks; mean over lengths, depths, seeds)", fontsize=8)
    save(fig, path, 110)
