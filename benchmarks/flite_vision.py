"""FLITE at its paper's scale in vision: a GroupNorm ResNet-18 that lightfed pretrains itself, 1,280 latents.

    python benchmarks/flite_vision.py --calibrate        # each method's lr on validation images (one seed, IID)
    python benchmarks/flite_vision.py                    # the grid: 3 seeds of the claims' rows, one of the Pareto's
    python benchmarks/flite_vision.py --quick            # every row on the tiny twin (minutes)
    python benchmarks/flite_vision.py --rows flite_r16g,fedavg --partitions iid --name flite_vision_rank   # some rows

Setting: task fmnist, arch resnet18 (models/vision.GNResNet18: 11.2M weights, 20 convolutions; pretrained by
`lightfed pretrain fmnist` on classes 0-4 of training images 0-29,999, a new 10-way head), 6,000 training images
from 30,000-59,999, 2,000 official test images (one image = 0.05 pp); 10 clients, half a round, 20 rounds x 10
local steps of 32, the lr decayed over the rounds (cosine), IID and Dirichlet(0.1); forwards in bf16 (autocast; trainable weights and messages fp32) for
every row alike. FLITE in the paper's form: r = 8 matrix latents on each of the 20 convolutions (20 x 64 = 1,280),
the frozen orthogonal head, int4 or fp32 latents, or a trained head (fp32, at its own lr: head_lr); lightfed's
int4 upload of the round's move (delta = true) beside the paper's upload of z; against
full-weight FedAvg (fp32, int4), FedAvg+LoRA (PEFT's conv LoRA, r = 8 on every block's conv1 / conv2, head
trained), top-k 1% and PowerSGD rank 4 (error feedback); and, for reference, what the base's frozen features allow:
the probe (a closed-form head from one round of class statistics).
Every lr is chosen on validation images (300 training images the run never trains on: task option validation),
never on the test set (--calibrate; results flite_vision_calibrate.*).
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
from common import meta, ms, verdict, write  # noqa: E402

TASK = {"arch": "resnet18", "train_size": 6000, "test_size": 2000}
# every row decays its lr over the rounds (cosine): the model scored is the last round's, which then moves little
# (FedNL's passkey seed 2 went from 0.44 to 0.93 with it; a constant lr let FLITE peak at round 5 and drift)
BASE = {"task": "fmnist", "clients": 10, "fraction": 0.5, "rounds": 20, "local_steps": 10, "batch_size": 32, "lr_decay": "cosine",
        "eval_every": 5, "dtype": "bf16", "progress": False}
QUICK = {"rounds": 2, "local_steps": 2, "eval_every": 2, "task_options": {"tiny": True, "train_size": 200, "test_size": 100}}
PAPER = {"r": 8, "head": "orthogonal", "codec": "int4"}            # 20 convolutions x 8^2 = 1,280 latents
# (key, label, method, method options, task options, partitions, seeds: "claim" = 3, "pareto" = the first; the Pareto
# plot's compressors and LoRA run 3 seeds too, so their points carry a range)
ROWS = [
    ("flite", "FLITE (1,280 int4 latents, frozen orthogonal head)", "flite", PAPER, {}, ["iid", "dirichlet:0.1"], "claim"),
    ("flite_fp32", "FLITE, fp32 latents", "flite", {**PAPER, "codec": "fp32"}, {}, ["iid", "dirichlet:0.1"], "claim"),
    # lightfed's int4 upload: the round's move z_k - z^t, not z_k (the down link stays int4 z); the same lr as FLITE's,
    # since it changes only how the upload rounds (with fp32 latents the two are the same run)
    ("flite_delta", "FLITE, int4 latents uploaded as the round's move (lightfed's delta)", "flite", {**PAPER, "delta": True},
     {}, ["iid"], "claim"),
    # what averaging costs (issue 47, item 1): the fp32 row with no federation, one client holding all 6,000 images for
    # the federated run's 1,000 client steps (20 rounds x 50), at the same lr (ROW_RUN)
    ("flite_central", "FLITE, fp32 latents, centralised (1 client, all images, the same 1,000 steps: no averaging)", "flite",
     {**PAPER, "codec": "fp32"}, {}, ["iid"], "claim"),
    # the trained head travels as fp32 (int4 on a head is int4 on absolute weights: its loss swung 1.5-2.2 by round,
    # and at head lr 1e-2 reached 30-40): compare it with the fp32-latent row, which differs from it by the head only
    # under Dirichlet(0.1) beside flite_fp32 (the same map, the head frozen): does the frozen head, which FedAvg's clients
    # retrain, cost the latent map its skew loss (issue 47)?
    ("flite_head", "FLITE, trained head (fp32 latents and head)", "flite", {**PAPER, "head": "trainable", "codec": "fp32"}, {},
     ["iid", "dirichlet:0.1"], "claim"),
    ("flite_scratch", "FLITE from scratch (random ResNet-18)", "flite", PAPER, {"pretrained": False}, ["iid"], "claim"),
    # issue 47's question: does the frozen orthogonal head's geometry serve FLITE when the base grew in it? The base is
    # pretrained under that head (`lightfed pretrain fmnist --head orthogonal`: its rows for classes 0-4), and FLITE
    # keeps it frozen (head = keep: all 10 rows now), its lr chosen on validation images like every row's
    ("flite_obase", "FLITE (1,280 int4 latents) on a base pretrained under the frozen orthogonal head", "flite",
     {**PAPER, "head": "keep"}, {"base_head": "orthogonal"}, ["iid"], "claim"),
    # rank bought with bits: r = 16 is 5,120 latents; int4 with a float32 scale per 32 (int4g) rounds none to 0, and
    # at 0.625 B a latent keeps the upload >= 8,000x below FedAvg's up to r = 20
    ("flite_r16g", "FLITE r = 16 (5,120 latents, int4 with a scale per 32), frozen orthogonal head", "flite",
     {**PAPER, "r": 16, "codec": "int4g"}, {}, ["iid", "dirichlet:0.1"], "claim"),
    # rank's price and its ceiling: r = 20 (8,000 latents) is the largest square map whose int4g upload stays >= 8,000x
    # below FedAvg's; r = 32 (20,480) gives that up to say what rank alone can buy
    ("flite_r20g", "FLITE r = 20 (8,000 latents, int4g), frozen orthogonal head", "flite",
     {**PAPER, "r": 20, "codec": "int4g"}, {}, ["iid"], "claim"),
    # what averaging costs r = 20 is the averaging's in z-space (clients agree on 0.73 of their moves there, FedAvg's
    # weights on 0.92): a server step that moves server_lr times the clients' mean move (the lr pair: z's, the server's;
    # (0.3, 1) is flite_r20g's lr 0.3 validation run at this code: every client's loss of every round bitwise the same)
    ("flite_r20g_srv", "FLITE r = 20 int4g, the server stepping server_lr x the clients' mean move", "flite",
     {**PAPER, "r": 20, "codec": "int4g"}, {}, ["iid"], "claim"),
    # Validation refused the server's step (0.80 at server_lr 1, 0.76 at 2, 0.53 at 4; at z's lr 0.1 and server_lr 4:
    # 0.49): the mean move carries noise that a larger step amplifies. A client's absolute int4g upload rounds z itself
    # (|z| grows to ~50 while a late round moves it little), so the move arrives as codes of z: the round's move uploaded
    # instead (lightfed's delta, +7.1 pp on the paper form) keeps its own scale, at the same bytes
    ("flite_r20g_delta", "FLITE r = 20 int4g, the round's move uploaded (delta)", "flite",
     {**PAPER, "r": 20, "codec": "int4g", "delta": True}, {}, ["iid"], "claim"),
    ("flite_r32g", "FLITE r = 32 (20,480 latents, int4g), frozen orthogonal head", "flite",
     {**PAPER, "r": 32, "codec": "int4g"}, {}, ["iid"], "claim"),
    # what averaging costs r = 16 (the codec kept): one client, all images, the federated run's 1,000 client steps
    ("flite_r16g_central", "FLITE r = 16 int4g, centralised (1 client, all images, the same 1,000 steps: no averaging)",
     "flite", {**PAPER, "r": 16, "codec": "int4g"}, {}, ["iid"], "claim"),
    # Under Dirichlet(0.1) r = 16 loses whole classes, the pretrained 0-4 most (per_class): a fresh frozen head makes the
    # map relearn what the base already separates. The head here is the probe's (a closed form from one round of class
    # statistics summed over every client, so label skew does not bias it; its bytes are counted in the run's init),
    # then frozen (head = keep) while z trains
    ("flite_r16g_probe", "FLITE r = 16 int4g on a probed head (closed form from one round of pooled class statistics, "
     "then frozen)", "flite", {**PAPER, "r": 16, "codec": "int4g", "head": "keep"}, {}, ["iid", "dirichlet:0.1"], "claim"),
    # a map that fine-tunes: a unit of z moves each convolution by its own weight's rms (full fine-tuning moves ~0.1x)
    ("flite_wscale", "FLITE's paper form, the map scaled to each weight (scale = weight)", "flite",
     {**PAPER, "scale": "weight"}, {}, ["iid"], "claim"),
    ("fedavg", "FedAvg fp32", "fedavg", {}, {}, ["iid", "dirichlet:0.1"], "claim"),
    # is the probed head FLITE's edge or everyone's? FedAvg fp32 from the same probe run (LP-then-FT: every weight,
    # the head too, trained from it), its lr chosen on the same skewed clients
    ("fedavg_probe", "FedAvg fp32 from the probed head (LP-then-FT)", "fedavg", {}, {}, ["dirichlet:0.1"], "claim"),
    # the same question of FedAvg: one client, all images, 1,000 steps. Federated, 5 clients a round average 10 steps
    # each, so a run makes 200 sequential steps of progress to the central row's 1,000: is the loss FLITE's, or every
    # method's under this protocol? At FedAvg's federated lr (1e-4) the central run fell to 0.569 (seed 0: its loss
    # rose from 2.5 to 5.5 in round 2): an lr chosen for averaged steps does not carry to sequential ones, so this row
    # takes its own, chosen on validation images in its own setting (ROW_RUN)
    ("fedavg_central", "FedAvg fp32, centralised (1 client, all images, the same 1,000 steps: no averaging)", "fedavg", {}, {},
     ["iid"], "claim"),
    ("fedavg_int4", "FedAvg int4", "fedavg", {"codec": "int4"}, {}, ["iid"], "claim"),
    ("lora", "FedAvg+LoRA (conv, r=8)", "lora", {}, {}, ["iid"], "claim"),
    ("topk", "top-k 1% (EF)", "topk", {"ratio": 0.01}, {}, ["iid"], "claim"),
    ("powersgd", "PowerSGD r4 (EF)", "powersgd", {"rank": 4}, {}, ["iid"], "claim"),
    ("probe", "the base's features, closed-form head (probe, 1 round; what a frozen body allows)", "probe", {}, {}, ["iid"], "pareto"),
]
# a row's run settings, BASE's otherwise
ROW_RUN = {k: {"clients": 1, "fraction": 1.0, "local_steps": 50} for k in ("flite_central", "flite_r16g_central", "fedavg_central")}
ONCE = {"rounds": 1, "fraction": 1.0, "eval_every": 1, "lr_decay": "none"}   # the probe: one round of every client's statistics
LR_OF = {"flite": "flite", "flite_fp32": "flite", "flite_delta": "flite", "flite_central": "flite", "flite_head": "flite_head", "flite_scratch": "flite", "flite_obase": "flite_obase",
         "flite_r16g": "flite_r16g", "flite_r16g_central": "flite_r16g", "flite_r20g": "flite_r20g", "flite_r20g_srv": "flite_r20g_srv",
         "flite_r20g_delta": "flite_r20g_delta", "flite_r32g": "flite_r32g",
         "flite_r16g_probe": "flite_r16g_probe",
         "flite_wscale": "flite_wscale",
         "fedavg": "fedavg", "fedavg_probe": "fedavg_probe", "fedavg_central": "fedavg_central",
         "fedavg_int4": "fedavg", "topk": "fedavg", "powersgd": "fedavg", "lora": "lora", "probe": None}
# lr = (z's lr, a second step's): the trained head's head_lr (a latent and weights want steps far apart), the server's
PAIRED = {"flite_head": "head_lr", "flite_r20g_srv": "server_lr"}
# Each kind's lr: the best on validation images at the grid's horizon; a sweep whose best sat at an edge was extended
# past it (how each grew, and why: docs/results.md, "How the vision sweeps grew"). "<kind>@<partition>" sweeps on that
# partition's clients, and the grid's cells of that partition take its lr (IID's otherwise).
SWEEP = {"flite": [1e-2, 3e-2, 1e-1, 3e-1, 1.0, 3.0, 10.0, 30.0], "flite_obase": [0.1, 0.3, 1.0],
         "flite_r16g": [3e-2, 0.1, 0.3, 1.0, 3.0, 10.0], "flite_r20g": [0.1, 0.3, 1.0], "flite_r32g": [0.1, 0.3, 1.0],
         "flite_r16g_probe": [0.1, 0.3, 1.0], "flite_r16g_probe@dirichlet:0.1": [3e-3, 0.01, 0.03, 0.1],
         "flite_wscale": [3e-3, 1e-2, 3e-2, 1e-1, 0.3, 1.0, 3.0, 10.0], "fedavg": [1e-5, 3e-5, 1e-4, 3e-4], "lora": [3e-4, 1e-3, 3e-3],
         "flite_r16g@dirichlet:0.1": [3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0], "fedavg@dirichlet:0.1": [1e-5, 3e-5, 1e-4, 3e-4],
         "fedavg_probe@dirichlet:0.1": [3e-5, 1e-4, 3e-4], "fedavg_central": [3e-6, 1e-5, 3e-5, 1e-4],
         "flite_r20g_srv": [(0.3, 2.0), (0.3, 4.0), (0.1, 4.0), (0.3, 1.0), (0.3, 0.5)], "flite_r20g_delta": [0.1, 0.3, 1.0],
         "flite_head": [(3e-1, 1e-3), (1e-1, 1e-3), (1.0, 1e-3), (3e-1, 3e-3), (3e-1, 3e-4), (3e-1, 1e-4), (1e-1, 3e-4)]}
CALIB = {"rounds": 20, "eval_every": 20, "task_options": {**TASK, "validation": True, "test_size": 300}}
CHANCE = 0.1


def set_lr(c: dict, key: str, lr) -> dict:
    """c with the row's lr: a float, or (z's lr, the second step's) for PAIRED rows."""
    if key in PAIRED:
        return {**c, "lr": lr[0], "method_options": {**c["method_options"], PAIRED[key]: lr[1]}}
    return {**c, "lr": lr}


