"""Latent-delta parameterization of any torch model:  theta = theta_pre + U V^T z   (FLITE's map).

One trainable flat latent `z` (K,) is registered on the model root as `model.z`, initialised to
zeros: z = 0 is exactly the pretrained model. Every selected layer l (nn.Linear / nn.Conv2d /
nn.Embedding by exact type, in model.named_modules() order; any module named `head` excluded)
is replaced in place by a LatentLayer that owns the slice z_l = z[o_l : o_l + k_l] and adds a
correction to its frozen weight W_l, viewed as a (rows x cols) matrix:
    Linear (out, in) -> out x in    Conv2d (out, in/g, kh, kw) -> out x (in/g)*kh*kw    Embedding (num, dim) -> num x dim

  form "matrix" (default)   dW_l = A_l Z_l B_l^T              A_l: rows x r   B_l: cols x r   Z_l = z_l.view(r, r)
                            k_l = r^2, live = min(r,rows) * min(r,cols)  (every latent reachable; factors (rows+cols) r)
  form "flat" (the paper)   dW_l = (U_l (V_l^T z_l)).view(rows, cols)      U_l: rows*cols x r   V_l: k x r
                            k_l = k, live = min(k, r)  (k > r wastes latents; factors r x the layer's size)

The map z -> weights is affine, so mean_k theta(z_k) = theta(mean_k z_k): averaging latents is
FedAvg of the generated weights.

Factors: frozen float32, drawn on the CPU by lightfed.seeds.normal (float64 draws rounded: the same
on every CPU) from derive(s_l, 0) for A (rows x r) and derive(s_l, 1) for B^T (r x cols) (flat: U, V^T),
s_l = derive(seed, 1, l), l = the layer's index among the selected layers. Never sent, never saved (non-persistent buffers in
mode "cache"; mode "regen" draws them again in every forward: no memory, more compute).
Scaling (both forms):  A ~ N(0, 1/r), B ~ N(0, 1/(r cols))   |   U ~ N(0, 1/(r cols)), V ~ N(0, 1/k)
so that E[dW^2] = rms(z_l)^2 / cols: z is in fan-in (LeCun) units in every layer, and an input
with unit-rms entries gets an output change of rms ~rms(z_l) (in expectation over the factors),
whatever the layer's shape or r. Adam moves every latent by ~lr per step, so one latent learning
rate suits all layers (measured: lr 1e-2..3e-2 on MiniLM; see methods/flite.py).

Forward, and what it materialises beyond the layer's own forward:
  Linear, matrix      y = x W^T + b + ((x B) Z^T) A^T             (..., r) intermediates only (LoRA-style)
  Embedding, matrix   y = W[x] + (A[x] Z) B^T                    (..., r) intermediates only
  Conv2d, matrix      y = conv(x, W + (A Z B^T).view_as(W)) + b  one dW of this layer per forward
  any layer, flat     y = layer(x; W + dW)                       one dW of this layer per forward
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from lightfed.seeds import derive, normal

KINDS = {"linear": nn.Linear, "conv": nn.Conv2d, "embedding": nn.Embedding}
FORMS = ("matrix", "flat")
MODES = ("cache", "regen")


def layer_seed(seed: int, index: int) -> int:
    """Seed of the index-th selected layer's factors."""
    return derive(seed, 1, index)


def make_factors(seed: int, rows: int, cols: int, r: int, form: str = "matrix", k: int = 0, basis: str = "random",
                 weight: torch.Tensor | None = None, gain: float = 1.0):
    """The frozen factors of one layer, float32 on the CPU: (A, B^T) for "matrix", (U, V^T) for "flat".
    The right factor is drawn and kept transposed (r x cols, nn.Linear's layout): x -> x B is then a
    row-major F.linear, ~3x faster on CPU than a skinny x @ B.
    basis "svd" (matrix form): A, B^T span the top-r singular subspaces of the pretrained `weight`
    (float64 SVD, signs fixed, rounded to float32), scaled to the random factors' Frobenius norms.
    gain: multiplies A (per-layer scaling; 1 = fan-in units)."""
    if basis == "svd":
        W = weight.detach().to("cpu", torch.float64).reshape(rows, cols)
        U, _, Vh = torch.linalg.svd(W, full_matrices=False)
        rr = min(r, U.shape[1])
        U, Vh = U[:, :rr], Vh[:rr]
        sign = torch.sign(U.gather(0, U.abs().argmax(0, keepdim=True)))               # largest entry of each u > 0
        U, Vh = U * sign, Vh * sign.T
        A = torch.zeros(rows, r, dtype=torch.float64)
        Bt = torch.zeros(r, cols, dtype=torch.float64)
        A[:, :rr], Bt[:rr] = U * math.sqrt(rows / r) * gain, Vh / math.sqrt(r)
        return A.float(), Bt.float()
    if form == "matrix":
        A = normal((rows, r), derive(seed, 0)).mul_(1 / math.sqrt(r))                # rows x r
        Bt = normal((r, cols), derive(seed, 1)).mul_(1 / math.sqrt(r * cols))       # r x cols
    else:
        A = normal((rows * cols, r), derive(seed, 0)).mul_(1 / math.sqrt(r * cols))  # U: rows*cols x r
        Bt = normal((r, k), derive(seed, 1)).mul_(1 / math.sqrt(k))                   # V^T: r x k
    return (A if gain == 1.0 else A.mul_(gain)), Bt


