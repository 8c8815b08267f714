"""`psentiment`: the tweets prompt-based on SmolLM2: the class is the label word with the higher logit at the
prompt's last token (zero-shot above chance: round 0). `validation = true` scores on test_size balanced tweets from
outside the task's train and test rows (the train rows unchanged): settings are chosen there, never on the test set."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from lightfed.config import ConfigError
from lightfed.models import backbones
from lightfed.models.lm import label_scores
from lightfed.tasks.base import Task, accuracy, balanced_pick, eval_mode
from lightfed.tasks.sentiment import tweet_split


@dataclass
class Options:
    tiny: bool = False
    model: str = ""                # a local Hugging Face model folder (or .gguf file) instead of the default backbone
    train_size: int = 2000
    test_size: int = 1000          # balanced; one example = 0.1 pp
    max_len: int = 64              # prompt tokens (the tweet is cut from its end to fit)
    template: str = "Tweet: {text}\nSentiment:"
    labels: str = " negative| positive"   # label words in class order, "|"-separated (each scored by its first token)
    data_seed: int = 0
    validation: bool = False       # test on tweets outside the train and test rows (the train rows are the same)

    def check(self):
        if self.train_size < 2 or self.test_size < 2 or self.train_size % 2 or self.test_size % 2:
            raise ConfigError("psentiment: train_size and test_size must be even and >= 2 (classes are balanced)")
        if "{text}" not in self.template:
            raise ConfigError(f"psentiment: template {self.template!r} has no {{text}}")
        if len(self.labels.split("|")) != 2:
            raise ConfigError(f"psentiment: labels = {self.labels!r}: two label words, '|'-separated")
        if not 8 <= self.max_len <= 512:
            raise ConfigError(f"psentiment: max_len = {self.max_len} must be in [8, 512]")


def build(o: Options, seed: int) -> Task:
    """The prompt-based setting of the zeroth-order line (MeZO, DeComFL, FedKSeed): the pretrained LM already
    ranks the label words above chance (zero-shot: round 0), fine-tuning moves it from there."""
    texts, labels, train_idx, test_idx = tweet_split(o)
    if o.validation:                # balanced, disjoint from the train rows and from the test rows it replaces
        rest = np.setdiff1d(np.arange(len(labels)), np.concatenate([train_idx, test_idx]))
        test_idx = rest[balanced_pick(labels[rest], o.test_size // 2, np.random.default_rng([o.data_seed, 11]))]
    tok = backbones.smollm2_tokenizer(o.model)
    words = o.labels.split("|")
    label_ids = torch.tensor([tok(w, add_special_tokens=False)["input_ids"][0] for w in words])
    if len(set(label_ids.tolist())) != len(words):
        raise ConfigError(f"psentiment: label words {words} share their first token")
    head, tail = o.template.split("{text}", 1)
    h_ids, t_ids = tok(head, add_special_tokens=False)["input_ids"], tok(tail, add_special_tokens=False)["input_ids"]
    room = o.max_len - len(h_ids) - len(t_ids)
    if room < 1:
        raise ConfigError(f"psentiment: the template takes {o.max_len - room} tokens, more than max_len = {o.max_len}")

    def encode(idx):
        ids = torch.full((len(idx), o.max_len), tok.pad_token_id, dtype=torch.long)
        attn = torch.zeros((len(idx), o.max_len), dtype=torch.long)
        n_tok = []
        for r, i in enumerate(idx):
            seq = h_ids + tok(texts[i], add_special_tokens=False)["input_ids"][:room] + t_ids
            ids[r, : len(seq)], attn[r, : len(seq)] = torch.tensor(seq), 1
            n_tok.append(len(seq))
        return {"input_ids": ids, "attention_mask": attn, "label_ids": label_ids.expand(len(idx), -1).clone(),
                "labels": torch.as_tensor(labels[idx], dtype=torch.long)}, n_tok

    model = backbones.smollm2(o.tiny, seed, o.model)

    def loss(m, b):
        return F.cross_entropy(label_scores(m, b["input_ids"], b["attention_mask"], b["label_ids"]), b["labels"])

    @eval_mode
    def evaluate(m, data):
        return accuracy(lambda b: label_scores(m, b["input_ids"], b["attention_mask"], b["label_ids"]), data, 32)

    (train, n_train), (test, n_test) = encode(train_idx), encode(test_idx)
    return Task("psentiment", "accuracy", True, model, train, test, train["labels"].numpy(), None, loss, evaluate,
                {"backbone": o.model or ("tiny-llama" if o.tiny else "SmolLM2-135M-Instruct"), "classes": ["negative", "positive"],
                 "template": o.template, "label_words": words, "label_token_ids": label_ids.tolist(),
                 "prompt_tokens_mean": float(np.mean(n_train + n_test))})
