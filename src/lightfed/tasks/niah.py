"""`niah`: needle in a haystack, RULER-style (data/niah.py), streamed through a local attention window."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from lightfed.config import ConfigError
from lightfed.data import datasets
from lightfed.models import backbones, lm
from lightfed.tasks.base import Task, eval_mode


@dataclass
class Options:
    tiny: bool = False
    model: str = ""                # a local Hugging Face model folder (or .gguf file) instead of the default backbone
    templates: str = "all"         # comma-separated names from data.niah.TASKS, or all (the seven of TASKS7)
    train_len: int = 1024          # tokens per training stream (train split: Austen's first 90%, its own keys/values)
    train_per_template: int = 16
    lengths: str = "1024,4096"     # evaluation lengths in tokens (eval split: Austen's last 10%)
    test_per_cell: int = 4         # samples per (template, length), needle depths spread over 0-100%
    window: int = 256              # attention window: every input goes through in chunks of this many tokens
    gen_tokens: int = 32
    data_seed: int = 0

    def check(self):
        from lightfed.data import niah
        names = niah.TASKS7 if self.templates == "all" else tuple(t.strip() for t in self.templates.split(","))
        bad = [t for t in names if t not in niah.TASKS]
        if bad:
            raise ConfigError(f"niah: unknown template(s) {bad}; templates: {', '.join(niah.TASKS)}")
        try:
            lens = [int(x) for x in self.lengths.split(",")]
        except ValueError:
            lens = [0]
        if min(lens) < 256 or self.train_len < 256:
            raise ConfigError(f"niah: lengths = {self.lengths!r}, train_len = {self.train_len}: use token counts >= 256")
        if self.window < 16 or self.train_per_template < 1 or self.test_per_cell < 1 or self.gen_tokens < 1:
            raise ConfigError("niah: window >= 16, train_per_template, test_per_cell and gen_tokens >= 1")


def build(o: Options, seed: int) -> Task:
    """Train: each template's needles (train split) in `train_len`-token streams, loss on the answer's
    tokens, computed through the chunked stream (models/streaming.py), so only a model whose memory
    carries the needle across chunks can lower it. Test: the eval split at each length, answered
    greedily in the same chunked setting, scored by "string match all". Domain = template."""
    from lightfed.data import niah as N
    from lightfed.models import streaming

    names = list(N.TASKS7 if o.templates == "all" else [t.strip() for t in o.templates.split(",")])
    lengths = [int(x) for x in o.lengths.split(",")]
    books = datasets.load_austen()
    tok = backbones.smollm2_tokenizer(o.model)
    tok.model_max_length = 10**9
    hay_train, hay_eval = N.haystack_split(books, "train"), N.haystack_split(books, "eval")
    rows, doms = [], []
    for i, t in enumerate(names):
        for s_ in N.make_samples(t, o.train_len, tok, hay_train, o.train_per_template, seed=o.data_seed * 1000 + i,
                                 split="train", gen_tokens=o.gen_tokens):
            prompt, answer = N.training_text(s_)
            p = tok(prompt, add_special_tokens=False)["input_ids"]
            a = tok(answer, add_special_tokens=False)["input_ids"][: o.gen_tokens]
            rows.append((p + a, len(p)))
            doms.append(t)
    L = max(len(r) for r, _ in rows)
    ids = torch.full((len(rows), L), tok.pad_token_id, dtype=torch.long)
    tmask = torch.zeros((len(rows), L), dtype=torch.bool)
    for j, (r, n_prompt) in enumerate(rows):
        ids[j, : len(r)] = torch.tensor(r)
        tmask[j, n_prompt: len(r)] = True
    tests = [s_ for i, t in enumerate(names) for k, n in enumerate(lengths)
             for s_ in N.make_samples(t, n, tok, hay_eval, o.test_per_cell, seed=10**6 + o.data_seed * 1000 + 10 * i + k,
                                      split="eval", gen_tokens=o.gen_tokens)]
    prompts = [torch.tensor([tok(s_.prompt, add_special_tokens=False)["input_ids"]]) for s_ in tests]
    model = backbones.smollm2(o.tiny, seed, o.model)

    def loss(m, b):
        return lm.target_nll(m, b["input_ids"], b["target_mask"], o.window)

    def scores(m, data) -> list[float]:
        out = []
        for i in data["idx"].tolist():
            new = streaming.generate(m, prompts[i], o.window, o.gen_tokens, tok.eos_token_id)
            out.append(N.score(tok.decode(new), tests[i].golds))
        return out

    @eval_mode
    def evaluate(m, data):
        return float(np.mean(scores(m, data)))

    @eval_mode
    def details(m, data):      # {template: {length: [score per sample]}}
        cells: dict[str, dict[str, list[float]]] = {}
        for i, sc in zip(data["idx"].tolist(), scores(m, data)):
            cells.setdefault(tests[i].task, {}).setdefault(str(tests[i].length), []).append(sc)
        return cells

    test = {"idx": torch.arange(len(tests)), "labels": torch.tensor([names.index(s_.task) for s_ in tests])}
    train = {"input_ids": ids, "target_mask": tmask, "labels": torch.tensor([names.index(d) for d in doms])}
    return Task("niah", "accuracy", True, model, train, test, train["labels"].numpy(), np.array(doms), loss, evaluate,
                {"backbone": o.model or ("tiny-llama" if o.tiny else "SmolLM2-135M-Instruct"), "templates": names, "lengths": lengths,
                 "window": o.window, "train_tokens_padded": int(tmask.shape[1]),
                 "test_tokens_mean": float(np.mean([s_.n_tokens for s_ in tests]))},
                test_domains=np.array([s_.task for s_ in tests]), details=details)