def layer_gain(weight: torch.Tensor, cols: int) -> float:
    """scale "weight": rms(W_l) sqrt(cols), so that rms(dW_l) / rms(W_l) ~ rms(z_l) in every layer (a unit of z
    moves each layer by the same fraction of its own weight). float64, rounded to float32."""
    w = weight.detach().to("cpu", torch.float64)
    return float(torch.tensor(float(w.square().mean().sqrt()) * math.sqrt(cols), dtype=torch.float32))


class LatentLayer(nn.Module):
    """base (frozen) + a weight correction generated from its slice z[lo:hi] of the root's z."""

    def __init__(self, base: nn.Module, root: nn.Module, kind: str, lo: int, seed: int, r: int, form: str, k: int,
                 mode: str, basis: str = "random", scale: str = "fanin"):
        super().__init__()
        self.base, self._root = base, (root,)          # a tuple: the root is not registered as a child
        self.kind, self.seed, self.r, self.form, self.mode, self.basis = kind, seed, r, form, mode, basis
        self.rows, self.cols = base.weight.shape[0], base.weight[0].numel()
        self.k = r * r if form == "matrix" else k
        self.lo, self.hi = lo, lo + self.k
        self.gain = layer_gain(base.weight, self.cols) if scale == "weight" else 1.0
        A, Bt = self._make() if mode == "cache" else (None, None)
        w = base.weight
        self.register_buffer("A", None if A is None else A.to(w.device, w.dtype), persistent=False)
        self.register_buffer("Bt", None if Bt is None else Bt.to(w.device, w.dtype), persistent=False)

    def _make(self):
        return make_factors(self.seed, self.rows, self.cols, self.r, self.form, self.k, self.basis, self.base.weight, self.gain)

    def factors(self):
        if self.mode == "cache":
            return self.A, self.Bt
        z = self._root[0].z
        return tuple(t.to(z.device, z.dtype) for t in self._make())

    def latent(self) -> torch.Tensor:
        return self._root[0].z[self.lo:self.hi]                                     # (k,)

    def delta(self, z: torch.Tensor | None = None) -> torch.Tensor:
        """dW of this layer, shaped like base.weight (from `z_l`, default the model's own slice)."""
        z = self.latent() if z is None else z
        A, Bt = (t.to(z.dtype) for t in self.factors())
        if self.form == "matrix":
            dW = A @ z.view(self.r, self.r) @ Bt                                    # rows x cols
        else:
            dW = A @ (Bt @ z)                                                       # rows*cols
        return dW.view(self.base.weight.shape)

    def live_dim(self) -> int:
        if self.form == "matrix":
            return min(self.r, self.rows) * min(self.r, self.cols)
        return min(self.k, self.r, self.rows * self.cols)

    def forward(self, x):
        b = self.base
        if self.form == "matrix" and self.kind != "conv":       # low rank: nothing rows x cols is built
            A, Bt = self.factors()
            Z = self.latent().view(self.r, self.r)                                  # r x r
            if self.kind == "linear":                                               # x B Z^T A^T
                return b(x) + F.linear(F.linear(F.linear(x, Bt), Z), A)             # (..., in)->(..., r)->(..., out)
            return b(x) + (F.embedding(x, A) @ Z) @ Bt                              # A[x] Z B^T: (..., r)->(..., dim)
        W = b.weight + self.delta()                                                 # this layer's weight only
        if self.kind == "linear":
            return F.linear(x, W, b.bias)
        if self.kind == "conv":
            return b._conv_forward(x, W, b.bias)
        return F.embedding(x, W, b.padding_idx, None, b.norm_type, b.scale_grad_by_freq, b.sparse)

    def extra_repr(self):
        return (f"{self.kind}, z[{self.lo}:{self.hi}], r={self.r}, form={self.form}, mode={self.mode}, basis={self.basis}, "
                f"gain={self.gain:.4g}")


