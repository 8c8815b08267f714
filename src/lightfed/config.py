"""Run configuration: one flat dataclass, loaded from TOML and/or CLI flags, validated before any work.

A run is reproducible from its resolved config (written to <out>/config.json) and its seed.
Method and task options live in two free-form tables that the method / task validate
against their own option dataclasses (see methods/base.py and tasks.py).
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A config value that cannot work; the message says what to change."""


@dataclass
class RunConfig:
    task: str = "sentiment"
    method: str = "fedavg"
    clients: int = 10
    rounds: int = 5
    fraction: float = 1.0           # share of clients sampled each round
    min_clients: int = 1            # a round fails if fewer client replies are valid
    partition: str = "iid"          # iid | dirichlet:ALPHA | domain
    holdout: str = ""               # client ids never sampled to train (e.g. "6"): unseen clients, scored by the global model
    seed: int = 0
    local_epochs: float = 1.0       # epochs over the client's shard (fractions allowed)
    local_steps: int = 0            # if > 0, overrides local_epochs: this many batches
    batch_size: int = 16
    lr: float = 0.0                 # 0: the method's recommended lr (`lightfed list`); config.json records the one used
    lr_decay: str = ""              # none | cosine: each round's lr x 0.5 (1 + cos(pi (round - 1) / rounds)), first-order
                                    # methods (the local optimizer restarts every round; late rounds then move little);
                                    # "": the method's recommended one (`lightfed list`); config.json records the one used
    optimizer: str = ""             # adamw | sgd: first-order methods' local optimizer; "": the method's (adamw;
                                    # zeroth-order and closed-form methods have none and refuse one, and weight_decay)
    weight_decay: float = 0.0
    eval_every: int = 1
    eval_start: bool = True         # False: no evaluation at round 0 (e.g. a grid whose runs all start from one pretrained
                                    # model, scored once by itself); the summary's `initial` is then None
    max_message_bytes: int = 2**30          # decode refuses anything larger (SmolLM2 in fp32: 538 MB)
    robust: str = "mean"                    # aggregation: mean | median | trim:F (coordinate-wise) | clip:C (update norm)
    max_examples: int = 1_000_000           # the most training examples a client may claim (`_n`, its aggregation
                                            # weight, and with local_epochs the bound on its claimed steps); more is refused
    # simulated faults (in-process engine; on Flower, faults are real: engine_options.round_timeout)
    dropout: float = 0.0            # share of sampled clients that fail after the broadcast, drawn per (seed, round, client)
    straggle: float = 0.0           # client speed spread: each sampled client's time is its work x LogNormal(0, straggle)
    deadline: float = 0.0           # with straggle: a client slower than deadline x the round's median misses the round
    # client-level differential privacy (privacy.py): clip each client's update to dp_clip (L2), add Gaussian noise
    dp_clip: float = 0.0            # C; 0: off
    dp_noise: float = 0.0           # z: noise multiplier of the round's sum (each of m clients adds std z C / sqrt(m))
    dp_delta: float = 1e-5          # the delta that epsilon is reported at
    secagg: bool = False            # secure aggregation (secagg.py): the server sees only masked updates and their sum
    secagg_threshold: int = 0       # t of its t-of-m secret sharing; 0: ceil(2m/3)
    dp_seeded: bool = True          # noise drawn from the run's seed (reproducible); false: from the OS, which no server
                                    # can remove (use it on real devices)
    device: str = "auto"            # auto (CUDA if torch sees one, else CPU) | cpu | cuda | cuda:N: where clients train
                                    # and the engines evaluate; the wire and the server's aggregation stay on the CPU
    dtype: str = "fp32"             # fp32 | bf16: the frozen weights in bfloat16 and forwards under autocast
                                    # (trainable weights, optimizer state and messages stay float32)
    init: str = ""                  # start from a finished run's model (a results folder whose state holds the
                                    # model's own tensors, e.g. a `probe` run: LP-then-FT); its cost is reported
    out: str = ""                   # results folder; default runs/<task>-<method>-<time>
    progress: bool = True
    method_options: dict[str, Any] = field(default_factory=dict)
    task_options: dict[str, Any] = field(default_factory=dict)
    engine_options: dict[str, Any] = field(default_factory=dict)   # checked by the engine that runs (Flower: flower_app.Options)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


FIELDS = {f.name: f for f in dataclasses.fields(RunConfig)}


