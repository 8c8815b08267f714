"""Secure aggregation: what the server sees, the exact sum with and without dropped clients, the
threshold, and runs through the engine that equal plain FedAvg / FLITE up to the fixed point."""
import json

import numpy as np
import pytest
import torch

from conftest import tiny_config
from lightfed import config as C
from lightfed import secagg
from lightfed.engine import flower_app, local
from lightfed.wire import decode


def _protocol(xs: dict[int, np.ndarray], drop_after_shares=(), threshold=0):
    U = sorted(xs)
    server = secagg.Server(U, threshold)
    clients = {i: secagg.Client(i) for i in U}
    roster = server.roster({i: c.keys() for i, c in clients.items()})
    inbox = server.route({i: c.shares(roster) for i, c in clients.items()})
    for i, c in clients.items():
        c.receive(inbox[i])
    masked = {i: clients[i].masked(xs[i]) for i in U if i not in drop_after_shares}
    dim = len(next(iter(xs.values())))
    total = server.unmask(masked, dim, lambda i, req: clients[i].unmask(req))
    return total, masked, server


def test_the_server_sees_masked_vectors_and_recovers_the_exact_sum():
    rng = np.random.default_rng(0)
    xs = {i: rng.integers(0, 2**40, 256, dtype=np.uint64) for i in range(5)}
    total, masked, _ = _protocol(xs)
    assert np.array_equal(total, sum(xs.values()))                       # exact, mod 2^64
    for i, m in masked.items():                                          # each masked vector looks uniform
        y = decode(m, {"y": secagg.Spec("tensor", (256,), "i64")}, kind="secagg/masked", max_bytes=2**20)["y"].numpy().view(np.uint64)
        assert not np.any(y == xs[i]) and y.max() > 2**62               # x_i < 2^40; masks fill 64 bits


def test_dropped_clients_are_recovered_and_too_many_fail():
    xs = {i: np.full(16, i + 1, dtype=np.uint64) for i in range(6)}
    total, _, server = _protocol(xs, drop_after_shares=(1, 4))
    assert server.t == 4 and np.array_equal(total, sum(xs[i] for i in (0, 2, 3, 5)))
    total, _, _ = _protocol(xs, drop_after_shares=(0, 1, 2))              # 3 survivors < t = 4
    assert total is None


def test_shamir_rebuilds_from_any_t_shares_only():
    s = bytes(range(32))
    sh = secagg.split(s, 3, 5)
    assert secagg.combine({1: sh[0], 3: sh[2], 5: sh[4]}) == s
    assert secagg.combine({1: sh[0], 2: sh[1]}) != s


def test_a_client_refuses_an_unmask_request_naming_an_outsider():
    xs = {i: np.zeros(4, dtype=np.uint64) for i in range(3)}
    U = [0, 1, 2]
    server, clients = secagg.Server(U), {i: secagg.Client(i) for i in U}
    roster = server.roster({i: c.keys() for i, c in clients.items()})
    inbox = server.route({i: c.shares(roster) for i, c in clients.items()})
    for i, c in clients.items():
        c.receive(inbox[i])
        c.masked(xs[i])
    from lightfed.wire import encode
    req = encode({"dropped": np.array([7], dtype="<u4").tobytes()}, {"dropped": secagg.Spec("bytes", max_len=12)}, kind="secagg/unmask")
    with pytest.raises(ValueError, match="outside the round"):
        clients[0].unmask(req)


@pytest.mark.parametrize("method", ["fedavg", "flite"])
def test_a_secagg_run_equals_the_plain_run_and_counts_the_protocol_bytes(tmp_path, method):
    kw = dict(rounds=2, clients=4, fraction=1.0)
    plain = local.run(tiny_config("sentiment", method, tmp_path / "p", **kw), log=lambda *a: None)
    sec = local.run(tiny_config("sentiment", method, tmp_path / "s", secagg=True, **kw), log=lambda *a: None)
    sp, ss = local.load_checkpoint(tmp_path / "p")[1], local.load_checkpoint(tmp_path / "s")[1]
    err = max((sp[k].float() - ss[k].float()).abs().max().item() for k in sp)
    assert err < 1e-5, err                                           # the fixed point's 2^-24
    recs = [json.loads(l) for l in (tmp_path / "s" / "metrics.jsonl").read_text().splitlines()][1:]
    for r in recs:
        assert r["accepted"] == 4 and r["secagg"]["survivors"] == [0, 1, 2, 3]
        for c in r["clients"]:
            assert c["secagg"]["up"] > 64 and c["secagg"]["down"] > 0
    assert sec["bytes"]["up_total"] > plain["bytes"]["up_total"]
    assert abs(sec["final"] - plain["final"]) < 1e-3


def test_secagg_with_dropouts_aggregates_the_survivors(tmp_path):
    s = local.run(tiny_config("sentiment", "fedavg", tmp_path, rounds=3, clients=8, fraction=1.0, dropout=0.25,
                              secagg=True), log=lambda *a: None)
    recs = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()][1:]
    assert any(r.get("dropped") for r in recs)
    for r in recs:
        gone = {d["id"] for d in r.get("dropped", [])}
        if len(gone) <= 8 - 6:                                      # t = ceil(16 / 3) = 6
            assert r["accepted"] == 8 - len(gone) and set(r["secagg"]["survivors"]).isdisjoint(gone)
        assert all(d["up"] > 0 for d in r.get("dropped", []))        # their keys and shares were sent
    assert s["bytes"]["rejected_messages"] == 0


