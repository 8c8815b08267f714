"""The client side: a ClientApp's handlers. `train` runs protocol.client_round on the node (or in the node's
worker process); `query` answers the server's discovery and secure aggregation's phases. A client's private
state lives on its node (Flower's Context, or files in engine_options.client_state_dir), never in a message."""
from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path

from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict

from lightfed import config as C
from lightfed.engine.flower.config import (META, NODE_DEVICE, REC, SECAGG_REC, STATE_REC, Options, config_from_run_config,
                                           digest, options)
from lightfed.engine.flower.faults import inject
from lightfed.engine.flower.records import pack_stats
from lightfed.engine.flower.train import setup, train_core

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
        from lightfed.engine.flower import node_worker as W
        W.start(W.socket_path(digest(cfg), _partition_id(context)), idle=options(cfg).worker_idle,
                max_bytes=2 * cfg.max_message_bytes + (1 << 30), config=cfg.to_dict())
    return Message(RecordDict({REC: ConfigRecord({"partition-id": -1 if _partition_id(context) is None
                                                  else _partition_id(context), "pid": os.getpid()})}), reply_to=msg)


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
    if NODE_DEVICE in context.node_config:          # this node's own device (the messages do not depend on it)
        cfg = dataclasses.replace(cfg, device=str(context.node_config[NODE_DEVICE]))
    if opts.node_worker:       # the model lives in the node's worker; this process imports no torch
        from lightfed.engine.flower import node_worker as W
        state_blob = _client_state_blob(context, cid, rnd, opts)
        h, (state_blob, up) = W.call(W.socket_path(digest(cfg), pid), {"config": cfg.to_dict(), "round": rnd, "cid": cid},
                                     [state_blob, down], max_bytes=2 * cfg.max_message_bytes + (1 << 30), idle=opts.worker_idle)
        stats, measure = h["stats"], h["measure"]
        inject(faults, rnd, cid)
        _store_client_state_blob(context, cid, state_blob, rnd, opts)
    else:
        up, state, stats, measure = train_core(cfg, rnd, cid, down, _load_client_state(context, cid, rnd, opts))
        if cfg.secagg:                     # the masked input replaces the plain upload (secagg.py)
            up = _mask(cfg, opts, context, rnd, cid, up)
        inject(faults, rnd, cid)
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
    method = setup(cfg, opts).method
    return secagg.Client.restore(cid, held["held"]).mask_upload(up, P.up_schema(method), kind=f"{method.name}/up")