def parse_partition(spec: str) -> tuple[str, float | None]:
    """'iid' | 'domain' | 'dirichlet:0.1' -> (kind, alpha)."""
    m = re.fullmatch(r"dirichlet:([0-9.eE+-]+)", spec)
    if m:
        try:
            alpha = float(m.group(1))
        except ValueError:
            alpha = -1.0
        if not alpha > 0:
            raise ConfigError(f"partition {spec!r}: the Dirichlet alpha must be a number > 0, e.g. dirichlet:0.1")
        return "dirichlet", alpha
    if spec in ("iid", "domain"):
        return spec, None
    raise ConfigError(f"partition {spec!r}: use one of iid, domain, dirichlet:ALPHA (e.g. dirichlet:0.1)")


def round_lr_scale(cfg: "RunConfig", rnd: int) -> float:
    """The factor on every lr in round `rnd` (1-based): 1 without decay; cosine: 1 in round 1, > 0 in the last."""
    if cfg.lr_decay == "cosine":
        return 0.5 * (1 + math.cos(math.pi * (rnd - 1) / cfg.rounds))
    return 1.0


def parse_robust(spec: str) -> tuple[str, float]:
    """'mean' | 'median' | 'trim:F' (0 < F < 0.5) | 'clip:C' (C > 0) -> (kind, value)."""
    kind, _, val = spec.partition(":")
    try:
        v = float(val) if val else 0.0
    except ValueError:
        v = -1.0
    if (kind in ("mean", "median") and not val) or (kind == "trim" and 0 < v < 0.5) or (kind == "clip" and v > 0):
        return kind, v
    raise ConfigError(f"robust = {spec!r}: use mean, median, trim:F (0 < F < 0.5, e.g. trim:0.2) or clip:C (C > 0)")


def _coerce(name: str, value: Any) -> Any:
    """Type-check one top-level value against RunConfig's annotation."""
    typ = FIELDS[name].type
    if typ == "int" and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{name} = {value!r}: expected an integer")
    if typ == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{name} = {value!r}: expected a number")
        return float(value)
    if typ == "str" and not isinstance(value, str):
        raise ConfigError(f"{name} = {value!r}: expected a string")
    if typ == "bool" and not isinstance(value, bool):
        raise ConfigError(f"{name} = {value!r}: expected true or false")
    if typ.startswith("dict") and not isinstance(value, dict):
        raise ConfigError(f"{name}: expected a table of options")
    return value


def from_dict(d: dict[str, Any], base: RunConfig | None = None) -> RunConfig:
    cfg = dataclasses.replace(base) if base else RunConfig()
    for k, v in d.items():
        if k not in FIELDS:
            raise ConfigError(f"unknown config key {k!r}; valid keys: {', '.join(FIELDS)}")
        v = _coerce(k, v)
        if k in ("method_options", "task_options", "engine_options"):
            v = {**getattr(cfg, k), **v}
        setattr(cfg, k, v)
    return cfg


def load_toml(path: str | Path, base: RunConfig | None = None) -> RunConfig:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} not found")
    try:
        d = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {str(p)!r} is not valid TOML: {e}") from None
    return from_dict(d, base)


def parse_assignment(text: str) -> tuple[str, Any]:
    """'mu=0.01' -> ('mu', 0.01); values are parsed as TOML scalars, else kept as strings."""
    if "=" not in text:
        raise ConfigError(f"option {text!r}: write it as KEY=VALUE, e.g. mu=0.01")
    k, v = text.split("=", 1)
    try:
        val = tomllib.loads(f"x = {v}")["x"]
    except tomllib.TOMLDecodeError:
        val = v
    return k.strip(), val


def holdout_ids(cfg: RunConfig) -> list[int]:
    """The held-out clients: never sampled to train; the evaluation scores them with the global model."""
    try:
        return sorted({int(x) for x in str(cfg.holdout).split(",") if x.strip()})
    except ValueError:
        raise ConfigError(f"holdout = {cfg.holdout!r}: comma-separated client ids, e.g. \"6\" or \"0,3\"") from None


def per_round(cfg: RunConfig) -> int:
    """Clients sampled a round: fraction of the clients that train (all but the held-out), at least min_clients."""
    return max(cfg.min_clients, round(cfg.fraction * (cfg.clients - len(holdout_ids(cfg)))))