def parse_kinds(layers: str) -> list[str]:
    kinds = [s.strip() for s in layers.split(",") if s.strip()]
    bad = [s for s in kinds if s not in KINDS]
    if bad or not kinds:
        raise ValueError(f"layers = {layers!r}: a comma-separated subset of {', '.join(KINDS)}")
    return kinds


def parse_ranks(pattern: str) -> dict[str, int]:
    """A rank pattern, "v_proj:66,o_proj:32,*:0" -> {key: rank}: a layer whose name is a key or ends with "." + key
    takes that rank (the first key that matches), "*" every layer no key matches (default: the map's r); rank 0 puts no
    latents on a layer (PEFT's rank_pattern, with suffixes for its regular expressions)."""
    out: dict[str, int] = {}
    for item in (x.strip() for x in pattern.split(",") if x.strip()):
        key, sep, rank = item.rpartition(":")
        if not sep or not key or not rank.strip().isdigit():
            raise ValueError(f"rank_pattern {pattern!r}: {item!r} is not <layer name suffix>:<rank>, rank an integer >= 0")
        if key.strip() in out:
            raise ValueError(f"rank_pattern {pattern!r}: {key.strip()!r} given twice")
        out[key.strip()] = int(rank)
    return out


def _rank(name: str, ranks: dict[str, int], r: int) -> int:
    return next((v for k, v in ranks.items() if k != "*" and (name == k or name.endswith("." + k))), ranks.get("*", r))


BASES = ("random", "svd")
SCALES = ("fanin", "weight")


def install(model: nn.Module, *, r: int = 6, layers: str = "linear,conv", seed: int = 0, mode: str = "cache",
            form: str = "matrix", k: int = 0, basis: str = "random", scale: str = "fanin", ranks: str = "") -> nn.Module:
    """Freeze `model`, wrap its selected layers in place, add `model.z` = zeros(K). Returns model.
    k: latents per layer in the flat form (0 = the layer's r); the matrix form always uses r^2.
    ranks: a rank pattern (parse_ranks) giving layers their own r, or none (0); a layer's factors do not depend on
    which other layers the pattern keeps (its seed is its index among the layers of the selected kinds)."""
    if form not in FORMS or mode not in MODES:
        raise ValueError(f"form {form!r} / mode {mode!r}: use form in {FORMS}, mode in {MODES}")
    if basis not in BASES or scale not in SCALES:
        raise ValueError(f"basis {basis!r} / scale {scale!r}: use basis in {BASES}, scale in {SCALES}")
    if basis == "svd" and (form != "matrix" or mode != "cache"):
        raise ValueError("basis svd: the matrix form in mode cache (an SVD per forward would cost far more than it saves)")
    if r < 1 or k < 0 or not 0 <= seed < 2**64:
        raise ValueError(f"r = {r}, k = {k}, seed = {seed}: need r >= 1, k >= 0, 0 <= seed < 2**64")
    if hasattr(model, "z") or any(isinstance(m, LatentLayer) for m in model.modules()):
        raise ValueError("install: the model already has a latent `z`")
    pattern = parse_ranks(ranks)
    types = tuple(KINDS[s] for s in parse_kinds(layers))
    targets = [(n, m) for n, m in model.named_modules() if type(m) in types and n.rsplit(".", 1)[-1] != "head"]
    if not targets:
        raise ValueError(f"install: no {layers} layer to parameterize (besides `head`)")
    unmatched = [key for key in pattern if key != "*" and not any(n == key or n.endswith("." + key) for n, _ in targets)]
    if unmatched:
        raise ValueError(f"rank_pattern: {unmatched} match no {layers} layer (names end like "
                         f"{sorted({n.rsplit('.', 1)[-1] for n, _ in targets})[:8]})")
    if not any(_rank(n, pattern, r) for n, _ in targets):
        raise ValueError(f"rank_pattern {ranks!r} leaves no layer with latents")
    for name, m in targets:
        if getattr(m, "max_norm", None) is not None:
            raise ValueError(f"install: {name} has max_norm (renormalises its weight in place): not supported")
    model.requires_grad_(False)
    lo = 0
    for i, (name, m) in enumerate(targets):
        rl = _rank(name, pattern, r)
        if rl == 0:
            continue
        kind = next(s for s, t in KINDS.items() if type(m) is t)
        wrapped = LatentLayer(m, model, kind, lo, layer_seed(seed, i), rl, form, k or rl, mode, basis, scale)
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, wrapped)
        lo = wrapped.hi
    w = targets[0][1].weight
    model.register_parameter("z", nn.Parameter(torch.zeros(lo, device=w.device, dtype=w.dtype)))
    return model


def latent_layers(model: nn.Module) -> list[tuple[str, LatentLayer]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, LatentLayer)]


