"""`sentiment`: tweets, positive vs negative (an SST-2 stand-in), on all-MiniLM-L6-v2 + a linear head (accuracy)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lightfed.config import ConfigError
from lightfed.data import datasets
from lightfed.models import backbones
from lightfed.models.backbones import seeded
from lightfed.tasks.base import Task, balanced_pick, clf_evaluate, clf_loss, encode_texts


@dataclass
class Options:
    tiny: bool = False
    model: str = ""                # a local Hugging Face model folder (or .gguf file) instead of the default backbone
    train_size: int = 4000   # balanced positive/negative
    test_size: int = 1000    # balanced, disjoint from train, fixed by data_seed
    max_len: int = 40        # tokens; tweets are short (95% fit)
    data_seed: int = 0
    pretrained: bool = True  # False: the same architecture from random weights (ablations)

    def check(self):
        if self.train_size < 2 or self.test_size < 2 or self.train_size % 2 or self.test_size % 2:
            raise ConfigError("sentiment: train_size and test_size must be even and >= 2 (classes are balanced)")
        if not 8 <= self.max_len <= 512:
            raise ConfigError(f"sentiment: max_len = {self.max_len} must be in [8, 512]")


def tweet_split(o) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """Balanced positive/negative tweets: (texts, labels, train rows, test rows), fixed by o.data_seed."""
    texts, labels = datasets.load_tweets()
    labels = np.asarray(labels)
    rng = np.random.default_rng([o.data_seed, 10])
    pick = balanced_pick(labels, (o.train_size + o.test_size) // 2, rng)
    pick = rng.permutation(pick)
    # put test_size/2 of each class in test
    test_idx = np.concatenate([pick[labels[pick] == c][: o.test_size // 2] for c in (0, 1)])
    return texts, labels, np.setdiff1d(pick, test_idx), test_idx


def build(o: Options, seed: int) -> Task:
    texts, labels, train_idx, test_idx = tweet_split(o)
    tok = backbones.minilm_tokenizer(o.model)

    def encode(idx):
        return encode_texts(tok, [texts[i] for i in idx], labels[idx], o.max_len)

    if not o.pretrained and not o.tiny:  # the real architecture (its config), random weights
        encoder = backbones.minilm_random(seed, o.model)
    else:
        encoder = backbones.minilm(o.tiny, seed, o.model)
    with seeded(seed):
        model = backbones.TextClassifier(encoder, 2)


    train = encode(train_idx)
    return Task("sentiment", "accuracy", True, model, train, encode(test_idx), train["labels"].numpy(), None,
                clf_loss, clf_evaluate, {"backbone": o.model or ("tiny-bert" if o.tiny else "all-MiniLM-L6-v2"), "classes": ["negative", "positive"]})
