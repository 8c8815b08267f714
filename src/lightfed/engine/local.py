"""The in-process engine: every client of a federation simulated one after another in this process.

It knows nothing about any method: it encodes what a method broadcasts, hands each sampled
client the decoded fields and its shard, encodes the client's reply, decodes + validates it on
the server side, and hands the valid replies to the method's aggregator. Bytes are len() of
the encoded messages. Every random choice derives from (seed, round, client), so a run is
reproducible from its config, and a resumed run reaches the same result as an uninterrupted one.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from lightfed import config as C
from lightfed import device, methods, privacy, secagg, tasks
from lightfed.data import partition
from lightfed.data.tensors import subset
from lightfed.measure import Clock, PeakRSS
from lightfed.seeds import derive
from lightfed.engine import protocol as P
from lightfed.engine.files import fsync, source_hash
from lightfed.methods.base import ClientContext
from lightfed.models.backbones import seeded


def derive_seed(seed: int, *parts: int) -> int:
    """A 63-bit seed for one (round, client, ...) from the run seed."""
    return derive(seed, *parts)


def sample_clients(cfg: C.RunConfig, rnd: int) -> list[int]:
    """This round's clients, drawn from (seed, round) among those that train (never a held-out one)."""
    held = C.holdout_ids(cfg)
    pool = [c for c in range(cfg.clients) if c not in held]
    rng = np.random.default_rng([cfg.seed, rnd, 7])
    return sorted(pool[i] for i in rng.choice(len(pool), C.per_round(cfg), replace=False).tolist())


def faults(cfg: C.RunConfig, rnd: int, sampled: list[int], shard_sizes: list[int]) -> dict[int, str]:
    """The clients that fail this round in simulation, {client: why}, drawn from (seed, round, client) so a
    resumed run drops the same ones. A straggler's time is its work (its examples with local_epochs, else
    one unit: every client runs local_steps) x LogNormal(0, straggle); it misses the round when that is over
    deadline x the sampled clients' median. A dropout fails after receiving the broadcast."""
    why = {}
    if cfg.straggle > 0:
        t = {c: (1 if cfg.local_steps > 0 else shard_sizes[c]) * np.random.default_rng([cfg.seed, rnd, c, 11]).lognormal(0, cfg.straggle)
             for c in sampled}
        med = float(np.median(list(t.values())))
        why.update({c: f"straggler: {t[c] / med:.2f}x the round's median time, past the deadline ({cfg.deadline:g}x)"
                    for c in sampled if t[c] > cfg.deadline * med})
    for c in sampled:
        if cfg.dropout > 0 and np.random.default_rng([cfg.seed, rnd, c, 12]).random() < cfg.dropout:
            why.setdefault(c, f"failed (simulated dropout, p = {cfg.dropout:g})")
    return why


@dataclass
class Setup:
    """Everything a run needs, built (and so validated) before the first round."""
    cfg: C.RunConfig
    task: tasks.Task
    method: methods.Method
    model: torch.nn.Module
    shards: list[np.ndarray]
    info: dict = field(default_factory=dict)


def check(cfg: C.RunConfig) -> None:
    """Every check that needs no data or model: a bad config fails here, before any work."""
    C.validate(cfg)
    device.check(cfg.device, cfg.dtype)
    methods.options(cfg.method, cfg.method_options)
    methods.check_run(cfg)
    privacy.check(cfg, methods.METHODS[cfg.method])
    if cfg.init and not (Path(cfg.init) / "summary.json").is_file():
        raise C.ConfigError(f"init = {cfg.init!r}: no finished run there (summary.json)")
    secagg.check(cfg, methods.METHODS[cfg.method])
    tasks.options(cfg.task, cfg.task_options)