def run_lr(c: dict):
    """A run's lr as set_lr set it: a float, or [z's lr, the second step's]."""
    second = [c["method_options"][k] for k in PAIRED.values() if k in c["method_options"]]
    return [c["lr"], *second] if second else c.get("lr")


def lr_name(lr, kind: str) -> str:
    """kind: a row key, or a sweep's kind ("<row>@<partition>")."""
    return f"{lr[0]:g} {PAIRED[kind.split('@')[0]]} {lr[1]:g}" if isinstance(lr, (tuple, list)) else f"{lr:g}"


def hashable(lr):
    return tuple(lr) if isinstance(lr, (list, tuple)) else lr


def at_edge(kind: str, lr, pts) -> bool:
    """The chosen lr (each coordinate of a pair) at the lowest or highest value of the runs `pts` that finished."""
    if kind not in PAIRED:
        return lr in (min(pts), max(pts))
    return any(lr[i] in (min(p[i] for p in pts), max(p[i] for p in pts)) for i in range(2))


def lr_for(lrs: dict, key: str, part: str):
    """A row's lr on a partition: its kind's lr chosen on that partition's clients where swept there, else on IID ones
    (None: neither is calibrated yet)."""
    return lrs.get(f"{LR_OF[key]}@{part}", lrs.get(LR_OF[key]))


