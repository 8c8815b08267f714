"""`austen`: the six Austen novels in 128-token blocks (the last 10% of each held out), causal language modelling on
SmolLM2 (perplexity); `window > 0` runs every block in chunks (the streaming setting); `domain`: one novel each."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from lightfed.config import ConfigError
from lightfed.data import datasets
from lightfed.data.tensors import batches
from lightfed.models import backbones, lm
from lightfed.tasks.base import Task, eval_mode


@dataclass
class Options:
    tiny: bool = False
    model: str = ""                # a local Hugging Face model folder (or .gguf file) instead of the default backbone
    block_len: int = 128
    train_blocks: int = 1200  # sampled from the first 90% of each novel
    test_blocks: int = 120    # sampled from the last 10% of each novel
    data: str = ""            # instead of the novels: a folder of .txt files (one domain each), or a .csv / .jsonl /
                              # .parquet with a `text_column` (+ `client_column`: the domains; else one domain)
    text_column: str = "text"
    client_column: str = ""
    window: int = 0           # 0: a block in one forward; > 0: in chunks of `window` tokens, attention local to a
                              # chunk, FedNL's memory carrying across (the streaming setting, models/streaming.py)
    data_seed: int = 0

    def check(self):
        if self.window < 0 or 0 < self.window < 8:
            raise ConfigError(f"austen: window = {self.window}: 0 (whole blocks) or >= 8 tokens")
        if not 16 <= self.block_len <= 16384:
            raise ConfigError(f"austen: block_len = {self.block_len} must be in [16, 16384]")
        if self.train_blocks < 6 or self.test_blocks < 6:
            raise ConfigError("austen: train_blocks and test_blocks must be >= 6 (one per novel)")


def build(o: Options, seed: int) -> Task:
    if o.data:
        from lightfed.data import user
        books = user.read_corpus(o.data, o.text_column, o.client_column)
    else:
        books = datasets.load_austen()
    tok = backbones.smollm2_tokenizer(o.model)
    tok.model_max_length = 10**9   # whole novels are tokenised once, then cut into blocks
    rng = np.random.default_rng([o.data_seed, 12])
    titles = sorted(books)
    train_x, train_d, test_x = [], [], []
    for b, title in enumerate(titles):
        ids = torch.tensor(tok(books[title], add_special_tokens=False)["input_ids"])
        blocks = ids[: len(ids) // o.block_len * o.block_len].view(-1, o.block_len)   # (nb, L)
        cut = int(len(blocks) * 0.9)
        ntr = o.train_blocks // len(titles) + (b < o.train_blocks % len(titles))
        nte = o.test_blocks // len(titles) + (b < o.test_blocks % len(titles))
        train_x.append(blocks[torch.as_tensor(np.sort(rng.choice(cut, ntr, replace=False)))])
        test_x.append(blocks[cut:][torch.as_tensor(np.sort(rng.choice(len(blocks) - cut, nte, replace=False)))])
        train_d += [b] * ntr
    model = backbones.smollm2(o.tiny, seed, o.model)

    def loss(m, b):
        if o.window:
            return lm.target_nll(m, b["input_ids"], torch.ones_like(b["input_ids"], dtype=torch.bool), o.window)
        return m(input_ids=b["input_ids"], labels=b["input_ids"]).loss

    @eval_mode
    @torch.no_grad()
    def evaluate(m, data):   # perplexity = exp(mean token NLL) over all test tokens
        nll, n = 0.0, 0
        for b in batches(data, 8):
            k = b["input_ids"].numel() - len(b["input_ids"])
            nll += loss(m, b).item() * k
            n += k
        return float(np.exp(nll / n))

    domains = np.array([titles[d] for d in train_d])
    return Task("austen", "perplexity", False, model, {"input_ids": torch.cat(train_x)}, {"input_ids": torch.cat(test_x)},
                np.array(train_d), domains, loss, evaluate,
                {"backbone": o.model or ("tiny-llama" if o.tiny else "SmolLM2-135M-Instruct"), "novels": titles})
