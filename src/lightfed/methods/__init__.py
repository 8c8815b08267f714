"""Every method, by name. Adding one = one file + one line here; the engine does not change."""
from lightfed.config import ConfigError, RunConfig, check_options
from lightfed.methods.base import Method
from lightfed.methods.fedavg import FedAvg
from lightfed.methods.fedprox import FedProx
from lightfed.methods.lora import LoRA

METHODS: dict[str, type[Method]] = {m.name: m for m in (FedAvg, FedProx, LoRA)}


def options(name: str, given: dict):
    if name not in METHODS:
        raise ConfigError(f"unknown method {name!r}; methods: {', '.join(METHODS)}")
    return check_options("method", name, METHODS[name].Options, given)


def build(cfg: RunConfig) -> Method:
    return METHODS[cfg.method](options(cfg.method, cfg.method_options), cfg)