@pytest.mark.parametrize("kw, words", [({"method": "mezo"}, "needs each client's upload"),
                                       ({"robust": "median"}, "robust aggregation needs each update")])
def test_secagg_refuses_what_it_cannot_cover(kw, words):
    with pytest.raises(C.ConfigError, match=words):
        local.check(tiny_config("sentiment", **{"method": "fedavg", **kw}, secagg=True))
    with pytest.raises(C.ConfigError, match="node_worker"):
        flower_app.options(tiny_config("sentiment", "fedavg", secagg=True, engine_options={"node_worker": True}))


def test_the_masked_input_hides_the_update():
    x = secagg.to_fixed({"w": torch.ones(8)}, ["w"], 3)
    assert x[-1] == 3 and np.all(x[:-1].view(np.int64) == 3 * 2**secagg.FRAC)
    mean, n = secagg.from_fixed(x + x, ["w"], {"w": (8,)})
    assert n == 6 and torch.equal(mean["w"], torch.ones(8))


def test_a_key_or_share_of_the_wrong_length_is_refused_naming_it():
    """Found by benchmarks/robustness.py's fuzzing: a 31-byte key went through the wire's max_len and
    crashed X25519; now the receiver refuses it."""
    from lightfed.wire import Spec, WireError, encode
    short = encode({"c": b"k" * 31, "s": b"k" * 32}, {"c": Spec("bytes", max_len=32), "s": Spec("bytes", max_len=32)},
                   kind="secagg/keys")
    good = {i: secagg.Client(i).keys() for i in (1, 2)}
    with pytest.raises(WireError, match="'c'.*32"):
        secagg.Server([0, 1, 2]).roster({0: short, **good})


def test_a_bad_inbox_leaves_the_shares_a_client_held():
    """Found by fuzzing: a malformed inbox emptied the client's held shares before failing."""
    U = [0, 1, 2]
    server, clients = secagg.Server(U), {i: secagg.Client(i) for i in U}
    roster = server.roster({i: c.keys() for i, c in clients.items()})
    inbox = server.route({i: c.shares(roster) for i, c in clients.items()})
    clients[1].receive(inbox[1])
    held = dict(clients[1].held)
    with pytest.raises(Exception):
        clients[1].receive(inbox[1][:-5] + b"\x00" * 5)
    assert clients[1].held == held


def test_a_client_that_keeps_only_bytes_between_phases_takes_part_like_an_object():
    """The Flower client's path (secagg.step: secrets dumped and restored between messages) against the
    in-process one, in one round, with one client dropped after the setup."""
    U, held, xs = [0, 1, 2, 3], {}, {i: np.full(8, 10 * (i + 1), dtype=np.uint64) for i in range(4)}
    sent = []

    def call(phase, reqs):                 # clients 0, 1 keep only bytes; 2, 3 are objects
        out = {}
        for i, req in reqs.items():
            if i < 2:
                out[i], held[i] = secagg.step(i, phase, req, held.get(i))
            else:
                out[i] = r._local(phase, {i: req})[i]
        sent.extend(out.values())
        return out

    r = secagg.Round.__new__(secagg.Round)
    r.clients = {i: secagg.Client(i) for i in (2, 3)}
    r.__init__(U, 0, call=call)
    assert r.members == U and not r.failed
    for i in (0, 1):                       # what the Flower client does after training
        r.masked[i] = secagg.Client.restore(i, held[i]).masked(xs[i])
    r.masked[2] = r.clients[2].masked(xs[2])                                   # client 3 drops
    req = r.server.unmask_request(r.masked, 8)
    total = r.server.unmask_finish(call("unmask", {i: req for i in r.server.alive}))
    assert np.array_equal(total, xs[0] + xs[1] + xs[2])
    mine = decode(held[0], secagg.SECRETS, kind="secagg/secrets", max_bytes=2**20)
    assert not any(mine[k] in m for k in ("c", "s", "b") for m in sent)           # its secret keys never went out


def test_a_client_that_drops_during_the_setup_is_left_out_and_the_setup_starts_again():
    calls = []

    def call(phase, reqs):
        calls.append((phase, sorted(reqs)))
        out = r._local(phase, reqs)
        return {i: b for i, b in out.items() if not (phase == "shares" and i == 1)}   # client 1 vanishes

    r = secagg.Round.__new__(secagg.Round)
    r.clients = {i: secagg.Client(i) for i in range(5)}
    r.__init__(list(range(5)), 0, call=call)
    assert r.members == [0, 2, 3, 4] and r.server.t == 3
    assert [c[0] for c in calls] == ["keys", "shares", "keys", "shares", "inbox"]
    assert r.overhead(1)["up"] > 0 and r.overhead(1)["down"] > 0        # its first attempt's bytes count
    assert r.overhead(0)["down"] > r.server.bytes[0]["down"]            # two rosters, one inbox