def start_from(model: torch.nn.Module, run: str) -> dict:
    """Load a finished run's final state into the (unprepared) model: its keys must be the model's own
    parameter names (a probe's head, a full FedAvg). -> what it cost (its bytes and client FLOPs)."""
    out = Path(run)
    if not (out / "summary.json").is_file():
        raise C.ConfigError(f"init = {run!r}: no finished run there (summary.json)")
    _, state, _, _ = load_checkpoint(out)
    params = dict(model.named_parameters())
    bad = [k for k in state if k not in params or tuple(params[k].shape) != tuple(state[k].shape)]
    if bad:
        raise C.ConfigError(f"init = {run!r}: its state holds {bad[:3]}, not tensors of this model "
                            "(init takes a run that trains the model's own tensors, e.g. probe or fedavg)")
    with torch.no_grad():
        for k, v in state.items():
            params[k].copy_(v)
    s = json.loads((out / "summary.json").read_text())
    return {"from": str(out), "method": s["method"], "tensors": sorted(state), "up_total": s["bytes"]["up_total"],
            "down_total": s["bytes"]["down_total"], "client_flops": s["flops"]["client_total"], "metric": s["final"]}


def build(cfg: C.RunConfig) -> Setup:
    check(cfg)
    task = tasks.build(cfg.task, cfg.task_options, cfg.seed)
    kind, alpha = C.parse_partition(cfg.partition)
    try:
        shards = partition.split(kind, alpha, task.labels, task.domains, cfg.clients, cfg.seed)
    except ValueError as e:
        raise C.ConfigError(f"partition {cfg.partition!r} on task {cfg.task!r}: {e}") from None
    method = methods.build(cfg)
    init = start_from(task.model, cfg.init) if cfg.init else None
    with seeded(derive_seed(cfg.seed, 0)):      # e.g. PEFT draws LoRA's A from the global RNG
        model = method.prepare(task.model)
    device.place(model, cfg.device, cfg.dtype)
    n_train = sum(p.numel() for p in method.trainable(model).values())
    info = {"task": task.info, "trainable_params": n_train, "lr": method.lrs(), "method": getattr(method, "info", None), "init": init,
            "model_params": sum(p.numel() for p in model.parameters()),
            "clients": [{"id": k, "examples": len(s)} for k, s in enumerate(shards)],
            "label_histograms": partition.histograms(shards, task.labels)}
    return Setup(cfg, task, method, model, shards, info)


# --- checkpoints: <out>/ckpt/round-NNNN/{state,clients}.safetensors, then latest.json (atomic) ---

def save_checkpoint(out: Path, rnd: int, state: dict, client_states: dict, history: list) -> None:
    """Write the round's files, fsync them and their folder, then atomically replace latest.json (written,
    fsynced, renamed, folder fsynced): the commit point. It holds the history (every round's record), so a
    resume recovers a round whose metrics line the kill cut off."""
    ck = out / "ckpt"
    d = ck / f"round-{rnd:04d}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in state.items()}, d / "state.safetensors")
    flat = {f"{cid}/{k}": v.contiguous() for cid, s in client_states.items() for k, v in s.items()}
    save_file(flat, d / "clients.safetensors")
    for p in (d / "state.safetensors", d / "clients.safetensors", d, ck):
        fsync(p)
    tmp = ck / "latest.json.tmp"
    tmp.write_text(json.dumps({"round": rnd, "dir": d.name, "history": history}))
    fsync(tmp)
    tmp.replace(ck / "latest.json")                  # the commit point
    fsync(ck)
    for old in ck.glob("round-*"):
        if old != d:
            shutil.rmtree(old, ignore_errors=True)


def append_line(path: Path, rec: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(rec) + "\n")
        f.flush()
        os.fsync(f.fileno())


def rewrite_metrics(out: Path, history: list, start: int, resume: bool) -> None:
    """metrics.jsonl = what the checkpoint covers: the lines written before (complete records), else the
    checkpoint's own records (a kill between the checkpoint and its line)."""
    lines = (out / "metrics.jsonl").read_text().splitlines() if resume and (out / "metrics.jsonl").exists() else []
    with open(out / "metrics.jsonl", "w") as f:
        have = {json.loads(l)["round"]: l for l in lines}
        f.writelines(have.get(h["round"], json.dumps(h)) + "\n" for h in history if h["round"] <= start)


