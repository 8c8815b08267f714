"""Seeds and random numbers that are the same in every process and on every CPU.

Everything random in lightfed (client shuffles, FLITE's factors, zeroth-order directions) comes
from an explicit generator seeded by `derive(...)` of the run seed and counters: never from the
global RNG state. torch's float32 normals differ between CPU kernels (default / AVX2 / AVX512),
its float64 ones do not: `normal` draws in float64 and rounds, so a server on another machine
regenerates the same numbers (FLITE's factors, replayed ZO directions).
"""
from __future__ import annotations

import hashlib
import math
import struct

import torch

CHUNK = 1 << 20          # float64 normals drawn per call (part of the definition of the stream)


def derive(*parts: int) -> int:
    """A 63-bit seed from integers (blake2b of their little-endian uint64s): portable, order-sensitive."""
    data = struct.pack(f"<{len(parts)}Q", *(int(p) % 2**64 for p in parts))
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 1


def generator(*parts: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(derive(*parts))


def normal(shape, seed: int, fast: bool = False) -> torch.Tensor:
    """N(0, I) of `shape`, float32 on the CPU, from `seed`. fast=True: torch's float32 draw (~4x
    faster, but the numbers depend on the CPU's kernels, so only like machines agree)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    if fast:
        return torch.randn(tuple(shape), generator=g, dtype=torch.float32)
    n = math.prod(shape)
    z = torch.empty(n, dtype=torch.float32)
    for off in range(0, n, CHUNK):
        k = min(CHUNK, n - off)
        z[off:off + k] = torch.randn(k, generator=g, dtype=torch.float64)
    return z.view(tuple(shape))


def orthogonal(shape, seed: int) -> torch.Tensor:
    """A (rows, cols) matrix with orthonormal rows or columns (what nn.init.orthogonal_ makes), float32,
    from `seed`: float64 normals, QR in float64 with the signs fixed by diag(R), rounded to float32, so
    every CPU gets the same matrix."""
    rows, cols = shape
    g = torch.Generator(device="cpu").manual_seed(seed)
    a = torch.randn(max(rows, cols), min(rows, cols), generator=g, dtype=torch.float64)
    q, r = torch.linalg.qr(a)                                  # (max, min), orthonormal columns
    q = q * torch.sign(torch.diagonal(r)).where(torch.diagonal(r) != 0, torch.ones(()))
    return (q if rows >= cols else q.T).to(torch.float32).contiguous()
