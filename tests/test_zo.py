"""Zeroth-order core (optim/zeroth_order.py), model split (models/split.py), MeZO and FedSPZO."""
import copy
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file

from conftest import Quadratic, tiny_config, tiny_task
from lightfed import methods, tasks
from lightfed.data.tensors import subset
from lightfed import measure
from lightfed.engine import protocol as P
from lightfed.methods.base import ClientContext
from lightfed.models import backbones, lm
from lightfed.models.split import split
from lightfed.optim import zeroth_order as zo
from lightfed.wire import decode, encode


pytestmark = pytest.mark.usefixtures("one_thread")


def test_two_point_on_a_quadratic_is_z_dot_grad():
    q = Quadratic()
    params = {"theta": q.theta}
    grad = (q.A @ q.theta + q.b).detach()                  # exact gradient
    for seed in (1, 2, 3):
        g, lp, lm = zo.two_point(lambda: q(), q, params, seed, eps=1e-3)
        z = zo.direction(seed, 0, q.theta.shape).double()
        assert g == pytest.approx((z @ grad).item(), rel=1e-9, abs=1e-9)
    before = q.theta.detach().clone()
    zo.apply_update(params, 7, 0.25)
    assert torch.equal(q.theta.detach(), before - zo.direction(7, 0, before.shape).double() * zo.f32(0.25))
    assert q.theta.grad is None


def test_directions_are_seeded_and_leave_the_global_rng_alone():
    state = torch.get_rng_state()
    a, b = zo.direction(5, 0, (3, 1000)), zo.direction(5, 0, (3, 1000))
    assert a.dtype == torch.float32 and torch.equal(a, b)
    assert not torch.equal(a, zo.direction(5, 1, (3, 1000))) and not torch.equal(a, zo.direction(6, 0, (3, 1000)))
    assert torch.equal(torch.get_rng_state(), state)
    assert abs(a.mean().item()) < 0.05 and abs(a.std().item() - 1) < 0.05
    assert torch.equal(zo.direction(5, 0, (3, 1000), draw="fast"), zo.direction(5, 0, (3, 1000), draw="fast"))


def _explicit_loss(model, params, seed, scale, loss):
    """Reference: a deep copy whose weights are overwritten with theta + scale z."""
    m2 = copy.deepcopy(model)
    named = dict(m2.named_parameters())
    with torch.no_grad():
        for i, (n, p) in enumerate(params.items()):
            named[n].copy_(zo.direction(seed, i, p.shape) * scale + p)
        return loss(m2).item()


@pytest.mark.parametrize("kind", ["bert", "llama-tied"])
def test_perturbed_forward_is_exact_and_leaves_weights_bit_identical(kind):
    if kind == "bert":
        model = backbones.TextClassifier(backbones.minilm(True, 0), 2).eval()
        batch = {"input_ids": torch.randint(0, 1000, (4, 12)), "attention_mask": torch.ones(4, 12, dtype=torch.long),
                 "labels": torch.tensor([0, 1, 0, 1])}
        loss = lambda m: F.cross_entropy(m(batch["input_ids"], batch["attention_mask"]), batch["labels"])
    else:   # tied embedding / lm_head: perturbed once, the same in both uses
        model = backbones.smollm2(True, 0).eval()
        assert model.lm_head.weight is model.model.embed_tokens.weight
        ids = torch.randint(0, 1000, (2, 12))
        loss = lambda m: m(input_ids=ids, labels=ids).loss
    params = dict(model.named_parameters())
    before = {n: p.detach().clone() for n, p in params.items()}
    for scale in (1e-3, -1e-3):
        with zo.perturbed(model, params, 11, scale):
            got = loss(model).item()
        assert got == pytest.approx(_explicit_loss(model, params, 11, scale, loss), rel=1e-6, abs=1e-6)
    with torch.no_grad():
        assert abs(loss(model).item() - got) > 1e-7          # the perturbation did change the loss
    assert all(torch.equal(p, before[n]) for n, p in params.items())
    assert all(p.grad is None for p in params.values())


