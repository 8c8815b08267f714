"""The processes Flower starts: the environment they run in (offline, loopback only, nothing installed at run
time; see docs/flower.md) and the clean-up of Ray's leftovers."""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from pathlib import Path

SAFE_ENV = {                           # see docs/flower.md: offline, loopback only, nothing pulled at run time
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_TELEMETRY_ENABLED": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
}


@contextlib.contextmanager
def flower_environment():
    """The environment every Flower process of ours runs in (see SAFE_ENV); per-run FLWR_HOME and Ray temp."""
    tmp = Path(tempfile.mkdtemp(prefix="lf-flwr-"))
    env = {**SAFE_ENV, "FLWR_HOME": str(tmp / "home"), "RAY_TMPDIR": str(tmp / "ray")}
    (tmp / "ray").mkdir()
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield tmp
    finally:
        _stop_leftovers(str(tmp))
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(tmp, ignore_errors=True)


def _stop_leftovers(marker: str, wait: float = 15.0) -> None:
    """Ray's processes of this run (their command line or their RAY_TMPDIR names our per-run temp folder)
    exit shortly after ray.shutdown(); wait for that, then stop any that did not, by pid."""
    try:
        import psutil
    except ImportError:
        return

    def ours():
        out = []
        for p in psutil.process_iter(["pid", "cmdline", "status"]):
            try:
                if p.pid == os.getpid() or p.info["status"] == psutil.STATUS_ZOMBIE:
                    continue
                if any(marker in a for a in (p.info["cmdline"] or ())) or marker in p.environ().get("RAY_TMPDIR", ""):
                    out.append(p)
            except (psutil.Error, TypeError):
                pass
        return out

    deadline = time.monotonic() + wait
    while (left := ours()) and time.monotonic() < deadline:
        time.sleep(0.25)
    for sig in ("terminate", "kill"):
        for p in left:
            with contextlib.suppress(psutil.Error):
                getattr(p, sig)()
        if left:
            _, left = psutil.wait_procs(left, timeout=5)
