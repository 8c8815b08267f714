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
    sel = tmask[:, 1:]                                                      # token t is predicted at t-1
    logp = lm.lm_head(h[:, :-1][sel]).float().log_softmax(-1)               # (P, V)
    lp = logp.gather(1, ids[:, 1:][sel].unsqueeze(1)).squeeze(1)            # (P,)
    rows = sel.nonzero()[:, 0]
    total = torch.zeros(B * K, dtype=lp.dtype, device=lp.device).index_add(0, rows, lp)
    count = torch.zeros(B * K, dtype=lp.dtype, device=lp.device).index_add(0, rows, torch.ones_like(lp))
    return (total / count.clamp_min(1)).view(B, K)


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
