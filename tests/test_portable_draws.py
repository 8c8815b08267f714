"""Every random draw that another process must reproduce comes from lightfed.seeds (float64 draws,
rounded): FLITE's factors and frozen head (the server and every client regenerate them), and the
zeroth-order directions (the server replays them). A dispatch mode lists the draws each makes."""
import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import tiny_config, tiny_task
from lightfed import methods, seeds
from lightfed.data.tensors import subset
from lightfed.engine import protocol as P
from lightfed.methods.base import ClientContext

RANDOM = ("normal", "randn", "rand", "uniform", "bernoulli", "random_", "multinomial", "exponential", "cauchy",
          "log_normal", "geometric", "randint", "randperm")


class Draws(TorchDispatchMode):
    """Records (op, dtype) of every random op torch runs inside the block."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.__name__
        if any(r in name for r in RANDOM):
            t = out if torch.is_tensor(out) else args[0]
            self.seen.append((name, t.dtype))
        return out


def float_draws(seen):
    return [(n, d) for n, d in seen if d.is_floating_point]


@pytest.mark.parametrize("name,task,opts", [("flite", "sentiment", {}), ("flite", "sentiment", {"head": "random"}),
                                            ("flite", "fmnist", {}), ("mezo", "sentiment", {}), ("fedspzo", "sentiment", {}),
                                            ("decomfl", "sentiment", {})])
def test_every_reproduced_draw_is_portable(name, task, opts):
    T = tiny_task(task)
    cfg = tiny_config(task, name, method_options=opts)
    m = methods.build(cfg)
    with Draws() as prep:
        model = m.prepare(copy.deepcopy(T.model))
    state = m.init_state(model)
    down = P.broadcast(m, state, 1)
    with Draws() as client:
        P.client_round(m, model, down, subset(T.train, range(8)), ClientContext(0, 1, 3, cfg, T.loss, {}), cfg.max_message_bytes)
    reproduced = prep.seen if name == "flite" else client.seen        # what the other side regenerates
    assert reproduced, "the method must draw something"
    assert all(d == torch.float64 for _, d in float_draws(reproduced)), float_draws(reproduced)


def test_the_flite_head_is_the_same_from_float64_draws_and_orthogonal():
    w = seeds.orthogonal((2, 32), 7)
    assert torch.allclose(w @ w.T, torch.eye(2), atol=1e-6) and w.dtype == torch.float32
    assert torch.equal(w, seeds.orthogonal((2, 32), 7)) and not torch.equal(w, seeds.orthogonal((2, 32), 8))
    tall = seeds.orthogonal((32, 4), 7)
    assert torch.allclose(tall.T @ tall, torch.eye(4), atol=1e-6)
