"""Crash safety, measured: N runs killed with SIGKILL at a random moment, then resumed with --resume; each
must end with the same summary history, final metric and final state (bit for bit) as one clean run.

    .venv/bin/python scripts/kill_trials.py [--trials 10] [--seed 0]      prints "K/N trials resumed identically"

The kill moment is uniform between the clean run's first checkpoint and its end (both measured first), so it
lands in local training, aggregation, evaluation or a checkpoint write in proportion to their time. tests/test_engine.py holds the
one-trial version that CI runs.
"""
from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

ARGS = ["--task", "fmnist", "--method", "fedavg", "--clients", "4", "--rounds", "30", "--seed", "1",
        "--set", "local_steps=2", "--set", "batch_size=8", "--set", "lr=1e-3", "--set", "fraction=0.5",
        "--task-opt", "tiny=true", "--task-opt", "train_size=64", "--task-opt", "test_size=32", "--no-progress"]


def run(out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "lightfed.cli", "run", *extra, *([] if extra else ARGS + ["--out", str(out)])],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def result(out: Path) -> tuple[list, float, dict]:
    s = json.loads((out / "summary.json").read_text())
    meta = json.loads((out / "ckpt" / "latest.json").read_text())
    return s["history"], s["final"], load_file(out / "ckpt" / meta["dir"] / "state.safetensors")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        t, p, first = time.time(), run(tmp / "clean"), None
        while p.poll() is None:                           # when the first checkpoint lands, and when the run ends
            if first is None and (tmp / "clean" / "ckpt" / "latest.json").exists():
                first = time.time() - t
            time.sleep(0.01)
        assert p.returncode == 0 and first is not None, "the clean run failed"
        span = time.time() - t
        ref = result(tmp / "clean")
        ok = 0
        for i in range(a.trials):
            out = tmp / f"trial-{i}"
            at = rng.uniform(first, 0.98 * span)          # between the first checkpoint and the end
            p = run(out)
            time.sleep(at)
            killed = p.poll() is None
            p.send_signal(signal.SIGKILL)
            p.wait()
            started = (out / "ckpt" / "latest.json").exists()
            rc = run(out, "--resume", str(out)).wait() if started else run(out).wait()
            got = result(out) if rc == 0 else None
            same = got is not None and got[0] == ref[0] and got[1] == ref[1] and got[2].keys() == ref[2].keys() \
                and all(torch.equal(got[2][k], ref[2][k]) for k in ref[2])
            ok += same
            print(f"trial {i}: killed at {at:.1f} s of {span:.1f} ({'mid-run' if killed else 'after the end'}), "
                  f"{'resumed' if started else 'restarted (no checkpoint yet)'}: {'identical' if same else 'DIFFERENT'}",
                  flush=True)
        print(f"{ok}/{a.trials} trials resumed identically")
        sys.exit(0 if ok == a.trials else 1)


if __name__ == "__main__":
    main()