@pytest.mark.parametrize("task", ["sentiment", "austen", "trivia", "fmnist"])
def test_split_forward_equals_unsplit(task):
    if task in ("sentiment", "fmnist"):
        T = tiny_task(task)
        model, loss, batch = T.model, T.loss, subset(T.train, range(6))
    elif task == "austen":   # the tiny LM and the exact body of tasks.austen's loss (no need to tokenise novels)
        model, batch = backbones.smollm2(True, 0), {"input_ids": torch.randint(0, 49152, (3, 16))}
        loss = lambda m, b: m(input_ids=b["input_ids"], labels=b["input_ids"]).loss
    else:                    # trivia: lm.option_scores + cross-entropy, as tasks.trivia's loss
        model = backbones.smollm2(True, 0)
        attn = torch.ones(2, 4, 10, dtype=torch.long)
        attn[:, :, 8:] = 0
        tmask = torch.zeros(2, 4, 10, dtype=torch.bool)
        tmask[:, :, 5:8] = True
        batch = {"input_ids": torch.randint(0, 49152, (2, 4, 10)), "attention_mask": attn, "target_mask": tmask,
                 "labels": torch.tensor([1, 3])}
        loss = lambda m, b: F.cross_entropy(lm.option_scores(m, b["input_ids"], b["attention_mask"],
                                                                b["target_mask"]), b["labels"])
    model.eval()
    with torch.no_grad():
        ref = loss(model, batch)
        for n in (1, 2):
            sp = split(model, task, n)
            bd = sp.f1(batch)
            assert torch.allclose(sp.f2_loss(bd, batch), ref, rtol=1e-6, atol=1e-6)
            assert sorted(sp.f1_names + sp.f2_names) == sorted(n for n, _ in model.named_parameters())
            assert sp.shared == (["model.embed_tokens.weight"] if task in ("austen", "trivia") else [])


# --- FedSPZO / MeZO end to end on tiny sentiment ---------------------------------------------------
def _round(name, lr=1e-3, **opts):
    T = tiny_task("sentiment")
    cfg = tiny_config("sentiment", name, lr=lr, method_options=opts)
    m = methods.build(cfg)
    model = m.prepare(copy.deepcopy(T.model))
    state = m.init_state(model)
    down = P.broadcast(m, state, 1)
    ups = []
    for cid, rows in ((0, range(16)), (1, range(16, 32))):
        ctx = ClientContext(cid, 1, 100 + cid, cfg, T.loss, {})
        up, stats = P.client_round(m, model, down, subset(T.train, rows), ctx, cfg.max_message_bytes)
        ups.append((up, stats, {n: p.detach().clone() for n, p in m.trainable(model).items()}))
    return T, cfg, m, model, state, ups


@pytest.fixture(scope="module")
def spzo():
    return _round("fedspzo", P1=1, Ps=2, lr=1e-2)


def test_fedspzo_step_stats_and_no_grad(spzo):
    T, cfg, m, model, state, ups = spzo
    up, stats, _ = ups[0]
    assert all(p.grad is None for p in model.parameters())
    assert stats["forwards_per_step"] == {"f1": 2, "f2": 8}
    assert stats["flops"] == stats["flops_f1"] + stats["flops_f2"] > 0
    # exact accounting: per-sample FLOPs of one forward of each block x forwards x samples
    sp, b = split(model, "sentiment", 1), subset(T.train, range(8))
    y, f1 = measure.count_flops(lambda: sp.f1(b))
    _, f2 = measure.count_flops(lambda: sp.f2_loss(y, b))
    assert stats["flops_f1"] == f1 / 8 * 2 * stats["samples"] and stats["flops_f2"] == f2 / 8 * 8 * stats["samples"]
    mem = stats["memory_accounted"]
    assert set(mem) == {"params", "activations", "boundary", "z"} and all(v > 0 for v in mem.values())
    # the uplink is scalars: K x (P1 + P2) fp32 + digest + _n
    f = decode(up, P.up_schema(m), kind="fedspzo/up", max_bytes=10**6)
    assert f["g1"].shape == (2, 1) and f["g2"].shape == (2, 4) and len(f["digest"]) == 8 and len(up) < 200


