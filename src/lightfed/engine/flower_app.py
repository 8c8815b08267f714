"""The Flower engine: any lightfed method + task as a Flower 1.42 ServerApp / ClientApp (Message API).

The round is the in-process engine's round (engine/protocol.py), with Flower carrying the bytes:

    ServerApp   down = protocol.broadcast(...)   -> "lightfed": ConfigRecord{"down": bytes}
                                                    "lightfed-meta": ConfigRecord{round, cid, config digest}
                                                    one Message per sampled client (local.sample_clients)
    ClientApp   up, stats = protocol.client_round(...) with local's ClientContext (same derive_seed)
                                                 -> "lightfed": ConfigRecord{"up": bytes}, "lightfed-meta",
                                                    "stats": MetricRecord (numbers), "measure": MetricRecord
    ServerApp   state, report = protocol.aggregate(method, state, uploads in client order, ...)

so the final model and the metrics equal the in-process engine's for the same config, seed and
torch thread count (CPU kernels may sum in another order with another number of threads).

Clients: lightfed client k is the SuperNode whose node config says `partition-id = k` (the
Simulation Engine numbers its virtual nodes 0..N-1 that way). The ServerApp asks every node for
its partition-id once (a `query` message), so the map node id -> client id is deterministic.
A client keeps what a method stores between rounds (ClientContext.state) in Flower's
Context.state, on its own node.

Faults: a reply that is an error (the client app raised or crashed), a node that went away, or no
reply within `round_timeout` is recorded in the round's `dropped` list; the round aggregates the
replies it got (protocol.aggregate enforces min_clients).

Bytes: `up` / `down` per client are len() of the lightfed bytes, exactly as in-process; Flower's
envelope (the serialized Message objects Flower ships, minus the lightfed bytes) is reported
apart, per client, under `flower`.

Three ways to run it:
    lightfed run --engine flower-sim ...          run_simulation() below (Ray, all on loopback)
    flwr run . <superlink> --run-config F.toml    deployment: `server_app` / `client_app` below,
                                                  the config in run config `lightfed-config`
    python -m lightfed.engine.flower_app run-config LIGHTFED.toml --out DIR > F.toml
                                                  writes that run-config file
Heavy modules (torch, the tasks) are imported inside the handlers: a `query` stays cheap.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from lightfed import config as C

RUN_CONFIG_KEY = "lightfed-config"     # run config: the lightfed RunConfig as JSON text (or a path to a TOML/JSON file)
OUT_KEY = "lightfed-out"               # run config: results folder of the ServerApp (absolute path advised)
REC = "lightfed"                       # the ConfigRecord holding lightfed's bytes ("down" / "up"), and nothing else
META = "lightfed-meta"                 # round, client id, config digest (apart: the broadcast record is then the
                                       # same object for every client, which Flower stores and ships once)
RESUME_KEY = "lightfed-resume"         # run config: true = continue the run in lightfed-out from its checkpoint
STATE_REC = "lightfed-client-state"    # Context.state record holding a client's ClientContext.state
SECAGG_REC = "lightfed-secagg"         # Context.state record holding a client's secure-aggregation secrets (this round)
FAULTS_ENV = "LIGHTFED_FLOWER_FAULTS"  # e.g. "raise@1:2,sleep@2:0:30,exit@1:3" (kind@round:client[:seconds])
SAFE_ENV = {                           # see docs/flower.md: offline, loopback only, nothing pulled at run time
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_TELEMETRY_ENABLED": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
}


@dataclass
class Options:
    """cfg.engine_options for the Flower engines (the in-process engine ignores them)."""
    client_cpus: float = 1.0      # simulation: Ray CPUs per virtual client (2 cores, 1 each = 2 clients at a time)
    client_gpus: float = 0.0      # simulation: Ray GPUs per virtual client
    sim_cpus: int = 0             # simulation: CPUs Ray may use (0 = all of this machine)
    client_threads: int = 1       # torch threads in a client app; equal results need the same count as the compared run
    server_threads: int = 0       # torch threads of the ServerApp (0: simulation: the caller's; deployment: torch's default)
    round_timeout: float = 0.0    # seconds to wait for a round's replies (0 = until every node answered or went away)
    node_wait: float = 120.0      # seconds the ServerApp waits for all cfg.clients SuperNodes to connect
    envelope: bool = True         # measure Flower's envelope bytes (serializes each Message once more)
    node_worker: bool = False     # deployment: keep torch and the built model alive in one worker process per node
                                  # (engine/node_worker.py) instead of building them for every message
    worker_idle: float = 600.0    # seconds a node worker waits for the next message before it exits
    client_state_dir: str = ""    # a folder on each node where its clients keep their private state, one file per
                                  # (client, round): it outlives the run, so a resumed run continues with it. Empty:
                                  # Flower's Context (lost when the run ends; simulation sets <out>/client_state)

    def check(self):
        if not self.client_cpus > 0 or self.client_gpus < 0 or self.sim_cpus < 0:
            raise C.ConfigError("engine_options: client_cpus must be > 0, client_gpus and sim_cpus >= 0")
        if self.client_threads < 1 or self.server_threads < 0:
            raise C.ConfigError("engine_options: client_threads must be >= 1, server_threads >= 0")
        if self.round_timeout < 0 or self.node_wait < 0:
            raise C.ConfigError("engine_options: round_timeout and node_wait must be >= 0")


def options(cfg: C.RunConfig) -> Options:
    if cfg.dropout or cfg.straggle:
        raise C.ConfigError("dropout / straggle simulate faults in the in-process engine; on Flower faults are real "
                            "(a client that fails or misses engine_options.round_timeout is dropped)")
    o = C.check_options("engine", "flower", Options, cfg.engine_options)
    if cfg.secagg and o.node_worker:
        raise C.ConfigError("secagg with engine_options.node_worker: not supported yet (the node worker trains; "
                            "the masking would need the client-app process to load torch)")
    return o


# --- the config on the wire ---------------------------------------------------------------------
def _client_view(cfg: C.RunConfig) -> dict:
    """What a client's work depends on: everything but where results go and the progress bar."""
    d = cfg.to_dict()
    d.pop("out"), d.pop("progress")
    return d


