"""`textclf`: the user's own labelled texts (a CSV / JSON-lines / Parquet file), encoder + masked mean pooling + a
linear head, as `sentiment`; `client_column` names each row's client or domain (`--partition domain`)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lightfed.config import ConfigError
from lightfed.models import backbones
from lightfed.models.backbones import seeded
from lightfed.tasks.base import Task, clf_evaluate, clf_loss, encode_texts


@dataclass
class Options:
    data: str = ""                 # a CSV / JSON-lines / Parquet file of the user's (required)
    text_column: str = "text"
    label_column: str = "label"
    client_column: str = ""        # optional: names each example's client or domain (use partition = domain)
    test_fraction: float = 0.2     # held out at random (fixed by data_seed)
    max_len: int = 64
    tiny: bool = False
    model: str = ""                # a local encoder folder instead of all-MiniLM-L6-v2
    data_seed: int = 0

    def check(self):
        if not self.data:
            raise ConfigError("textclf: set data=FILE (--data FILE): a .csv, .jsonl or .parquet of text + label columns")
        if not 0 < self.test_fraction < 1:
            raise ConfigError(f"textclf: test_fraction = {self.test_fraction} must be in (0, 1)")
        if not 8 <= self.max_len <= 512:
            raise ConfigError(f"textclf: max_len = {self.max_len} must be in [8, 512]")


def build(o: Options, seed: int) -> Task:
    """Text classification on the user's file: encoder + masked mean pooling + a linear head (as sentiment)."""
    from lightfed.data import user
    cols = user.read_table(o.data, [o.text_column, o.label_column], (o.client_column,))
    names = sorted({str(v) for v in cols[o.label_column]})
    if len(names) < 2:
        raise ConfigError(f"textclf: column {o.label_column!r} has one class ({names}); need >= 2")
    labels = np.array([names.index(str(v)) for v in cols[o.label_column]])
    doms = np.array([str(v) for v in cols[o.client_column]]) if o.client_column else None
    rng = np.random.default_rng([o.data_seed, 14])
    order = rng.permutation(len(labels))
    n_test = max(1, round(o.test_fraction * len(labels)))
    test_idx, train_idx = np.sort(order[:n_test]), np.sort(order[n_test:])
    tok = backbones.minilm_tokenizer(o.model)
    texts = [str(t) for t in cols[o.text_column]]

    def encode(idx):
        return encode_texts(tok, [texts[i] for i in idx], labels[idx], o.max_len)

    with seeded(seed):
        model = backbones.TextClassifier(backbones.minilm(o.tiny, seed, o.model), len(names))


    train = encode(train_idx)
    return Task("textclf", "accuracy", True, model, train, encode(test_idx), labels[train_idx],
                doms[train_idx] if doms is not None else None, clf_loss, clf_evaluate,
                {"backbone": o.model or ("tiny-bert" if o.tiny else "all-MiniLM-L6-v2"), "classes": names,
                 "data": str(o.data), "rows": len(labels)},
                test_domains=doms[test_idx] if doms is not None else None)
