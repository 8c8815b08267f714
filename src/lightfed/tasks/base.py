"""What every task is made of: the Task record, and the helpers classification tasks share.

A task = data + pretrained backbone + loss + metric. Data are dicts of equally long tensors (`Data`);
a batch is the same dict indexed by rows.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from lightfed.config import ConfigError
from lightfed.data.tensors import Data, batches, size


@dataclass
class Task:
    name: str
    metric: str
    higher_is_better: bool
    model: nn.Module                      # the pretrained starting point (head initialised from the seed)
    train: Data
    test: Data
    labels: np.ndarray                    # per training example: what Dirichlet splits on
    domains: np.ndarray | None            # per training example: what `domain` splits on
    loss: Callable[[nn.Module, Data], torch.Tensor]
    evaluate: Callable[[nn.Module, Data], float]
    info: dict
    test_domains: np.ndarray | None = None   # per test example: its domain (per-domain and per-client scores)
    details: Callable[[nn.Module, Data], dict] | None = None   # {domain: {cell: [per-example scores]}}: the metric
                                                               # and its breakdown in one pass (NIAH: template x length)
    curriculum: Callable[[int, int], Data] | None = None       # (round, rounds) -> that round's training set: the
                                                               # same rows (labels, domains, shards), e.g. shorter
                                                               # streams first; None: `train` in every round

    def train_at(self, rnd: int, rounds: int) -> Data:
        """The training set clients draw from in round `rnd` of `rounds` (both engines ask here)."""
        return self.curriculum(rnd, rounds) if self.curriculum is not None else self.train


@torch.no_grad()
def accuracy(predict: Callable[[Data], torch.Tensor], data: Data, batch_size: int = 128) -> float:
    correct = 0
    for b in batches(data, batch_size):
        correct += (predict(b).argmax(-1) == b["labels"]).sum().item()
    return correct / size(data)


def eval_mode(fn):
    def wrapped(model, data):
        was = model.training
        model.eval()
        try:
            return fn(model, data)
        finally:
            model.train(was)
    return wrapped


def encode_texts(tok, texts: list[str], labels, max_len: int) -> Data:
    """An encoder classifier's examples: token ids and mask padded to max_len, and labels."""
    enc = tok(texts, padding="max_length", truncation=True, max_length=max_len, return_tensors="pt")
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
            "labels": torch.as_tensor(labels, dtype=torch.long)}


def clf_loss(m, b):
    return F.cross_entropy(m(b["input_ids"], b["attention_mask"]), b["labels"])


@eval_mode
def clf_evaluate(m, data):
    return accuracy(lambda b: m(b["input_ids"], b["attention_mask"]), data)


def balanced_pick(labels: np.ndarray, per_class: int, rng) -> np.ndarray:
    out = []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        if len(idx) < per_class:
            raise ConfigError(f"only {len(idx)} examples of class {c}; lower train_size/test_size")
        out.append(rng.choice(idx, per_class, replace=False))
    return np.concatenate(out)
