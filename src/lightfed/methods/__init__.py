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
    """lr = 0 / lr_decay = "" / optimizer = "" (not set) -> the method's recommended ones, in place; explicit ones are
    kept as given (check_run refuses those a method cannot honour)."""
    M = METHODS[cfg.method]
    if cfg.lr == 0:
        cfg.lr = M.lr
    if cfg.lr_decay == "":
        cfg.lr_decay = M.lr_decay
    if cfg.optimizer == "":
        cfg.optimizer = M.optimizer
    return cfg


def check_run(cfg: RunConfig) -> None:
    """The run settings a method cannot honour, refused before any work (an explicit setting is never ignored)."""
    M, name = METHODS[cfg.method], cfg.method
    if cfg.lr > 0 and not M.lr:
        raise ConfigError(f"lr = {cfg.lr:g}: {name} has no lr (a closed form, no step); leave lr unset")
    decay = cfg.lr_decay or M.lr_decay
    if decay != "none" and not M.lr_decays:
        raise ConfigError(f"lr_decay = {decay!r}: {name} keeps one lr across rounds (its server replays "
                          f"or estimates with it); lr_decay works with the first-order methods: "
                          f"{', '.join(n for n, m in METHODS.items() if m.lr_decays)}")
    if not M.optimizer and (cfg.optimizer or cfg.weight_decay):
        what = f"optimizer = {cfg.optimizer!r}" if cfg.optimizer else f"weight_decay = {cfg.weight_decay:g}"
        raise ConfigError(f"{what}: {name} has no first-order optimizer ({M.optimizer_why}); leave optimizer and "
                          f"weight_decay unset, or use a first-order method")
    if M.zeroth_order and cfg.dtype != "fp32":
        raise ConfigError(f"dtype = {cfg.dtype!r}: {name} estimates gradients from differences of two losses at "
                          f"theta +- eps z, which bfloat16 forwards round away (on a tiny twin the bf16 estimates "
                          f"correlate 0.7 with the fp32 ones); use dtype = fp32")


def build(cfg: RunConfig) -> Method:
    check_run(cfg)
    cfg = resolve_lr(cfg)
    return METHODS[cfg.method](options(cfg.method, cfg.method_options), cfg)
