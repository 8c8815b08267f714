"""First-order local training (SGD / AdamW over the client's shard), with exact accounting.

FLOPs: torch's FlopCounterMode (matmul, convolution and attention kernels, forward+backward;
element-wise ops are not counted) measured on the first batch, divided by its size and
multiplied by the samples processed: exact for matmul/conv FLOPs because every batch has the
same per-sample shape (inputs are padded to a fixed length).
Memory: bytes of the tensors autograd saves for backward on the first batch (activations,
parameters excluded), of the gradients and of the optimizer state, counted from the tensors.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode

from lightfed import measure  # noqa: F401  (FLOP formulas for CPU fused attention)
from lightfed.data.tensors import Data, batches, size


def _nbytes(ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


def count_saved_activations(fn: Callable[[], torch.Tensor], exclude: set[int]) -> tuple[torch.Tensor, int]:
    """Run fn() (a forward) and count the unique storages autograd saves, except `exclude` (params).
    The storages are held until the count is taken: one freed mid-forward (a discarded branch's) cannot hand its
    address to a later one and be counted once for two, so the count does not depend on the allocator's history.
    What the graph keeps is the tensor detached (the same storage and version counter): the tensor itself would tie
    its graph into a reference cycle that outlives the step (FedNL's memory forward kept ~1.8 GB per client round
    of SmolLM2-135M that way, until the process ran out of memory)."""
    seen: dict[int, torch.UntypedStorage] = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in exclude:
            seen.setdefault(s.data_ptr(), s)
        return t.detach()

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(s.nbytes() for s in seen.values())


def local_train(model: nn.Module, params: list, data: Data, loss_fn, *, epochs: float, steps: int,
                batch_size: int, lr: float, optimizer: str, weight_decay: float, generator: torch.Generator,
                regularizer: Callable[[], torch.Tensor] | None = None) -> dict:
    """Train `params` on `data`; return stats. `steps > 0` overrides `epochs` (fractions allowed).
    params: tensors, or the optimizer's parameter groups ({"params": [...], "lr": x}; `lr` for those without)."""
    n = size(data)
    per_epoch = math.ceil(n / batch_size)
    total = steps if steps > 0 else max(1, math.ceil(epochs * per_epoch))
    if optimizer not in ("adamw", "sgd"):   # "" is resolved by methods.resolve_lr; never a silent default here
        raise ValueError(f"optimizer = {optimizer!r}: expected 'adamw' or 'sgd' (build the method with methods.build)")
    opt = (torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay) if optimizer == "adamw"
           else torch.optim.SGD(params, lr=lr, weight_decay=weight_decay))
    model.train()
    param_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    done, samples, loss_sum, reg_sum, flops_per_sample, act_bytes = 0, 0, 0.0, 0.0, 0.0, 0
    def penalised(loss):
        nonlocal reg_sum
        if regularizer is None:
            return loss
        reg = regularizer()
        reg_sum += reg.item()
        return loss + reg

    while done < total:
        for b in batches(data, batch_size, generator):
            bs = size(b)
            opt.zero_grad(set_to_none=True)
            if done == 0:   # measure on the first batch
                with FlopCounterMode(display=False) as fc:
                    loss, act_bytes = count_saved_activations(lambda: loss_fn(model, b), param_ptrs)
                    loss = penalised(loss)
                    loss.backward()
                flops_per_sample = fc.get_total_flops() / bs
            else:
                loss = penalised(loss_fn(model, b))
                loss.backward()
            opt.step()
            loss_sum += loss.item()
            samples += bs
            done += 1
            if done == total:
                break
    grads = [p.grad for g in opt.param_groups for p in g["params"] if p.grad is not None]
    opt_state = [t for s in opt.state.values() for t in s.values() if torch.is_tensor(t)]
    stats = {
        "steps": done, "samples": samples, "train_loss": loss_sum / done,
        "flops": flops_per_sample * samples,
        "memory_accounted": {"params": _nbytes(list(model.parameters()) + list(model.buffers())),
                             "grads": _nbytes(grads), "optimizer": _nbytes(opt_state), "activations": act_bytes},
    }
    if regularizer is not None:     # the penalty's mean and its share of the loss trained on (train_loss includes it)
        stats["penalty"] = reg_sum / done
        stats["penalty_share"] = reg_sum / loss_sum if loss_sum > 0 else 0.0
    opt.zero_grad(set_to_none=True)
    del opt
    return stats