def digest(cfg: C.RunConfig) -> str:
    return hashlib.sha256(json.dumps(_client_view(cfg), sort_keys=True).encode()).hexdigest()[:16]


def config_from_run_config(run_config) -> C.RunConfig:
    text = str(run_config.get(RUN_CONFIG_KEY, "") or "").strip()
    if not text:
        raise C.ConfigError(f"run config {RUN_CONFIG_KEY!r} is empty: give the lightfed config as JSON (see "
                            "`python -m lightfed.engine.flower_app run-config --help`)")
    if text.startswith("{"):
        return C.from_dict(json.loads(text))
    p = Path(text)
    return C.load_json(p) if p.suffix == ".json" else C.load_toml(p)


# --- faults (tests and the CI inject them; nothing else does) ------------------------------------
@dataclass(frozen=True)
class Fault:
    kind: str            # raise: the client app raises after its local update | sleep | exit: the process dies
    round: int
    cid: int
    seconds: float = 0.0


def parse_faults(text: str | None) -> tuple[Fault, ...]:
    out = []
    for item in filter(None, (text or "").replace(" ", "").split(",")):
        kind, rest = item.split("@", 1)
        parts = rest.split(":")
        if kind not in ("raise", "sleep", "exit"):
            raise ValueError(f"{FAULTS_ENV}: unknown fault {kind!r} (raise, sleep, exit)")
        out.append(Fault(kind, int(parts[0]), int(parts[1]), float(parts[2]) if len(parts) > 2 else 0.0))
    return tuple(out)


def _inject(faults, rnd: int, cid: int) -> None:
    for f in faults:
        if f.round == rnd and f.cid == cid:
            if f.kind == "raise":
                raise RuntimeError(f"injected fault: client {cid} crashes in round {rnd}")
            if f.kind == "sleep":
                time.sleep(f.seconds)
            if f.kind == "exit":
                os._exit(17)


# --- stats: numbers travel in a MetricRecord, anything else (rare) as JSON -------------------------
def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def pack_stats(stats: dict) -> RecordDict:
    """A client's stats -> MetricRecord (numeric leaves, nested keys joined by '.') + JSON for the rest."""
    nums, other = {}, []

    def walk(path: tuple, v):
        if isinstance(v, dict) and v and all(isinstance(k, str) and "." not in k for k in v):
            for k, x in v.items():
                walk(path + (k,), x)
        elif _is_num(v) or (isinstance(v, list) and v and all(type(x) is type(v[0]) and _is_num(x) for x in v)):
            nums[".".join(path)] = v
        else:
            other.append([list(path), v])

    for k, v in stats.items():
        if "." in k:
            other.append([[k], v])
        else:
            walk((k,), v)
    rd = RecordDict({"stats": MetricRecord(nums)})
    if other:
        rd["stats-other"] = ConfigRecord({"json": json.dumps(other)})
    return rd


def unpack_stats(content: RecordDict) -> dict:
    out: dict = {}

    def put(path: list, v):
        d = out
        for h in path[:-1]:
            d = d.setdefault(h, {})
        d[path[-1]] = v

    for k, v in content["stats"].items():
        put(k.split("."), v)
    if "stats-other" in content:
        for path, v in json.loads(content["stats-other"]["json"]):
            put(path, v)
    return out


def message_bytes(msg: Message, sizes: dict | None = None) -> int:
    """Bytes of the objects Flower ships for a Message: it pushes each object, deflated, once (objects
    are content-addressed). Call inside flwr's no_object_id_recompute() with one `sizes` cache per round:
    then a broadcast record shared by all messages is serialized and hashed once, not once per message."""
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
    sizes = {} if sizes is None else sizes
    total = 0
    for oid, o in get_all_nested_objects(msg).items():
        if oid not in sizes:
            sizes[oid] = len(o.deflate())
        total += sizes[oid]
    return total


# --- the client side ---------------------------------------------------------------------------
_SETUP: dict[str, Any] = {}           # one built task + method + model per client-app process