def load_checkpoint(out: Path):
    ck = out / "ckpt"
    meta = json.loads((ck / "latest.json").read_text())
    state = load_file(ck / meta["dir"] / "state.safetensors")
    client_states: dict[int, dict] = {}
    for k, v in load_file(ck / meta["dir"] / "clients.safetensors").items():
        cid, name = k.split("/", 1)
        client_states.setdefault(int(cid), {})[name] = v
    return meta["round"], state, client_states, meta["history"]


def run(cfg: C.RunConfig | None = None, *, resume: str | Path | None = None, stop_after: int | None = None,
        tamper: Callable[[int, int, bytes], bytes] | None = None, log=print) -> dict:
    """Run (or resume) a federation; returns the summary (also written to <out>/summary.json).

    stop_after: stop after that round, as an interruption would (tests use it).
    tamper(round, client, bytes) -> bytes: alters a client's upload on the wire (tests use it).
    """
    if resume is not None:
        cfg = resume_config(resume) if cfg is None else cfg
        if Path(cfg.out).resolve() != Path(resume).resolve():
            raise C.ConfigError(f"resume {str(resume)!r} with a config for {cfg.out!r}: use resume_config({str(resume)!r})")
    t_start = time.perf_counter()
    S, out, start, state, client_states, history = begin(cfg, resume is not None, log)
    task, method, model = S.task, S.method, S.model

    bar = tqdm(total=(cfg.rounds - start) * C.per_round(cfg), disable=not cfg.progress, unit="client", file=sys.stderr)
    for rnd in range(start + 1, cfg.rounds + 1):
        clock, rec = Clock(), {"round": rnd, "clients": []}
        t_round = time.perf_counter()
        bar.set_description(f"round {rnd}/{cfg.rounds}")
        uploads, downs, sampled = [], {}, sample_clients(cfg, rnd)
        fail = faults(cfg, rnd, sampled, [len(s) for s in S.shards])
        if cfg.secagg:                             # keys and shares go round before anyone trains
            with clock("secagg"):
                sec = secagg.Round(sampled, cfg.secagg_threshold)
        for cid in sampled:
            with clock("server"):                  # one broadcast, unless the method sends per client
                down = P.broadcast(method, state, rnd, cid, cache=downs)
            if cid in fail:                        # it got the broadcast; its reply never comes
                rec.setdefault("dropped", []).append({"id": cid, "down": len(down), "error": fail[cid]})
                bar.update(1)
                continue
            ctx = ClientContext(cid, rnd, derive_seed(cfg.seed, rnd, cid), cfg, task.loss, client_states.setdefault(cid, {}))
            data = subset(task.train_at(rnd, cfg.rounds), S.shards[cid])
            with clock("client"), PeakRSS(device.resolve(cfg.device)) as mem:
                up, stats = P.client_round(method, model, down, data, ctx, cfg.max_message_bytes)
            if cfg.secagg:                         # the masked input replaces the plain upload
                with clock("secagg"):
                    up = sec.mask(cid, up, method, P.up_schema(method))
            if tamper is not None:
                up = tamper(rnd, cid, up)
            uploads.append((cid, up))
            rec["clients"].append({"id": cid, "up": len(up), "down": len(down), "rss_peak": mem.peak,
                                   "rss_rise": mem.rise, **({"device_peak": mem.device_peak} if mem.device_peak else {}),
                                   **stats})
            bar.update(1)
        state = close_round(S, state, uploads, rnd, rec, clock, history, client_states, out, bar, log,
                            sec if cfg.secagg else None)
        rec["time"] = {**clock.total, "round": time.perf_counter() - t_round}
        rec["time"]["engine"] = rec["time"]["round"] - sum(clock.total.get(k, 0) for k in ("client", "server", "eval", "secagg"))
        append_line(out / "metrics.jsonl", rec)          # the complete record, checkpoint time included
        if stop_after is not None and rnd >= stop_after and rnd < cfg.rounds:
            bar.close()
            return {"interrupted_after": rnd, "out": str(out)}
    bar.close()
    records = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    summary = summarize(cfg, S, records, time.perf_counter() - t_start)
    if method.personalised or not method.federated:
        summary["per_client"] = evaluate_clients(S, state, client_states)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def load_config(out: str | Path) -> C.RunConfig:
    """A run folder's config.json. Runs recorded before zeroth-order and closed-form methods refused a first-order
    optimizer carry the old default (adamw), which they never used: read as unset."""
    cfg = C.load_json(Path(out) / "config.json")
    if not methods.METHODS[cfg.method].optimizer and cfg.optimizer == "adamw" and cfg.weight_decay == 0:
        cfg.optimizer = ""
    return cfg