def validate(cfg: RunConfig) -> None:
    """Checks that need no task or method knowledge. Task/method options are checked by them."""
    def need(ok: bool, msg: str):
        if not ok:
            raise ConfigError(msg)

    need(cfg.clients >= 1, f"clients = {cfg.clients}: need at least 1 client")
    need(cfg.rounds >= 1, f"rounds = {cfg.rounds}: need at least 1 round")
    need(0 < cfg.fraction <= 1, f"fraction = {cfg.fraction}: must be in (0, 1]")
    held = holdout_ids(cfg)
    need(all(0 <= c < cfg.clients for c in held), f"holdout = {cfg.holdout!r}: client ids must be in [0, {cfg.clients})")
    need(per_round(cfg) <= cfg.clients - len(held),
         f"holdout = {cfg.holdout!r} leaves {cfg.clients - len(held)} clients to train, fewer than the "
         f"{per_round(cfg)} a round samples (min_clients = {cfg.min_clients})")
    need(1 <= cfg.min_clients <= cfg.clients, f"min_clients = {cfg.min_clients}: must be in [1, clients={cfg.clients}]")
    need(max(1, round(cfg.fraction * cfg.clients)) >= cfg.min_clients,
         f"fraction * clients = {cfg.fraction * cfg.clients:g} samples fewer clients than min_clients = {cfg.min_clients}")
    parse_partition(cfg.partition)
    need(cfg.local_epochs > 0 or cfg.local_steps > 0, "set local_epochs > 0 or local_steps > 0")
    need(cfg.local_steps >= 0, f"local_steps = {cfg.local_steps}: must be >= 0")
    need(cfg.batch_size >= 1, f"batch_size = {cfg.batch_size}: must be >= 1")
    need(cfg.lr >= 0, f"lr = {cfg.lr}: must be > 0 (or 0: the method's recommended lr)")
    need(cfg.lr_decay in ("", "none", "cosine"), f"lr_decay = {cfg.lr_decay!r}: use none or cosine")
    need(cfg.optimizer in ("", "adamw", "sgd"), f"optimizer = {cfg.optimizer!r}: use adamw or sgd")
    need(cfg.eval_every >= 1, f"eval_every = {cfg.eval_every}: must be >= 1")
    need(cfg.max_message_bytes > 0, "max_message_bytes must be > 0")
    need(1 <= cfg.max_examples <= 2**32 - 1, "max_examples must be in [1, 2**32 - 1]")
    parse_robust(cfg.robust)
    need(0 <= cfg.dropout < 1, f"dropout = {cfg.dropout}: a share of clients, must be in [0, 1)")
    need(cfg.straggle >= 0, f"straggle = {cfg.straggle}: must be >= 0")
    need(cfg.deadline == 0 or cfg.deadline > 1, f"deadline = {cfg.deadline}: a multiple of the round's median client "
         "time, must be > 1 (or 0: none)")
    need(not (cfg.straggle > 0 and cfg.deadline == 0), f"straggle = {cfg.straggle} needs a deadline (> 1, e.g. 2)")
    need(cfg.dp_clip >= 0 and cfg.dp_noise >= 0, "dp_clip and dp_noise must be >= 0")
    need(not (cfg.dp_noise > 0 and cfg.dp_clip == 0), f"dp_noise = {cfg.dp_noise} needs dp_clip > 0 (noise is scaled to the clip)")
    need(cfg.secagg_threshold >= 0, "secagg_threshold must be >= 0 (0: ceil(2m/3))")
    need(0 < cfg.dp_delta < 1, f"dp_delta = {cfg.dp_delta}: must be in (0, 1)")
    need(0 <= cfg.seed < 2**63, f"seed = {cfg.seed}: must be in [0, 2**63)")


def save(cfg: RunConfig, path: Path) -> None:
    path.write_text(json.dumps(cfg.to_dict(), indent=2, sort_keys=True))


def load_json(path: Path) -> RunConfig:
    return from_dict(json.loads(path.read_text()))


def check_options(kind: str, name: str, options_cls: type, given: dict[str, Any]):
    """Build an options dataclass from a dict, refusing unknown keys and wrong types."""
    fields = {f.name: f for f in dataclasses.fields(options_cls)}
    for k, v in given.items():
        if k not in fields:
            valid = ", ".join(f"{f}={getattr(options_cls(), f)!r}" for f in fields) or "(none)"
            raise ConfigError(f"{kind} {name!r} has no option {k!r}; its options: {valid}")
        default = getattr(options_cls(), k)
        if isinstance(default, bool) != isinstance(v, bool) or (
            isinstance(default, (int, float)) and not isinstance(v, (int, float))
        ) or (isinstance(default, str) and not isinstance(v, str)):
            raise ConfigError(f"{kind} {name!r} option {k} = {v!r}: expected {type(default).__name__}")
        if isinstance(default, int) and not isinstance(default, bool) and isinstance(v, float):
            if not v.is_integer():
                raise ConfigError(f"{kind} {name!r} option {k} = {v!r}: expected an integer")
            given = {**given, k: int(v)}
        if isinstance(default, float) and isinstance(v, int):
            given = {**given, k: float(v)}
    opts = options_cls(**given)
    if hasattr(opts, "check"):
        opts.check()
    return opts
