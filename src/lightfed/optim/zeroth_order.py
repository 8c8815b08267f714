"""Zeroth-order (forward-only) core shared by every ZO method (MeZO, FedSPZO, ...).

Directions.  z ~ N(0, I) for parameter number i (its position in the ordered dict of the block
being perturbed) comes from its own CPU torch.Generator seeded with derive(seed, i); the global
RNG is never touched. The normals are drawn in float64, in chunks of CHUNK elements, and
rounded to float32: torch's float32 `randn` has a vectorised AVX2 path that gives different
numbers than its default path (checked: ATEN_CPU_CAPABILITY=default vs avx2 differ), while the
float64 path is the same on both, so a server on another CPU regenerates the very same z.
That portability costs time: ~40 ns per draw on one core vs ~10 ns for float32 (22.7M draws,
MiniLM: ~1 s vs ~0.25 s), and drawing z dominates a CPU ZO step. `draw="fast"` (methods: z="fast")
takes the float32 path: for simulations and fleets of like CPUs; `draw="counter"` (z="counter") draws on the
parameter's device with a counter-based generator in integer arithmetic, the same numbers everywhere (for GPUs).
z is built on the CPU, then moved to the parameter's device and dtype.

Perturbed forward: `perturbed(model, params, seed, scale)` evaluates the model at
theta + scale * z WITHOUT writing to any stored weight. It registers a forward pre-hook on
each module that directly owns a perturbed parameter; the pre-hook points `p.data` at a fresh
tensor theta + scale * z (z regenerated from the seed), and the forward hook points it back at
the original tensor, which nobody wrote to: the stored weights are bit-identical afterwards
by construction (not restored by arithmetic: theta + eps z - 2 eps z + eps z != theta in fp32).
Memory: weights + ONE parameter's perturbed copy at a time (+ one float64 chunk of CHUNK
elements while drawing), i.e. ~ weights + the largest parameter tensor. A parameter owned by
several modules (tied embeddings / lm_head) is materialised once per context and kept until
the context exits (+ that tensor), so each use sees the same perturbation.
Caveat: a perturbed parameter must be used inside its owner's forward (true of every
nn.Linear / Embedding / LayerNorm / Conv / RMSNorm); a parent reading `child.weight` directly
would see the unperturbed weight. tests/test_zo.py checks hooks == an explicitly perturbed copy.

Everything runs under torch.no_grad(): no autograd graph, no .grad buffer is ever created.
Losses are returned as Python floats of the fp32 (or higher) loss. Weights should be fp32
(in bf16/fp16, eps-sized perturbations and L+ - L- are lost to rounding).

Updates: `apply_update(params, seed, coef)` does theta_i <- theta_i - coef * z_i for every
parameter, as two IEEE-rounded ops (t = z * coef; theta - t, coef as float32) so no fused
multiply-add can make one machine differ from another. Clients and the server's replay call
this same function in the same order, so the replay is bit-exact.

FLOPs and memory of a forward are measured with lightfed.measure (count_flops, peak_live_bytes, z_bytes).
"""
from __future__ import annotations

import hashlib
import math
from typing import Callable, Iterator

import numpy as np
import torch
import torch.nn as nn
from lightfed.data.tensors import Data, batches, size
from lightfed.seeds import counter_normal, derive, normal  # noqa: F401  (derive is re-exported)

Params = dict[str, torch.Tensor]
DRAWS = ("portable", "fast", "counter")


# --- seeds and directions ------------------------------------------------------------------------
def f32(x: float) -> float:
    """x rounded to float32 (what the wire carries), as a Python float."""
    return float(np.float32(x))


def direction(seed: int, index: int, shape, draw: str = "portable", device=None) -> torch.Tensor:
    """z of `shape`, float32, for parameter `index` of a block perturbed with `seed`. draw:
      portable  N(0, I), float64 draws on the CPU rounded (lightfed.seeds.normal): the same on every CPU
      fast      torch's float32 draw on the CPU, ~4x faster, like CPUs only (a server on another kind of CPU then
                refuses every upload: digest mismatch, rather than aggregating wrongly)
      counter   a counter-based draw in integer arithmetic made on `device` (lightfed.seeds.counter_normal): the
                same numbers on every CPU and GPU, at device speed"""
    if draw == "counter":
        return counter_normal(shape, derive(seed, index), device)
    return normal(shape, derive(seed, index), draw == "fast")


