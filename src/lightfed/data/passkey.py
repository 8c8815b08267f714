"""Passkey (and RULER-template) retrieval streams, built at the token level: every stream is exactly `chunks` x
`window` tokens.

    [ haystack ... needle ... haystack ... | ... haystack, question, answer ]      (the last chunk holds the question)
    needle    " The pass key is 4817263. Remember it. 4817263 is the pass key."
    question  " What is the pass key? The pass key is"        answer " 4817263" (its 8 tokens, " " and 7 digits, are the targets)

The needle lies wholly inside one chunk: chunk floor(depth x (chunks - 1)) for depth < 1, at a random offset;
depth 1.0 puts it in the question's own chunk (which a local attention window can answer alone). The haystack is
a contiguous run of Austen tokens (train: the first 90% of each novel, eval: the last 10%); passkeys are 7-digit
numbers whose last digit is even for training and odd for evaluation (data/niah.py's split), so no evaluation
needle was ever trained on. Exact match = every answer token (its leading space too) is the model's argmax given the
tokens before it (teacher forcing): exactly when greedy decoding writes the answer first. (Until issue 45 the space
was not a target: a model trained on the digits alone rarely wrote it, and greedy decoding then wandered off before
the digits it would have scored.)

Templates (`template` = a name of data/niah.TASKS): the same geometry with RULER's words (niah.md): the instruction
opens chunk 0, the asked key's (first) gold needle lies wholly inside chunk floor(depth x (chunks - 1)) as above,
the template's other needles (more keys, more values, asked or not) at random places between the instruction and
the question, the haystack Austen's tokens ("book"), the filler sentences ("filler") or distractor needles only
("needles"); the last chunk ends with the question and the answer " v1, v2, ...", whose tokens are the
targets (separators too: what greedy decoding must write), each marked with the gold value it spells (`gold_of`: RULER's string-match-all counts the golds found).
Keys and values come from the split's half of their spaces (data/niah.py), so evaluation needles are new.
Whether a template fits a chunk is decided on the most tokens any draw can take (Builder.template_sizes), so a
geometry that fails, fails for every seed, before any stream is drawn.
"""
from __future__ import annotations

import dataclasses
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
    gold_of: torch.Tensor | None = None    # (chunks x window,) int: the gold value a target token spells (0, 1, ...),
                                           # -1 elsewhere (a separator, not a target); None: one gold, every target


def reorder(s: Stream, order: list[int], unit: int) -> Stream:
    """Stream s made of its `unit`-token chunks in `order` (the needle's chunk named by its place in it); chunks and
    depth stay the ones it was drawn with (its cell)."""
    def cut(x):
        return None if x is None else torch.cat([x[j * unit:(j + 1) * unit] for j in order])
    return dataclasses.replace(s, ids=cut(s.ids), targets=cut(s.targets), gold_of=cut(s.gold_of),
                               needle_chunk=order.index(s.needle_chunk))


def needle_moved(s: Stream, unit: int) -> Stream:
    """The same chunks with the needle's moved to just before the question's: the haystack chunks written after the
    needle are written before it instead. Attention is local to a chunk, so the memory's writes are all that moves."""
    return reorder(s, [j for j in range(s.chunks - 1) if j != s.needle_chunk] + [s.needle_chunk, s.chunks - 1], unit)


def needle_alone(s: Stream, unit: int) -> Stream:
    """The needle's chunk, then the question's: nothing else written (a 2-chunk stream)."""
    return reorder(s, [s.needle_chunk, s.chunks - 1], unit)


def chunk_of(chunks: int, depth: float) -> int:
    """The chunk a needle at `depth` lies in: floor(depth x (chunks - 1)) below the question's, which depth 1 names."""
    return chunks - 1 if depth >= 1 else min(int(depth * (chunks - 1)), chunks - 2)


def _qa(kind: str, asked: list[str], golds: list[str]) -> tuple[str, str]:
    """A template's question (after the haystack) and its answer " v1, v2, ..." (data/niah's words)."""
    return "\n\n" + niah._question(kind, asked, len(golds)), " " + ", ".join(golds)


