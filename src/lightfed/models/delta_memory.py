"""Delta-rule memory (DeltaNet / Titans style) and the FedNL memory branch for a frozen causal LM.

The memory of one head is a matrix S (d_k x d_v). Each token writes one step of gradient descent on
the associative loss 1/2 ||S^T k_t - v_t||^2 with step beta_t in (0, 1), then reads with q_t:

    S_t = S_{t-1} + beta_t k_t (v_t - S_{t-1}^T k_t)^T          k_t, q_t L2-normalised
    o_t = S_t^T q_t

and, with the optional forgetting gate a_t in (0, 1] of Gated DeltaNet (Yang et al., 2025), which bounds how
far back the memory reaches: S_t = a_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T.

(the spec writes S as d_v x d_k: S_here = S_spec^T, the same numbers). Two forms, equal to ~1e-5:
- `recurrent`: the loop above, token by token (the reference; also decoding, one token at a time);
- `chunked`: C tokens at once with the WY / UT transform (Yang et al., 2024). Inside a chunk,
  with A = I + tril(diag(beta) K K^T, -1) (C x C, unit lower triangular),
      U = A^{-1} diag(beta) V,  W = A^{-1} diag(beta) K        (a triangular solve)
      U' = U - W S_0                                           (the chunk's corrected writes)
      O  = Q S_0 + tril(Q K^T) U',   S_C = S_0 + K^T U'
  the state carries across chunks, so memory is O(1) in sequence length.

`MemoryBranch` is FedNL's adapter on one decoder layer: q/k/v come from the layer's own frozen
projections plus LoRA deltas (B A, B = 0 at start), no RoPE (the memory is position-free);
beta_t = sigmoid(w_b . h_t + b_b) per KV head and token; the read-out goes through the frozen o_proj
scaled by a per-head gate alpha (0 at start, so the model starts as the pretrained one):

    attn_out + o_proj(alpha (.) o_mem)        (o_proj is linear: the same as gating before it)

The state S never lives in a module: a `Stream` holds it, per stream and per layer, outside every
parameter and buffer, so no message built from the trainable tensors can carry it.
"""
from __future__ import annotations

import contextlib
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


