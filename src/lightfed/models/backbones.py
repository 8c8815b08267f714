"""Backbones: real pretrained models loaded offline, and tiny random twins of each for tests.

- MiniLM-L6 encoder (all-MiniLM-L6-v2, 22.7M params) + mean pooling + a linear head: `sentiment`.
- SmolLM2-135M-Instruct causal LM (Llama architecture): `trivia` and `austen`.
- GroupNorm ResNets for Fashion-MNIST, pretrained by lightfed itself (models/vision.py, tasks/fmnist.py).
A tiny twin keeps the architecture (and the real tokenizer) with a few thousand times fewer
weights, initialised from a seed: it is what the unit tests run.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn as nn

from lightfed import assets

TRANSFORMERS_MIN = (5, 24)    # models take the KV cache as `cache=` from 5.24 on; older ones would drop it in **kwargs


def require_transformers(version: str) -> None:
    """Refuse a transformers older than the code needs, naming the fix (an older one would silently run
    every cached decode without its KV cache)."""
    parts = []
    for x in version.split(".")[:2]:
        digits = "".join(c for c in x if c.isdigit())
        parts.append(int(digits) if digits else 0)
    if tuple(parts) < TRANSFORMERS_MIN:
        need = ".".join(map(str, TRANSFORMERS_MIN))
        raise ImportError(f"lightfed needs transformers >= {need} (found {version}): its models' `cache=` keyword "
                          f"carries the KV cache. Upgrade: python -m pip install 'transformers>={need}'")


import transformers as _transformers                           # noqa: E402
from transformers.utils import logging as _hf_logging         # noqa: E402

require_transformers(_transformers.__version__)
_hf_logging.set_verbosity_error()    # transformers prints a load report for every checkpoint (e.g. the unused pooler)
_hf_logging.disable_progress_bar()


@contextlib.contextmanager
def seeded(seed: int):
    """Run random initialisation from `seed` without touching the caller's RNG state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


class TextClassifier(nn.Module):
    """encoder(input_ids) -> masked mean pool -> head.   logits: (B, C)"""

    def __init__(self, encoder: nn.Module, num_classes: int):
        super().__init__()
        self.encoder = encoder
        self.head = nn.Linear(encoder.config.hidden_size, num_classes)

    def forward(self, input_ids, attention_mask):
        h = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (B, T, d)
        m = attention_mask.unsqueeze(-1).to(h.dtype)                                               # (B, T, 1)
        pooled = (h * m).sum(1) / m.sum(1).clamp_min(1.0)                                           # (B, d)
        return self.head(pooled)                                                                    # (B, C)


def minilm(tiny: bool, seed: int, path: str = "") -> nn.Module:
    """The encoder: all-MiniLM-L6-v2, its tiny twin, or a user's local encoder folder (`path`)."""
    from transformers import AutoModel, BertConfig, BertModel

    if path:
        return AutoModel.from_pretrained(assets.user_model(path)[0], dtype=torch.float32)
    if tiny:
        cfg = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=512)
        with seeded(seed):
            return BertModel(cfg, add_pooling_layer=False)
    return BertModel.from_pretrained(assets.minilm_dir(), add_pooling_layer=False, dtype=torch.float32)


def minilm_random(seed: int, path: str = "") -> nn.Module:
    """all-MiniLM-L6-v2's architecture (or the user's encoder's), from its config, with random weights."""
    from transformers import AutoConfig, AutoModel

    cfg = AutoConfig.from_pretrained(assets.user_model(path)[0] if path else assets.minilm_dir())
    with seeded(seed):
        return AutoModel.from_config(cfg, add_pooling_layer=False) if cfg.model_type == "bert" else AutoModel.from_config(cfg)


def minilm_tokenizer(path: str = ""):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(assets.user_model(path)[0] if path else assets.minilm_dir())


def smollm2(tiny: bool, seed: int, path: str = "") -> nn.Module:
    """The causal LM: SmolLM2-135M-Instruct, its tiny twin, or a user's local folder (`path`)."""
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    if path:
        folder, gguf = assets.user_model(path)
        kw = {"gguf_file": gguf} if gguf else {}
        return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **kw)
    if tiny:
        cfg = LlamaConfig(vocab_size=49152, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                          tie_word_embeddings=True)
        with seeded(seed):
            return LlamaForCausalLM(cfg)
    return AutoModelForCausalLM.from_pretrained(assets.smollm2_dir(), dtype=torch.float32)


def smollm2_tokenizer(path: str = ""):
    from transformers import AutoTokenizer

    if path:
        folder, gguf = assets.user_model(path)
        tok = AutoTokenizer.from_pretrained(folder, **({"gguf_file": gguf} if gguf else {}))
    else:
        tok = AutoTokenizer.from_pretrained(assets.smollm2_dir())
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok

