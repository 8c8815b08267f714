"""FedAvg + LoRA (Hu et al., 2021, via PEFT): the backbone is frozen; each target layer gains
W + (alpha / r) B A with A (r x in), B (out x r) trainable. Clients train A, B (and a task head,
if the model has one: it is new, so it must learn) and the server averages them like FedAvg
(A and B averaged separately, the usual FedAvg+LoRA, which is not the mean of the products).
`mu > 0` adds FedProx's proximal term on the adapters: FedProx (LoRA).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch.nn as nn

from lightfed.config import ConfigError
from lightfed.methods import fedavg, fedprox

# target layers by backbone family: attention projections, or every conv of the ResNet
AUTO_TARGETS = {"BertModel": ["query", "value"], "LlamaForCausalLM": ["q_proj", "v_proj"], "GNResNet": ["conv1", "conv2"],
                "GNResNet18": ["conv1", "conv2"]}


@dataclass
class Options(fedavg.Options):
    r: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: str = "auto"        # comma-separated module names, or auto (see AUTO_TARGETS)
    train_head: bool = True      # the task head (if any) is trained and sent in full
    mu: float = 0.0              # > 0: FedProx's proximal term (mu / 2) ||w - w_global||^2 on the adapters

    def check(self):
        super().check()
        if self.r < 1:
            raise ConfigError(f"r = {self.r}: LoRA rank must be >= 1")
        if self.mu < 0:
            raise ConfigError(f"mu = {self.mu}: must be >= 0")


# any other model: the first of these attention-projection name sets whose Linear layers it has
ATTENTION_NAMES = [["q_proj", "v_proj"], ["query", "value"], ["q_lin", "v_lin"], ["qkv_proj"], ["c_attn"], ["Wqkv"]]


def auto_targets(model: nn.Module) -> list[str]:
    for m in model.modules():
        if type(m).__name__ in AUTO_TARGETS:
            return AUTO_TARGETS[type(m).__name__]
    linear = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    for names in ATTENTION_NAMES:
        if all(x in linear for x in names):
            return names
    raise ConfigError(f"lora: found none of the attention projections {ATTENTION_NAMES} among the Linear layers of "
                      f"{type(model).__name__}; set targets=NAME,NAME")


def resolve_targets(model: nn.Module, spec: str) -> list[str]:
    """`targets` option -> module names: "auto" (AUTO_TARGETS by backbone) or a comma-separated list."""
    return auto_targets(model) if spec == "auto" else [t.strip() for t in spec.split(",")]


def train_only(model: nn.Module, marker: str, train_head: bool) -> None:
    """Freeze everything but the adapter parameters (names containing `marker`) and, optionally, the head."""
    for n, p in model.named_parameters():
        p.requires_grad = marker in n or (train_head and n.startswith("head."))


class LoRA(fedavg.FedAvg):
    name = "lora"
    Options = Options

    def prepare(self, model):
        from peft import LoraConfig, inject_adapter_in_model

        o = self.opts
        model = inject_adapter_in_model(LoraConfig(r=o.r, lora_alpha=o.alpha, lora_dropout=o.dropout,
                                                   target_modules=resolve_targets(model, o.targets)), model)
        train_only(model, "lora_", o.train_head)
        return super().prepare(model)

    def regularizer(self, params, down):
        return fedprox.proximal(params, down, self.opts.mu) if self.opts.mu else None