PROBED = {"flite_r16g_probe", "fedavg_probe"}  # rows that start from a probe run (common.chained): its head (FLITE keeps it frozen)


def probe_of(c: dict) -> tuple[str, dict]:
    """The probe start of a run on a probed head: the same data, clients and seed, one round (the grid's probe row on
    IID clients is the same run)."""
    p = {k: v for k, v in c.items() if k not in ("lr", "init", "out", "method_options")}
    label = f"probe|{c['partition']}|s{c['seed']}" + ("|validation" if c["task_options"].get("validation") else "")
    return label, {**p, "method": "probe", "method_options": {}, **ONCE}


def starts_of(g: list[tuple[str, dict]]) -> list[tuple[str, dict]]:
    """The probe starts the runs of `g` name in their "init" (each once)."""
    return list({c["init"]: probe_of(c) for _, c in g if c.get("init")}.values())


def probed(key: str, c: dict) -> dict:
    return {**c, "init": probe_of(c)[0]} if key in PROBED else c


def calibration_grid(quick: bool, kinds=SWEEP) -> list[tuple[str, dict]]:
    """The sweep's runs of `kinds` (each kind is a row key)."""
    g = []
    for kind in kinds:
        row, _, part = kind.partition("@")
        _, _, m, mo, to, _, _ = next(r for r in ROWS if r[0] == row)
        for lr in SWEEP[kind]:
            c = set_lr({**BASE, **CALIB, "method": m, "method_options": mo, "seed": 0, "partition": part or "iid",
                        "task_options": {**CALIB["task_options"], **to}, **ROW_RUN.get(row, {})}, kind, lr)
            if quick:
                c = {**c, **QUICK, "task_options": {**c["task_options"], **QUICK["task_options"]}}
            g.append((f"{kind} lr {lr_name(lr, row)}", probed(row, c)))
    return g


def chosen_lrs(quick: bool) -> dict[str, float]:
    """Each kind's lr: the highest validation accuracy of its calibration runs (results/flite_vision_calibrate.json)."""
    p = common.RESULTS / f"flite_vision_calibrate{'_quick' if quick else ''}.json"
    if not p.exists():
        raise SystemExit(f"no calibration at {p}: run `python benchmarks/flite_vision.py --calibrate"
                         f"{' --quick' if quick else ''}` first (lrs are chosen on validation images)")
    return json.loads(p.read_text())["chosen"]


def grid(seeds: list[int], quick: bool, lrs: dict, keys: set | None = None, parts: set | None = None) -> list[tuple[str, dict]]:
    """The grid's runs (every config without "out": each lives in the run store, named by its config)."""
    g = []
    for key, label, m, mo, to, row_parts, role in ROWS:
        if keys and key not in keys:
            continue
        for part in row_parts:
            if parts and part not in parts:
                continue
            for s in (seeds if role == "claim" else seeds[:1]):
                c = {**BASE, "method": m, "method_options": mo, "task_options": {**TASK, **to}, "partition": part, "seed": s,
                     **ROW_RUN.get(key, {})}
                if quick:
                    c = {**c, **QUICK, "task_options": {**c["task_options"], **QUICK["task_options"]}}
                lr = lr_for(lrs, key, part) if LR_OF[key] else None
                if LR_OF[key] and lr is None:
                    continue                                # not calibrated yet: main reports the cell empty
                c = set_lr(c, key, lr) if LR_OF[key] else {**c, **ONCE}
                g.append((f"{key}|{part}|s{s}", probed(key, c)))
    return g