# --- the delta rule ----------------------------------------------------------------------------
# One memory per KV head, read by its g = Hq / Hkv query heads (grouped, as GQA shares keys and values):
#   q: (B, Hq, T, dk)   k: (B, Hkv, T, dk)   v: (B, Hkv, T, dv)   beta: (B, Hkv, T)   S: (B, Hkv, dk, dv)
#   o: (B, Hq, T, dv), query head h reading memory h // g.   Hq = Hkv is the plain (ungrouped) rule.
def _grouped(q, Hkv):
    B, Hq, T, dk = q.shape
    return q.view(B, Hkv, Hq // Hkv, T, dk)                                          # (B, Hkv, g, T, dk)


def recurrent(q, k, v, beta, S=None, g=None):
    """The rule token by token (the reference; also decoding).  -> o: (B, Hq, T, dv), S_T: (B, Hkv, dk, dv).
    g: (B, Hkv, T) log alpha_t <= 0, the forgetting gate (Gated DeltaNet): S is scaled by alpha_t before token t's
    write, S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T; None: alpha = 1, the plain rule."""
    B, H, T, dk = k.shape
    S = k.new_zeros(B, H, dk, v.shape[-1]) if S is None else S
    qg = _grouped(q, H)
    out = []
    for t in range(T):
        kt, vt, bt = k[:, :, t], v[:, :, t], beta[:, :, t, None]                  # (B, H, dk) (B, H, dv) (B, H, 1)
        if g is not None:
            S = S * g[:, :, t, None, None].exp()                                   # forget: alpha_t S
        err = vt - torch.einsum("bhkv,bhk->bhv", S, kt)                            # v_t - S^T k_t
        S = S + torch.einsum("bhk,bhv->bhkv", kt, bt * err)                        # rank-1 write
        out.append(torch.einsum("bhkv,bhgk->bhgv", S, qg[:, :, :, t]))              # read S_t^T q_t per query head
    o = torch.stack(out, 3)                                                        # (B, H, g, T, dv)
    return o.reshape(B, q.shape[1], T, -1), S


def chunked(q, k, v, beta, S=None, chunk: int = 64, g=None):
    """The same map as `recurrent`, C = `chunk` tokens at a time (T need not divide by C). With the forgetting gate
    (g = log alpha), G_t = sum_{i<=t} g_i within the chunk, gamma_t = e^{G_t} and Gam_ij = e^{G_i - G_j} (i >= j):
        A = I + tril(diag(beta) (K K^T * Gam), -1),  W = A^{-1} diag(beta gamma) K,  U = A^{-1} diag(beta) V - W S_0
        O = diag(gamma) Q S_0 + tril(Q K^T * Gam) U,  S_C = gamma_C S_0 + (K * gamma_C / gamma)^T U"""
    B, H, T, dk = k.shape
    S = k.new_zeros(B, H, dk, v.shape[-1]) if S is None else S
    qg = _grouped(q, H)
    out = []
    for s in range(0, T, chunk):
        Q, K, V, b = qg[:, :, :, s:s + chunk], k[:, :, s:s + chunk], v[:, :, s:s + chunk], beta[:, :, s:s + chunk, None]
        C = K.shape[2]
        eye = torch.eye(C, dtype=K.dtype, device=K.device)
        KK, QK = K @ K.transpose(-1, -2), Q @ K.transpose(-1, -2).unsqueeze(2)      # (B, H, C, C), (B, H, g, C, C)
        if g is None:
            gam = None                                                              # the plain rule
        else:
            G = g[:, :, s:s + chunk].cumsum(-1)                                     # (B, H, C)
            low = torch.tril(torch.ones(C, C, dtype=torch.bool, device=K.device))
            Gam = torch.where(low, G[..., :, None] - G[..., None, :], -torch.inf).exp()   # (B, H, C, C), 0 above
            gam, gam_end = G.exp()[..., None], G[..., -1:, None].exp()              # (B, H, C, 1), (B, H, 1, 1)
            to_end = (G[..., -1:] - G).exp()[..., None]                             # gamma_C / gamma_t, (B, H, C, 1)
            KK, QK = KK * Gam, QK * Gam.unsqueeze(2)
        A = eye + torch.tril(b * KK, -1)                                            # (B, H, C, C)
        W = torch.linalg.solve_triangular(A, b * K * (1 if gam is None else gam), upper=False, unitriangular=True)
        U = torch.linalg.solve_triangular(A, b * V, upper=False, unitriangular=True)   # (B, H, C, dv)
        U = U - W @ S                                                               # writes given S_0
        Sg = S.unsqueeze(2)                                                         # broadcast over g
        QS = Q @ Sg if gam is None else (Q * gam.unsqueeze(2)) @ Sg
        out.append(QS + torch.tril(QK) @ U.unsqueeze(2))                           # (B, H, g, C, dv)
        if gam is None:
            S = S + K.transpose(-1, -2) @ U
        else:
            S = gam_end * S + (K * to_end).transpose(-1, -2) @ U
    o = torch.cat(out, 3)                                                          # (B, H, g, T, dv)
    return o.reshape(B, q.shape[1], T, -1), S


# --- per-stream state, outside the model -------------------------------------------------------
class Stream:
    """The private memory of one input stream: {layer index: S (B, Hkv, dk, dv)}. Never a parameter
    or buffer; dropped when the stream ends. `grad=True` (training): the states keep their graph, so
    the loss of a later chunk backpropagates through the whole memory trajectory."""

    def __init__(self, grad: bool = False):
        self.S: dict[int, torch.Tensor] = {}
        self.grad = grad

    def nbytes(self) -> int:
        return sum(s.numel() * s.element_size() for s in self.S.values())


def branches(model: nn.Module) -> list["MemoryBranch"]:
    return [m for m in model.modules() if isinstance(m, MemoryBranch)]


@contextlib.contextmanager
def stream(model: nn.Module, st: Stream | None = None):
    """with stream(model) as st: model(chunk_1); model(chunk_2); ...   the memory carries across calls."""
    st = st if st is not None else Stream()
    mods = branches(model)
    for m in mods:
        m.stream = st
    try:
        yield st
    finally:
        for m in mods:
            m.stream = None


# --- FedNL's memory branch on one Llama-style attention ----------------------------------------
class LowRank(nn.Module):
    """x -> B A x (r x d_in, d_out x r); B starts at 0 so the delta starts at 0 (LoRA's init)."""

    def __init__(self, d_in: int, d_out: int, r: int):
        super().__init__()
        self.A = nn.Parameter(torch.randn(r, d_in) / math.sqrt(d_in))
        self.B = nn.Parameter(torch.zeros(d_out, r))

    def forward(self, x):
        return (x @ self.A.T) @ self.B.T


class MemoryBranch(nn.Module):
    """Reads the attention's input h (B, T, d), returns the gated memory read-out (B, T, d)."""

    def __init__(self, attn: nn.Module, layer: int, r: int = 8, chunk: int = 64, beta_bias: float = 0.0,
                 gate: float = 0.0, r_k: int = 0, forget: float = 0.0):
        super().__init__()
        self.layer, self.chunk = layer, chunk
        self.attn = [attn]                                 # the frozen projections, not a submodule (no new names)
        d = attn.q_proj.in_features
        self.dh = attn.head_dim
        self.H, self.Hkv = attn.q_proj.out_features // self.dh, attn.k_proj.out_features // self.dh
        self.q = LowRank(d, self.H * self.dh, r)
        self.k = LowRank(d, self.Hkv * self.dh, r_k or r)
        self.v = LowRank(d, self.Hkv * self.dh, r)
        self.beta = nn.Linear(d, self.Hkv)
        nn.init.zeros_(self.beta.weight)
        nn.init.constant_(self.beta.bias, beta_bias)       # sigmoid(beta_bias): the write step of every token at start
        self.alpha = nn.Parameter(torch.full((self.H,), float(gate)))   # per-head gate; 0: the pretrained model
        self.forget = None                                 # the forgetting gate: log a_t = logsigmoid(w_f . h_t + b_f)
        if forget > 0:                                     # per KV head and token, a_t = 1 - forget for every token at start
            self.forget = nn.Linear(d, self.Hkv)
            nn.init.zeros_(self.forget.weight)
            nn.init.constant_(self.forget.bias, math.log((1 - forget) / forget))
        self.stream: Stream | None = None

    def qkv(self, h):
        """h: (B, T, d) -> q (B, H, T, dh), k, v (B, Hkv, T, dh), beta, log a (B, Hkv, T; log a None without
        the forgetting gate): one memory per KV head."""
        a, (B, T, _) = self.attn[0], h.shape
        heads = lambda x, n: x.view(B, T, n, self.dh).transpose(1, 2)                 # noqa: E731
        q = heads(a.q_proj(h) + self.q(h), self.H)
        k = heads(a.k_proj(h) + self.k(h), self.Hkv)
        v = heads(a.v_proj(h) + self.v(h), self.Hkv)
        beta = torch.sigmoid(self.beta(h)).transpose(1, 2)                              # (B, Hkv, T)
        g = None if self.forget is None else F.logsigmoid(self.forget(h).float()).transpose(1, 2)   # (B, Hkv, T)
        return F.normalize(q, dim=-1), F.normalize(k, dim=-1), v, beta, g

    def forward(self, h):
        q, k, v, beta, g = (None if x is None else x.float() for x in self.qkv(h))   # the rule in float32
        S0 = self.stream.S.get(self.layer) if self.stream is not None else None
        if S0 is not None and S0.shape[0] != h.shape[0]:
            S0 = S0.expand(h.shape[0], *S0.shape[1:])       # one warmed memory read by a batch
        with torch.autocast(h.device.type, enabled=False):
            o, S = chunked(q, k, v, beta, S0, self.chunk, g) if h.shape[1] > 1 else recurrent(q, k, v, beta, S0, g)
        if self.stream is not None:
            self.stream.S[self.layer] = S if self.stream.grad else S.detach()
        B, _, T, _ = o.shape
        o = (o * self.alpha.view(1, -1, 1, 1)).transpose(1, 2).reshape(B, T, self.H * self.dh)
        return self.attn[0].o_proj(o)                       # (B, T, d)

    def hook(self, module, args, kwargs, output):
        """Forward hook on the attention: attn_out + memory read-out."""
        h = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        return (output[0] + self(h), *output[1:])


def attach(model: nn.Module, layers: list[int], r: int, chunk: int, **kw) -> list[MemoryBranch]:
    """Add a memory branch to each chosen decoder layer of a Llama-style causal LM (in place); kw: MemoryBranch's
    beta_bias, gate, r_k, forget. The branch is the layer's submodule `memory`; the backbone's parameter names do not
    change."""
    decoder = model.model.layers
    out = []
    for i in layers:
        layer = decoder[i]
        m = MemoryBranch(layer.self_attn, i, r=r, chunk=chunk, **kw)
        layer.memory = m
        layer.self_attn.register_forward_hook(m.hook, with_kwargs=True)
        out.append(m)
    return out
