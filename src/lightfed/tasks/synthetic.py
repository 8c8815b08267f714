"""`synthetic`: random data on the tiny twins, with no asset at all: for checks on a machine that has none of
lightfed's assets (scripts/gpu_check.sh runs every method there) and for smoke tests.

    kind = lm      a 2-layer Llama-style causal LM (vocab 512) on token streams from a fixed random bigram chain
                   (learnable: perplexity falls below the vocabulary size); every LM method runs on it (FedNL too)
    kind = clf     a 2-layer BERT encoder + linear head on random token sequences, the label a fixed random linear
                   rule of the token counts (learnable: accuracy above 0.5)
    kind = image   the ResNet-18 twin (20 convolutions, widths 4-16) on random 32x32 images whose label is the sign
                   of a fixed random projection (learnable)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from lightfed.config import ConfigError
from lightfed.data.tensors import batches
from lightfed.models import backbones, vision
from lightfed.models.backbones import seeded
from lightfed.tasks.base import Task, accuracy, eval_mode

KINDS = ("lm", "clf", "image")
VOCAB = 512


@dataclass
class Options:
    kind: str = "lm"
    train_size: int = 256
    test_size: int = 64
    seq_len: int = 32
    data_seed: int = 0

    def check(self):
        if self.kind not in KINDS:
            raise ConfigError(f"synthetic: kind = {self.kind!r}: use one of {', '.join(KINDS)}")
        if self.train_size < 2 or self.test_size < 2 or not 8 <= self.seq_len <= 512:
            raise ConfigError("synthetic: train_size, test_size >= 2 and seq_len in [8, 512]")


def _lm(o: Options, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM
    g = torch.Generator().manual_seed(o.data_seed)
    nxt = torch.softmax(3 * torch.randn(VOCAB, VOCAB, generator=g), -1)            # a fixed bigram chain

    def draw(n):
        ids = torch.empty(n, o.seq_len, dtype=torch.long)
        ids[:, 0] = torch.randint(0, VOCAB, (n,), generator=g)
        for t in range(1, o.seq_len):
            ids[:, t] = torch.multinomial(nxt[ids[:, t - 1]], 1, generator=g)[:, 0]
        return {"input_ids": ids}
    with seeded(seed):
        model = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                                             tie_word_embeddings=True))

    def loss(m, b):
        return m(input_ids=b["input_ids"], labels=b["input_ids"]).loss

    @eval_mode
    @torch.no_grad()
    def evaluate(m, data):
        return float(np.exp(np.mean([loss(m, b).item() for b in batches(data, 32)])))
    train, test = draw(o.train_size), draw(o.test_size)
    return Task("synthetic", "perplexity", False, model, train, test, np.zeros(o.train_size, dtype=np.int64), None,
                loss, evaluate, {"backbone": "tiny-llama (random)", "kind": "lm"})


def _clf(o: Options, seed: int):
    from transformers import BertConfig, BertModel
    g = torch.Generator().manual_seed(o.data_seed)
    w = torch.randn(VOCAB, generator=g)

    def draw(n):
        ids = torch.randint(0, VOCAB, (n, o.seq_len), generator=g)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": (w[ids].sum(1) > 0).long()}
    with seeded(seed):
        enc = BertModel(BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                   intermediate_size=64, max_position_embeddings=512), add_pooling_layer=False)
        model = backbones.TextClassifier(enc, 2)

    def loss(m, b):
        return F.cross_entropy(m(b["input_ids"], b["attention_mask"]), b["labels"])

    @eval_mode
    def evaluate(m, data):
        return accuracy(lambda b: m(b["input_ids"], b["attention_mask"]), data)
    train, test = draw(o.train_size), draw(o.test_size)
    return Task("synthetic", "accuracy", True, model, train, test, train["labels"].numpy(), None, loss, evaluate,
                {"backbone": "tiny-bert (random)", "kind": "clf"})


def _image(o: Options, seed: int):
    g = torch.Generator().manual_seed(o.data_seed)
    w = torch.randn(32 * 32, generator=g)

    def draw(n):
        x = torch.randn(n, 1, 32, 32, generator=g)
        return {"x": x, "labels": (x.view(n, -1) @ w > 0).long()}
    with seeded(seed):
        model = vision.GNResNet18(2, widths=(4, 8, 8, 16), groups=4)

    def loss(m, b):
        return F.cross_entropy(m(b["x"]), b["labels"])

    @eval_mode
    def evaluate(m, data):
        return accuracy(lambda b: m(b["x"]), data)
    train, test = draw(o.train_size), draw(o.test_size)
    return Task("synthetic", "accuracy", True, model, train, test, train["labels"].numpy(), None, loss, evaluate,
                {"backbone": "GNResNet18 (tiny twin, random)", "kind": "image"})


def build(o: Options, seed: int) -> Task:
    return {"lm": _lm, "clf": _clf, "image": _image}[o.kind](o, seed)
