"""Long inputs through a causal LM, chunk by chunk, with no KV cache that grows with length.

The chunked setting used for every method alike: the text goes through in chunks of `window`
tokens; softmax attention is local to the chunk (positions restart at 0 in each chunk, nothing of an
earlier chunk is attended to); FedNL's memory branches (if the model has any) carry a delta-rule
state S across chunks, so the long context reaches later chunks only through the memory. A model
without memory branches (the frozen backbone, FedAvg+LoRA, ...) sees one chunk at a time.

For comparison, `kv_nll` runs the plain backbone with a full KV cache (all earlier tokens attended
to), up to its context limit: the growing baseline.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from lightfed.models import delta_memory


def _cut(T: int, window: int) -> list[tuple[int, int]]:
    return [(s, min(s + window, T)) for s in range(0, T, window)]


def hidden(model, ids: torch.Tensor, window: int, st: delta_memory.Stream | None = None) -> torch.Tensor:
    """Last hidden states of a (B, T) batch run in chunks.   -> (B, T, d)
    With gradients when the model trains (the memory trajectory is differentiated end to end)."""
    st = st if st is not None else delta_memory.Stream(grad=torch.is_grad_enabled())
    with delta_memory.stream(model, st):
        return torch.cat([model.model(input_ids=ids[:, s:e], use_cache=False).last_hidden_state
                          for s, e in _cut(ids.shape[1], window)], 1)


def target_nll(model, ids: torch.Tensor, tmask: torch.Tensor, window: int) -> torch.Tensor:
    """Mean NLL of the tokens marked in tmask (B, T), predicted through the chunked stream."""
    h = hidden(model, ids, window)                                        # (B, T, d)
    sel = tmask[:, 1:]                                                    # token t is predicted at t - 1
    logits = model.lm_head(h[:, :-1][sel])                                # (P, V)
    logits = logits if logits.dtype == torch.float64 else logits.float()
    return F.cross_entropy(logits, ids[:, 1:][sel])


@torch.no_grad()
def stream_nll(model, ids: torch.Tensor, window: int, carry: bool = True) -> tuple[torch.Tensor, int]:
    """Per-token NLL along one long stream (1, T) in the chunked setting.  -> ((T - 1,), state bytes)
    Only one chunk's logits exist at a time. carry=False empties the memory at every chunk (an ablation:
    the same model without the long context)."""
    out, last = [], None
    with delta_memory.stream(model) as st:
        for s, e in _cut(ids.shape[1], window):
            if not carry:
                st.S.clear()
            h = model.model(input_ids=ids[:, s:e], use_cache=False).last_hidden_state[0]     # (C, d)
            h = h if last is None else torch.cat([last, h])                                  # + previous chunk's last
            logp = model.lm_head(h[:-1]).float().log_softmax(-1)
            out.append(-logp.gather(1, ids[0, s + (last is None):e, None])[:, 0])
            last, logp = h[-1:], None                        # this chunk's logits go before the next chunk's come
        return torch.cat(out), st.nbytes()


@torch.no_grad()
def kv_nll(model, ids: torch.Tensor, chunk: int) -> tuple[torch.Tensor, int, bool]:
    """The backbone with a full KV cache, fed `chunk` tokens at a time, up to its context limit.
    -> (per-token NLL (n - 1,), KV cache bytes at the end, stopped at the limit?)"""
    from transformers import DynamicCache

    limit = getattr(model.config, "max_position_embeddings", ids.shape[1])
    T = min(ids.shape[1], limit)
    cache, out, last = DynamicCache(), [], None
    for s, e in _cut(T, chunk):
        o = model(input_ids=ids[:, s:e], cache=cache, use_cache=True)
        logits = o.logits[0] if last is None else torch.cat([last, o.logits[0]])
        out.append(-logits[:-1].float().log_softmax(-1).gather(1, ids[0, s + (last is None):e, None])[:, 0])
        last = o.logits[0, -1:]
    nbytes = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    return torch.cat(out), nbytes, ids.shape[1] > limit


@torch.no_grad()
def generate(model, ids: torch.Tensor, window: int, max_new: int, eos: int | None = None) -> list[int]:
    """Greedy answer to a long prompt (1, T): every chunk but the last goes through the stream; the last
    chunk and the answer share one local KV cache (<= window + max_new tokens); the memory keeps
    writing token by token while it answers."""
    from transformers import DynamicCache

    cuts = _cut(ids.shape[1], window)
    new = []
    with delta_memory.stream(model):
        for s, e in cuts[:-1]:
            model.model(input_ids=ids[:, s:e], use_cache=False)
        s, e = cuts[-1]
        cache = DynamicCache()
        logits = model(input_ids=ids[:, s:e], cache=cache, use_cache=True).logits[0, -1]
        for _ in range(max_new):
            t = int(logits.argmax())
            if t == eos:
                break
            new.append(t)
            logits = model(input_ids=torch.tensor([[t]]), cache=cache, use_cache=True).logits[0, -1]
    return new
