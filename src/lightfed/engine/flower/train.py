"""A client round where the model lives: in the ClientApp's process, or in the node's long-lived worker
(flower/node_worker.py). No Flower import: both sides import this module, and neither imports the other."""
from __future__ import annotations

import time
from typing import Any

from lightfed import config as C
from lightfed.engine.flower.config import Options, digest, options

_SETUP: dict[str, Any] = {}           # one built task + method + model per client-app process


def setup(cfg: C.RunConfig, opts: Options):
    import torch
    torch.set_num_threads(opts.client_threads)      # every call: OpenMP thread counts are per calling thread
    key = digest(cfg)
    if key not in _SETUP:
        from lightfed.engine import local
        _SETUP.clear()
        _SETUP[key] = local.build(cfg)
    return _SETUP[key]



def _process_age() -> float | None:
    """Seconds since this process started (a deployment starts one client-app process per message)."""
    try:
        import psutil
        return time.time() - psutil.Process().create_time()
    except Exception:  # noqa: BLE001 - a measurement only
        return None



def train_core(cfg: C.RunConfig, rnd: int, cid: int, down: bytes, state: dict) -> tuple[bytes, dict, dict, dict]:
    """One client round where the model lives (this process, or the node worker). -> (up, state, stats, measure)"""
    from lightfed.data.tensors import subset
    from lightfed.engine import local
    from lightfed.engine import protocol as P
    from lightfed.measure import PeakRSS
    from lightfed.methods.base import ClientContext

    t_build = time.perf_counter()
    S = setup(cfg, options(cfg))
    build_s = time.perf_counter() - t_build             # 0 when this process built it before (actors, node workers)
    ctx = ClientContext(cid, rnd, local.derive_seed(cfg.seed, rnd, cid), cfg, S.task.loss, state)   # as local.run's
    data = subset(S.task.train_at(rnd, cfg.rounds), S.shards[cid])
    t = time.perf_counter()
    from lightfed import device
    with PeakRSS(device.resolve(cfg.device)) as mem:
        up, stats = P.client_round(S.method, S.model, down, data, ctx, cfg.max_message_bytes)
    measure = {"seconds": time.perf_counter() - t, "build_seconds": build_s,
               **{k: v for k, v in (("rss_peak", mem.peak), ("rss_rise", mem.rise), ("device_peak", mem.device_peak),
                                    ("process_age", _process_age()))
                  if v is not None}}
    return up, ctx.state, stats, measure
