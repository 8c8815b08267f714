"""`trivia`: 4-way multiple choice from 54 trivia subjects with same-subject distractors (an MMLU stand-in), scored by
SmolLM2's mean log-likelihood of each option; `domain` partition: 6 subject groups."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from lightfed.config import ConfigError
from lightfed.data import datasets
from lightfed.models import backbones
from lightfed.models.lm import option_scores, option_scores_shared
from lightfed.tasks.base import Task, accuracy, eval_mode


@dataclass
class Options:
    tiny: bool = False
    model: str = ""                # a local Hugging Face model folder (or .gguf file) instead of the default backbone
    train_size: int = 2000
    test_size: int = 500
    test_per_domain: int = 0       # > 0: a balanced test set, this many questions of every domain (replaces test_size)
    domains: str = ""              # comma-separated subject groups to keep (datasets.TRIVIA_DOMAINS); "": all
    max_len: int = 48
    data_seed: int = 0

    def check(self):
        if self.train_size < 1 or self.test_size < 1 or self.test_per_domain < 0:
            raise ConfigError("trivia: train_size and test_size must be >= 1, test_per_domain >= 0")
        bad = sorted(set(self.kept()) - set(datasets.TRIVIA_DOMAINS))
        if bad:
            raise ConfigError(f"trivia: unknown domains {bad}; known: {sorted(datasets.TRIVIA_DOMAINS)}")

    def kept(self) -> list[str]:
        return [d.strip() for d in self.domains.split(",") if d.strip()] or sorted(datasets.TRIVIA_DOMAINS)


def split(questions, o: Options) -> tuple[list, list]:
    """(train, test) from the questions in their shuffled order: the first train_size to training, then the next
    test_size to the test set; or, with test_per_domain, the next test_per_domain of every domain (balanced: each
    domain judged on as many; training the same either way). A test question whose text came earlier in the
    stream is skipped (11 are asked twice, e.g. a capital under two subjects): no test question is a training one."""
    questions = iter(questions)
    train = list(itertools.islice(questions, o.train_size))
    seen = {q[0] for q in train}

    def unseen(q):
        new = q[0] not in seen
        seen.add(q[0])
        return new
    questions = filter(unseen, questions)
    if not o.test_per_domain:
        test = list(itertools.islice(questions, o.test_size))
        if len(train) + len(test) < o.train_size + o.test_size:
            raise ConfigError(f"trivia: only {len(train) + len(test)} questions available, {o.train_size} + {o.test_size} asked")
        return train, test
    per = {d: [] for d in o.kept()}
    for q in questions:
        t = per.get(datasets.subject_domain(q[3]))
        if t is not None and len(t) < o.test_per_domain:
            t.append(q)
            if all(len(t) == o.test_per_domain for t in per.values()):
                break
    short = {d: len(t) for d, t in per.items() if len(t) < o.test_per_domain}
    if short or len(train) < o.train_size:
        raise ConfigError(f"trivia: train_size = {o.train_size} and test_per_domain = {o.test_per_domain} need more "
                          f"questions than there are (training {len(train)}; test questions left per domain: {short}); "
                          f"keep fewer domains (option domains) or ask fewer")
    return train, [q for d in sorted(per) for q in per[d]]


def _questions(items, by_subject, rng):
    """(prompt, [4 options], correct index, subject) in a shuffled order: the answer and three other answers of the
    question's own subject (none an accepted answer of it); a question whose subject has too few is skipped."""
    for i in rng.permutation(len(items)):
        it = items[i]
        accepted = {a.strip().lower() for a in it["answers"]}
        pool = [items[j]["answers"][0] for j in by_subject[it["subject"]] if j != i]
        pool = sorted({p for p in pool if p.strip().lower() not in accepted})
        if len(pool) < 3:
            continue
        opts = [it["answers"][0]] + [pool[k] for k in rng.choice(len(pool), 3, replace=False)]
        perm = rng.permutation(4)
        yield (f"Question: {it['question']}\nAnswer:", [opts[p] for p in perm], int(np.flatnonzero(perm == 0)[0]), it["subject"])


def questions(o: Options):
    """The text-only questions of the kept domains, shuffled by data_seed (one pass of _questions)."""
    items = [it for it in datasets.load_trivia() if "http" not in it["question"]   # ~1,500 are only an image link
             and (not o.domains or datasets.subject_domain(it["subject"]) in o.kept())]
    by_subject: dict[str, list[int]] = {}
    for i, it in enumerate(items):
        by_subject.setdefault(it["subject"], []).append(i)
    return _questions(items, by_subject, np.random.default_rng([o.data_seed, 11]))


def build(o: Options, seed: int) -> Task:
    train_q, test_q = split(questions(o), o)
    tok = backbones.smollm2_tokenizer(o.model)

    def encode(qs):
        n, L = len(qs), o.max_len
        ids = torch.full((n, 4, L), tok.pad_token_id, dtype=torch.long)
        attn = torch.zeros((n, 4, L), dtype=torch.long)
        tmask = torch.zeros((n, 4, L), dtype=torch.bool)
        for i, (prompt, opts, _, _) in enumerate(qs):
            p = tok(prompt, add_special_tokens=False)["input_ids"]
            ts = [tok(" " + a, add_special_tokens=False)["input_ids"][: L // 2] for a in opts]
            p = p[-(L - max(map(len, ts))):]        # keep the answers, cut the question's start: one prompt for all options
            for k, t in enumerate(ts):
                seq = p + t
                ids[i, k, : len(seq)] = torch.tensor(seq)
                attn[i, k, : len(seq)] = 1
                tmask[i, k, len(seq) - len(t): len(seq)] = True
        return {"input_ids": ids, "attention_mask": attn, "target_mask": tmask,
                "labels": torch.tensor([q[2] for q in qs])}

    model = backbones.smollm2(o.tiny, seed, o.model)

    def loss(m, b):
        return F.cross_entropy(option_scores(m, b["input_ids"], b["attention_mask"], b["target_mask"]), b["labels"])

    @eval_mode
    def evaluate(m, data):
        return accuracy(lambda b: option_scores_shared(m, b["input_ids"], b["attention_mask"], b["target_mask"]), data, max(1, len(data["labels"])))

    train = encode(train_q)
    domains = np.array([datasets.subject_domain(q[3]) for q in train_q])
    return Task("trivia", "accuracy", True, model, train, encode(test_q), train["labels"].numpy(), domains,
                loss, evaluate, {"backbone": o.model or ("tiny-llama" if o.tiny else "SmolLM2-135M-Instruct"), "domains": sorted(set(domains))},
                test_domains=np.array([datasets.subject_domain(q[3]) for q in test_q]))
