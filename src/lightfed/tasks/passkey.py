"""`passkey`: find a 7-digit pass key hidden in a long Austen haystack (data/passkey.py), the input streamed in
`window`-token chunks with attention local to each chunk, so a needle outside the question's chunk is reachable
only through a memory that carries across chunks (FedNL's). `window = 0`: full attention over the whole stream
(the reference a user would otherwise run, its KV cache growing with the length).

Train: `train_size` streams of `train_chunks` x `unit` tokens, the needle in a uniformly drawn chunk other than
the question's, the loss on the answer's 7 digits. Test: `test_per_cell` streams per (length, depth) cell,
lengths in chunks of `unit` tokens, depth 1.0 = the needle in the question's own chunk (reported apart). Metric:
exact match (every digit right, teacher forced), the mean over all cells; `details` gives it per cell.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from lightfed.config import ConfigError
from lightfed.data import datasets, niah
from lightfed.data import passkey as P
from lightfed.models import backbones, lm
from lightfed.tasks.base import Task, eval_mode


@dataclass
class Options:
    tiny: bool = False
    model: str = ""              # a local Hugging Face causal LM folder (or .gguf) instead of SmolLM2
    unit: int = 64               # tokens per chunk of a stream (its geometry: lengths count these)
    window: int = 64             # attention window in tokens; 0: full attention over the whole stream
    train_chunks: int = 4        # training stream length, in chunks
    train_size: int = 256        # training streams
    lengths: str = "4,8,16,32"   # test stream lengths, in chunks
    depths: str = "0,0.25,0.5,0.75,1"   # needle depths (1: the question's own chunk)
    test_per_cell: int = 20
    validation: bool = False     # test on streams built from the training split (its haystack, its passkeys): the set
                                 # on which settings are chosen, never the evaluation split
    data_seed: int = 0

    def check(self):
        try:
            lens, deps = self.lens(), self.deps()
        except ValueError:
            raise ConfigError(f"passkey: lengths = {self.lengths!r}, depths = {self.depths!r}: comma-separated numbers") from None
        if min(lens) < 2 or self.train_chunks < 2:
            raise ConfigError("passkey: lengths and train_chunks count chunks and must be >= 2 (the question has its own)")
        if not all(0 <= d <= 1 for d in deps):
            raise ConfigError(f"passkey: depths = {self.depths!r} must lie in [0, 1]")
        if self.unit < 48 or self.window < 0 or 0 < self.window < self.unit or self.window % self.unit:
            raise ConfigError(f"passkey: unit = {self.unit} (>= 48) and window = {self.window} (0, or a multiple of unit)")
        if self.train_size < 1 or self.test_per_cell < 1:
            raise ConfigError("passkey: train_size and test_per_cell must be >= 1")

    def lens(self) -> list[int]:
        return [int(x) for x in self.lengths.split(",")]

    def deps(self) -> list[float]:
        return [float(x) for x in self.depths.split(",")]


def streams(o: Options, tok, split: str, validation: bool = False) -> list[P.Stream]:
    """The task's streams: the training set (split "train") or the test cells (split "eval"; with validation, built
    from the training split's haystack and passkeys with other draws)."""
    src = "train" if validation else split
    b = P.Builder(tok, niah.haystack_split(datasets.load_austen(), src), o.unit, src)
    if split == "train":
        rng = np.random.default_rng([o.data_seed, 21])
        vals = b.values(o.train_size, rng)
        n = o.train_chunks
        return [b.stream(n, int(rng.integers(0, n - 1)) / (n - 1), v, rng) for v in vals]
    out = []
    for i, L in enumerate(o.lens()):
        for j, d in enumerate(o.deps()):
            rng = np.random.default_rng([o.data_seed, 23 if validation else 22, i, j])
            out += [b.stream(L, d, v, rng) for v in b.values(o.test_per_cell, rng)]
    return out


@torch.no_grad()
def exact_match(model, ss: list[P.Stream], window: int, reset: bool = False, batch: int = 16) -> list[float]:
    """1.0 per stream whose every answer digit is the argmax (teacher forcing), else 0.0. window 0: one chunk (full
    attention). reset: the memory emptied at every chunk (the control)."""
    from lightfed.models import streaming
    dev = model.lm_head.weight.device
    out = [0.0] * len(ss)
    by_len: dict[int, list[int]] = {}
    for i, s in enumerate(ss):
        by_len.setdefault(len(s.ids), []).append(i)
    for T, idx in sorted(by_len.items()):
        for j in range(0, len(idx), batch):
            rows = idx[j:j + batch]
            ids = torch.stack([ss[i].ids for i in rows]).to(dev)                          # (B, T)
            tgt = torch.stack([ss[i].targets for i in rows]).to(dev)
            h = streaming.hidden(model, ids, window or T, targets=tgt, reset=reset)       # (B, T, d)
            sel = tgt[:, 1:]
            pred = model.lm_head(h[:, :-1][sel]).argmax(-1).view(len(rows), -1)           # (B, digits)
            gold = ids[:, 1:][sel].view(len(rows), -1)
            for i, ok in zip(rows, (pred == gold).all(1).tolist()):
                out[i] = float(ok)
    return out


def cell(s: P.Stream) -> str:
    return f"{s.chunks}/{s.depth:g}"


def build(o: Options, seed: int) -> Task:
    tok = backbones.smollm2_tokenizer(o.model)
    tok.model_max_length = 10**9
    train_s, test_s = streams(o, tok, "train"), streams(o, tok, "eval", o.validation)
    model = backbones.smollm2(o.tiny, seed, o.model)

    def loss(m, b):
        return lm.target_nll(m, b["input_ids"], b["target_mask"], o.window or b["input_ids"].shape[1])

    @eval_mode
    def details(m, data):       # {"passkey": {"<chunks>/<depth>": [exact match per stream]}}
        picked = [test_s[i] for i in data["idx"].tolist()]
        cells: dict[str, list[float]] = {}
        for s, x in zip(picked, exact_match(m, picked, o.window)):
            cells.setdefault(cell(s), []).append(x)
        return {"passkey": cells}

    @eval_mode
    def evaluate(m, data):
        return float(np.mean([x for xs in details(m, data)["passkey"].values() for x in xs]))

    train = {"input_ids": torch.stack([s.ids for s in train_s]), "target_mask": torch.stack([s.targets for s in train_s]),
             "labels": torch.zeros(len(train_s), dtype=torch.long)}
    test = {"idx": torch.arange(len(test_s)), "labels": torch.zeros(len(test_s), dtype=torch.long)}
    c = model.config
    kv = 2 * c.num_hidden_layers * c.num_key_value_heads * (c.hidden_size // c.num_attention_heads) * 4   # fp32 bytes/token
    return Task("passkey", "exact_match", True, model, train, test, train["labels"].numpy(), None, loss, evaluate,
                {"backbone": o.model or ("tiny-llama" if o.tiny else "SmolLM2-135M-Instruct"), "unit": o.unit,
                 "window": o.window or "full", "lengths_chunks": o.lens(), "depths": o.deps(),
                 "train_tokens": o.train_chunks * o.unit, "kv_cache_bytes_per_token_fp32": kv},
                details=details)
