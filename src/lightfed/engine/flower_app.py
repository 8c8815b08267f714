"""The Flower engine: any lightfed method + task as a Flower 1.42 ServerApp / ClientApp (Message API).

The round is the in-process engine's round (engine/protocol.py), with Flower carrying the bytes:

    ServerApp   down = protocol.broadcast(...)   -> "lightfed": ConfigRecord{"down": bytes}
                                                    "lightfed-meta": ConfigRecord{round, cid, config digest}
                                                    one Message per sampled client (local.sample_clients)
    ClientApp   up, stats = protocol.client_round(...) with local's ClientContext (same derive_seed)
                                                 -> "lightfed": ConfigRecord{"up": bytes}, "lightfed-meta",
                                                    "stats": MetricRecord (numbers), "measure": MetricRecord
    ServerApp   state, report = protocol.aggregate(method, state, uploads in client order, ...)

so the final model and the metrics equal the in-process engine's for the same config, seed and
torch thread count (CPU kernels may sum in another order with another number of threads).

Clients: lightfed client k is the SuperNode whose node config says `partition-id = k` (the
Simulation Engine numbers its virtual nodes 0..N-1 that way). The ServerApp asks every node for
its partition-id once (a `query` message), so the map node id -> client id is deterministic.
A client keeps what a method stores between rounds (ClientContext.state) in Flower's
Context.state, on its own node.

Faults: a reply that is an error (the client app raised or crashed), a node that went away, or no
reply within `round_timeout` is recorded in the round's `dropped` list; the round aggregates the
replies it got (protocol.aggregate enforces min_clients).

Bytes: `up` / `down` per client are len() of the lightfed bytes, exactly as in-process; Flower's
envelope (the serialized Message objects Flower ships, minus the lightfed bytes) is reported
apart, per client, under `flower`.

Three ways to run it:
    lightfed run --engine flower-sim ...          run_simulation() below (Ray, all on loopback)
    flwr run . <superlink> --run-config F.toml    deployment: `server_app` / `client_app` below,
                                                  the config in run config `lightfed-config`
    python -m lightfed.engine.flower_app run-config LIGHTFED.toml --out DIR > F.toml
                                                  writes that run-config file
Heavy modules (torch, the tasks) are imported inside the handlers: a `query` stays cheap.
This file wires the apps and runs the Simulation Engine; each piece lives in engine/flower/ (its __init__ maps them).
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from lightfed import config as C
from lightfed.engine.flower.client import client_query, client_train
from lightfed.engine.flower.compare import compare
from lightfed.engine.flower.config import OUT_KEY, RESUME_KEY, config_from_run_config, options, run_config_toml
from lightfed.engine.flower.faults import FAULTS_ENV, parse_faults
from lightfed.engine.flower.processes import flower_environment
from lightfed.engine.flower.server import serve
from lightfed.engine.lock import hold

# --- the apps ----------------------------------------------------------------------------------
def make_apps(cfg: C.RunConfig | None = None, *, faults=None, engine: str = "flower-deployment",
              result: dict | None = None, server_threads: int = 0, log=print, resume: bool = False,
              stop_after: int | None = None) -> tuple[ServerApp, ClientApp]:
    """cfg=None: read the config from the run config (deployment); else use this one (simulation)."""
    server_app, client_app = ServerApp(), ClientApp()
    fixed_faults = tuple(faults) if faults is not None else None

    @server_app.main()
    def _main(grid: Grid, context: Context) -> None:
        c = cfg if cfg is not None else config_from_run_config(context.run_config)
        if cfg is None and str(context.run_config.get(OUT_KEY, "") or ""):
            c.out = str(context.run_config[OUT_KEY])
        again = resume or bool(context.run_config.get(RESUME_KEY, False))
        with hold(c.out):                   # one process at a time in a run folder (held already in simulation)
            summary = serve(grid, c, engine=engine, threads=server_threads, log=log, resume=again, stop_after=stop_after)
        if result is not None:
            result["summary"] = summary
        if "interrupted_after" in summary:
            return
        log(f"lightfed: {engine}: {c.task}/{c.method} final {summary['metric']} = {summary['final']:.4g}; "
            f"results in {summary['out']}")

    @client_app.query()
    def _query(msg: Message, context: Context) -> Message:
        return client_query(msg, context)

    @client_app.train()
    def _train(msg: Message, context: Context) -> Message:
        f = fixed_faults if fixed_faults is not None else parse_faults(os.environ.get(FAULTS_ENV))
        return client_train(msg, context, cfg, f)

    return server_app, client_app


# what `flwr run .` loads (pyproject: [tool.flwr.app.components]; flwr checks these names statically)
_apps = make_apps()
server_app = _apps[0]
client_app = _apps[1]


def run_simulation(cfg: C.RunConfig, *, faults=(), log=print, resume: bool = False, stop_after: int | None = None) -> dict:
    """One run on Flower's Simulation Engine: cfg.clients virtual SuperNodes on Ray, all on loopback.
    Returns the summary (also in <out>/summary.json), like local.run."""
    import logging

    import torch
    from lightfed.engine import local

    local.check(cfg)
    opts = options(cfg)
    cfg.out = cfg.out or f"runs/{cfg.task}-{cfg.method}-{time.strftime('%Y%m%d-%H%M%S')}"
    if resume and not (Path(cfg.out) / "ckpt" / "latest.json").is_file():
        raise C.ConfigError(f"--resume {cfg.out!r}: no ckpt/latest.json there")
    if not opts.client_state_dir:              # the virtual nodes keep their clients' state beside the results
        cfg.engine_options = {**cfg.engine_options, "client_state_dir": str(Path(cfg.out).resolve() / "client_state")}
    result: dict = {}
    server_app, client_app = make_apps(cfg, faults=faults, engine="flower-sim", result=result, log=log,
                                       server_threads=opts.server_threads or torch.get_num_threads(),
                                       resume=resume, stop_after=stop_after)
    with flower_environment():
        from flwr.simulation import run_simulation as flwr_run_simulation
        flwr_run_simulation(
            server_app=server_app, client_app=client_app, num_supernodes=cfg.clients,
            backend_config={"client_resources": {"num_cpus": opts.client_cpus, "num_gpus": opts.client_gpus},
                            "init_args": {"num_cpus": opts.sim_cpus or os.cpu_count() or 1,
                                          "num_gpus": torch.cuda.device_count() if opts.client_gpus > 0 else 0,
                                          "include_dashboard": False, "logging_level": logging.WARNING}})
    if "summary" not in result:
        raise RuntimeError("the Flower simulation ended without a result (see the log above)")
    return result["summary"]


def main(argv=None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m lightfed.engine.flower_app",
                                description="Write the run-config TOML that `flwr run` takes for a lightfed config.")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run-config", help="lightfed config (TOML, as for `lightfed run --config`) -> flwr run config")
    r.add_argument("config", nargs="?", help="a lightfed TOML config (default: RunConfig defaults)")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a run setting, e.g. rounds=2")
    r.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE", help="a method option")
    r.add_argument("--task-opt", action="append", default=[], metavar="KEY=VALUE", help="a task option")
    r.add_argument("--engine-opt", action="append", default=[], metavar="KEY=VALUE", help="a Flower engine option")
    r.add_argument("--out", default="", help="results folder written by the ServerApp")
    cp = sub.add_parser("compare", help="exit 1 unless two results folders hold the same run (state, metrics, bytes)")
    cp.add_argument("a")
    cp.add_argument("b")
    a = p.parse_args(argv)
    if a.cmd == "compare":
        diffs = compare(a.a, a.b)
        for d in diffs:
            print(f"lightfed: {a.a} vs {a.b}: {d}", file=sys.stderr)
        if not diffs:
            print(f"lightfed: {a.a} == {a.b}: same final state, metrics and bytes per client and round", file=sys.stderr)
        return 1 if diffs else 0
    try:
        cfg = C.load_toml(a.config) if a.config else C.RunConfig()
        cfg = C.from_dict(dict(C.parse_assignment(s) for s in a.set), cfg)
        cfg.method_options = {**cfg.method_options, **dict(C.parse_assignment(s) for s in a.opt)}
        cfg.task_options = {**cfg.task_options, **dict(C.parse_assignment(s) for s in a.task_opt)}
        cfg.engine_options = {**cfg.engine_options, **dict(C.parse_assignment(s) for s in a.engine_opt)}
        cfg.progress = False
        C.validate(cfg)
        options(cfg)
    except C.ConfigError as e:
        print(f"lightfed: error: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(run_config_toml(cfg, a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