def _setup(cfg: C.RunConfig, opts: Options):
    import torch
    torch.set_num_threads(opts.client_threads)      # every call: OpenMP thread counts are per calling thread
    key = digest(cfg)
    if key not in _SETUP:
        from lightfed.engine import local
        _SETUP.clear()
        _SETUP[key] = local.build(cfg)
    return _SETUP[key]


def _state_files(d: str, cid: int) -> dict[int, Path]:
    return {int(p.stem.rsplit("-r", 1)[1]): p for p in Path(d).glob(f"client-{cid}-r*.safetensors")}


def _load_client_state(context: Context, cid: int, rnd: int = 0, opts: Options | None = None) -> dict:
    """The client's state after its last participation before round `rnd` (a resumed round sees exactly
    what it saw the first time, even if the client had gone further before the server's crash)."""
    from safetensors.torch import load
    blob = _client_state_blob(context, cid, rnd, opts or Options())
    return dict(load(blob)) if blob else {}


def _client_state_blob(context: Context, cid: int, rnd: int, opts: Options) -> bytes:
    """The client's state as safetensors bytes, without torch (for the node worker)."""
    if opts.client_state_dir:
        before = [r for r in _state_files(opts.client_state_dir, cid) if r < rnd]
        return _state_files(opts.client_state_dir, cid)[max(before)].read_bytes() if before else b""
    rec = context.state.get(STATE_REC) if STATE_REC in context.state else None
    return rec["tensors"] if rec is not None and int(rec["cid"]) == cid else b""


def _store_client_state_blob(context: Context, cid: int, blob: bytes, rnd: int, opts: Options) -> None:
    if opts.client_state_dir:
        from lightfed.engine.files import fsync
        d = Path(opts.client_state_dir)
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".client-{cid}-r{rnd:06d}.tmp"
        tmp.write_bytes(blob)
        fsync(tmp)
        tmp.rename(d / f"client-{cid}-r{rnd:06d}.safetensors")
        fsync(d)
        for r, p in sorted(_state_files(d, cid).items())[:-2]:
            p.unlink()
    elif blob or STATE_REC in context.state:
        context.state[STATE_REC] = ConfigRecord({"cid": cid, "tensors": blob})


def _save_client_state(context: Context, cid: int, state: dict, rnd: int = 0, opts: Options | None = None) -> None:
    from safetensors.torch import save
    blob = save({k: v.contiguous() for k, v in state.items()}) if state else b""
    _store_client_state_blob(context, cid, blob, rnd, opts or Options())


def _process_age() -> float | None:
    """Seconds since this process started (a deployment starts one client-app process per message)."""
    try:
        import psutil
        return time.time() - psutil.Process().create_time()
    except Exception:  # noqa: BLE001 - a measurement only
        return None


def _partition_id(context: Context) -> int | None:
    v = context.node_config.get("partition-id")
    return None if v is None else int(v)


def client_secagg(msg: Message, context: Context) -> Message:
    """One phase of secure aggregation (secagg.py) on this client: its secrets stay in the node's Context."""
    from lightfed import secagg
    meta = msg.content[META]
    rnd, cid, phase = int(meta["round"]), int(meta["cid"]), str(meta["secagg"])
    pid = _partition_id(context)
    if pid is not None and pid != cid:
        raise RuntimeError(f"secagg message for client {cid} reached the node of partition-id {pid}")
    held = context.state.get(SECAGG_REC) if SECAGG_REC in context.state else None
    mine = held["held"] if held is not None and int(held["round"]) == rnd and int(held["cid"]) == cid else None
    if phase != "keys" and mine is None:
        raise RuntimeError(f"secagg: client {cid} holds no keys for round {rnd}")
    reply, now = secagg.step(cid, phase, msg.content[REC]["req"], mine)
    context.state[SECAGG_REC] = ConfigRecord({"round": rnd, "cid": cid, "held": now})
    return Message(RecordDict({REC: ConfigRecord({"reply": reply}), META: ConfigRecord({"round": rnd, "cid": cid})}),
                   reply_to=msg)


def client_query(msg: Message, context: Context) -> Message:
    if META in msg.content and "secagg" in msg.content[META]:
        return client_secagg(msg, context)
    cfg = None
    with contextlib.suppress(Exception):             # a query must answer even with no usable config
        cfg = config_from_run_config(context.run_config)
    if cfg is not None and options(cfg).node_worker:   # warm this node's worker now, not in round 1
        from lightfed.engine import node_worker as W
        W.start(W.socket_path(digest(cfg), _partition_id(context)), idle=options(cfg).worker_idle,
                max_bytes=2 * cfg.max_message_bytes + (1 << 30), config=cfg.to_dict())
    return Message(RecordDict({REC: ConfigRecord({"partition-id": -1 if _partition_id(context) is None
                                                  else _partition_id(context), "pid": os.getpid()})}), reply_to=msg)


