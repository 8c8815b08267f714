"""Every task, by name. A task = data + pretrained backbone + loss + metric (tasks/base.py's Task); each module
holds its `Options` (validated before any work) and `build(options, seed) -> Task`. Adding a task = one file +
one line here; the engine does not change.

| task       | data (offline)                              | backbone                                   | metric     |
|------------|---------------------------------------------|--------------------------------------------|------------|
| sentiment  | tweets, positive vs negative                | all-MiniLM-L6-v2 + linear head             | accuracy   |
| psentiment | the same tweets, prompt-based label words   | SmolLM2-135M-Instruct                      | accuracy   |
| trivia     | 4-way multiple choice, 54 subjects          | SmolLM2-135M, option log-likelihood        | accuracy   |
| austen     | six novels, next-token prediction           | SmolLM2-135M                               | perplexity |
| fmnist     | Fashion-MNIST, all 10 classes               | GroupNorm ResNet-18 lightfed pretrains     | accuracy   |
| niah       | RULER-style needles in Austen haystacks     | SmolLM2-135M, streamed in local windows    | accuracy   |
| passkey    | a pass key in an Austen haystack, streamed  | SmolLM2-135M, local windows (or full attn) | exact match|
| textclf    | the user's own file of labelled texts       | all-MiniLM-L6-v2 (or --model) + head       | accuracy   |
| synthetic  | random data, no asset (checks, GPU machines)| the tiny twins (Llama, BERT, ResNet-18)    | either     |
`tiny = true` swaps the backbone for a random twin of a few thousand weights (tests only).
"""
from __future__ import annotations

import dataclasses

from lightfed.config import ConfigError, check_options
from lightfed.tasks import austen, fmnist, niah, passkey, psentiment, sentiment, synthetic, textclf, trivia
from lightfed.tasks.base import Task  # noqa: F401  (the record every task builds)

TASKS = {m.__name__.rsplit(".", 1)[-1]: m for m in (sentiment, psentiment, trivia, austen, fmnist, niah, passkey, textclf, synthetic)}

# The tiny twin of each task (tests, `reproduce.py --quick`): real data and tokenizers, random backbones of a few
# thousand weights, a few examples.
TINY = {
    "sentiment": {"tiny": True, "train_size": 64, "test_size": 32, "max_len": 16},
    "fmnist": {"tiny": True, "train_size": 64, "test_size": 32},
    "austen": {"tiny": True, "block_len": 32, "train_blocks": 36, "test_blocks": 12},
    "trivia": {"tiny": True, "train_size": 32, "test_size": 16, "max_len": 32},
    "psentiment": {"tiny": True, "train_size": 64, "test_size": 32, "max_len": 24},
    "passkey": {"tiny": True, "train_size": 4, "train_chunks": 2, "lengths": "2", "depths": "0,1", "test_per_cell": 2},
    "niah": {"tiny": True, "train_len": 256, "lengths": "256,384", "train_per_template": 2, "test_per_cell": 1,
             "window": 64, "gen_tokens": 6},
}


def options(name: str, given: dict):
    if name not in TASKS:
        raise ConfigError(f"unknown task {name!r}; tasks: {', '.join(TASKS)}")
    return check_options("task", name, TASKS[name].Options, given)


def build(name: str, given: dict, seed: int) -> Task:
    opts = options(name, given)
    task = TASKS[name].build(opts, seed)
    task.info["options"] = dataclasses.asdict(opts)
    return task