def weight_moves(c: dict) -> dict | None:
    """How far a FLITE run's final global z moved each generated convolution from the base: ||dW_l|| / ||W_pre,l||,
    min / median / max over the layers (from the run's last checkpoint; None for other methods)."""
    from lightfed import config as C
    from lightfed.engine import local
    from lightfed.models import latent
    if c["method"] != "flite" or not (Path(c["out"]) / "ckpt" / "latest.json").exists():
        return None
    z = local.load_checkpoint(Path(c["out"]))[1]["z"].float()
    model = local.build(C.from_dict({**c, "dtype": "fp32"})).model
    r = sorted(float(L.delta(z[L.lo:L.hi]).norm() / L.base.weight.float().norm()) for _, L in latent.latent_layers(model))
    return {"min": r[0], "median": r[len(r) // 2], "max": r[-1]}


def int4_internals(c: dict) -> dict | None:
    """Where full-weight int4 FedAvg's accuracy goes: the test accuracy per class of the model the clients receive
    at round 0 (the int4-decoded base) and after the last round, and the share of the body's int4 codes that differ
    between the two (from the run's last checkpoint; None for other rows or an unfinished run)."""
    import numpy as np
    from lightfed import config as C
    from lightfed.data.tensors import subset
    from lightfed.engine import local, protocol as P
    if c["method"] != "fedavg" or (c.get("method_options") or {}).get("codec") != "int4" \
            or not (Path(c["out"]) / "ckpt" / "latest.json").exists():
        return None
    cfg = C.from_dict({**c, "dtype": "fp32"})
    S = local.build(cfg)
    rnd, last, _, _ = local.load_checkpoint(Path(c["out"]))
    labels = S.task.test["labels"].numpy()
    out, codes = {}, {}
    for name, state, r in (("round 0", S.method.init_state(S.model), 0), ("final", last, rnd)):
        got = P.received(S.method, state, r, cfg.max_message_bytes)
        S.method.load(S.model, got)
        codes[name] = {k: v.detach().float().clone() for k, v in got.items() if not k.startswith("head")}
        out[name] = {int(k): S.task.evaluate(S.model, subset(S.task.test, np.flatnonzero(labels == k)))
                     for k in sorted(set(labels.tolist()))}
    same = sum(int((codes["round 0"][k] == codes["final"][k]).sum()) for k in codes["final"])
    total = sum(v.numel() for v in codes["final"].values())
    return {"per_class": out, "codes_changed": 1 - same / total}


def int4_roundtrip(c: dict) -> dict | None:
    """What int4 costs the fp32-latent run's final model alone: its test accuracy with the final global z as it is
    and after one int4 round trip (one scale over z, round to nearest, as the wire does it), the round trip's relative
    error and the share of latents it sends to 0 (None for other rows or an unfinished run)."""
    from lightfed import config as C
    from lightfed.engine import local
    from lightfed.wire.quantize import dequantize, quantize
    mo = c.get("method_options") or {}
    if c["method"] != "flite" or mo.get("codec") != "fp32" or mo.get("head") == "trainable" \
            or not (Path(c["out"]) / "ckpt" / "latest.json").exists():
        return None
    z = local.load_checkpoint(Path(c["out"]))[1]["z"].float()
    payload, scale = quantize(z, "int4")
    zq = dequantize(payload, "int4", scale, z.numel()).view(z.shape)
    cfg = C.from_dict(c)                # the run's own dtype: the fp32 accuracy is the run's final one
    S = local.build(cfg)
    acc = {}
    for name, v in (("fp32", z), ("int4", zq)):
        S.method.load(S.model, {"z": v})
        acc[name] = local.evaluate(S.task, S.model, cfg)[S.task.metric]
    return {"accuracy": acc, "rel_error": float((zq - z).norm() / z.norm()), "zeroed": float((zq == 0).float().mean()),
            "median_abs_z": float(z.abs().median())}


AGREEMENT = {"flite_r16g", "fedavg"}      # the rows whose clients' first moves are measured (agreement)
PER_CLASS = AGREEMENT | PROBED            # the rows whose final model is scored class by class (per_class)


def per_class(c: dict) -> dict:
    """Where a run's accuracy sits: the final global model's test accuracy per class, in the run's own dtype (the base
    was pretrained on classes 0-4; 5-9 are new to it)."""
    from lightfed import device
    from lightfed.data.tensors import subset
    from lightfed.engine import local
    S, _ = local.final_model(c["out"], "cpu", c["dtype"])
    labels = S.task.test["labels"].numpy()
    with device.using("cpu", c["dtype"]):
        return {int(k): S.task.evaluate(S.model, subset(S.task.test, np.flatnonzero(labels == k)))
                for k in sorted(set(labels.tolist()))}


def agreement(c: dict) -> dict:
    """What averaging keeps of the clients' first moves (issue 47: why label skew costs FLITE more than FedAvg): from
    the run's initial state, every client trains round 1 as the run does; each move is taken in the space the 20
    convolutions' weights live in (FedAvg: its weights' change; FLITE: the map's dW of its latents' change) and in the
    trained parameters' own (z; FedAvg's every weight). efficiency = ||sum_k n_k d_k|| / sum_k n_k ||d_k|| (1: the
    clients agree; ~1/sqrt(10) if orthogonal); cosine: the mean over clients of cos(d_k, the average)."""
    import torch
    from lightfed import config as C
    from lightfed.data.tensors import subset
    from lightfed.engine import local, protocol as P
    from lightfed.methods.base import ClientContext
    from lightfed.models import latent
    cfg = C.from_dict(c)
    S = local.build(cfg)
    state, lat = S.method.init_state(S.model), dict(latent.latent_layers(S.model))
    convs = [n for n, m in S.model.named_modules() if isinstance(m, torch.nn.Conv2d)] if not lat else list(lat)
    moves = {"convolutions' weights": [], "trained parameters": []}
    for cid in range(cfg.clients):
        down = P.broadcast(S.method, state, 1, cid)
        S.method.load(S.model, P.received(S.method, state, 1, cfg.max_message_bytes))
        before = {n: p.detach().clone() for n, p in S.method.trainable(S.model).items()}
        ctx = ClientContext(cid, 1, local.derive_seed(cfg.seed, 1, cid), cfg, S.task.loss, {})
        P.client_round(S.method, S.model, down, subset(S.task.train_at(1, cfg.rounds), S.shards[cid]), ctx,
                       cfg.max_message_bytes)
        d = {n: (p.detach() - before[n]).float() for n, p in S.method.trainable(S.model).items()}
        moves["trained parameters"].append(torch.cat([v.flatten() for v in d.values()]))
        with torch.no_grad():       # FLITE: dW_l = map_l(dz_l); FedAvg: the convolutions' own change
            moves["convolutions' weights"].append(torch.cat(
                [lat[n].delta(d["z"][lat[n].lo:lat[n].hi]).flatten() for n in convs] if lat else [d[f"{n}.weight"].flatten() for n in convs]))
    n = [float(len(s)) for s in S.shards]
    return {space: agreement_of(torch.stack(ds), n) for space, ds in moves.items()}


def agreement_of(D, n) -> dict:
    """D (clients, dim): the clients' moves, n: their examples (the average's weights)."""
    import torch
    D, n = D.double(), torch.tensor(n, dtype=torch.float64)
    mean = (n[:, None] * D).sum(0) / n.sum()                     # (dim,) what the server's average moves
    norms = D.norm(dim=1)
    return {"efficiency": float(mean.norm() * n.sum() / (n * norms).sum()),
            "cosine": float(torch.nn.functional.cosine_similarity(D, mean[None], dim=1).mean()),
            "move_norm_median": float(norms.median())}


def empty_row(key: str, part: str, errors=()) -> dict:
    return {"key": key, "partition": part, "finals": [], "initials": [], "seeds": [], "errors": list(errors),
            "curves": [], "weight_moves": [], "provenance": []}


def summarize(g, sums) -> dict:
    from lightfed.models import latent
    from lightfed.wire import quantize
    rows: dict[str, dict] = {}
    for (label, c), s in zip(g, sums):
        key, part, _ = label.split("|")
        r = rows.setdefault(f"{key}|{part}", empty_row(key, part))
        if not common.add_seed(r, c, s):                        # its provenance: who made it, is it the code at hand
            continue
        r["curves"].append([[h["round"], h[s["metric"]]] for h in s["history"]])
        r["weight_moves"].append(common.derived(c, "weight_moves", weight_moves, latent))
        if key in AGREEMENT:
            r.setdefault("agreement", []).append(common.derived(c, "agreement", agreement, latent))
        if key in PER_CLASS:
            r.setdefault("per_class", []).append(common.derived(c, "per_class", per_class))
        if key == "fedavg_int4":
            r.setdefault("int4_internals", []).append(common.derived(c, "int4_internals", int4_internals, quantize))
        if key == "flite_fp32":
            r.setdefault("int4_roundtrip", []).append(common.derived(c, "int4_roundtrip", int4_roundtrip, quantize))
        r.update(up=s["bytes"]["up_per_client_round"], down=s["bytes"]["down_per_client_round"], lr=run_lr(c),
                 trainable=s["trainable_params"], test_images=c["task_options"]["test_size"],
                 method_info=s.get("method_info"), wall_s=s["time"]["wall"], init=s.get("init"),
                 up_total=s["bytes"]["up_total"])
    return rows


def claims(rows: dict, backbone_bytes: int) -> list[tuple[str, str]]:
    def f(key, part="iid"):
        return rows.get(f"{key}|{part}", {}).get("finals", [])

    def within(a, b, pp):       # a >= b - pp, judged over seeds: met when a's range clears b - pp
        return verdict([-x for x in a], [-(y - pp) for y in b], True) if a and b else "not run"

    def paired(ka, kb, pa="iid", pb="iid"):    # a - b seed by seed, over the seeds both rows ran
        ra, rb = rows.get(f"{ka}|{pa}", {}), rows.get(f"{kb}|{pb}", {})
        a, b = dict(zip(ra.get("seeds", []), ra.get("finals", []))), dict(zip(rb.get("seeds", []), rb.get("finals", [])))
        return {s: a[s] - b[s] for s in sorted(set(a) & set(b))}

    def gap(ka, kb, pa="iid", pb="iid"):   # a - b in pp over the seeds both rows ran (seed by seed, then the mean)
        d = paired(ka, kb, pa, pb)
        m = np.mean(list(d.values())) * 100 if d else float("nan")
        return f"{m:+.2f} pp over seed{'s' if len(d) > 1 else ''} {', '.join(map(str, d))}"

    def above(text, ka, kb, what, pa="iid", pb="iid", note=""):     # a above b, where both rows ran
        if f(ka, pa) and f(kb, pb):
            out.append((text, verdict(f(ka, pa), f(kb, pb), False) + f" ({what} = {gap(ka, kb, pa, pb)}{note})"))

    out = []
    fl, fa = f("flite"), f("fedavg")
    if "flite|iid" in rows:         # a grid of some rows (--rows) judges only the claims of its rows
        out.append(("FLITE within 1 pp of FedAvg fp32 (IID): FLITE >= FedAvg - 1 pp", within(fl, fa, 0.01)
                    + (f" (means {np.mean(fl):.4f} vs {np.mean(fa):.4f})" if fl and fa else "")))
    fld, fad = f("flite", "dirichlet:0.1"), f("fedavg", "dirichlet:0.1")
    if fld and fad:
        out.append(("Dirichlet(0.1): FLITE no worse than FedAvg - 1 pp", within(fld, fad, 0.01)
                    + f" (FLITE - FedAvg = {gap('flite', 'fedavg', 'dirichlet:0.1', 'dirichlet:0.1')}; the paper: +0.97 pp)"))
    r = rows.get("flite|iid")
    if r and "up" in r:
        fa_up = rows.get("fedavg|iid", {}).get("up")
        ours = fa_up / r["up"] if fa_up else None
        latents = (r.get("method_info") or {}).get("latent", 1280)
        paper = backbone_bytes / (4 * latents + 8)
        out.append(("uplink >= 8,000x below FedAvg fp32, by len() of the messages",
                    (f"{'met' if ours >= 8000 else 'missed'} ({ours:,.0f}x: {fa_up:,.0f} B vs {r['up']:,.0f} B; exact, no seeds)"
                     if ours else "not run")
                    + f"; the paper's accounting (backbone without head, fp32 / (4 x {latents} + 8)): {paper:,.0f}x"))
    def half_pp(i4, f32):           # int4 within 0.5 pp of fp32, either way
        if (verdict([-x for x in i4], [-(y - 0.005) for y in f32], True) == "met"
                and verdict(i4, [y + 0.005 for y in f32], True) == "met"):
            return "met"
        if abs(np.mean(i4) - np.mean(f32)) > 0.005 and verdict(i4, f32, True) in ("met", "missed"):
            return "missed"                                         # more than 0.5 pp apart, the ranges separated
        if min(len(i4), len(f32)) < 3:
            return verdict(i4, f32, True)                           # says how many seeds each has
        return "inconclusive (the seeds' ranges do not settle it)"

    i4, f32, dl = f("flite"), f("flite_fp32"), f("flite_delta")
    if i4 and f32:
        out.append(("int4 latents within 0.5 pp of fp32 latents", f"{half_pp(i4, f32)} (int4 - fp32 = {gap('flite', 'flite_fp32')})"))
    if dl and f32:
        out.append(("int4 latents uploaded as the round's move (delta) within 0.5 pp of fp32 latents",
                    f"{half_pp(dl, f32)} (delta int4 - fp32 = {gap('flite_delta', 'flite_fp32')})"))
    above("delta upload above the paper's absolute int4 upload", "flite_delta", "flite", "delta - absolute")
    # the codec gone (fp32 both), what is left between them is the averaging
    above("what averaging costs: fp32 latents centralised (same steps) above federated", "flite_central", "flite_fp32",
          "centralised - federated")
    if i4 and f32:
        for s, x in zip(rows["flite_fp32|iid"]["seeds"], rows["flite_fp32|iid"].get("int4_roundtrip") or []):
            if x:       # is the loss the rounding of the final model, or int4's effect on training?
                out.append((f"the fp32-latent run's final z through one int4 round trip, seed {s}",
                            f"{x['accuracy']['fp32']:.4f} -> {x['accuracy']['int4']:.4f} (relative error "
                            f"{x['rel_error']:.3f}, {100 * x['zeroed']:.0f}% of the latents sent to 0; median |z| "
                            f"{x['median_abs_z']:.1f})"))
    q = f("fedavg_int4")
    if q:
        q0 = rows["fedavg_int4|iid"]["initials"]
        out.append(("int4 full-weight FedAvg", f"{np.mean(q):.4f} (chance {CHANCE}); FedAvg fp32 {np.mean(fa):.4f}"
                    + (" (collapses to chance)" if np.mean(q) < CHANCE + 0.05 else "")
                    + (f" (round 0, the int4-decoded base: {np.mean(q0):.4f}; the accuracy does not move)"
                       if abs(np.mean(q) - np.mean(q0)) < 0.005 else "")))
        pc = lambda d: " ".join(f"{v:.2f}" for _, v in sorted(d.items(), key=lambda kv: int(kv[0])))  # noqa: E731
        for s, x in zip(rows["fedavg_int4|iid"]["seeds"], rows["fedavg_int4|iid"].get("int4_internals") or []):
            if x:       # where the accuracy sits: per class, before and after; and how much of the model moved
                out.append((f"int4 FedAvg's accuracy per class 0-9, seed {s}",
                            f"round 0: {pc(x['per_class']['round 0'])}; final: {pc(x['per_class']['final'])}; "
                            f"{100 * x['codes_changed']:.1f}% of the body's int4 codes moved"))
    above("the frozen orthogonal head's geometry serves FLITE when the base grew in it: FLITE's paper form on the base "
          "pretrained under that head above today's base", "flite_obase", "flite", "head-pretrained - today's")
    # the same map and codec: what is left between them is the averaging
    above("what averaging costs r = 16 int4g: centralised (same steps) above federated", "flite_r16g_central", "flite_r16g",
          "centralised - federated")
    # the protocol's cost to full fine-tuning, beside FLITE's
    above("what averaging costs FedAvg fp32: centralised (same steps) above federated", "fedavg_central", "fedavg",
          "centralised - federated")
    if all(f(k) for k in ("flite_r16g_central", "flite_r16g", "fedavg_central", "fedavg")):
        # seed by seed, central - federated: is FLITE's cost the protocol's or its own?
        fc, ac = (list(paired(central, fed).values()) for central, fed in (("flite_r16g_central", "flite_r16g"), ("fedavg_central", "fedavg")))
        out.append(("averaging costs FLITE r = 16 int4g more than FedAvg fp32 (central - federated, seed by seed)",
                    verdict(fc, ac, False) + f" (FLITE's cost {100 * np.mean(fc):+.2f} pp, FedAvg's {100 * np.mean(ac):+.2f} pp; "
                    f"centralised, FLITE - FedAvg = {gap('flite_r16g_central', 'fedavg_central')})"))
    # the same map, codec and client steps: what the server's step adds; what uploading the move instead of z buys
    above("r = 20 int4g: the server's step above the clients' mean", "flite_r20g_srv", "flite_r20g", "server step - mean")
    above("r = 20 int4g: the round's move uploaded above z uploaded", "flite_r20g_delta", "flite_r20g", "delta - z")
    for key, what in (("flite_obase", "on the head-pretrained base"), ("flite_r16g", "r = 16, int4g"),
                      ("flite_r20g", "r = 20, int4g"), ("flite_r20g_srv", "r = 20, int4g, the server's step"),
                      ("flite_r20g_delta", "r = 20, int4g, the move uploaded"),
                      ("flite_r32g", "r = 32, int4g"), ("flite_r16g_central", "r = 16, int4g, centralised"),
                      ("flite_r16g_probe", "r = 16, int4g, on a probed head"),
                      ("flite_wscale", "scale = weight")):
        for part in ("iid", "dirichlet:0.1"):
            x, y = f(key, part), f("fedavg", part)
            if x and y:         # the goal: within 1 pp of FedAvg fp32 at >= 8,000x fewer uplink bytes
                up, fa_up = rows[f"{key}|{part}"]["up"], rows[f"fedavg|{part}"]["up"]
                out.append((f"FLITE {what} within 1 pp of FedAvg fp32 ({part})", within(x, y, 0.01)
                            + f" (means {np.mean(x):.4f} vs {np.mean(y):.4f}; uplink {fa_up / up:,.0f}x below FedAvg's)"))
    for part in ("iid", "dirichlet:0.1"):
        pb, r16 = f("flite_r16g_probe", part), f("flite_r16g", part)
        if pb and r16:              # the same map and codec; the head the probe's closed form against a fresh orthogonal one
            r, fr = rows[f"flite_r16g_probe|{part}"], rows.get(f"fedavg|{part}", {})
            init = r.get("init") or {}
            whole = (f"; the whole run's uplink, the probe's included, {fr['up_total'] / (r['up_total'] + init.get('up_total', 0)):,.0f}x "
                     "below FedAvg's" if fr.get("up_total") and r.get("up_total") else "")
            out.append((f"FLITE r = 16 int4g on a probed head above the fresh frozen orthogonal head ({part})", verdict(pb, r16, False)
                        + f" (probed - orthogonal = {gap('flite_r16g_probe', 'flite_r16g', part, part)}; the probe's one "
                        f"round: {init.get('up_total', 0):,} B up over all clients, once; its head alone scores "
                        f"{init.get('metric', float('nan')):.4f}{whole})"))
            p0 = r.get("initials") or []    # round 0: the probe's head on the base, before z moves (FLITE's own share)
            out.append((f"FLITE's latents add to the probed head: above the probe alone ({part})", verdict(pb, p0, False)
                        + f" (FLITE - probe alone = {100 * (np.mean(pb) - np.mean(p0)):+.2f} pp)"))
            fp = f("fedavg_probe", part)
            if fp:                  # both from the same probe run: the head is no longer FLITE's edge alone
                up = rows[f"fedavg_probe|{part}"]["up"] / r["up"]
                out.append((f"on the same probed head, FLITE r = 16 int4g no worse than FedAvg fp32 - 1 pp ({part})",
                            within(pb, fp, 0.01) + f" (FLITE - FedAvg = {gap('flite_r16g_probe', 'fedavg_probe', part, part)}; "
                            f"uplink {up:,.0f}x below FedAvg's a client a round)"))
                above(f"the probed head helps FedAvg too: from the probe above from the fresh head ({part})",
                      "fedavg_probe", "fedavg", "probed - fresh", part, part)
    above("FLITE needs the pretrained base: pretrained above from scratch", "flite", "flite_scratch", "pretrained - scratch",
          note="; the paper: 74.67% vs 2.5%")
    pr = f("probe")
    if pr:
        out.append(("what the frozen base's features allow (the probe: a closed-form head, no body change; for reference)",
                    f"{np.mean(pr):.4f}" + (f"; FLITE {np.mean(fl):.4f}, FedAvg fp32 {np.mean(fa):.4f}" if fl and fa else "")))
    hd = f("flite_head")
    if hd and fl:
        o = f32 or fl              # the trained head travels as fp32: its like-for-like is the fp32-latent row
        out.append((f"frozen orthogonal head above a trained head ({'fp32' if f32 else 'int4'} latents)", verdict(o, hd, False)
                    + f" (orthogonal - trained = {gap('flite_fp32' if f32 else 'flite', 'flite_head')}; the paper: "
                    "+0.54 pp)"))
    # FedAvg's clients retrain their head: is the frozen one what skew costs the map?
    above("Dirichlet(0.1): a trained head above the frozen orthogonal head (fp32 latents)", "flite_head", "flite_fp32",
          "trained - frozen", "dirichlet:0.1", "dirichlet:0.1")
    return out


def x_fewer(fa, up) -> str:
    return f"{fa / up:,.0f}" if fa else "-"          # "-": FedAvg has no finished run yet


def kept(report: dict) -> str:
    """The end of a base's sentence: where its report came from when this machine has not built that base."""
    return f" (its report {report['kept']})." if "kept" in report else "."


def render(res: dict) -> str:
    c = res["config"]
    L = [f"# FLITE at paper scale in vision (GN ResNet-18, {res['base'].get('params', 0):,} weights)\n",
         f"Command: `{res['meta']['command']}`  \nDate {res['meta']['date']}, code {res['meta']['code']}; "
         f"{c['runs']} runs ({c['reused']} reused from the run store), {res['wall_s'] / 3600:.1f} h. Setting: {json.dumps(c['base'])}; "
         f"task {json.dumps(c['task'])}; lrs chosen on validation images: {json.dumps(c['lrs'])}.\n",
         f"Base: lightfed's own ResNet-18 pretrained on classes 0-4 of training images 0-29,999: held-out accuracy "
         f"{res['base'].get('heldout_accuracy')} on {res['base'].get('heldout_images')} images after {res['base'].get('epochs')} "
         f"epochs ({res['base'].get('seconds', 0) / 60:.0f} min, {res['base'].get('torch_threads')} thread); backbone "
         f"{res['backbone_fp32_bytes']:,} B fp32 without its head{kept(res['base'])}"
         + (f" The base pretrained under the frozen orthogonal head (rows 0-4): held-out accuracy {ob.get('heldout_accuracy')} "
            f"after {ob.get('epochs')} epochs ({ob.get('seconds', 0) / 60:.0f} min){kept(ob)}" if (ob := res.get("base_orthogonal")) else "")
         + "\n",
         "| row | partition | accuracy (mean ± sd over seeds) | round 0 | seeds | up B / client / round | x fewer than FedAvg | lr |",
         "|---|---|---|---|---|---|---|---|"]
    label = {k: lab for k, lab, *_ in ROWS}
    fa = res["rows"].get("fedavg|iid", {}).get("up")
    for k, r in res["rows"].items():
        if not r["finals"]:
            e = (r["errors"] or ["not run"])[0]
            L.append(f"| {label[r['key']]} | {r['partition']} | {common.why(e)} | | | | | |")
            continue
        m, sd, n = ms(r["finals"])
        L.append(f"| {label[r['key']]} | {r['partition']} | {common.marked(f'{m:.4f} ± {sd:.4f}', r['provenance'])} | {np.mean(r['initials']):.4f} | "
                 f"{', '.join(map(str, r['seeds']))} | "
                 f"{r['up']:,.0f} | {x_fewer(fa, r['up'])} | {'-' if r['lr'] is None else lr_name(r['lr'], r['key'])} |")
    moves = [(label[r["key"]], r["partition"], r["seeds"], r["weight_moves"]) for r in res["rows"].values()
             if any(r.get("weight_moves") or [])]
    if moves:
        L += ["", "How far FLITE's final global z moved the generated convolutions from the base: ‖dW_l‖ / ‖W_pre,l‖, "
              "min / median / max over the 20 layers (above 1, the change outweighs the pretrained weight; GroupNorm "
              "then hides the scale, and the base is replaced rather than tuned).", "",
              "| row | partition | per seed: min / median / max |", "|---|---|---|"]
        L += [f"| {lab} | {part} | " + "; ".join(f"s{sd}: {w['min']:.2f} / {w['median']:.2f} / {w['max']:.2f}"
                                                  for sd, w in zip(seeds, ws) if w) + " |" for lab, part, seeds, ws in moves]
    agree = [(label[r["key"]], r["partition"], r["agreement"]) for r in res["rows"].values() if any(r.get("agreement") or [])]
    if agree:
        L += ["", "What averaging keeps of the clients' moves in round 1 (every client of the run trains from the initial "
              "state, the run's own lr and data): efficiency = ‖Σ n_k d_k‖ / Σ n_k ‖d_k‖ (1: the clients agree; "
              "~0.32 for 10 orthogonal moves) and the mean cosine of a client's move to the average, in the space of the "
              "20 convolutions' weights (FLITE: the map's dW of its latents' move) and in the trained parameters' own "
              "(FLITE: z; FedAvg: every weight, head included). Mean ± sd over seeds.", "",
              "| row | partition | efficiency (convolutions) | cosine (convolutions) | efficiency (trained parameters) | cosine (trained parameters) |",
              "|---|---|---|---|---|---|"]
        for lab, part, ag in agree:
            ag = [a for a in ag if a]
            L.append(f"| {lab} | {part} | " + " | ".join(common.pm([a[sp][k] for a in ag]) for sp in ag[0]
                                                        for k in ("efficiency", "cosine")) + " |")
    pcs = [(label[r["key"]], r["partition"], [x for x in r.get("per_class") or [] if x]) for r in res["rows"].values()
           if any(r.get("per_class") or [])]
    if pcs:
        L += ["", "Where the accuracy sits: the final model's test accuracy per class, mean over seeds (the base was pretrained "
              "on classes 0-4; 5-9 are new to it).", "",
              "| row | partition | " + " | ".join(map(str, range(10))) + " | classes 0-4 | classes 5-9 |", "|---|---|" + "---|" * 12]
        for lab, part, xs in pcs:
            m = {k: np.mean([x[str(k)] if str(k) in x else x[k] for x in xs]) for k in range(10)}
            L.append(f"| {lab} | {part} | " + " | ".join(f"{m[k]:.2f}" for k in range(10))
                     + f" | {np.mean([m[k] for k in range(5)]):.3f} | {np.mean([m[k] for k in range(5, 10)]):.3f} |")
    if any(not r["finals"] for r in res["rows"].values()):
        L += ["", "A row not run here was last measured by older code, before the run store: "
              "`git show 63bcdd6:benchmarks/results/flite_vision.md` (21 of its 37 runs carried from still older results)."]
    older = sorted({(p["code"], p["commit"], p["date"]) for r in res["rows"].values() for p in r["provenance"] if not p["at_hand"]})
    if older:
        L += ["", "† a seed of the row was made by code other than this file's (the functions its run executed have changed "
              "since): " + "; ".join(f"code {c} (commit {m or '?'}, {d or '?'})" for c, m, d in older) + "."]
    L += ["", "| claim | verdict |", "|---|---|"] + [f"| {a} | {b} |" for a, b in res["claims"]]
    n = next((r["test_images"] for r in res["rows"].values() if r.get("test_images")), c["task"]["test_size"])
    L += ["", f"Test images: {n} (one image = {100 / n:.2f} pp). Plots: "
          f"{res.get('name', 'flite_vision')}.png (accuracy against uplink bytes, log scale; and the curves)."]
    return "\n".join(L) + "\n"


def plot(res: dict, name: str) -> None:
    plt = common.pyplot()
    label = {k: lab for k, lab, *_ in ROWS}
    color = {k: f"C{i}" if i < 10 else "black" for i, (k, *_) in enumerate(ROWS)}   # one per row, both panels
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 6.2))
    for k, r in res["rows"].items():
        if not r["finals"] or r["partition"] != "iid":
            continue
        m, sd, _ = ms(r["finals"])
        a.errorbar([r["up"]], [m], yerr=[[m - min(r["finals"])], [max(r["finals"]) - m]], fmt="o", capsize=3,
                   color=color[r["key"]], label=label[r["key"]])
    a.set_xscale("log")
    a.set(xlabel="uplink bytes per client per round (len of the message)", ylabel="test accuracy",
          title="accuracy vs uplink (IID; bars: seed range)")
    a.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14))   # below the axes: never over a point
    for k, r in res["rows"].items():
        for j, cur in enumerate(r["curves"]):
            xs, ys = zip(*cur)
            b.plot(xs, ys, "-" if r["partition"] == "iid" else "--", color=color[r["key"]], alpha=0.7,
                   label=f"{label[r['key']]} ({r['partition']})" if j == 0 else None)
    b.set(xlabel="round", ylabel="test accuracy", title="curves (every seed; dashed: Dirichlet)")
    b.legend(fontsize=6)
    common.save(fig, common.RESULTS / f"{name}.png", 110)


