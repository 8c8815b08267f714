"""Long inputs through a causal LM, chunk by chunk, with no KV cache that grows with length.

The chunked setting used for every method alike: the text goes through in chunks of `window`
tokens; softmax attention is local to the chunk (positions restart at 0 in each chunk, nothing of an
earlier chunk is attended to); FedNL's memory branches (if the model has any) carry a delta-rule
state S across chunks, so the long context reaches later chunks only through the memory. A model
without memory branches (the frozen backbone, FedAvg+LoRA, ...) sees one chunk at a time.

For comparison, `kv_nll` runs the plain backbone with a full KV cache (all earlier tokens attended
to), up to its context limit: the growing baseline.

A model with memory runs each chunk in three parts (`_chunk`): the frozen layers below the first memory layer
(no memory, no trainable weight: their output depends on the chunk's tokens alone, so a `PrefixCache` keeps it
across steps and rounds), the layers up to the last memory layer (the memory reads and writes there), and the
layers above it, run only for a chunk whose positions predict a target (`targets`): an earlier chunk of a
stream matters to the loss only through the memory it wrote. The result is the plain forward's, to float
rounding (tests/test_fednl.py).
"""
from __future__ import annotations

import torch

from lightfed.models import delta_memory


def _cut(T: int, window: int) -> list[tuple[int, int]]:
    return [(s, min(s + window, T)) for s in range(0, T, window)]


class PrefixCache:
    """The frozen layers' output below the first memory layer, per chunk of tokens (keyed by the tokens' bytes), up
    to `max_bytes` (the oldest entries go first). Valid for a whole run: nothing below that layer ever trains.
    Each chunk is computed on its own (batch of 1): its value is a function of its tokens alone, bit for bit, not of
    which other chunks missed beside it (a GEMM's rounding depends on its shape), so a run gives the same result
    whatever the cache held before (a long-lived model in one process, a fresh one per Flower actor)."""

    def __init__(self, max_bytes: int = 2**30):
        self.max_bytes, self.nbytes, self.hits, self.misses = max_bytes, 0, 0, 0
        self.store: dict[bytes, torch.Tensor] = {}

    def get(self, model, ids: torch.Tensor, lo: int) -> torch.Tensor:
        """ids (B, C) -> hidden states at the input of decoder layer `lo` (B, C, d)."""
        keys = [r.numpy().tobytes() for r in ids.cpu()]
        todo = [i for i, k in enumerate(keys) if k not in self.store]
        self.hits, self.misses = self.hits + len(keys) - len(todo), self.misses + len(todo)
        if todo:
            for i in todo:
                with torch.no_grad():
                    row = _layers(model, model.model.embed_tokens(ids[i:i + 1]), 0, lo)[0]     # (C, d)
                self.store[keys[i]] = row
                self.nbytes += row.numel() * row.element_size()
            while self.nbytes > self.max_bytes and len(self.store) > len(keys):
                old = self.store.pop(next(iter(self.store)))
                self.nbytes -= old.numel() * old.element_size()
        return torch.stack([self.store[k] for k in keys])