def final_model(out: str | Path, device: str = "cpu", dtype: str = "fp32") -> tuple[Setup, int]:
    """A run folder's last checkpointed global model as its clients receive it (the state through the downlink codec:
    what the run evaluated), rebuilt from the run's own config on `device` with its frozen weights in `dtype`, in eval
    mode. -> (the Setup: .model, .task, .method, .cfg; the checkpoint's round)."""
    cfg = load_config(out)
    cfg.device, cfg.dtype = device, dtype
    rnd, state, _, _ = load_checkpoint(Path(out))
    S = build(cfg)
    S.method.load(S.model, P.received(S.method, state, rnd + 1, cfg.max_message_bytes))
    S.model.eval()
    return S, rnd


def resume_config(out: str | Path, rounds: int | None = None, device: str | None = None) -> C.RunConfig:
    """The config that continues the run in folder `out`, wherever that folder now lives (its results are written
    there, whatever config.json says it was called). rounds: continue to that many rounds instead (more extends a
    finished run), refused where the run's schedule depends on its number of rounds, since the run would then not be
    the one made with that number from the start; device: compute there instead of the recorded device."""
    out = Path(out)
    if not (out / "config.json").is_file() or not (out / "ckpt" / "latest.json").is_file():
        raise C.ConfigError(f"--resume {str(out)!r}: no config.json + ckpt/latest.json there")
    cfg = load_config(out)
    state_dir = Path(cfg.engine_options.get("client_state_dir", ""))
    if state_dir.name == "client_state" and state_dir.parent.name == Path(cfg.out).name:    # Flower's, beside the results
        cfg.engine_options = {**cfg.engine_options, "client_state_dir": str(out.resolve() / "client_state")}
    cfg.out = str(out)
    if device is not None:
        cfg.device = device
    if rounds is not None and rounds != cfg.rounds:
        done = json.loads((out / "ckpt" / "latest.json").read_text())["round"]
        why = []
        decay = cfg.lr_decay or methods.METHODS[cfg.method].lr_decay
        if decay != "none":
            why.append(f"its lr decays over its {cfg.rounds} rounds (lr_decay = {decay})")
        if cfg.task_options.get("curriculum"):
            why.append(f"its curriculum splits its {cfg.rounds} rounds into stages")
        if rounds < done:
            why.append(f"it has already trained {done} rounds")
        if why:
            raise C.ConfigError(f"--rounds {rounds} with --resume {str(out)!r}: {'; '.join(why)}, so it cannot continue "
                                f"to {rounds} rounds as the run made with {rounds} from the start; start a new run")
        cfg.rounds = rounds
    return cfg


def begin(cfg: C.RunConfig, resume: bool, log, engine: str = ""):
    """Every engine's preamble: check the config, build the run, write config.json and setup.json, then
    the server's state and history from the checkpoint (resume) or from round 0 (evaluated).
    -> (S, out, start round, server state, client states, history); client states: the checkpoint's, or {}."""
    check(cfg)
    out = Path(cfg.out or f"runs/{cfg.task}-{cfg.method}-{time.strftime('%Y%m%d-%H%M%S')}")
    cfg.out = str(out)
    S = build(cfg)
    out.mkdir(parents=True, exist_ok=True)
    if not resume:          # an earlier run's checkpoint there would be resumed under this run's config
        shutil.rmtree(out / "ckpt", ignore_errors=True)
        (out / "summary.json").unlink(missing_ok=True)
    C.save(cfg, out / "config.json")
    (out / "setup.json").write_text(json.dumps({**S.info, **({"engine": engine} if engine else {})}, indent=1))
    if resume:
        start, state, client_states, history = load_checkpoint(out)
        log(f"lightfed: {engine + ': ' if engine else ''}resuming {out} after round {start}")
    else:
        start, state, client_states = 0, S.method.init_state(S.model), {}
        S.method.load(S.model, P.received(S.method, state, 0, cfg.max_message_bytes))
        history = [{"round": 0, **(evaluate(S.task, S.model, cfg) if cfg.eval_start else {})}]
    rewrite_metrics(out, history, start, resume)
    return S, out, start, state, client_states, history


