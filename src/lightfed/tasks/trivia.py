"""`trivia`: 4-way multiple choice from 54 trivia subjects with same-subject distractors (an MMLU stand-in), scored by
SmolLM2's mean log-likelihood of each option; `domain` partition: 6 subject groups."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from lightfed.config import ConfigError
from lightfed.data import datasets
from lightfed.models import backbones
from lightfed.models.lm import option_scores
from lightfed.tasks.base import Task, accuracy, eval_mode


@dataclass
class Options:
    tiny: bool = False
    model: str = ""                # a local Hugging Face model folder (or .gguf file) instead of the default backbone
    train_size: int = 2000
    test_size: int = 500
    max_len: int = 48
    data_seed: int = 0

    def check(self):
        if self.train_size < 1 or self.test_size < 1:
            raise ConfigError("trivia: train_size and test_size must be >= 1")


def build(o: Options, seed: int) -> Task:
    items = datasets.load_trivia()
    rng = np.random.default_rng([o.data_seed, 11])
    by_subject: dict[str, list[int]] = {}
    items = [it for it in items if "http" not in it["question"]]   # ~1,500 questions are only an image link
    for i, it in enumerate(items):
        by_subject.setdefault(it["subject"], []).append(i)
    questions = []  # (prompt, [4 options], correct index, subject)
    for i in rng.permutation(len(items)):
        it = items[i]
        accepted = {a.strip().lower() for a in it["answers"]}
        pool = [items[j]["answers"][0] for j in by_subject[it["subject"]] if j != i]
        pool = sorted({p for p in pool if p.strip().lower() not in accepted})
        if len(pool) < 3:
            continue
        opts = [it["answers"][0]] + [pool[k] for k in rng.choice(len(pool), 3, replace=False)]
        perm = rng.permutation(4)
        questions.append((f"Question: {it['question']}\nAnswer:", [opts[p] for p in perm],
                          int(np.flatnonzero(perm == 0)[0]), it["subject"]))
        if len(questions) == o.train_size + o.test_size:
            break
    if len(questions) < o.train_size + o.test_size:
        raise ConfigError(f"trivia: only {len(questions)} questions available")
    tok = backbones.smollm2_tokenizer(o.model)

    def encode(qs):
        n, L = len(qs), o.max_len
        ids = torch.full((n, 4, L), tok.pad_token_id, dtype=torch.long)
        attn = torch.zeros((n, 4, L), dtype=torch.long)
        tmask = torch.zeros((n, 4, L), dtype=torch.bool)
        for i, (prompt, opts, _, _) in enumerate(qs):
            p = tok(prompt, add_special_tokens=False)["input_ids"]
            for k, a in enumerate(opts):
                t = tok(" " + a, add_special_tokens=False)["input_ids"][: L // 2]
                seq = (p[-(L - len(t)):] + t) if len(p) + len(t) > L else p + t   # keep the answer, cut the question's start
                ids[i, k, : len(seq)] = torch.tensor(seq)
                attn[i, k, : len(seq)] = 1
                tmask[i, k, len(seq) - len(t): len(seq)] = True
        return {"input_ids": ids, "attention_mask": attn, "target_mask": tmask,
                "labels": torch.tensor([q[2] for q in qs])}

    train_q, test_q = questions[: o.train_size], questions[o.train_size:]
    model = backbones.smollm2(o.tiny, seed, o.model)

    def loss(m, b):
        return F.cross_entropy(option_scores(m, b["input_ids"], b["attention_mask"], b["target_mask"]), b["labels"])

    @eval_mode
    def evaluate(m, data):
        return accuracy(lambda b: option_scores(m, b["input_ids"], b["attention_mask"], b["target_mask"]), data, 32)

    train = encode(train_q)
    domains = np.array([datasets.subject_domain(q[3]) for q in train_q])
    return Task("trivia", "accuracy", True, model, train, encode(test_q), train["labels"].numpy(), domains,
                loss, evaluate, {"backbone": o.model or ("tiny-llama" if o.tiny else "SmolLM2-135M-Instruct"), "domains": sorted(set(domains))},
                test_domains=np.array([datasets.subject_domain(q[3]) for q in test_q]))