def _layers(model, h: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """Decoder layers lo..hi-1 on one chunk's hidden states (B, C, d), positions 0..C-1, causal attention."""
    from transformers.masking_utils import create_causal_mask
    if lo >= hi:
        return h
    pos = torch.arange(h.shape[1], device=h.device)[None]
    mask = create_causal_mask(config=model.config, inputs_embeds=h, attention_mask=None, cache=None, position_ids=pos)
    rope = model.model.rotary_emb(h, position_ids=pos)
    for layer in model.model.layers[lo:hi]:
        h = layer(h, attention_mask=mask, position_embeddings=rope, position_ids=pos)
    return h


def _chunk(model, ids: torch.Tensor, full: bool, span: tuple[int, int] | None) -> torch.Tensor | None:
    """One chunk (B, C): the final hidden states (B, C, d), or None when `full` is False (only the memory writes
    matter). span: (first, last) memory layer, or None for a model without memory (the plain forward)."""
    if span is None:
        return model.model(input_ids=ids, use_cache=False).last_hidden_state
    lo, hi = span
    cache = getattr(model, "prefix_cache", None)
    h = cache.get(model, ids, lo) if (cache is not None and torch.is_grad_enabled()) else \
        _layers(model, model.model.embed_tokens(ids), 0, lo)
    h = _layers(model, h, lo, hi + 1)
    return model.model.norm(_layers(model, h, hi + 1, len(model.model.layers))) if full else None


def memory_span(model) -> tuple[int, int] | None:
    layers = [m.layer for m in delta_memory.branches(model)]
    return (min(layers), max(layers)) if layers else None


def hidden(model, ids: torch.Tensor, window: int, st: delta_memory.Stream | None = None, targets=None,
           reset: bool = False) -> torch.Tensor:
    """Last hidden states of a (B, T) batch run in chunks.   -> (B, T, d)
    With gradients when the model trains (the memory trajectory is differentiated end to end).
    targets (B, T) bool: only positions that predict a marked token need their hidden state (position t predicts
    t + 1); with memory, a chunk that predicts none stops at the last memory layer and its rows are zeros.
    reset: empty the memory at every chunk (the same model without the long context: a control)."""
    st = st if st is not None else delta_memory.Stream(grad=torch.is_grad_enabled())
    span = memory_span(model)
    out = []
    with delta_memory.stream(model, st):
        for s, e in _cut(ids.shape[1], window):
            if reset:
                st.S.clear()
            full = span is None or targets is None or bool(targets[:, s + 1:e + 1].any())
            h = _chunk(model, ids[:, s:e], full, span)
            out.append(h if h is not None else torch.zeros(ids.shape[0], e - s, model.config.hidden_size, device=ids.device))
    return torch.cat(out, 1)


@torch.no_grad()
def stream_nll(model, ids: torch.Tensor, window: int, carry: bool = True, reset_every: int = 0) -> tuple[torch.Tensor, int]:
    """Per-token NLL along one long stream (1, T) in the chunked setting.  -> ((T - 1,), state bytes)
    Only one chunk's logits exist at a time. carry=False empties the memory at every chunk (an ablation:
    the same model without the long context); reset_every=k empties it before every k-th chunk (the context the
    memory holds never longer than k chunks)."""
    out, last, every = [], None, reset_every if carry else 1
    with delta_memory.stream(model) as st:
        for i, (s, e) in enumerate(_cut(ids.shape[1], window)):
            if every and i % every == 0:
                st.S.clear()
            h = model.model(input_ids=ids[:, s:e], use_cache=False).last_hidden_state[0]     # (C, d)
            h = h if last is None else torch.cat([last, h])                                  # + previous chunk's last
            logp = model.lm_head(h[:-1]).float().log_softmax(-1)
            out.append(-logp.gather(1, ids[0, s + (last is None):e, None])[:, 0])
            last, logp = h[-1:], None                        # this chunk's logits go before the next chunk's come
        return torch.cat(out), st.nbytes()


def ce_buckets(model, ids: torch.Tensor, window: int, bucket: int, carry: bool = True, reset_every: int = 0) -> list[float]:
    """Next-token CE along one long stream (1, T) in `window`-token chunks (stream_nll: the memory carried, emptied at
    every chunk, or every `reset_every` chunks), the mean over each `bucket` tokens: how the CE moves along the stream."""
    nll, _ = stream_nll(model, ids, window, carry, reset_every)
    k = nll.numel() // bucket
    return [float(x) for x in nll[: k * bucket].float().view(k, bucket).mean(1)]


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
def generate(model, ids: torch.Tensor, window: int, max_new: int, eos: int | None = None, reset: bool = False,
             stop=None) -> list[int]:
    """Greedy answer to a long prompt (1, T): every chunk but the last goes through the stream (chunks cut from the
    start, as `hidden` cuts them); the last chunk and the answer share one local KV cache (<= window + max_new
    tokens); the memory keeps writing token by token while it answers. reset: the memory emptied at every chunk
    (the control: only the last chunk is seen). stop(tokens) -> True ends the answer early (e.g. at a newline).
    The tokens are those the teacher-forced argmaxes give (tests/test_fednl.py), so scoring by either agrees."""
    from transformers import DynamicCache

    ids = ids.to(model.lm_head.weight.device)
    cuts = _cut(ids.shape[1], window)
    new = []
    span = memory_span(model)
    with delta_memory.stream(model) as st:
        for s, e in cuts[:-1]:                       # only their memory writes matter
            if span is not None and not reset:
                _chunk(model, ids[:, s:e], False, span)
        s, e = cuts[-1]
        cache = DynamicCache()
        logits = model(input_ids=ids[:, s:e], cache=cache, use_cache=True).logits[0, -1]
        for _ in range(max_new):
            t = int(logits.argmax())
            if t == eos:
                break
            new.append(t)
            if stop is not None and stop(new):
                break
            logits = model(input_ids=torch.tensor([[t]], device=ids.device), cache=cache, use_cache=True).logits[0, -1]
    return new
