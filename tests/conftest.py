import os

import pytest
import torch
import torch.nn as nn

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Under pytest-xdist (scripts/test.sh runs 2 workers on CI's 2 cores) each worker takes one core's thread.
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)

from lightfed import assets, config, tasks  # noqa: E402

TINY = tasks.TINY     # the tiny twin of each task (real data and tokenizers, random backbones)


def tiny_config(task="sentiment", method="fedavg", tmp_path=None, **kw) -> config.RunConfig:
    d = {"task": task, "method": method, "clients": 4, "rounds": 2, "fraction": 0.5, "batch_size": 8,
         "local_steps": 2, "lr": 1e-3, "progress": False, "task_options": TINY[task]}
    d.update(kw)
    if "lr" not in kw and not __import__("lightfed.methods", fromlist=["METHODS"]).METHODS[method].lr:
        d.pop("lr")                                 # a closed form has no lr (a run that sets one is refused)
    cfg = config.from_dict(d)
    if tmp_path is not None:
        cfg.out = str(tmp_path)
    return cfg


_TASK_CACHE = {}


def tiny_task(name: str, seed: int = 0) -> tasks.Task:
    """Build (once per session) a tiny task; skip cleanly if its asset is not installed."""
    if (name, seed) not in _TASK_CACHE:
        try:
            _TASK_CACHE[(name, seed)] = tasks.build(name, TINY[name], seed)
        except assets.AssetMissing as e:
            pytest.skip(str(e))
    return _TASK_CACHE[(name, seed)]


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models: one thread is faster, and far faster on a shared, busy machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


class Quadratic(nn.Module):
    """L(theta) = 1/2 theta^T A theta + b^T theta, float64, A positive definite: grad = A theta + b."""

    def __init__(self, d=40, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        m = torch.randn(d, d, generator=g, dtype=torch.float64)
        self.register_buffer("A", m @ m.T / d + torch.eye(d, dtype=torch.float64))
        self.register_buffer("b", torch.randn(d, generator=g, dtype=torch.float64))
        self.theta = nn.Parameter(torch.randn(d, generator=g, dtype=torch.float64))

    def forward(self):
        return 0.5 * self.theta @ self.A @ self.theta + self.b @ self.theta

    def f(self, theta):
        return (0.5 * theta @ self.A @ theta + self.b @ theta).item()