def _z_like(seed: int, index: int, p: torch.Tensor, draw: str = "portable") -> torch.Tensor:
    z = direction(seed, index, p.shape, draw, p.device)
    return z if (z.device == p.device and p.dtype == torch.float32) else z.to(p.device, p.dtype)


# --- perturbed forward ---------------------------------------------------------------------------
def owners(model: nn.Module) -> dict[int, list[nn.Module]]:
    """id(parameter) -> every module that holds it directly (two for tied weights)."""
    out: dict[int, list[nn.Module]] = {}
    for m in model.modules():
        for p in m._parameters.values():
            if p is not None and m not in out.setdefault(id(p), []):
                out[id(p)].append(m)
    return out


class perturbed:
    """with perturbed(model, params, seed, scale): loss = ...   evaluates at theta + scale * z(seed).

    `params`: ordered {name: parameter} of the block; z for the i-th is direction(seed, i, shape).
    Nothing is written to the stored weights (see the module docstring for how and what it costs).
    Contexts on disjoint blocks nest (FedSPZO keeps theta1's open while it perturbs theta2)."""

    def __init__(self, model: nn.Module, params: Params, seed: int, scale: float, owner_map=None, draw: str = "portable"):
        self.model, self.seed, self.scale, self.draw = model, seed, float(scale), draw
        self.index = {id(p): i for i, p in enumerate(params.values())}
        self.owner_map = owner_map if owner_map is not None else owners(model)
        self.shared = {pid for pid in self.index if len(self.owner_map.get(pid, ())) > 1}
        self.held: dict[int, torch.Tensor] = {}              # perturbed copies of shared params
        self.active: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}   # id -> (param, original data)
        self.handles = []

    def _value(self, p: torch.Tensor, orig: torch.Tensor) -> torch.Tensor:
        pid = id(p)
        if pid in self.held:
            return self.held[pid]
        v = _z_like(self.seed, self.index[pid], orig, self.draw).mul_(self.scale).add_(orig)
        if pid in self.shared:
            self.held[pid] = v
        return v

    def _pre(self, module, args):
        for p in module._parameters.values():
            if p is not None and id(p) in self.index and id(p) not in self.active:
                orig = p.data
                self.active[id(p)] = (p, orig)
                p.data = self._value(p, orig)

    def _post(self, module, args, out):
        for p in module._parameters.values():
            if p is not None and id(p) in self.active:
                q, orig = self.active.pop(id(p))
                q.data = orig

    def __enter__(self):
        self._grad = torch.is_grad_enabled()
        torch.set_grad_enabled(False)
        mods = {id(m): m for pid in self.index for m in self.owner_map.get(pid, ())}
        for m in mods.values():
            self.handles.append(m.register_forward_pre_hook(self._pre))
            self.handles.append(m.register_forward_hook(self._post))
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        for p, orig in self.active.values():      # a forward that raised half way
            p.data = orig
        self.active.clear()
        self.held.clear()
        self.handles = []
        torch.set_grad_enabled(self._grad)
        return False


class shifted:
    """with shifted(params, seed, scale): loss = ...   evaluates at theta + scale * z(seed) by writing it IN
    PLACE, and copies the saved originals back on exit (bit-exact: a copy, not arithmetic).

    For small blocks read through a tensor that no module owns at call time: FLITE's latent z lives on the
    model root and every latent layer reads its slice z[lo:hi] in its own forward, so `params` may be views
    (slices) of z, and FedSPZO's f2, which calls the last layers without the root's forward, still sees the
    shift. Memory: a copy of the block (K floats), not of any weight."""

    def __init__(self, params: Params, seed: int, scale: float, draw: str = "portable"):
        self.params, self.seed, self.scale, self.draw = params, seed, float(scale), draw

    def __enter__(self):
        self._grad = torch.is_grad_enabled()
        torch.set_grad_enabled(False)
        self.saved = [p.detach().clone() for p in self.params.values()]
        for i, p in enumerate(self.params.values()):
            p.add_(_z_like(self.seed, i, p, self.draw).mul_(self.scale))
        return self

    def __exit__(self, *exc):
        for p, keep in zip(self.params.values(), self.saved):
            p.copy_(keep)
        self.saved = []
        torch.set_grad_enabled(self._grad)
        return False