def test_replay_rebuilds_the_client_model_bit_for_bit(spzo, tmp_path):
    T, cfg, m, model, state, ups = spzo
    up, _, client_weights = ups[0]
    f = decode(up, P.up_schema(m), kind="fedspzo/up", max_bytes=10**6)
    rebuilt = m.replay(state, 1, f)
    assert all(torch.equal(rebuilt[n], client_weights[n]) for n in client_weights)
    assert zo.digest(rebuilt) == f["digest"]
    # in another process, with torch's default (non-AVX) CPU kernels: only safetensors + JSON cross
    save_file({n: v.contiguous() for n, v in state.items()}, str(tmp_path / "state.safetensors"))
    (tmp_path / "replay.json").write_text(json.dumps({"blocks": m.blocks(), "updates": m.updates_of(1, f)}))
    code = ("import json,sys; from safetensors.torch import load_file; from lightfed.optim import zeroth_order as zo;"
            "d=json.load(open(sys.argv[1]+'/replay.json')); s=load_file(sys.argv[1]+'/state.safetensors');"
            "print(zo.digest(zo.replay(s, d['blocks'], [tuple(u) for u in d['updates']])).hex())")
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f["digest"].hex()


def test_forged_scalar_is_refused_by_the_digest(spzo):
    T, cfg, m, model, state, ups = spzo
    good, bad = ups[0][0], ups[1][0]
    schema = P.up_schema(m)
    f = decode(bad, schema, kind="fedspzo/up", max_bytes=10**6)
    f["g2"] = f["g2"].clone()
    f["g2"][1, 2] += 0.5
    forged = encode(f, schema, kind="fedspzo/up")                      # a valid message, CRC and all
    new, report = P.aggregate(m, state, [(0, good), (1, forged)], 1, max_bytes=cfg.max_message_bytes)
    assert report["accepted"] == 1 and [r["id"] for r in report["rejected"]] == [1]
    assert "replay digest mismatch" in report["rejected"][0]["error"]
    alone, _ = P.aggregate(m, state, [(0, good)], 1, max_bytes=cfg.max_message_bytes)
    assert all(torch.equal(new[k], alone[k]) for k in state)


def test_a_forged_step_count_or_example_count_is_refused_before_any_replay(spzo, monkeypatch):
    """A well-formed upload claiming more steps than the round's config allows (with local_steps the schema fixes
    K; with local_epochs: epochs x its examples / batch_size), or more examples than max_examples, is refused
    without replaying anything."""
    T, cfg, m, model, state, ups = spzo
    f = decode(ups[0][0], P.up_schema(m), kind="fedspzo/up", max_bytes=10**6)
    monkeypatch.setattr(cfg, "local_steps", 0)                 # epochs 1.0 x 16 examples / batch 8 = 2 steps
    schema = P.up_schema(m)
    replays = []
    monkeypatch.setattr(m, "replay", lambda *a: replays.append(1))
    K = 5000
    big = {**f, "g1": torch.zeros(K, 1), "g2": torch.zeros(K, 4)}
    huge_n = {**f, P.EXAMPLES: 2**32 - 1}
    _, report = P.aggregate(m, state, [(0, encode(big, schema, kind="fedspzo/up")),
                                       (1, encode(huge_n, schema, kind="fedspzo/up"))], 1, max_bytes=cfg.max_message_bytes)
    assert report["accepted"] == 0 and replays == []
    assert "5000 local steps claimed" in report["rejected"][0]["error"] and "1..2" in report["rejected"][0]["error"]
    assert "_n" in report["rejected"][1]["error"] and "max_examples" in report["rejected"][1]["error"]