def train_core(cfg: C.RunConfig, rnd: int, cid: int, down: bytes, state: dict) -> tuple[bytes, dict, dict, dict]:
    """One client round where the model lives (this process, or the node worker). -> (up, state, stats, measure)"""
    from lightfed.data.tensors import subset
    from lightfed.engine import local
    from lightfed.engine import protocol as P
    from lightfed.measure import PeakRSS
    from lightfed.methods.base import ClientContext

    t_build = time.perf_counter()
    S = _setup(cfg, options(cfg))
    build_s = time.perf_counter() - t_build             # 0 when this process built it before (actors, node workers)
    ctx = ClientContext(cid, rnd, local.derive_seed(cfg.seed, rnd, cid), cfg, S.task.loss, state)   # as local.run's
    data = subset(S.task.train, S.shards[cid])
    t = time.perf_counter()
    with PeakRSS() as mem:
        up, stats = P.client_round(S.method, S.model, down, data, ctx, cfg.max_message_bytes)
    measure = {"seconds": time.perf_counter() - t, "build_seconds": build_s,
               **{k: v for k, v in (("rss_peak", mem.peak), ("rss_rise", mem.rise), ("process_age", _process_age()))
                  if v is not None}}
    return up, ctx.state, stats, measure


def client_train(msg: Message, context: Context, cfg: C.RunConfig | None, faults) -> Message:
    cfg = cfg if cfg is not None else config_from_run_config(context.run_config)
    meta, down = msg.content[META], msg.content[REC]["down"]
    rnd, cid = int(meta["round"]), int(meta["cid"])
    if meta["config"] != digest(cfg):
        raise RuntimeError(f"this node's lightfed config ({digest(cfg)}) is not the server's ({meta['config']})")
    pid = _partition_id(context)
    if pid is not None and pid != cid:
        raise RuntimeError(f"message for client {cid} reached the node of partition-id {pid}")
    opts = options(cfg)
    if opts.node_worker:       # the model lives in the node's worker; this process imports no torch
        from lightfed.engine import node_worker as W
        state_blob = _client_state_blob(context, cid, rnd, opts)
        h, (state_blob, up) = W.call(W.socket_path(digest(cfg), pid), {"config": cfg.to_dict(), "round": rnd, "cid": cid},
                                     [state_blob, down], max_bytes=2 * cfg.max_message_bytes + (1 << 30), idle=opts.worker_idle)
        stats, measure = h["stats"], h["measure"]
        _inject(faults, rnd, cid)
        _store_client_state_blob(context, cid, state_blob, rnd, opts)
    else:
        up, state, stats, measure = train_core(cfg, rnd, cid, down, _load_client_state(context, cid, rnd, opts))
        if cfg.secagg:                     # the masked input replaces the plain upload (secagg.py)
            up = _mask(cfg, opts, context, rnd, cid, up)
        _inject(faults, rnd, cid)
        _save_client_state(context, cid, state, rnd, opts)
    content = pack_stats(stats)
    content[REC] = ConfigRecord({"up": up})
    content[META] = ConfigRecord({"round": rnd, "cid": cid})
    content["measure"] = MetricRecord(measure)
    return Message(content, reply_to=msg)


def _mask(cfg, opts, context: Context, rnd: int, cid: int, up: bytes) -> bytes:
    from lightfed import secagg
    from lightfed.engine import protocol as P
    held = context.state.get(SECAGG_REC) if SECAGG_REC in context.state else None
    if held is None or int(held["round"]) != rnd or int(held["cid"]) != cid:
        raise RuntimeError(f"secagg: client {cid} took no part in round {rnd}'s setup")
    method = _setup(cfg, opts).method
    return secagg.Client.restore(cid, held["held"]).mask_upload(up, P.up_schema(method), kind=f"{method.name}/up")


# --- the server side ---------------------------------------------------------------------------
def _error_text(reply: Message) -> str:
    e = reply.error
    return f"flower error {e.code}: {e.reason}"


def discover(grid: Grid, cfg: C.RunConfig, opts: Options, known: dict, log) -> dict[int, int]:
    """{client id: node id}. `known` (node id -> partition id or None) is updated in place."""
    deadline = time.monotonic() + opts.node_wait
    while True:
        new = [n for n in grid.get_node_ids() if n not in known]
        if new:
            msgs = [Message(RecordDict({META: ConfigRecord({"config": digest(cfg)})}), dst_node_id=n,
                            message_type=MessageType.QUERY, group_id="discover") for n in new]
            replies = list(grid.send_and_receive(msgs, timeout=opts.round_timeout or None))
            sent = {m.metadata.message_id: m.metadata.dst_node_id for m in msgs}
            for r in replies:
                node = sent.get(r.metadata.reply_to_message_id)
                if node is not None:
                    known[node] = None if r.has_error() else int(r.content[REC]["partition-id"])
        mapping: dict[int, int] = {}
        for node in sorted(known):
            pid = known[node]
            if pid is not None and 0 <= pid < cfg.clients:
                if pid in mapping:
                    log(f"lightfed: nodes {mapping[pid]} and {node} both say partition-id={pid}; using {mapping[pid]}")
                    continue
                mapping[pid] = node
        if len(mapping) == cfg.clients or time.monotonic() >= deadline:
            missing = sorted(set(range(cfg.clients)) - set(mapping))
            if missing:
                log(f"lightfed: no SuperNode for clients {missing} after {opts.node_wait:g} s; they count as dropped")
            return mapping
        time.sleep(0.5)


