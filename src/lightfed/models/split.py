"""A task model cut in two consecutive blocks, y = f2(theta2; f1(theta1; batch)), for FedSPZO.

    sp = split(model, task, n)          # n = trailing layers that go to f2
    boundary = sp.f1(batch)             # embeddings + the first L - n layers: the cached activation
    loss = sp.f2_loss(boundary, batch)  # the last n layers + the task's tail + the task's loss
    sp.f2_loss(sp.f1(b), b) == task.loss(model, b)      (tests/test_zo.py checks it)

| task      | model            | f1                          | f2                                          |
|-----------|------------------|-----------------------------|---------------------------------------------|
| sentiment | TextClassifier   | BERT embeddings + L-n layers| n layers + masked mean pool + head + CE     |
| austen    | LlamaForCausalLM | embeddings + L-n layers     | n layers + final norm + lm_head + next-token CE (HF's own loss_function) |
| trivia    | LlamaForCausalLM | the same, on (B*4, T) rows  | n layers + norm + option scores (lm.option_scores) + CE |
| psentiment| LlamaForCausalLM | the same, with the padding mask | n layers + norm + the tied lm_head's label-word rows at the last token + CE |
| fmnist    | GNResNet(18)     | stem + all but n blocks     | n blocks + global pool + head + CE          |

How f1 stops: it runs the model's own forward with a forward pre-hook on layer L-n that records
the arguments that layer receives (hidden states, attention mask, rotary position embeddings,
...) and raises to stop the forward there. That record IS the boundary: whatever the model
passes its layers (which changes between transformers versions) is reused as is, and f2 calls
layers L-n..L-1 with it (every layer of BERT/Llama gets the same extra arguments). The KV cache
is switched off for the causal LM (a cache would grow with each reuse of the boundary).
f2's tail re-implements the few lines after the last layer (pooling + head, norm + lm_head,
option scoring); the equality test keeps it in step with the unsplit model.

Parameters: theta2 (`f2_names`) = parameters held only by f2's modules; theta1 (`f1_names`) =
all others. A parameter held on both sides (the tied embedding / lm_head of SmolLM2) belongs
to theta1 and is listed in `shared`: f2 uses it too, so a perturbation of theta1 must stay in
force while f2 runs on that side's boundary (FedSPZO does that).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from lightfed.config import ConfigError
from lightfed.data.tensors import Data
from lightfed.models.lm import label_scores, option_scores


@dataclass
class Boundary:
    """The input of layer L-n as the model's forward passes it: args[0] is the hidden state."""
    args: tuple
    kwargs: dict[str, Any]


@dataclass
class Split:
    f1: Callable[[Data], Boundary]
    f2_loss: Callable[[Boundary, Data], torch.Tensor]
    f1_names: list[str]      # theta1 (includes `shared`)
    f2_names: list[str]      # theta2
    shared: list[str]        # theta1 parameters that f2 uses too (tied weights)
    layers: int              # L
    n: int                   # layers in f2

    def loss(self, batch: Data) -> torch.Tensor:
        return self.f2_loss(self.f1(batch), batch)


class _Stop(Exception):
    pass


def _capture(layer: nn.Module, run: Callable[[], Any]) -> Boundary:
    box = {}

    def hook(module, args, kwargs):
        box["b"] = Boundary(args, kwargs)
        raise _Stop

    h = layer.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        run()
    except _Stop:
        pass
    finally:
        h.remove()
    if "b" not in box:
        raise RuntimeError(f"split: the forward never reached the boundary layer {type(layer).__name__}")
    return box["b"]


def _run(layers, b: Boundary) -> torch.Tensor:
    h, rest = b.args[0], b.args[1:]
    for layer in layers:
        out = layer(h, *rest, **b.kwargs)
        h = out[0] if isinstance(out, tuple) else out
    return h


def _partition(model: nn.Module, f2_modules: list[nn.Module]):
    in_f2 = {id(m) for top in f2_modules for m in top.modules()}
    sides: dict[int, set[bool]] = {}
    for m in model.modules():
        for p in m._parameters.values():
            if p is not None:
                sides.setdefault(id(p), set()).add(id(m) in in_f2)
    f1, f2, shared = [], [], []
    for name, p in model.named_parameters():
        s = sides[id(p)]
        (f2 if s == {True} else f1).append(name)
        if s == {True, False}:
            shared.append(name)
    return f1, f2, shared


