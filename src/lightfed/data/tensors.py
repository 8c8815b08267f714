"""A dataset is a dict of equally long tensors (`Data`); a batch is the same dict indexed by rows."""
from __future__ import annotations

import numpy as np
import torch

Data = dict[str, torch.Tensor]


def size(data: Data) -> int:
    return len(next(iter(data.values())))


def subset(data: Data, idx) -> Data:
    idx = torch.as_tensor(np.asarray(idx), dtype=torch.long)
    return {k: v[idx] for k, v in data.items()}


def batches(data: Data, batch_size: int, generator: torch.Generator | None = None):
    """Yield batches; shuffled when a generator is given, in order otherwise. Each batch is on the device of the
    `device.using` block it is drawn in (the CPU outside one)."""
    from lightfed import device
    n = size(data)
    order = torch.randperm(n, generator=generator) if generator is not None else torch.arange(n)
    dev = device.current()
    for i in range(0, n, batch_size):
        b = subset(data, order[i:i + batch_size])
        yield b if dev.type == "cpu" else device.to(b, dev)