def _secagg_call(grid: Grid, nodes: dict[int, int], rnd: int, key: str, opts: Options):
    """secagg.Round's transport: one exchange of QUERY messages per phase; a missing reply is a dropped client."""
    def call(phase: str, requests: dict[int, bytes]) -> dict[int, bytes]:
        msgs = [Message(RecordDict({REC: ConfigRecord({"req": req}),
                                    META: ConfigRecord({"round": rnd, "cid": cid, "config": key, "secagg": phase})}),
                        dst_node_id=nodes[cid], message_type=MessageType.QUERY, group_id=f"{rnd}-secagg-{phase}")
                for cid, req in requests.items() if cid in nodes]
        replies = list(grid.send_and_receive(msgs, timeout=opts.round_timeout or None))
        sent = {m.metadata.message_id: cid for m, cid in zip(msgs, [c for c in requests if c in nodes])}   # ids: set when sent
        out = {}
        for r in replies:
            cid = sent.get(r.metadata.reply_to_message_id)
            if cid is None:
                continue
            if r.has_error():
                errors[cid] = f"secagg {phase}: {_error_text(r)}"
            elif int(r.content[META]["cid"]) == cid and int(r.content[META]["round"]) == rnd:
                out[cid] = r.content[REC]["reply"]
        return out
    errors: dict[int, str] = {}          # why a client left the setup (reported as its drop)
    call.errors = errors
    return call