def _check_n(n: int, L: int, what: str):
    if not 1 <= n <= L:
        raise ConfigError(f"split = {n}: f2 takes 1..{L} trailing {what} of this model")


def split(model: nn.Module, task: str, n: int = 1) -> Split:
    """Cut `model` (the model of `task`, see the table above) before its last `n` layers."""
    kind = type(model).__name__
    if kind == "TextClassifier":
        layers = model.encoder.encoder.layer
        L = len(layers)
        _check_n(n, L, "encoder layers")
        cut = layers[L - n]

        def f1(b):
            return _capture(cut, lambda: model(b["input_ids"], b["attention_mask"]))

        def f2_loss(bd, b):
            h = _run(layers[L - n:], bd)
            m = b["attention_mask"].unsqueeze(-1).to(h.dtype)            # as TextClassifier.forward
            pooled = (h * m).sum(1) / m.sum(1).clamp_min(1.0)
            return F.cross_entropy(model.head(pooled), b["labels"])

        tail = [model.head]
    elif hasattr(getattr(model, "model", None), "layers") and hasattr(model.model, "norm") and hasattr(model, "lm_head"):
        # a Llama-style causal LM (Llama, Qwen2, Mistral, SmolLM, ...): model.model.layers, .norm, lm_head
        layers = model.model.layers
        L = len(layers)
        _check_n(n, L, "decoder layers")
        cut = layers[L - n]
        if task in ("austen", "synthetic"):
            def f1(b):
                return _capture(cut, lambda: model.model(input_ids=b["input_ids"], use_cache=False))

            def f2_loss(bd, b):
                h = model.model.norm(_run(layers[L - n:], bd))
                return model.loss_function(logits=model.lm_head(h), labels=b["input_ids"],
                                           vocab_size=model.config.vocab_size)
        elif task == "trivia":
            def f1(b):
                B, K, T = b["input_ids"].shape
                return _capture(cut, lambda: model.model(input_ids=b["input_ids"].view(B * K, T),
                                                         attention_mask=b["attention_mask"].view(B * K, T),
                                                         use_cache=False))

            def f2_loss(bd, b):
                B, K, _ = b["input_ids"].shape
                h = model.model.norm(_run(layers[L - n:], bd))
                return F.cross_entropy(option_scores(model, b["input_ids"], b["attention_mask"], b["target_mask"], h=h),
                                       b["labels"])
        elif task == "psentiment":
            def f1(b):                                      # each example carries its label-word token ids
                return _capture(cut, lambda: model.model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                                                         use_cache=False))

            def f2_loss(bd, b):
                h = model.model.norm(_run(layers[L - n:], bd))
                return F.cross_entropy(label_scores(model, b["input_ids"], b["attention_mask"], b["label_ids"], h=h),
                                       b["labels"])
        else:
            raise ConfigError(f"split: no causal-LM loss for task {task!r} (austen, trivia, psentiment)")
        tail = [model.model.norm, model.lm_head]
    elif kind in ("GNResNet", "GNResNet18"):          # stages: blocks (n trailing blocks in f2)
        layers = model.stages
        L = len(layers)
        _check_n(n, L, "stages")
        cut = layers[L - n]

        def f1(b):
            return _capture(cut, lambda: model(b["x"]))

        def f2_loss(bd, b):
            h = _run(layers[L - n:], bd)
            return F.cross_entropy(model.head(h.mean((2, 3))), b["labels"])

        tail = [model.head]
    else:
        raise ConfigError(f"split: cannot split a {kind}: it needs a layer list (a TextClassifier over a BERT-style "
                          f"encoder.layer, a causal LM with model.layers + model.norm + lm_head, or GNResNet)")
    f1_names, f2_names, shared = _partition(model, list(layers[L - n:]) + tail)
    return Split(f1, f2_loss, f1_names, f2_names, shared, L, n)
