"""One contract, every method, on tiny twins of the real tasks (PEFT-style table-driven test)."""
import copy

import pytest
import torch

from conftest import tiny_config, tiny_task
from lightfed import methods
from lightfed.data.tensors import subset
from lightfed.engine import protocol as P
from lightfed.methods.base import ClientContext
from lightfed.wire import encoded_size

ONLY = {"fednl": ("austen", "trivia"),          # FedNL's memory branches need a causal LM
        "probe": ("sentiment", "fmnist")}        # a probe fits a classifier's head
CASES = [(m, t) for m in methods.METHODS for t in ONLY.get(m, ("sentiment", "fmnist", "austen"))
         if (m, t) != ("vera", "fmnist")] + [("fedavg", "trivia")]   # PEFT's VeRA adapts Linear layers only


@pytest.mark.parametrize("name,task", CASES)
def test_method_contract(name, task):
    T = tiny_task(task)
    cfg = tiny_config(task, name)
    m = methods.build(cfg)
    model = m.prepare(copy.deepcopy(T.model))

    # 1. parameterization: a non-empty trainable set, and state <-> model round-trips
    trainable = m.trainable(model)
    assert trainable, "a method must train something"
    state = m.init_state(model)
    assert {k: tuple(v.shape) for k, v in state.items() if k in m.shapes} == m.shapes
    assert all(k.startswith("_") for k in state if k not in m.shapes), "server bookkeeping keys start with _"
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if n not in trainable}

    # 3. codec: the broadcast has the exact size its schema promises
    down = P.broadcast(m, state, 1)
    size = encoded_size(m.down_schema(), kind=f"{m.name}/down")
    assert size is None or len(down) == size

    # 2. local optimizer: deterministic from the context seed, reports what it did
    data = subset(T.train, range(16))

    def client(seed, rows):
        ctx = ClientContext(0, 1, seed, cfg, T.loss, {})
        return P.client_round(m, model, down, subset(T.train, rows), ctx, cfg.max_message_bytes)

    up1, stats = client(123, range(16))
    up1_again, _ = client(123, range(16))
    assert up1 == up1_again, "same seed, same data, same broadcast -> same bytes"
    assert stats["samples"] == 16 and stats["steps"] == (0 if name == "probe" else 2) and stats["flops"] > 0
    up2, _ = client(7, range(16, 32))
    for n, p in model.named_parameters():
        if n in frozen:
            assert torch.equal(p, frozen[n]), f"frozen parameter {n} changed"

    # 4. aggregator: valid replies combine into a finite state of the same shape; a garbage reply
    #    is refused with a reason and does not change what the others produce
    new, report = P.aggregate(m, state, [(0, up1), (1, up2), (2, b"\x00garbage")], 1, max_bytes=cfg.max_message_bytes)
    assert report["accepted"] == 2 and [r["id"] for r in report["rejected"]] == [2]
    assert "wire" in report["rejected"][0]["error"]
    clean, _ = P.aggregate(m, state, [(0, up1), (1, up2)], 1, max_bytes=cfg.max_message_bytes)
    assert set(new) >= set(state) and all(k.startswith("_") for k in set(new) - set(state))   # + bookkeeping
    assert set(new) == set(clean) and all(torch.equal(new[k], clean[k]) for k in new)
    for k in m.shapes:
        assert new[k].shape == state[k].shape and torch.isfinite(new[k]).all()
    if m.federated:
        assert any(not torch.equal(new[k], state[k]) for k in m.shapes), "a round of training moved nothing"
    else:
        assert all(torch.equal(new[k], state[k]) for k in m.shapes), "a local-only server state must not move"
    m.load(model, new)
    assert all(torch.equal(v, new[k]) for k, v in m.init_state(model).items() if k in m.shapes)
