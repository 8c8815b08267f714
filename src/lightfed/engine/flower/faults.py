"""Injected faults: tests and the CI make a client app raise, stall or die; nothing else does."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

FAULTS_ENV = "LIGHTFED_FLOWER_FAULTS"  # e.g. "raise@1:2,sleep@2:0:30,exit@1:3" (kind@round:client[:seconds])


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


def inject(faults, rnd: int, cid: int) -> None:
    for f in faults:
        if f.round == rnd and f.cid == cid:
            if f.kind == "raise":
                raise RuntimeError(f"injected fault: client {cid} crashes in round {rnd}")
            if f.kind == "sleep":
                time.sleep(f.seconds)
            if f.kind == "exit":
                os._exit(17)
