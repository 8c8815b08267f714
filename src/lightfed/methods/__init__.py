"""Every method, by name. Adding one = one file + one line here; the engine does not change."""
from lightfed.config import ConfigError, RunConfig, check_options
from lightfed.methods.base import Method
from lightfed.methods.decomfl import DeComFL
from lightfed.methods.fedavg import FedAvg
from lightfed.methods.fedala import FedALA
from lightfed.methods.fednl import FedNL
from lightfed.methods.fedssi import FedSSI
from lightfed.methods.local_only import LocalOnly
from lightfed.methods.fedprox import FedProx
from lightfed.methods.fedspzo import FedSPZO
from lightfed.methods.fedzo import FedZO
from lightfed.methods.flite import FLITE
from lightfed.methods.lora import LoRA
from lightfed.methods.mezo import MeZO
from lightfed.methods.powersgd import PowerSGD
from lightfed.methods.probe import Probe
from lightfed.methods.topk import TopK
from lightfed.methods.vera import VeRA
from lightfed.methods.zoflite import ZOFLITE, ZOFLITESplit

METHODS: dict[str, type[Method]] = {m.name: m for m in (FedAvg, FedProx, LoRA, VeRA, TopK, PowerSGD, FLITE, MeZO, FedSPZO, FedZO, DeComFL, FedNL, FedALA, FedSSI, LocalOnly, ZOFLITE, ZOFLITESplit, Probe)}


def options(name: str, given: dict):
    if name not in METHODS:
        raise ConfigError(f"unknown method {name!r}; methods: {', '.join(METHODS)}")
    return check_options("method", name, METHODS[name].Options, given)


def build(cfg: RunConfig) -> Method:
    return METHODS[cfg.method](options(cfg.method, cfg.method_options), cfg)
