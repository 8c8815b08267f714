"""The Flower engines' options and the lightfed config as it travels: in the run config of `flwr run`, and as a
digest in every message (a client refuses a message made for another config)."""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from lightfed import config as C

RUN_CONFIG_KEY = "lightfed-config"     # run config: the lightfed RunConfig as JSON text (or a path to a TOML/JSON file)
OUT_KEY = "lightfed-out"               # run config: results folder of the ServerApp (absolute path advised)
REC = "lightfed"                       # the ConfigRecord holding lightfed's bytes ("down" / "up"), and nothing else
META = "lightfed-meta"                 # round, client id, config digest (apart: the broadcast record is then the
                                       # same object for every client, which Flower stores and ships once)
RESUME_KEY = "lightfed-resume"         # run config: true = continue the run in lightfed-out from its checkpoint
STATE_REC = "lightfed-client-state"    # Context.state record holding a client's ClientContext.state
NODE_DEVICE = "lightfed-device"        # node config (flower-supernode --node-config "lightfed-device='cuda:0'"): this
                                       # node's device, over the run's (a mixed fleet of CPU and GPU nodes)
SECAGG_REC = "lightfed-secagg"         # Context.state record holding a client's secure-aggregation secrets (this round)


@dataclass
class Options:
    """cfg.engine_options for the Flower engines (the in-process engine ignores them)."""
    client_cpus: float = 1.0      # simulation: Ray CPUs per virtual client (2 cores, 1 each = 2 clients at a time)
    client_gpus: float = 0.0      # simulation: Ray GPUs per virtual client
    sim_cpus: int = 0             # simulation: CPUs Ray may use (0 = all of this machine)
    client_threads: int = 1       # torch threads in a client app; equal results need the same count as the compared run
    server_threads: int = 0       # torch threads of the ServerApp (0: simulation: the caller's; deployment: torch's default)
    round_timeout: float = 0.0    # seconds to wait for a round's replies (0 = until every node answered or went away)
    node_wait: float = 120.0      # seconds the ServerApp waits for all cfg.clients SuperNodes to connect
    envelope: bool = True         # measure Flower's envelope bytes (serializes each Message once more)
    node_worker: bool = False     # deployment: keep torch and the built model alive in one worker process per node
                                  # (engine/flower/node_worker.py) instead of building them for every message
    worker_idle: float = 600.0    # seconds a node worker waits for the next message before it exits
    client_state_dir: str = ""    # a folder on each node where its clients keep their private state, one file per
                                  # (client, round): it outlives the run, so a resumed run continues with it. Empty:
                                  # Flower's Context (lost when the run ends; simulation sets <out>/client_state)

    def check(self):
        if not self.client_cpus > 0 or self.client_gpus < 0 or self.sim_cpus < 0:
            raise C.ConfigError("engine_options: client_cpus must be > 0, client_gpus and sim_cpus >= 0")
        if self.client_gpus > 0:
            import torch
            if not torch.cuda.is_available():
                raise C.ConfigError(f"engine_options: client_gpus = {self.client_gpus:g}, but torch sees no CUDA device")
        if self.client_threads < 1 or self.server_threads < 0:
            raise C.ConfigError("engine_options: client_threads must be >= 1, server_threads >= 0")
        if self.round_timeout < 0 or self.node_wait < 0:
            raise C.ConfigError("engine_options: round_timeout and node_wait must be >= 0")


def options(cfg: C.RunConfig) -> Options:
    if cfg.dropout or cfg.straggle:
        raise C.ConfigError("dropout / straggle simulate faults in the in-process engine; on Flower faults are real "
                            "(a client that fails or misses engine_options.round_timeout is dropped)")
    o = C.check_options("engine", "flower", Options, cfg.engine_options)
    if cfg.secagg and o.node_worker:
        raise C.ConfigError("secagg with engine_options.node_worker: not supported yet (the node worker trains; "
                            "the masking would need the client-app process to load torch)")
    return o


def _client_view(cfg: C.RunConfig) -> dict:
    """What a client's work depends on: everything but where results go, the progress bar and the device (a node may
    compute on its own: the messages are the same bytes)."""
    from lightfed import methods
    d = methods.resolve_lr(dataclasses.replace(cfg)).to_dict()     # lr / lr_decay as they train, set or recommended
    d.pop("out"), d.pop("progress"), d.pop("device")
    return d


def digest(cfg: C.RunConfig) -> str:
    return hashlib.sha256(json.dumps(_client_view(cfg), sort_keys=True).encode()).hexdigest()[:16]


def config_from_run_config(run_config) -> C.RunConfig:
    text = str(run_config.get(RUN_CONFIG_KEY, "") or "").strip()
    if not text:
        raise C.ConfigError(f"run config {RUN_CONFIG_KEY!r} is empty: give the lightfed config as JSON (see "
                            "`python -m lightfed.engine.flower_app run-config --help`)")
    if text.startswith("{"):
        return C.from_dict(json.loads(text))
    p = Path(text)
    return C.load_json(p) if p.suffix == ".json" else C.load_toml(p)


def run_config_toml(cfg: C.RunConfig, out: str = "") -> str:
    """A TOML file for `flwr run . <superlink> --run-config FILE`."""
    import tomllib
    text = f"{RUN_CONFIG_KEY} = {json.dumps(json.dumps(cfg.to_dict(), sort_keys=True))}\n" \
           f"{OUT_KEY} = {json.dumps(str(Path(out).resolve()) if out else '')}\n"
    assert C.from_dict(json.loads(tomllib.loads(text)[RUN_CONFIG_KEY])).to_dict() == cfg.to_dict()
    return text