def test_aggregate_is_the_mean_of_replays_and_the_seed_only_downlink_matches(spzo):
    T, cfg, m, model, state, ups = spzo
    new, report = P.aggregate(m, state, [(0, ups[0][0]), (1, ups[1][0])], 1, max_bytes=cfg.max_message_bytes)
    assert report["accepted"] == 2
    for k in state:   # equal shards (16 each): the plain mean of the two clients' models
        assert torch.allclose(new[k], (ups[0][2][k].double() + ups[1][2][k].double()).div(2).float(), atol=1e-7)
    fields = [(decode(u, P.up_schema(m), kind="fedspzo/up", max_bytes=10**6), 16.0) for u, _, _ in ups]
    for f, _ in fields:
        f.pop(P.EXAMPLES)
    seed_only = m.replay_mean(state, 1, fields)        # what a client holding the old model rebuilds
    assert all(torch.allclose(seed_only[k], new[k], rtol=0, atol=1e-6) for k in state)
    # the reported size is that of the message the server sends: its record fields are "0.g1", "0.g2"
    record = {"round_seed": 1, "0.g1": torch.zeros(2, 1), "0.g2": torch.zeros(2, 4)}
    assert ups[0][1]["down_seed_only_bytes"] == len(encode(record, m.seeds_schema(1), kind="fedspzo/seeds/1"))


def test_mezo_replays_exactly_too():
    T, cfg, m, model, state, ups = _round("mezo", P=2, lr=1e-2)
    f = decode(ups[0][0], P.up_schema(m), kind="mezo/up", max_bytes=10**6)
    assert f["g"].shape == (2, 2) and ups[0][1]["forwards_per_step"] == {"fwd": 4}
    rebuilt = m.replay(state, 1, f)
    assert all(torch.equal(rebuilt[n], ups[0][2][n]) for n in rebuilt)


def test_fedspzo_independent_estimates_the_ablation():
    """estimate=independent: same wire and replay, each block estimated with the other at rest."""
    T, cfg, m, model, state, ups = _round("fedspzo", P1=1, Ps=2, lr=1e-2, estimate="independent")
    up, stats, client_weights = ups[0]
    assert stats["forwards_per_step"] == {"f1": 3, "f2": 10} and all(p.grad is None for p in model.parameters())
    f = decode(up, P.up_schema(m), kind="fedspzo/up", max_bytes=10**6)
    assert f["g1"].shape == (2, 1) and f["g2"].shape == (2, 4)
    rebuilt = m.replay(state, 1, f)
    assert all(torch.equal(rebuilt[n], client_weights[n]) for n in client_weights)
    # step 0's g2_0 is the plain two-point estimate at the starting weights on the unperturbed f1 output
    m2 = methods.build(cfg)
    fresh = m2.prepare(copy.deepcopy(T.model))
    m2.load(fresh, state)
    m2._bind(fresh)
    fresh.eval()
    batch = next(iter(zo.step_batches(subset(T.train, range(16)), cfg.batch_size, 2,
                                      ClientContext(0, 1, 100, cfg, T.loss, {}).generator())))
    with torch.no_grad():
        y = m2.step.sp.f1(batch)
        g, _, _ = zo.two_point(lambda: m2.step.sp.f2_loss(y, batch), fresh, m2.block_params["theta2"],
                               zo.derive(m.round_seed(1), 0, 2, 0), 1e-3, m2.owner_map, m2.draw)
    assert f["g2"][0, 0].item() == zo.f32(g)


def test_flops_count_the_fused_cpu_attention_in_eval_mode():
    """Eval-mode SDPA on CPU takes a fused kernel torch's FlopCounterMode has no formula for;
    lightfed.measure registers one, so a forward counts the same FLOPs in eval and train mode."""
    T = tiny_task("sentiment")
    model, b = copy.deepcopy(T.model), subset(T.train, range(8))
    counts = {}
    for mode in ("train", "eval"):
        getattr(model, mode)()
        with torch.no_grad():
            _, counts[mode] = measure.count_flops(lambda: T.loss(model, b))
    assert counts["eval"] == counts["train"] > 0
