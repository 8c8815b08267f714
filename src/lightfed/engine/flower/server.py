"""The server side: the whole run as local.run's loop, with Flower carrying the bytes (discovery of the
nodes, secure aggregation's phases as QUERY messages, one TRAIN message per sampled client)."""
from __future__ import annotations

import json
import sys
import time

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from lightfed import config as C
from lightfed.engine.flower.config import META, REC, Options, digest, options
from lightfed.engine.flower.records import message_bytes, unpack_stats

POLL = 0.1   # seconds between the ServerApp's pulls for replies (Flower's HTTP grid sleeps 3 s between pulls)


def exchange(grid: Grid, msgs: list[Message], timeout: float | None) -> list[Message]:
    """grid.send_and_receive, pulling every POLL s: the replies that came within `timeout` (None: all).
    Pushing sets each message's id (callers map replies back through reply_to_message_id)."""
    ids = set(grid.push_messages(msgs))
    end = None if timeout is None else time.monotonic() + timeout
    out: list[Message] = []
    while ids and (end is None or time.monotonic() < end):
        got = list(grid.pull_messages(ids))
        out += got
        ids -= {r.metadata.reply_to_message_id for r in got}
        if ids:
            time.sleep(POLL)
    return out


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
            replies = exchange(grid, msgs, opts.round_timeout or None)
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
        replies = exchange(grid, msgs, opts.round_timeout or None)
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

    opts = options(cfg)
    if threads or opts.server_threads:
        torch.set_num_threads(threads or opts.server_threads)
    t_start = time.perf_counter()
    # client states live on the clients: the server keeps none (and checkpoints none)
    S, out, start, state, _, history = local.begin(cfg, resume, log, engine)
    method = S.method

    known: dict[int, int | None] = {}
    t = time.perf_counter()
    nodes = discover(grid, cfg, opts, known, log)
    log(f"lightfed: {engine}: {len(nodes)} of {cfg.clients} clients have a node ({time.perf_counter() - t:.1f} s); "
        f"set up in {time.perf_counter() - t_start:.1f} s")
    by_node = {n: c for c, n in nodes.items()}
    key = digest(cfg)
    per_round = C.per_round(cfg)
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
            replies = exchange(grid, msgs, opts.round_timeout or None)
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