def calibrate(a) -> None:
    """The sweep's runs (--kinds: some kinds only; they join the kinds calibrated before), each kind's best lr."""
    kinds = set(a.kinds.split(",")) if a.kinds else set(SWEEP)
    if kinds - set(SWEEP):
        raise SystemExit(f"--kinds: unknown {sorted(kinds - set(SWEEP))}; kinds: {list(SWEEP)}")
    from lightfed.models import latent
    g0 = calibration_grid(a.quick, [k for k in SWEEP if k in kinds])
    g = common.with_starts(starts_of(g0), g0)
    t0 = time.time()
    sums = common.chained(starts_of(g0), g0, a.workers, a.from_runs)[1]
    res = [{"label": label, "lr": run_lr(c), "validation_accuracy": s.get("final"), "initial": s.get("initial"),
            "error": s.get("error"), "weight_moves": None if "error" in s else common.derived(c, "weight_moves", weight_moves, latent)} for (label, c), s in zip(g, sums)]
    name = "flite_vision_calibrate" + ("_quick" if a.quick else "")
    command, wall = "python benchmarks/flite_vision.py " + " ".join(sys.argv[1:]), time.time() - t0
    p = common.RESULTS / f"{name}.json"
    if a.kinds and p.exists():                  # the other kinds' runs, as calibrated before
        old = json.loads(p.read_text())
        res = [r for r in old["runs"] if r["label"].split(" ")[0] not in kinds] + res
        command, wall = old["meta"]["command"] + "; then " + command, old["wall_s"] + wall
    acc = scores(res)
    chosen = {k: max(a, key=lambda lr: (a[lr], -list(a).index(lr))) for k, a in acc.items()}   # ties: the first run
    data = {"meta": meta(command), "runs": res, "sweep": SWEEP, "chosen": chosen,
            "setting": {k: v for k, v in g[0][1].items() if k not in ("lr", "out", "method", "method_options", "partition")}, "wall_s": wall}
    print(write(name, data, render_calibrate(data)))