class Builder:
    """Streams over one split's haystack, for one tokenizer and window."""

    def __init__(self, tok, text: str, window: int, split: str):
        self.tok, self.window, self.split = tok, window, split
        self.hay = np.asarray(tok(text, add_special_tokens=False)["input_ids"], dtype=np.int64)
        self.q = tok(QUESTION, add_special_tokens=False)["input_ids"]
        self._most_cache: dict[str, int] = {}                          # kind -> the most tokens one can take
        self._sizes: dict[str, tuple[int, int, int, int]] = {}         # template -> template_sizes
        if len(self.q) + 8 + self._needle_len() > window:
            raise ValueError(f"passkey: window = {window} tokens cannot hold the needle, the question and the answer")

    def _needle_len(self) -> int:
        return len(self.tok(NEEDLE.format(v="1234567"), add_special_tokens=False)["input_ids"])

    def stream(self, chunks: int, depth: float, value: str, rng: np.random.Generator, chunk: int | None = None) -> Stream:
        """chunk: the needle's chunk by index (training draws it so: every chunk but the question's equally often);
        None: chunk_of(chunks, depth)."""
        W, T = self.window, chunks * self.window
        n = self.tok(NEEDLE.format(v=value), add_special_tokens=False)["input_ids"]
        a = self.tok(" " + value, add_special_tokens=False)["input_ids"]         # [" ", d1, ..., d7]
        tail = self.q + a
        c = chunk_of(chunks, depth) if chunk is None else chunk
        room = (W - len(tail) if c == chunks - 1 else W) - len(n)               # where the needle can start in chunk c
        p = c * W + int(rng.integers(0, room + 1))
        m = T - len(tail) - len(n)                                              # haystack tokens
        s = int(rng.integers(0, len(self.hay) - m))
        hay = self.hay[s:s + m].tolist()
        ids = hay[:p] + n + hay[p:] + tail
        tgt = torch.zeros(T, dtype=torch.bool)
        tgt[T - len(a):] = True                             # the answer as greedy decoding writes it: " " and the digits
        return Stream(torch.tensor(ids), tgt, chunks, depth, c, value)

    def values(self, k: int, rng: np.random.Generator) -> list[str]:
        return niah._numbers(rng, k, self.split)

    def _enc(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def _most(self, kind: str) -> int:
        """The most tokens " " + a drawable key or value of `kind` can take: every word pair of the split counted,
        numbers and uuids bounded by one token per character (a byte-level BPE never emits more)."""
        if kind not in self._most_cache:
            if kind == "words":
                side = niah.SPLITS.index(self.split)
                pairs = [f" {a}-{n}" for a in niah.ADJECTIVES[side::2] for n in niah.NOUNS[side::2]]
                self._most_cache[kind] = max(map(len, self.tok(pairs, add_special_tokens=False)["input_ids"]))
            else:
                self._most_cache[kind] = 1 + len(niah._DRAW[kind](np.random.default_rng(0), 1, self.split)[0])
        return self._most_cache[kind]

    def template_sizes(self, name: str) -> tuple[int, int, int, int]:
        """(instruction, gold needle, question + answer, all needles) of template `name`: the most tokens any draw
        can take. One draw is tokenised and each of its keys and values widened to the most its kind can take; the
        pre-tokenizer splits at the spaces and punctuation around them, so the pieces add up."""
        if name in self._sizes:
            return self._sizes[name]
        t = niah.TASKS[name]
        rng = np.random.default_rng(0)
        keys = niah._DRAW[t.key](rng, t.n_keys, self.split)
        values = [niah._DRAW[t.value](rng, t.n_values, self.split) for _ in keys]
        wk = {k: self._most(t.key) - len(self._enc(" " + k)) for k in keys}          # what each could grow by
        wv = {v: self._most(t.value) - len(self._enc(" " + v)) for vs in values for v in vs}
        needles = [len(self._enc(" " + niah.needle(t.value, k, v))) + wk[k] + wv[v] for k, vs in zip(keys, values) for v in vs]
        golds = [v for vs in values[:t.n_queries] for v in vs]
        q, a = _qa(t.value, keys[:t.n_queries], golds)                              # q names each asked key twice
        tail = (len(self._enc(q)) + len(self._enc(a))
                + sum(wk[k] * q.count(k) for k in keys[:t.n_queries]) + sum(wv[v] for v in golds))
        self._sizes[name] = len(self._enc(niah._instruction(t.value))), needles[0], tail, sum(needles)
        return self._sizes[name]

    def check_template(self, name: str, chunks: int, depth: float, chunk: int | None = None) -> None:
        """ValueError, for every draw alike, when a stream of `name` at (chunks, depth) (or its needle in chunk `chunk`)
        might not fit its chunks."""
        head, gold, tail, total = self.template_sizes(name)
        W, c = self.window, chunk_of(chunks, depth) if chunk is None else chunk
        room = W - (tail if c == chunks - 1 else 0) - (head if c == 0 else 0)       # the gold needle's chunk
        if gold > room or tail > W or head + tail + total > chunks * W:
            raise ValueError(f"template {name}: a {W}-token chunk cannot hold its needle (up to {gold} tokens) beside "
                             f"the instruction ({head}) or the question and answer (up to {tail}) at depth {depth:g} of "
                             f"{chunks} chunks; use a larger unit, another depth or another template")

    def template_stream(self, name: str, chunks: int, depth: float, rng: np.random.Generator,
                        chunk: int | None = None) -> Stream:
        """One stream of RULER template `name` (data/niah.TASKS), its first gold needle in the chunk `depth` picks
        (or the chunk given by index)."""
        self.check_template(name, chunks, depth, chunk)
        t, W, T = niah.TASKS[name], self.window, chunks * self.window
        kind, used = t.value, {}
        keys = niah._unique(t.key, t.n_keys, rng, self.split, used)
        values = [niah._unique(kind, t.n_values, rng, self.split, used) for _ in keys]
        asked = keys[:t.n_queries]
        golds = [v for vs in values[:t.n_queries] for v in vs]
        needles = [self._enc(" " + niah.needle(kind, k, v)) for k, vs in zip(keys, values) for v in vs]   # gold first
        head = self._enc(niah._instruction(kind))
        q, a = (self._enc(x) for x in _qa(kind, asked, golds))
        tail = q + a
        c = chunk_of(chunks, depth) if chunk is None else chunk
        lo = c * W + (len(head) if c == 0 else 0)                               # the gold needle: wholly in chunk c
        hi = (T - len(tail) if c == chunks - 1 else (c + 1) * W) - len(needles[0])    # >= lo: check_template
        spans = [(p := int(rng.integers(lo, hi + 1)), p + len(needles[0]))]
        for n in needles[1:]:                   # the others: anywhere between the instruction and the question
            for _ in range(1000):
                p = int(rng.integers(len(head), T - len(tail) - len(n) + 1))
                if all(p + len(n) <= s0 or p >= e0 for s0, e0 in spans):
                    break
            else:
                raise ValueError(f"template {name}: no room for {len(needles)} needles in {chunks} chunks of {W} tokens")
            spans.append((p, p + len(n)))
        hay = self._haystack(t, T - len(head) - len(tail) - sum(map(len, needles)), rng, used)
        ids, pos, h = list(head), len(head), 0
        for i in sorted(range(len(needles)), key=lambda i: spans[i][0]):
            take = spans[i][0] - pos
            ids += hay[h:h + take] + needles[i]
            h, pos = h + take, spans[i][1]
        ids += hay[h:] + tail
        assert len(ids) == T, (len(ids), T)
        tgt = torch.zeros(T, dtype=torch.bool)
        tgt[T - len(a):] = True                             # every token of the answer, blanks and commas included
        gold_of = torch.full((T,), -1, dtype=torch.long)
        gold_of[T - len(a):] = torch.tensor(self._gold_of(a, golds))
        return Stream(torch.tensor(ids), tgt, chunks, depth, c, ", ".join(golds), gold_of)

    def _gold_of(self, a: list[int], golds: list[str]) -> list[int]:
        """For each token of the answer " v1, v2, ...": the index of the gold value its characters fall in, or -1
        (the separators), read off the decoded prefixes' lengths."""
        ends = [len(self.tok.decode(a[:j + 1])) for j in range(len(a))]             # char end of token j
        spans, at = [], 1                                                           # the answer opens with " "
        for g in golds:
            spans.append((at, at + len(g)))
            at += len(g) + 2                                                        # ", "
        out = []
        for j, e in enumerate(ends):
            b = ends[j - 1] if j else 0
            out.append(next((k for k, (lo, hi) in enumerate(spans) if b < hi and e > lo), -1))
        return out

    def _haystack(self, t: "niah.Template", n: int, rng: np.random.Generator, used: dict) -> list[int]:
        """n haystack tokens: a contiguous run of the split's text, the filler repeated, or distractor needles."""
        if t.haystack == "book":
            s = int(rng.integers(0, len(self.hay) - n))
            return self.hay[s:s + n].tolist()
        if t.haystack == "filler":
            one = self._enc(" " + niah.FILLER)
            return (one * (n // len(one) + 1))[:n]
        k = n // 16 + 2                                                         # a needle is >= 16 tokens
        ds = zip(niah._unique(t.key, k, rng, self.split, used), niah._unique(t.value, k, rng, self.split, used))
        return self._enc("".join(" " + niah.needle(t.value, key, v) for key, v in ds))[:n]