@torch.no_grad()
def two_point(loss: Callable[[], torch.Tensor], model: nn.Module, params: Params, seed: int, eps: float,
              owner_map=None, draw: str = "portable", in_place: bool = False) -> tuple[float, float, float]:
    """Central estimate of the directional derivative along z(seed):
    g = (L(theta + eps z) - L(theta - eps z)) / (2 eps).   Returns (g, L+, L-) as Python floats.
    in_place: through `shifted` (small blocks, views of FLITE's z) instead of `perturbed`'s hooks."""
    with perturbation(model, params, seed, +eps, owner_map, draw, in_place):
        lp = loss().double().item()
    with perturbation(model, params, seed, -eps, owner_map, draw, in_place):
        lm = loss().double().item()
    return (lp - lm) / (2 * eps), lp, lm


def perturbation(model: nn.Module, params: Params, seed: int, scale: float, owner_map=None, draw: str = "portable",
                 in_place: bool = False):
    """The context a perturbed forward runs in: `perturbed` (hooks on the owners: nothing written, for weights)
    or, in_place, `shifted` (small blocks written and restored: views of FLITE's z)."""
    return shifted(params, seed, scale, draw) if in_place else perturbed(model, params, seed, scale, owner_map, draw)


# --- updates and replay --------------------------------------------------------------------------
@torch.no_grad()
def apply_update(params: Params, seed: int, coef: float, draw: str = "portable") -> None:
    """theta_i <- theta_i - coef * z_i(seed) for every tensor of `params`, in place, in order.
    The client's step and the server's replay both call this: same numbers, bit for bit."""
    c = f32(coef)
    for i, p in enumerate(params.values()):
        p.sub_(_z_like(seed, i, p, draw).mul_(c))


Update = tuple[str, int, float]   # (block name, direction seed, coef = lr * g / P)


@torch.no_grad()
def replay(state: Params, blocks: dict[str, list[str]], updates: list[Update], draw: str = "portable") -> Params:
    """A copy of `state` after the updates, applied in order to the named blocks."""
    out = {k: v.detach().clone() for k, v in state.items()}
    for block, seed, coef in updates:
        apply_update({n: out[n] for n in blocks[block]}, seed, coef, draw)
    return out


def digest(tensors: Params) -> bytes:
    """8-byte blake2b of (name, raw little-endian bytes) in sorted name order (so any dict order,
    e.g. safetensors' sorted keys, gives the same digest): what a client commits its weights with."""
    h = hashlib.blake2b(digest_size=8)
    for name in sorted(tensors):
        t = tensors[name]
        h.update(name.encode())
        a = t.detach().to("cpu").contiguous()
        a = (a.view(torch.int16) if a.dtype == torch.bfloat16 else a).numpy()
        h.update(a.astype(a.dtype.newbyteorder("<"), copy=False))    # hashed in place, no copy
    return h.digest()


# --- batches, accounting -------------------------------------------------------------------------
def num_steps(n: int, batch_size: int, steps: int, epochs: float) -> int:
    """K local steps: `steps` if > 0, else ceil(epochs * n / batch_size) (at least 1)."""
    return steps if steps > 0 else max(1, math.ceil(epochs * n / batch_size))


def step_batches(data: Data, batch_size: int, steps: int, generator: torch.Generator) -> Iterator[Data]:
    """`steps` mini-batches: shuffled epochs from `generator`, one after another."""
    if size(data) == 0:
        raise ValueError("no training examples")
    done = 0
    while done < steps:
        for b in batches(data, batch_size, generator):
            yield b
            done += 1
            if done == steps:
                return