def evaluate(task: tasks.Task, model, cfg: C.RunConfig | None = None) -> dict:
    """{metric: value} on the test set; with test domains also {"per_domain": {domain: value}}, and the
    metric is then their example-weighted mean (the same number for a mean over examples). On the run's device and
    in its dtype."""
    with device.using(cfg.device if cfg else "cpu", cfg.dtype if cfg else "fp32"):
        return _evaluate(task, model)


def _evaluate(task: tasks.Task, model) -> dict:
    if task.details is not None:         # one pass gives the metric, per domain and per cell
        raw = task.details(model, task.test)
        flat = {d: [x for xs in cells.values() for x in xs] for d, cells in raw.items()}
        return {task.metric: float(np.mean([x for xs in flat.values() for x in xs])),
                "per_domain": {d: float(np.mean(xs)) for d, xs in sorted(flat.items())},
                "cells": {d: {c: float(np.mean(xs)) for c, xs in cells.items()} for d, cells in sorted(raw.items())}}
    if task.test_domains is None:
        return {task.metric: task.evaluate(model, task.test)}
    per, sizes = {}, {}
    for d in sorted(set(task.test_domains.tolist())):
        idx = np.flatnonzero(task.test_domains == d)
        per[d], sizes[d] = task.evaluate(model, subset(task.test, idx)), len(idx)
    return {task.metric: sum(per[d] * sizes[d] for d in per) / sum(sizes.values()), "per_domain": per}


def evaluate_clients(S: Setup, state, client_states: dict) -> dict:
    """Each client's own model (method.personal) on the test examples of its domains (all of the test
    set when the task has no domains). In-process engine only: on Flower a client's state is on its node."""
    task, method, model = S.task, S.method, S.model
    out = {}
    for cid in sorted(client_states):
        method.personal(model, state, client_states[cid])
        test = task.test
        if task.test_domains is not None and task.domains is not None:
            mine = set(task.domains[S.shards[cid]].tolist())
            test = subset(task.test, np.flatnonzero(np.isin(task.test_domains, sorted(mine))))
        with device.using(S.cfg.device, S.cfg.dtype):
            score = task.evaluate(model, test)
        out[str(cid)] = {task.metric: score,
                         "domains": sorted(set(task.domains[S.shards[cid]].tolist())) if task.domains is not None else None}
    method.load(model, state)
    return out


def close_round(S: Setup, state, uploads, rnd: int, rec: dict, clock: Clock, history: list, client_states: dict,
                out: Path, bar, log, sec: secagg.Round | None = None):
    """The server's end of a round, the same in every engine: aggregate (refusing bad uploads), log,
    evaluate, append the record to the history and checkpoint. Returns the new state."""
    cfg, task, method, model = S.cfg, S.task, S.method, S.model
    with clock("server"):
        sampled = [c["id"] for c in rec["clients"]] + [d["id"] for d in rec.get("dropped", [])]
        if sec is None:
            state, report = P.aggregate(method, state, uploads, rnd, max_bytes=cfg.max_message_bytes,
                                        min_clients=cfg.min_clients, sampled=sampled)
        else:                                 # only the survivors' sum; the protocol's bytes join each client's
            state, report = sec.aggregate(method, P.up_schema(method), state, rnd, sampled)
            for c in rec["clients"] + rec.get("dropped", []):
                o = sec.overhead(c["id"])
                c["secagg"] = o
                c["down"] += o["down"]
                c["up"] = c.get("up", 0) + o["up"]     # a dropped client sent its keys and shares
    rec.update(report)
    if cfg.dp_clip > 0:
        rec["dp"] = privacy.epsilon(cfg, rnd)
    for d in rec.get("dropped", []):
        log(f"lightfed: round {rnd}: client {d['id']} dropped: {d['error']}")
    for r in report["rejected"]:
        log(f"lightfed: round {rnd}: refused client {r['id']}: {r['error']}")
    if "failed" in report:
        log(f"lightfed: round {rnd} failed: {report['failed']}")
    if rnd % cfg.eval_every == 0 or rnd == cfg.rounds:
        with clock("eval"):
            method.load(model, P.received(method, state, rnd + 1, cfg.max_message_bytes))   # what clients get next
            rec.update(evaluate(task, model, cfg))
        bar.set_postfix({task.metric: f"{rec[task.metric]:.4g}"})
    rec["time"] = {"round": 0.0, "engine": 0.0, **clock.total}   # final after the checkpoint; a record recovered
                                                                 # from the checkpoint keeps these zeros
    history.append(rec)
    with clock("checkpoint"):
        save_checkpoint(out, rnd, state, client_states, history)
    return state


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return float(np.mean(xs)) if xs else None


