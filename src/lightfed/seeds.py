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


# --- counter-based draws: the same numbers on any CPU or GPU, made on the device ---------------------
_M32 = 0xFFFFFFFF
_UNIFORMS = 4                                       # Irwin-Hall: the sum of 4 uniforms, scaled to unit variance
_SCALE = float(torch.tensor(math.sqrt(3.0), dtype=torch.float32)) * 2.0**-24     # float32(sqrt 3) x 2^-24, exact
COUNTER_CHUNK = 1 << 22


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2^32 for int64 x in [0, 2^32): split in 16-bit halves so no product leaves int64."""
    return ((x & 0xFFFF) * c + (((x >> 16) * (c & 0xFFFF)) << 16)) & _M32


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mix (xor-shift-multiply; every step exact in int64 on every device)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def counter_normal(shape, seed: int, device=None) -> torch.Tensor:
    """Unit-variance, zero-mean draws of `shape`, float32 on `device`, from `seed`: element i takes 4 uniforms of 24
    bits from a counter-based hash of (seed, 4 i + j) in integer arithmetic, z = (sum - 2 (2^24 - 1)) x sqrt(3) / 2^24
    (one int -> float conversion and one multiply, both correctly rounded: no transcendental function, nothing a
    device may round its own way). The same numbers on every CPU and GPU, in any chunking; the Irwin-Hall(4) law
    is near-Gaussian (|z| <= 2 sqrt 3), which a zeroth-order direction needs no more than its mean and variance."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    k0, k1 = seed & _M32, (seed >> 32) & _M32
    n = math.prod(shape)
    out = torch.empty(n, dtype=torch.float32, device=dev)
    for off in range(0, n, COUNTER_CHUNK):
        m = min(COUNTER_CHUNK, n - off)
        c = (torch.arange(off, off + m, device=dev, dtype=torch.int64) * _UNIFORMS).unsqueeze(1) \
            + torch.arange(_UNIFORMS, device=dev, dtype=torch.int64)                              # (m, 4) counters
        h = _hash32(_hash32((c & _M32) ^ k0) ^ _mul32(c >> 32, 0x9E3779B9) ^ k1)
        s = (h >> 8).sum(1) - 2 * ((1 << 24) - 1)                                                # (m,) exact ints
        out[off:off + m] = s.to(torch.float32) * _SCALE
    return out.view(tuple(shape))