def scores(runs: list[dict]) -> dict[str, dict]:
    """kind -> {lr: validation accuracy} of the calibration runs that finished."""
    acc: dict[str, dict] = {}
    for r in runs:
        if r["validation_accuracy"] is not None:
            acc.setdefault(r["label"].split(" ")[0], {})[hashable(r["lr"])] = r["validation_accuracy"]
    return acc


def render_calibrate(data: dict) -> str:
    res, acc = data["runs"], scores(data["runs"])
    chosen = {k: hashable(v) for k, v in data["chosen"].items()}
    md = ["# FLITE vision: lrs on validation images\n", f"Command: `{data['meta']['command']}` ({data['wall_s'] / 60:.0f} min). "
          f"One seed, IID (a kind `<row>@<partition>`: that partition's clients), {data['setting']['rounds']} rounds, scored on {data['setting']['task_options']['test_size']} validation images "
          "(training images the runs never train on), never the test set. Rule: the highest validation accuracy.\n",
          "| run | validation accuracy | FLITE: ‖dW_l‖ / ‖W_pre,l‖, median over the 20 convolutions |", "|---|---|---|"]
    for r in res:
        score = (format(r["validation_accuracy"], ".4f") if not r["error"]
                 else "not run yet" if r["error"].startswith("not run") else "failed")
        md.append(f"| {r['label']} | {score} | {format(r['weight_moves']['median'], '.2f') if r.get('weight_moves') else '-'} |")
    edge = {k: v for k, v in chosen.items() if at_edge(k, v, list(acc[k]))}
    md += ["", "Chosen: " + ", ".join(f"{k} {lr_name(v, k)}" for k, v in chosen.items())]
    n = data["setting"]["task_options"]["test_size"]

    def beside(k, v):           # the chosen lr's neighbour in the sweep (a pair's: the runner-up), the gap in images
        a, lrs = acc[k], sorted(acc[k])
        if len(lrs) < 2:
            return ""
        nb = max((x for x in a if x != v), key=a.get) if k in PAIRED else lrs[1] if v == lrs[0] else lrs[-2]
        return f" ({a[v]:.4f} vs {a[nb]:.4f} at {lr_name(nb, k)}: {round((a[v] - a[nb]) * n)} of {n} images)"
    md += [f"At the sweep's edge (the best lr may lie beyond it): {', '.join(f'{k} {lr_name(v, k)}{beside(k, v)}' for k, v in edge.items())}."] if edge else []
    return "\n".join(md) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--calibrate", action="store_true")
    ap.add_argument("--kinds", default="", help="--calibrate: comma-separated kinds of SWEEP (default: all)")
    ap.add_argument("--rows", default="", help="comma-separated row keys (default: all)")
    ap.add_argument("--partitions", default="", help="comma-separated partitions (default: each row's)")
    ap.add_argument("--name", default="", help="the results file's name (default flite_vision[_quick]): a grid of some "
                    "rows written beside the full grid's file, not over it")
    common.add_args(ap)
    a = ap.parse_args(argv)
    common.configure(a)
    if a.calibrate:
        return common.rerender(a, "flite_vision_calibrate" + ("_quick" if a.quick else ""), render_calibrate) or calibrate(a)
    name = a.name or "flite_vision" + ("_quick" if a.quick else "")
    if common.rerender(a, name, render, lambda res: plot(res, name)):
        return
    from lightfed.tasks import fmnist
    seeds = [int(s) for s in a.seeds.split(",")]
    lrs = chosen_lrs(a.quick)
    keys = set(a.rows.split(",")) if a.rows else {k for k, *_ in ROWS}
    parts = set(a.partitions.split(",")) if a.partitions else None
    uncal = {(k, p) for k, *_, row_parts, _ in ROWS if k in keys for p in row_parts
             if (not parts or p in parts) and LR_OF[k] and lr_for(lrs, k, p) is None}   # no finished sweep run yet
    if uncal and not a.from_runs:
        kinds = ",".join(sorted({LR_OF[k] + ("" if p == "iid" else f"@{p}") for k, p in uncal}))
        raise SystemExit(f"no calibrated lr for {sorted(uncal)}: run --calibrate --kinds {kinds}")
    g0 = grid(seeds, a.quick, lrs, keys, parts)
    g = common.with_starts(starts_of(g0), g0)
    t0 = time.time()
    reused = sum(common.finished(label, c) is not None for label, c in g)
    # run the first seed's IID runs first, so a grid stopped early holds the comparisons that matter most
    order = sorted(range(len(g)), key=lambda i: (g[i][1]["seed"], g[i][1]["partition"] != "iid", i))
    sums = [None] * len(g)
    for i, s in zip(order, common.chained(starts_of(g0), [g0[i] for i in order], a.workers, a.from_runs)[1]):
        sums[i] = s
    rows = summarize(g, sums)
    for key, part in sorted(uncal):
        rows[f"{key}|{part}"] = empty_row(key, part, ["not run: its lr is not calibrated yet"])
    rows = {f"{k}|{p}": rows[f"{k}|{p}"] for k, *_, parts, _ in ROWS for p in parts if f"{k}|{p}" in rows}   # ROWS' order
    base = (fmnist.base_report("resnet18") or {}) if not a.quick else {}
    base_o = (fmnist.base_report("resnet18", head="orthogonal") or {}) if not a.quick else {}
    kept = common.RESULTS / f"{a.name or 'flite_vision'}.json"      # no base built here: the report the runs' base gave
    if not a.quick and kept.exists() and not (base and base_o):
        old = json.loads(kept.read_text())
        kept_note = "from the committed results: this machine has not built the base"
        base = base or {**old.get("base", {}), "kept": kept_note}
        base_o = base_o or ({**old["base_orthogonal"], "kept": kept_note} if old.get("base_orthogonal") else {})
    from lightfed.models import vision            # the paper's FedAvg charge: the backbone without its head, fp32
    bb = sum(p.numel() * 4 for n, p in vision.GNResNet18(10).named_parameters() if not n.startswith("head."))
    res = {"meta": meta("python benchmarks/flite_vision.py " + " ".join(sys.argv[1:] if argv is None else argv),
),
           "config": {"base": BASE, "task": TASK, "seeds": seeds, "lrs": lrs, "runs": len(g), "reused": reused,
                      "rows": [r[:6] for r in ROWS]},
           "base": base, "base_orthogonal": base_o,
           "backbone_fp32_bytes": bb, "rows": rows, "claims": claims(rows, bb), "wall_s": time.time() - t0}
    res["name"] = name
    print(write(name, res, render(res)))
    plot(res, name)


if __name__ == "__main__":
    main()