def summarize(cfg: C.RunConfig, S: Setup, history: list, wall: float) -> dict:
    rounds = [h for h in history if h["round"] > 0]
    clients = [c for h in rounds for c in h["clients"]]
    metric = S.task.metric
    evals = [h for h in history if metric in h]
    client_s = sum(h["time"].get("client", 0) for h in rounds)
    engine_s = sum(h["time"]["engine"] for h in rounds)
    server_s = sum(h["time"].get("server", 0) for h in rounds)
    return {
        "task": cfg.task, "method": cfg.method, "config": cfg.to_dict(), "code": source_hash(),
        "metric": metric, "final": evals[-1][metric], "initial": history[0].get(metric),
        "history": [{"round": h["round"], metric: h[metric]} for h in evals],
        "per_domain": evals[-1].get("per_domain"), "cells": evals[-1].get("cells"),
        "trainable_params": S.info["trainable_params"], "model_params": S.info["model_params"], "lr": S.info["lr"],
        "method_info": S.info.get("method"), "init": S.info.get("init"),
        "bytes": {"up_per_client_round": _mean([c["up"] for c in clients]),
                  "down_per_client_round": _mean([c["down"] for c in clients]),
                  "up_total": sum(c["up"] for c in clients) + sum(d.get("up", 0) for h in rounds for d in h.get("dropped", [])),
                  "down_total": sum(c["down"] for c in clients) + sum(d["down"] for h in rounds for d in h.get("dropped", [])),
                  "rejected_messages": sum(len(h["rejected"]) for h in rounds)},
        "dp": next((h["dp"] for h in reversed(rounds) if "dp" in h), None),
        "dropped_by_round": {str(h["round"]): [d["id"] for d in h["dropped"]] for h in rounds if h.get("dropped")},
        "clients_per_round": _mean([h["accepted"] for h in rounds]),
        "memory": {"client_rss_peak_bytes": max((c["rss_peak"] or 0) for c in clients) if clients else None,
                   "client_device_peak_bytes": max((c.get("device_peak") or 0) for c in clients) or None if clients else None,
                   "client_rss_rise_bytes": max((c["rss_rise"] or 0) for c in clients) if clients else None,
                   "client_accounted_bytes": max((sum(c["memory_accounted"].values()) for c in clients
                                                  if "memory_accounted" in c), default=None),
                   "client_accounted_parts": clients[0].get("memory_accounted") if clients else None},
        "flops": {"client_total": sum(c.get("flops", 0) for c in clients),
                  "per_client_round": _mean([c.get("flops") for c in clients]),
                  "counter": "torch FlopCounterMode (matmul/conv/attention, fwd+bwd) per sample x samples"},
        "time": {"wall": wall, "client_compute": client_s, "server_compute": server_s, "engine_overhead": engine_s,
                 "eval": sum(h["time"].get("eval", 0) for h in rounds),
                 "engine_overhead_share": engine_s / client_s if client_s else None},
        "out": cfg.out,
    }
