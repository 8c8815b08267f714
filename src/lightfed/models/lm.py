"""How a causal LM scores what the tasks ask of it: label words, multiple-choice options, marked target tokens.

Only the positions that are scored go through the LM head (V = 49,152 for SmolLM2), so memory stays at
O(scored tokens x V) instead of O(B T V). Each scorer takes the final hidden states `h` if they are already
computed (FedSPZO's f2 computes them itself).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def label_scores(lm: nn.Module, ids, attn, cand, h=None) -> torch.Tensor:
    """Logits of each row's candidate label tokens at its prompt's last token.
    ids, attn: (B, T) right-padded; cand: (B, C) token ids -> (B, C)."""
    h = lm.model(input_ids=ids, attention_mask=attn).last_hidden_state if h is None else h   # (B, T, d)
    last = attn.sum(1) - 1                                                                       # (B,)
    return lm.lm_head(h[torch.arange(len(ids), device=ids.device), last]).float().gather(1, cand)  # (B, C)


def option_scores(lm: nn.Module, ids, attn, tmask, h=None) -> torch.Tensor:
    """Mean log-probability of each option's tokens.   ids, attn, tmask: (B, K, L) -> scores (B, K)
    tmask marks the option's tokens. h: (B*K, L, d), the final hidden states, if already computed."""
    B, K, L = ids.shape
    ids, attn, tmask = ids.view(B * K, L), attn.view(B * K, L), tmask.view(B * K, L)
    if h is None:
        h = lm.model(input_ids=ids, attention_mask=attn).last_hidden_state  # (BK, L, d)
    return _mean_logp(lm, h[:, :-1], ids[:, 1:], tmask[:, 1:]).view(B, K)   # token t is predicted at t-1


def _mean_logp(lm: nn.Module, h, tokens, sel) -> torch.Tensor:
    """Per row, the mean log-probability of the tokens marked in sel, each predicted from h at its position.
    h: (N, T, d); tokens, sel: (N, T) -> (N,)"""
    logp = lm.lm_head(h[sel]).float().log_softmax(-1)                      # (P, V)
    lp = logp.gather(1, tokens[sel].unsqueeze(1)).squeeze(1)                # (P,)
    rows = sel.nonzero()[:, 0]
    total = torch.zeros(len(sel), dtype=lp.dtype, device=lp.device).index_add(0, rows, lp)
    count = torch.zeros(len(sel), dtype=lp.dtype, device=lp.device).index_add(0, rows, torch.ones_like(lp))
    return total / count.clamp_min(1)


def option_scores_shared(lm: nn.Module, ids, attn, tmask, batch: int = 32) -> torch.Tensor:
    """option_scores with each question's prompt run once and shared by its K options (the attention's KV cache and
    FedNL's memory state after the prompt, repeated K times): the same scores to float error, the prompt's tokens
    computed once instead of K times (trivia: a ~20-token prompt, ~3-token options, ~3x fewer tokens).
    ids, attn, tmask: (B, K, L) right-padded -> (B, K). A question whose K rows do not begin with the same unpadded
    prompt is scored by option_scores. Questions are grouped by prompt length (no prompt is padded) and
    batched by their longest option (little option padding)."""
    from transformers import DynamicCache
    from lightfed.models import delta_memory
    B, K, L = ids.shape
    out = torch.empty(B, K, device=ids.device)
    first = tmask.int().argmax(-1)                                              # (B, K): the option's first position
    groups: dict[int, list[int]] = {}
    for i in range(B):
        lp = int(first[i, 0])
        if lp > 0 and bool((first[i] == lp).all()) and bool((ids[i, :, :lp] == ids[i, :1, :lp]).all()) and bool(attn[i, :, :lp].all()):
            groups.setdefault(lp, []).append(i)
    rest = sorted(set(range(B)) - {i for g in groups.values() for i in g})
    if rest:
        out[rest] = option_scores(lm, ids[rest], attn[rest], tmask[rest]).float()
    longest = (attn.sum(-1) - first).max(1).values                               # (B,): each question's longest option
    for lp, idx in sorted(groups.items()):
        idx = sorted(idx, key=lambda i: int(longest[i]))                        # batches of like lengths: little padding
        for s in range(0, len(idx), batch):
            b = torch.tensor(idx[s: s + batch])
            n = len(b)
            with delta_memory.stream(lm, delta_memory.Stream(torch.is_grad_enabled())) as st:   # FedNL: the memory after the prompt
                cache = DynamicCache()
                hp = lm.model(input_ids=ids[b, 0, :lp], cache=cache, use_cache=True).last_hidden_state  # (n, lp, d)
                cache.batch_repeat_interleave(K)
                st.S = {k: v.repeat_interleave(K, 0) for k, v in st.S.items()}
                lo = int((attn[b].sum(-1) - lp).max())                          # the longest option
                oid = ids[b, :, lp: lp + lo].reshape(n * K, lo)                 # (nK, lo)
                om = attn[b, :, lp: lp + lo].reshape(n * K, lo)
                mask = torch.cat([torch.ones(n * K, lp, dtype=om.dtype, device=om.device), om], 1)
                pos = torch.arange(lp, lp + lo, device=oid.device).expand(n * K, lo)
                ho = lm.model(input_ids=oid, attention_mask=mask, position_ids=pos, cache=cache,
                              use_cache=True).last_hidden_state                 # (nK, lo, d)
            h = torch.cat([hp[:, -1:].repeat_interleave(K, 0), ho[:, :-1]], 1)  # (nK, lo, d): h[j] predicts option token j
            out[b] = _mean_logp(lm, h, oid, tmask[b, :, lp: lp + lo].reshape(n * K, lo)).view(n, K)
    return out


def target_nll(lm: nn.Module, ids: torch.Tensor, tmask: torch.Tensor, window: int, lm_weight: float = 0.0) -> torch.Tensor:
    """Mean NLL of the tokens marked in tmask (B, T), predicted through the chunked stream (models/streaming.py:
    attention local to `window`-token chunks, FedNL's memory carrying across).
    lm_weight > 0 adds lm_weight x the mean NLL of every other token of the stream (language modelling along it:
    what the memory must not harm), from the same forward; the LM head then sees every position."""
    from lightfed.models import streaming
    h = streaming.hidden(lm, ids, window, targets=tmask if lm_weight == 0 else None)   # (B, T, d)
    sel = tmask[:, 1:]                                                    # token t is predicted at t - 1
    logits = lm.lm_head(h[:, :-1][sel])                                   # (P, V)
    logits = logits if logits.dtype == torch.float64 else logits.float()
    loss = F.cross_entropy(logits, ids[:, 1:][sel])
    if lm_weight > 0:
        rest = ~sel                                                       # (B, T - 1): the stream's other tokens
        rl = lm.lm_head(h[:, :-1][rest])                                  # (P', V)
        rl = rl if rl.dtype == torch.float64 else rl.float()
        loss = loss + lm_weight * F.cross_entropy(rl, ids[:, 1:][rest])
    return loss
