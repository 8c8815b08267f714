"""Malformed variants of a valid message, for fuzzing a receiver (tests/test_wire.py,
benchmarks/robustness.py). Some variants may still be well-formed messages."""
from __future__ import annotations

import random
import struct
import zlib


def recrc(body: bytes) -> bytes:
    """body + a valid CRC32 trailer."""
    return body + struct.pack("<I", zlib.crc32(body))


def mutants(msg: bytes, n: int, rng: random.Random):
    """n variants of `msg`: 1-3 byte flips, cuts, insertions or deletions, half with the stale CRC and half with
    a recomputed one (which exercises the parser); every 10th is garbage, every 20th garbage with the right magic
    and a valid CRC."""
    for k in range(n):
        if k % 10 == 9:
            g = rng.randbytes(rng.randrange(0, min(2 * len(msg), 1 << 16) + 16))
            yield recrc(msg[:3] + g[3:]) if k % 20 == 19 and len(g) > 3 else g
            continue
        b = bytearray(msg[:-4])
        for _ in range(rng.randint(1, 3)):
            op, i = rng.randrange(4), rng.randrange(len(b) + 1)
            if op == 0 and i < len(b):
                b[i] = rng.randrange(256)
            elif op == 1:
                del b[i:]
            elif op == 2:
                b[i:i] = rng.randbytes(rng.randint(1, 8))
            else:
                del b[i: i + rng.randint(1, 8)]
        yield recrc(bytes(b)) if k % 2 else bytes(b) + msg[-4:]
