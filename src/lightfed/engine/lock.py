"""One process at a time in a run folder.

Two processes in one folder would each checkpoint and append their rounds: a benchmark killed while its pool
worker went on with a run, then restarted, resumed that run beside the worker, and the run's last round was
recorded twice. `hold(out)` takes an advisory lock on <out>/run.lock (fcntl.flock) for as long as the block runs;
the kernel drops it when its holder exits or is killed, so no crash leaves a stale lock. The entry points that
write a run folder take it (`lightfed run`, the Flower ServerApp, the benchmarks' store runs) before touching it.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

from lightfed.config import ConfigError

try:
    import fcntl
except ImportError:                 # Windows: no flock; the folder is not guarded there
    fcntl = None

_HELD: dict[str, object] = {}       # folders this process holds (`lightfed run` around the Simulation Engine's ServerApp,
                                    # which runs in a thread of the same process)


@contextmanager
def hold(out: str | Path | None):
    """Own the run folder `out` while the block runs, else raise ConfigError naming the process that owns it.
    out empty (the engine names a new folder): nothing to hold."""
    if not out or fcntl is None:
        yield
        return
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    key = str(out.resolve())
    if key in _HELD:                # held by this process already
        yield
        return
    f = open(out / "run.lock", "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        who = f.read().strip() or "another process"
        f.close()
        raise ConfigError(f"{out}: {who} is running in this folder; wait for it to end (or stop it), then --resume "
                          "it") from None
    f.seek(0)
    f.truncate()
    f.write(f"process {os.getpid()}")
    f.flush()
    _HELD[key] = f
    try:
        yield
    finally:
        del _HELD[key]
        f.close()