@torch.no_grad()
def materialize(model: nn.Module, z: torch.Tensor | None = None, dtype: torch.dtype | None = None) -> dict:
    """{layer name + ".weight": W + dW} of every latent layer, from `z` (default model.z), in `dtype`."""
    z = model.z if z is None else z
    dtype = dtype or z.dtype
    return {f"{n}.weight": m.base.weight.to(dtype) + m.delta(z[m.lo:m.hi].to(dtype))
            for n, m in latent_layers(model)}


def factor_bytes(model: nn.Module, held: bool = True) -> int:
    """Bytes of the frozen factors: held in memory now (0 in mode "regen"), or, held=False, what
    mode "cache" holds (float32) whatever the mode."""
    total = 0
    for _, m in latent_layers(model):
        if held:
            total += sum(t.numel() * t.element_size() for t in (m.A, m.Bt) if t is not None)
        else:
            total += 4 * (m.rows * m.cols * m.r + m.k * m.r if m.form == "flat" else (m.rows + m.cols) * m.r)
    return total


def info(model: nn.Module) -> dict:
    ls = latent_layers(model)
    return {"latent": int(model.z.numel()), "live": sum(m.live_dim() for _, m in ls), "layers": len(ls),
            "factor_bytes": factor_bytes(model), "factor_bytes_cache": factor_bytes(model, held=False)}


# --- the same map on any set of parameters (FedNL's rules: theta = theta_0 + map(z)) ----------------------------------

class ParamDelta(nn.Module):
    """A parametrization (torch.nn.utils.parametrize) p = p_0 + dP(z[lo:hi]) of one parameter, p_0 frozen:
      a matrix (rows, cols)   dP = A Z B^T   A: rows x r, B^T: r x cols, Z = z slice viewed (r, r)   k = r^2
      a vector (n,)           dP = U z       U: n x r                                               k = r
    Factors as make_factors draws them (the matrix form; a vector: its A with cols = 1): fan-in units, never sent.
    The model's `z` is reached through a plain list, so the parametrization registers no second copy of it."""

    def __init__(self, model: nn.Module, lo: int, shape: torch.Size, r: int, seed: int):
        super().__init__()
        self.z_of, self.lo, self.shape, self.r = [model], lo, tuple(shape), r
        rows, cols = (shape[0], math.prod(shape[1:])) if len(shape) > 1 else (shape[0], 1)
        A, Bt = make_factors(seed, rows, cols, r)
        self.register_buffer("A", A, persistent=False)                              # (rows, r)
        self.register_buffer("Bt", Bt if len(shape) > 1 else None, persistent=False)  # (r, cols)
        self.hi = lo + (r * r if len(shape) > 1 else r)

    def forward(self, p0):
        z = self.z_of[0].z[self.lo:self.hi].to(self.A.dtype)
        d = self.A @ z if self.Bt is None else self.A @ z.view(self.r, self.r) @ self.Bt     # (rows,) or (rows, cols)
        return p0 + d.view(self.shape).to(p0.dtype)


def install_params(model: nn.Module, names: list[str], *, r: int, seed: int) -> int:
    """theta = theta_0 + map(z) for the named parameters of `model` (each its own factors, seeded by its place in
    `names`); their current values become theta_0, frozen; `model.z` = zeros(K), the only trainable. -> K."""
    from torch.nn.utils import parametrize
    if hasattr(model, "z"):
        raise ValueError("install_params: the model already has a latent `z`")
    if r < 1 or not names:
        raise ValueError(f"install_params: r = {r}, {len(names)} parameters: need r >= 1 and a parameter")
    lo = 0
    for i, name in enumerate(names):
        owner, _, attr = name.rpartition(".")
        m = model.get_submodule(owner)
        p = getattr(m, attr)
        delta = ParamDelta(model, lo, p.shape, r, layer_seed(seed, i)).to(p.device)
        parametrize.register_parametrization(m, attr, delta, unsafe=True)
        m.parametrizations[attr].original.requires_grad_(False)
        lo = delta.hi
    model.z = nn.Parameter(torch.zeros(lo, device=next(model.parameters()).device))
    return lo


def bake_params(model: nn.Module) -> None:
    """Replace every ParamDelta by its current value (theta_0 + map(z)) as a plain parameter, and drop `z`: the
    model then holds the trained theta in the layout it had before install_params."""
    from torch.nn.utils import parametrize
    for m in list(model.modules()):
        if parametrize.is_parametrized(m):
            for attr in list(m.parametrizations):
                if any(isinstance(f, ParamDelta) for f in m.parametrizations[attr]):
                    parametrize.remove_parametrizations(m, attr, leave_parametrized=True)
    if hasattr(model, "z"):
        del model.z