def serve(grid: Grid, cfg: C.RunConfig, *, engine: str, threads: int = 0, log=print, resume: bool = False,
          stop_after: int | None = None) -> dict:
    """The whole run on the server side: local.run's loop with Flower carrying the bytes.
    threads: torch threads for the server's work (OpenMP counts are per thread: the Simulation Engine runs
    the ServerApp in a new thread, which would otherwise get the default count, and so other float sums)."""
    import numpy as np
    import torch
    from tqdm import tqdm
    from lightfed.engine import local
    from lightfed.engine import protocol as P
    from flwr.supercore.inflatable.inflatable_object import no_object_id_recompute
    from lightfed import secagg
    from lightfed.measure import Clock

    local.check(cfg)
    opts = options(cfg)
    if threads or opts.server_threads:
        torch.set_num_threads(threads or opts.server_threads)
    out = Path(cfg.out or f"runs/{cfg.task}-{cfg.method}-{time.strftime('%Y%m%d-%H%M%S')}")
    cfg.out = str(out)
    t_start = time.perf_counter()
    S = local.build(cfg)
    task, method, model = S.task, S.method, S.model
    out.mkdir(parents=True, exist_ok=True)
    C.save(cfg, out / "config.json")
    (out / "setup.json").write_text(json.dumps({**S.info, "engine": engine}, indent=1))
    if resume:                                  # the server's state from its checkpoint; clients keep theirs
        start, state, _, history = local.load_checkpoint(out)
        log(f"lightfed: {engine}: resuming {out} after round {start}")
    else:
        start, state = 0, method.init_state(model)
        method.load(model, P.received(method, state, 0, cfg.max_message_bytes))
        history = [{"round": 0, **local.evaluate(task, model)}]
    local.rewrite_metrics(out, history, start, resume)

    known: dict[int, int | None] = {}
    t = time.perf_counter()
    nodes = discover(grid, cfg, opts, known, log)
    log(f"lightfed: {engine}: {len(nodes)} of {cfg.clients} clients have a node ({time.perf_counter() - t:.1f} s); "
        f"set up in {time.perf_counter() - t_start:.1f} s")
    by_node = {n: c for c, n in nodes.items()}
    key = digest(cfg)
    per_round = max(cfg.min_clients, round(cfg.fraction * cfg.clients))
    bar = tqdm(total=(cfg.rounds - start) * per_round, disable=not cfg.progress, unit="client", file=sys.stderr)
    for rnd in range(start + 1, cfg.rounds + 1):
        clock, rec = Clock(), {"round": rnd, "clients": []}
        t_round = time.perf_counter()
        bar.set_description(f"round {rnd}/{cfg.rounds} ({engine})")
        sampled = local.sample_clients(cfg, rnd)
        with clock("server"):                   # one broadcast, unless the method sends per client
            cache: dict = {}
            downs = {cid: P.broadcast(method, state, rnd, cid, cache=cache) for cid in sampled}
        if any(c not in nodes for c in sampled):              # a node may have (re)connected since
            nodes = discover(grid, cfg, Options(**{**opts.__dict__, "node_wait": 0.0}), known, log)
            by_node = {n: c for c, n in nodes.items()}
        sec = None
        if cfg.secagg:                          # keys and shares go round before anyone trains (secagg.py)
            with clock("secagg"):
                sec = secagg.Round([c for c in sampled if c in nodes], cfg.secagg_threshold,
                                   call=_secagg_call(grid, nodes, rnd, key, opts))
        with clock("messages"), no_object_id_recompute():   # building them, and measuring Flower's envelope
            dropped, msgs, env_down, sizes = [], [], {}, {}
            down_recs = {}
            for cid in sampled:
                if cid not in nodes:
                    dropped.append({"id": cid, "down": 0, "error": "no SuperNode with this partition-id"})
                    continue
                if sec is not None and cid not in sec.members:
                    dropped.append({"id": cid, "down": 0, "error": sec.call.errors.get(cid) or sec.failed
                                    or "secagg: no reply during the setup"})
                    continue
                down = downs[cid]
                rec_d = down_recs.setdefault(id(down), ConfigRecord({"down": down}))   # shared when the bytes are
                m = Message(RecordDict({REC: rec_d, META: ConfigRecord({"round": rnd, "cid": cid, "config": key})}),
                            dst_node_id=nodes[cid], message_type=MessageType.TRAIN, group_id=str(rnd))
                if opts.envelope:
                    env_down[cid] = message_bytes(m, sizes) - len(down)
                msgs.append(m)
        with clock("wait"):
            replies = list(grid.send_and_receive(msgs, timeout=opts.round_timeout or None))
        with clock("replies"), no_object_id_recompute():
            got: dict[int, Message] = {}
            sent = {m.metadata.message_id: by_node[m.metadata.dst_node_id] for m in msgs}
            for r in replies:
                cid = sent.get(r.metadata.reply_to_message_id)
                if cid is None:
                    continue
                if r.has_error():
                    dropped.append({"id": cid, "down": len(downs[cid]), "error": _error_text(r)})
                elif int(r.content[META]["round"]) != rnd or int(r.content[META]["cid"]) != cid:
                    dropped.append({"id": cid, "down": len(downs[cid]), "error": "reply for another round or client"})
                else:
                    got[cid] = r
            for cid in sampled:
                if cid in nodes and cid not in got and all(d["id"] != cid for d in dropped):
                    dropped.append({"id": cid, "down": len(downs[cid]), "error": "no reply" + (
                        f" within round_timeout = {opts.round_timeout:g} s" if opts.round_timeout else "")})
            uploads = []
            for cid in sorted(got):                               # the in-process engine's order
                r = got[cid]
                up = r.content[REC]["up"]
                meas = r.content["measure"]
                uploads.append((cid, up))
                clock.total["client"] = clock.total.get("client", 0.0) + float(meas["seconds"])
                c = {"id": cid, "up": len(up), "down": len(downs[cid]), "rss_peak": meas.get("rss_peak"),
                     "rss_rise": meas.get("rss_rise"), **unpack_stats(r.content)}
                c["flower"] = {"down_envelope": env_down.get(cid),
                               "up_envelope": message_bytes(r) - len(up) if opts.envelope else None,
                               "seconds": float(meas["seconds"]), "build_seconds": float(meas.get("build_seconds", 0.0)),
                               "process_age": meas.get("process_age")}
                rec["clients"].append(c)
                bar.update(1)
        rec["dropped"] = sorted(dropped, key=lambda d: d["id"])          # close_round logs them
        if sec is not None:
            sec.masked = dict(uploads)
        # client states live on the clients: the server checkpoints none
        state = local.close_round(S, state, uploads, rnd, rec, clock, history, {}, out, bar, log, sec)
        t = clock.total
        rec["time"] = {**t, "round": time.perf_counter() - t_round}
        # engine overhead: what is neither server, eval nor (visible) client work; clients run in parallel,
        # so only the part of their work that the server waited for counts as client time here
        rec["time"]["engine"] = rec["time"]["round"] - t.get("server", 0) - t.get("eval", 0) \
            - min(t.get("wait", 0), t.get("client", 0))
        local.append_line(out / "metrics.jsonl", rec)
        if not cfg.progress:
            log(f"lightfed: {engine}: round {rnd}: {len(uploads)} replies, {len(rec['dropped'])} dropped, "
                f"{rec['time']['round']:.2f} s (waited {t.get('wait', 0):.2f} s)")
        if stop_after is not None and rnd >= stop_after and rnd < cfg.rounds:
            bar.close()
            return {"interrupted_after": rnd, "out": str(out)}
    bar.close()
    records = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    summary = local.summarize(cfg, S, records, time.perf_counter() - t_start)
    rounds = records[1:]
    cl = [c for h in rounds for c in h["clients"]]
    mean = lambda xs: float(np.mean(xs)) if xs else None  # noqa: E731
    summary["engine"] = engine
    summary["flower"] = {
        "dropped": sum(len(h["dropped"]) for h in rounds),
        "envelope_up_per_client_round": mean([c["flower"]["up_envelope"] for c in cl if c["flower"]["up_envelope"] is not None]),
        "envelope_down_per_client_round": mean([c["flower"]["down_envelope"] for c in cl
                                                if c["flower"]["down_envelope"] is not None]),
        "seconds_per_round": mean([h["time"]["round"] for h in rounds]),
        "nodes": {str(c): n for c, n in sorted(nodes.items())},
        "client_threads": opts.client_threads,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


# --- the apps ----------------------------------------------------------------------------------
def make_apps(cfg: C.RunConfig | None = None, *, faults=None, engine: str = "flower-deployment",
              result: dict | None = None, server_threads: int = 0, log=print, resume: bool = False,
              stop_after: int | None = None) -> tuple[ServerApp, ClientApp]:
    """cfg=None: read the config from the run config (deployment); else use this one (simulation)."""
    server_app, client_app = ServerApp(), ClientApp()
    fixed_faults = tuple(faults) if faults is not None else None

    @server_app.main()
    def _main(grid: Grid, context: Context) -> None:
        c = cfg if cfg is not None else config_from_run_config(context.run_config)
        if cfg is None and str(context.run_config.get(OUT_KEY, "") or ""):
            c.out = str(context.run_config[OUT_KEY])
        again = resume or bool(context.run_config.get(RESUME_KEY, False))
        summary = serve(grid, c, engine=engine, threads=server_threads, log=log, resume=again, stop_after=stop_after)
        if result is not None:
            result["summary"] = summary
        if "interrupted_after" in summary:
            return
        log(f"lightfed: {engine}: {c.task}/{c.method} final {summary['metric']} = {summary['final']:.4g}; "
            f"results in {summary['out']}")

    @client_app.query()
    def _query(msg: Message, context: Context) -> Message:
        return client_query(msg, context)

    @client_app.train()
    def _train(msg: Message, context: Context) -> Message:
        f = fixed_faults if fixed_faults is not None else parse_faults(os.environ.get(FAULTS_ENV))
        return client_train(msg, context, cfg, f)

    return server_app, client_app


# what `flwr run .` loads (pyproject: [tool.flwr.app.components]; flwr checks these names statically)
_apps = make_apps()
server_app = _apps[0]
client_app = _apps[1]


@contextlib.contextmanager
def flower_environment():
    """The environment every Flower process of ours runs in (see SAFE_ENV); per-run FLWR_HOME and Ray temp."""
    tmp = Path(tempfile.mkdtemp(prefix="lf-flwr-"))
    env = {**SAFE_ENV, "FLWR_HOME": str(tmp / "home"), "RAY_TMPDIR": str(tmp / "ray")}
    (tmp / "ray").mkdir()
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield tmp
    finally:
        _stop_leftovers(str(tmp))
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(tmp, ignore_errors=True)


def _stop_leftovers(marker: str, wait: float = 15.0) -> None:
    """Ray's processes of this run (their command line or their RAY_TMPDIR names our per-run temp folder)
    exit shortly after ray.shutdown(); wait for that, then stop any that did not, by pid."""
    try:
        import psutil
    except ImportError:
        return

    def ours():
        out = []
        for p in psutil.process_iter(["pid", "cmdline", "status"]):
            try:
                if p.pid == os.getpid() or p.info["status"] == psutil.STATUS_ZOMBIE:
                    continue
                if any(marker in a for a in (p.info["cmdline"] or ())) or marker in p.environ().get("RAY_TMPDIR", ""):
                    out.append(p)
            except (psutil.Error, TypeError):
                pass
        return out

    deadline = time.monotonic() + wait
    while (left := ours()) and time.monotonic() < deadline:
        time.sleep(0.25)
    for sig in ("terminate", "kill"):
        for p in left:
            with contextlib.suppress(psutil.Error):
                getattr(p, sig)()
        if left:
            _, left = psutil.wait_procs(left, timeout=5)


def run_simulation(cfg: C.RunConfig, *, faults=(), log=print, resume: bool = False, stop_after: int | None = None) -> dict:
    """One run on Flower's Simulation Engine: cfg.clients virtual SuperNodes on Ray, all on loopback.
    Returns the summary (also in <out>/summary.json), like local.run."""
    import logging

    import torch
    from lightfed.engine import local

    local.check(cfg)
    opts = options(cfg)
    cfg.out = cfg.out or f"runs/{cfg.task}-{cfg.method}-{time.strftime('%Y%m%d-%H%M%S')}"
    if resume and not (Path(cfg.out) / "ckpt" / "latest.json").is_file():
        raise C.ConfigError(f"--resume {cfg.out!r}: no ckpt/latest.json there")
    if not opts.client_state_dir:              # the virtual nodes keep their clients' state beside the results
        cfg.engine_options = {**cfg.engine_options, "client_state_dir": str(Path(cfg.out).resolve() / "client_state")}
    result: dict = {}
    server_app, client_app = make_apps(cfg, faults=faults, engine="flower-sim", result=result, log=log,
                                       server_threads=opts.server_threads or torch.get_num_threads(),
                                       resume=resume, stop_after=stop_after)
    with flower_environment():
        from flwr.simulation import run_simulation as flwr_run_simulation
        flwr_run_simulation(
            server_app=server_app, client_app=client_app, num_supernodes=cfg.clients,
            backend_config={"client_resources": {"num_cpus": opts.client_cpus, "num_gpus": opts.client_gpus},
                            "init_args": {"num_cpus": opts.sim_cpus or os.cpu_count() or 1, "num_gpus": 0,
                                          "include_dashboard": False, "logging_level": logging.WARNING}})
    if "summary" not in result:
        raise RuntimeError("the Flower simulation ended without a result (see the log above)")
    return result["summary"]


# --- run config for `flwr run` ---------------------------------------------------------------------
def run_config_toml(cfg: C.RunConfig, out: str = "") -> str:
    """A TOML file for `flwr run . <superlink> --run-config FILE`."""
    import tomllib
    text = f"{RUN_CONFIG_KEY} = {json.dumps(json.dumps(cfg.to_dict(), sort_keys=True))}\n" \
           f"{OUT_KEY} = {json.dumps(str(Path(out).resolve()) if out else '')}\n"
    assert C.from_dict(json.loads(tomllib.loads(text)[RUN_CONFIG_KEY])).to_dict() == cfg.to_dict()
    return text


# --- the same run on two engines? ----------------------------------------------------------------
MEASURED = ("rss_peak", "rss_rise", "flower")      # per-client fields that are measurements, not results


def compare(a: str | Path, b: str | Path) -> list[str]:
    """Differences between two results folders: final global state (bit for bit), metric history, and
    per round: sampled clients, their byte counts and stats, accepted / refused. [] = the same run."""
    import torch
    from safetensors.torch import load_file

    def final_state(d: Path):
        meta = json.loads((d / "ckpt" / "latest.json").read_text())
        return load_file(d / "ckpt" / meta["dir"] / "state.safetensors")

    a, b = Path(a), Path(b)
    diffs = []
    sa, sb = final_state(a), final_state(b)
    if sa.keys() != sb.keys() or not all(torch.equal(sa[k], sb[k]) for k in sa):
        diffs.append("final global state differs")
    ra = [json.loads(l) for l in (a / "metrics.jsonl").read_text().splitlines()]
    rb = [json.loads(l) for l in (b / "metrics.jsonl").read_text().splitlines()]
    if len(ra) != len(rb):
        return diffs + [f"{len(ra)} vs {len(rb)} rounds recorded"]
    metric = json.loads((a / "summary.json").read_text())["metric"]
    for x, y in zip(ra, rb):
        r = x["round"]
        if x.get(metric) != y.get(metric):
            diffs.append(f"round {r}: {metric} {x.get(metric)} vs {y.get(metric)}")
        if r == 0:
            continue
        cx = {c["id"]: {k: v for k, v in c.items() if k not in MEASURED} for c in x["clients"]}
        cy = {c["id"]: {k: v for k, v in c.items() if k not in MEASURED} for c in y["clients"]}
        if cx.keys() != cy.keys():
            diffs.append(f"round {r}: clients {sorted(cx)} vs {sorted(cy)}")
        for cid in sorted(cx.keys() & cy.keys()):
            for k in ("up", "down"):
                if cx[cid][k] != cy[cid][k]:
                    diffs.append(f"round {r}: client {cid}: {k} {cx[cid][k]} vs {cy[cid][k]} bytes")
            if {k: v for k, v in cx[cid].items() if k not in ("up", "down")} != \
                    {k: v for k, v in cy[cid].items() if k not in ("up", "down")}:
                diffs.append(f"round {r}: client {cid}: stats differ")
        if x["accepted"] != y["accepted"] or [e["id"] for e in x["rejected"]] != [e["id"] for e in y["rejected"]]:
            diffs.append(f"round {r}: accepted/refused differ")
    return diffs


def main(argv=None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m lightfed.engine.flower_app",
                                description="Write the run-config TOML that `flwr run` takes for a lightfed config.")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run-config", help="lightfed config (TOML, as for `lightfed run --config`) -> flwr run config")
    r.add_argument("config", nargs="?", help="a lightfed TOML config (default: RunConfig defaults)")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a run setting, e.g. rounds=2")
    r.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE", help="a method option")
    r.add_argument("--task-opt", action="append", default=[], metavar="KEY=VALUE", help="a task option")
    r.add_argument("--engine-opt", action="append", default=[], metavar="KEY=VALUE", help="a Flower engine option")
    r.add_argument("--out", default="", help="results folder written by the ServerApp")
    cp = sub.add_parser("compare", help="exit 1 unless two results folders hold the same run (state, metrics, bytes)")
    cp.add_argument("a")
    cp.add_argument("b")
    a = p.parse_args(argv)
    if a.cmd == "compare":
        diffs = compare(a.a, a.b)
        for d in diffs:
            print(f"lightfed: {a.a} vs {a.b}: {d}", file=sys.stderr)
        if not diffs:
            print(f"lightfed: {a.a} == {a.b}: same final state, metrics and bytes per client and round", file=sys.stderr)
        return 1 if diffs else 0
    try:
        cfg = C.load_toml(a.config) if a.config else C.RunConfig()
        cfg = C.from_dict(dict(C.parse_assignment(s) for s in a.set), cfg)
        cfg.method_options = {**cfg.method_options, **dict(C.parse_assignment(s) for s in a.opt)}
        cfg.task_options = {**cfg.task_options, **dict(C.parse_assignment(s) for s in a.task_opt)}
        cfg.engine_options = {**cfg.engine_options, **dict(C.parse_assignment(s) for s in a.engine_opt)}
        cfg.progress = False
        C.validate(cfg)
        options(cfg)
    except C.ConfigError as e:
        print(f"lightfed: error: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(run_config_toml(cfg, a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
