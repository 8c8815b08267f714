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
from lightfed.methods.zoflite import ZOFLITE
from lightfed.methods.zoflite_split import ZOFLITESplit

METHODS: dict[str, type[Method]] = {m.name: m for m in (FedAvg, FedProx, LoRA, VeRA, TopK, PowerSGD, FLITE, MeZO, FedSPZO, FedZO, DeComFL, FedNL, FedALA, FedSSI, LocalOnly, ZOFLITE, ZOFLITESplit, Probe)}


def options(name: str, given: dict):
    if name not in METHODS:
        raise ConfigError(f"unknown method {name!r}; methods: {', '.join(METHODS)}")
    if "lr" in given:
        raise ConfigError(f"method option lr: the lr is the run's setting (--set lr=X, or lr = X in a config file); "
                          f"{name} recommends {METHODS[name].lr:g}, which a run that sets no lr uses")
    return check_options("method", name, METHODS[name].Options, given)


def resolve_lr(cfg: RunConfig) -> RunConfig:
    """lr = 0 / lr_decay = "" (not set) -> the method's recommended ones, in place; explicit ones are kept as given."""
    if cfg.lr == 0:
        cfg.lr = METHODS[cfg.method].lr
    if cfg.lr_decay == "":
        cfg.lr_decay = METHODS[cfg.method].lr_decay
    return cfg


def build(cfg: RunConfig) -> Method:
    cfg = resolve_lr(cfg)
    if cfg.lr_decay != "none" and not METHODS[cfg.method].lr_decays:
        raise ConfigError(f"lr_decay = {cfg.lr_decay!r}: {cfg.method} keeps one lr across rounds (its server replays "
                          f"or estimates with it); lr_decay works with the first-order methods: "
                          f"{', '.join(n for n, m in METHODS.items() if m.lr_decays)}")
    return METHODS[cfg.method](options(cfg.method, cfg.method_options), cfg)
