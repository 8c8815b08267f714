"""Fuzzing a receiver: every mutant of a real message (wire/fuzz.mutants) fed to the code that receives it, and
tallied. tests/test_robust.py runs it on every method's messages and secure aggregation's; benchmarks/robustness.py
at 10,000 mutants a kind.

    receivers = method_receivers(m, model, train, cfg, loss)     # {kind: Receiver}: "up", "down", a seed-only downlink
    counts = tally(msg, n, random.Random(0), r)                  # {"mutants", "refused", "named", "well_formed",
                                                                 #  "crashes", "state_changed", "examples", ...}
A crash is any exception the receiver lets through that is not a refusal; a refused mutant must leave the
receiver's state as it was; a refusal should name the field (or header, CRC, trailer) at fault.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from lightfed import secagg
from lightfed.data.tensors import Data, subset
from lightfed.engine import protocol as P
from lightfed.methods.base import ClientContext, Method, Rejected
from lightfed.wire import WireError, encode
from lightfed.wire.fuzz import mutants

NAMES = ("field '", "<field ", "<header>", "<crc>", "<trailer>", "_n:", "digest", "steps")


@dataclass
class Receiver:
    msg: bytes                                  # the real message
    receive: Callable[[bytes], str | None]      # a mutant -> None (taken as well-formed) or the refusal's reason
    state: Callable[[], dict] | None = None     # a snapshot of what a refusal must not change
    reset: Callable[[], None] | None = None     # after each mutant: the receiver as it was before the fuzzing


def names_a_field(err: str) -> bool:
    return any(s in err for s in NAMES)


def marks(d: dict) -> dict:
    """What an in-place change or a replaced entry would alter: each value's identity and, for a tensor, its version
    counter (torch bumps it on every in-place write)."""
    return {k: (id(v), v._version if torch.is_tensor(v) else repr(v)) for k, v in d.items()}


def tally(n: int, rng: random.Random, r: Receiver) -> dict:
    c = {"mutants": 0, "refused": 0, "named": 0, "well_formed": 0, "crashes": 0, "state_changed": 0, "examples": []}
    t = time.perf_counter()
    for bad in mutants(r.msg, n, rng):
        if bad == r.msg:
            continue
        c["mutants"] += 1
        before = r.state() if r.state else None
        try:
            err = r.receive(bad)
        except Exception as e:  # noqa: BLE001  (what the fuzzing counts)
            err, c["crashes"] = None, c["crashes"] + 1
            c["examples"].append(f"CRASH {e!r}"[:200])
        else:
            if err is None:
                c["well_formed"] += 1
            else:
                c["refused"] += 1
                c["named"] += names_a_field(err)
                c["state_changed"] += bool(r.state) and r.state() != before
                if len(c["examples"]) < 3:
                    c["examples"].append(err[:120])
        if r.reset:
            r.reset()
    c["bytes"], c["seconds"] = len(r.msg), time.perf_counter() - t
    return c


def method_receivers(m: Method, model: torch.nn.Module, train: Data, cfg, loss) -> dict[str, Receiver]:
    """Method m's message kinds, made for real (round 1: one client on 16 examples of `train`), each with its receiver:
    "up" -> the server's aggregate (after round 1), "down" and a seed-only downlink's kind -> the client's round 2."""
    model = m.prepare(model)
    state0 = m.init_state(model)
    down = P.broadcast(m, state0, 1)
    ctx = ClientContext(0, 1, 5, cfg, loss, {})
    up, _ = P.client_round(m, model, down, subset(train, range(16)), ctx, cfg.max_message_bytes)
    state1, _ = P.aggregate(m, state0, [(0, up)], 1, max_bytes=cfg.max_message_bytes, sampled=[0])
    kept = {k: v.clone() for k, v in ctx.state.items()}

    def server(bad):
        _, rep = P.aggregate(m, state1, [(1, bad)], 2, max_bytes=cfg.max_message_bytes, sampled=[1])
        return rep["rejected"][0]["error"] if rep["rejected"] else None

    def client(bad):
        try:
            P.client_round(m, model, bad, subset(train, range(4)), ClientContext(0, 2, 6, cfg, loss, ctx.state),
                           cfg.max_message_bytes)
        except (WireError, Rejected) as e:
            return str(e)
        return None

    def reset():
        ctx.state.clear()
        ctx.state.update({k: v.clone() for k, v in kept.items()})

    out = {"up": Receiver(up, server, lambda: marks(state1)), "down": Receiver(down, client, lambda: marks(ctx.state), reset)}
    if "_held" in state1 and hasattr(m, "downlink"):          # the seed-only downlink to a client that holds round 1
        k2, f2, s2 = m.downlink(state1, 2, 0)
        if k2 != "down":
            out[k2] = Receiver(encode(f2, s2, kind=f"{m.name}/{k2}"), client, lambda: marks(ctx.state), reset)
    return out


def secagg_receivers() -> dict[str, Receiver]:
    """Secure aggregation's messages (4 clients, 8 coordinates), each fed to its receiver. A forged ciphertext fails
    AES-GCM's tag (InvalidTag): a refusal that names the ciphertext."""
    U = [0, 1, 2, 3]
    server, clients = secagg.Server(U), {i: secagg.Client(i) for i in U}
    keys = {i: c.keys() for i, c in clients.items()}
    roster = server.roster(keys)
    shares = {i: c.shares(roster) for i, c in clients.items()}
    inbox = server.route(shares)
    for i, c in clients.items():
        c.receive(inbox[i])
    masked = {i: clients[i].masked(np.arange(8, dtype=np.uint64)) for i in U}
    req = secagg.encode({"dropped": np.array([3], dtype="<u4").tobytes()}, {"dropped": secagg.Spec("bytes", max_len=16)},
                        kind="secagg/unmask")
    reveal = clients[0].unmask(req)

    def refusing(fn):
        def receive(b):
            try:
                fn(b)
            except WireError as e:
                return str(e)
            except Exception as e:  # noqa: BLE001
                if type(e).__name__ == "InvalidTag":
                    return "<field ciphertext>: AES-GCM's tag does not match"
                if isinstance(e, ValueError) and "secagg" in str(e):
                    return str(e)
                raise
            return None
        return receive

    return {
        "keys": Receiver(keys[0], refusing(lambda b: secagg.Server(U).roster({**keys, 0: b}))),
        "roster": Receiver(roster, refusing(lambda b: secagg.Client(0).shares(b))),
        "shares": Receiver(shares[0], refusing(lambda b: server.route({**shares, 0: b}))),
        "inbox": Receiver(inbox[1], refusing(lambda b: clients[1].receive(b))),
        "masked": Receiver(masked[0], refusing(lambda b: server.unmask({**masked, 0: b}, 8, lambda i, q: clients[i].unmask(q)))),
        "unmask": Receiver(req, refusing(lambda b: clients[1].unmask(b))),
        "reveal": Receiver(reveal, refusing(lambda b: server.unmask(masked, 8, lambda i, q: b if i == 0 else clients[i].unmask(q)))),
    }
