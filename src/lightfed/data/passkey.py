"""Passkey retrieval streams, built at the token level so that every stream is exactly `chunks` x `window` tokens.

    [ haystack ... needle ... haystack ... | ... haystack, question, answer ]      (the last chunk holds the question)
    needle    " The pass key is 4817263. Remember it. 4817263 is the pass key."
    question  " What is the pass key? The pass key is"        answer " 4817263" (its 7 digits are the targets)

The needle lies wholly inside one chunk: chunk floor(depth x (chunks - 1)) for depth < 1, at a random offset;
depth 1.0 puts it in the question's own chunk (which a local attention window can answer alone). The haystack is
a contiguous run of Austen tokens (train: the first 90% of each novel, eval: the last 10%); passkeys are 7-digit
numbers whose last digit is even for training and odd for evaluation (data/niah.py's split), so no evaluation
needle was ever trained on. Exact match = every answer digit is the model's argmax given the digits before it
(teacher forcing): the same as greedy decoding producing the passkey first.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from lightfed.data import niah

NEEDLE = " The pass key is {v}. Remember it. {v} is the pass key."
QUESTION = " What is the pass key? The pass key is"


@dataclass
class Stream:
    ids: torch.Tensor        # (chunks x window,) token ids
    targets: torch.Tensor    # (chunks x window,) bool: the answer's digits
    chunks: int
    depth: float
    needle_chunk: int
    value: str


class Builder:
    """Streams over one split's haystack, for one tokenizer and window."""

    def __init__(self, tok, text: str, window: int, split: str):
        self.tok, self.window, self.split = tok, window, split
        self.hay = np.asarray(tok(text, add_special_tokens=False)["input_ids"], dtype=np.int64)
        self.q = tok(QUESTION, add_special_tokens=False)["input_ids"]
        if len(self.q) + 8 + self._needle_len() > window:
            raise ValueError(f"passkey: window = {window} tokens cannot hold the needle, the question and the answer")

    def _needle_len(self) -> int:
        return len(self.tok(NEEDLE.format(v="1234567"), add_special_tokens=False)["input_ids"])

    def stream(self, chunks: int, depth: float, value: str, rng: np.random.Generator) -> Stream:
        W, T = self.window, chunks * self.window
        n = self.tok(NEEDLE.format(v=value), add_special_tokens=False)["input_ids"]
        a = self.tok(" " + value, add_special_tokens=False)["input_ids"]         # [" ", d1, ..., d7]
        tail = self.q + a
        c = chunks - 1 if depth >= 1 else min(int(depth * (chunks - 1)), chunks - 2)
        room = (W - len(tail) if c == chunks - 1 else W) - len(n)               # where the needle can start in chunk c
        p = c * W + int(rng.integers(0, room + 1))
        m = T - len(tail) - len(n)                                              # haystack tokens
        s = int(rng.integers(0, len(self.hay) - m))
        hay = self.hay[s:s + m].tolist()
        ids = hay[:p] + n + hay[p:] + tail
        tgt = torch.zeros(T, dtype=torch.bool)
        tgt[T - len(a) + 1:] = True                                             # the digits (not the space)
        return Stream(torch.tensor(ids), tgt, chunks, depth, c, value)

    def values(self, k: int, rng: np.random.Generator) -> list[str]:
        return niah._numbers(rng, k, self.split)
