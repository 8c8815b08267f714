"""Device and precision (issue 23): where a run computes and in which dtype, the device-free wire, zeroth-order
updates in one canonical form, and directions drawn on the device that are the same numbers everywhere."""
import copy
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import tiny_config, tiny_task
from lightfed import config as C
from lightfed import device, methods, seeds
from lightfed.data.tensors import subset
from lightfed.engine import local
from lightfed.engine import protocol as P
from lightfed.methods.base import ClientContext
from lightfed.models.backbones import seeded
from lightfed.optim import zeroth_order as zo
from test_contract import CASES


def test_a_bad_device_or_dtype_fails_before_any_work(tmp_path):
    if not torch.cuda.is_available():
        with pytest.raises(C.ConfigError, match=r"device = 'cuda', but torch sees no CUDA device .*use device = auto or cpu"):
            local.check(tiny_config("sentiment", "fedavg", device="cuda"))
        with pytest.raises(C.ConfigError, match="no CUDA device"):
            local.run(tiny_config("sentiment", "fedavg", tmp_path / "x", device="cuda:1"), log=lambda *a: None)
        assert not (tmp_path / "x").exists()
    with pytest.raises(C.ConfigError, match="device = 'gpu0': use auto, cpu, cuda or cuda:N"):
        local.check(tiny_config("sentiment", "fedavg", device="gpu0"))
    with pytest.raises(C.ConfigError, match="dtype = 'fp16': use one of fp32, bf16"):
        local.check(tiny_config("sentiment", "fedavg", dtype="fp16"))
    assert device.resolve("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")


ONE_TASK = list({m: (m, t) for m, t in reversed(CASES)}.values())      # every method, on one of its tasks


@pytest.mark.parametrize("name,task", ONE_TASK)
def test_every_message_is_the_same_with_device_cpu_given_or_auto(name, task):
    """On a machine without CUDA, auto is the CPU: a method's broadcast and a client's upload are the same bytes."""
    if torch.cuda.is_available():
        pytest.skip("auto is a GPU here")
    T = tiny_task(task)
    out = []
    for dev in ("cpu", "auto"):
        cfg = tiny_config(task, name, device=dev)
        m = methods.build(cfg)
        with seeded(0):                                    # PEFT draws LoRA's A from the global RNG
            model = device.place(m.prepare(copy.deepcopy(T.model)), cfg.device, cfg.dtype)
        state = m.init_state(model)
        down = P.broadcast(m, state, 1)
        up, _ = P.client_round(m, model, down, subset(T.train, range(16)), ClientContext(0, 1, 5, cfg, T.loss, {}),
                               cfg.max_message_bytes)
        out.append((down, up))
    assert out[0] == out[1]


@pytest.mark.parametrize("name", ["fedavg", "lora", "flite", "fednl", "decomfl", "fedspzo"])
def test_bf16_runs_a_round_of_each_first_order_lm_method_and_zeroth_order_refuses_it(tmp_path, name):
    """dtype = bf16: the frozen weights are bfloat16, forwards run under autocast, trainable tensors and messages
    stay float32; the run finishes and reports its memory."""
    tiny_task("austen")
    if methods.METHODS[name].zeroth_order:                     # refused before any work: bf16 rounds its estimate away
        with pytest.raises(C.ConfigError, match="dtype = 'bf16'.*use dtype = fp32"):
            local.run(tiny_config("austen", name, tmp_path, rounds=1, dtype="bf16"), log=lambda *a: None)
        assert not (tmp_path / "config.json").exists()
        return
    s = local.run(tiny_config("austen", name, tmp_path, rounds=1, dtype="bf16"), log=lambda *a: None)
    assert np.isfinite(s["final"]) and s["memory"]["client_rss_peak_bytes"] > 0
    acc = s["memory"]["client_accounted_parts"]
    assert acc["params"] > 0
    S = local.build(C.load_json(tmp_path / "config.json"))
    frozen = [p for p in S.model.parameters() if not p.requires_grad]
    trained = [p for p in S.model.parameters() if p.requires_grad]
    assert trained and all(p.dtype == torch.float32 for p in trained)
    assert not frozen or all(p.dtype == torch.bfloat16 for p in frozen)
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bf16"


def test_the_zeroth_order_update_is_two_separately_rounded_ops_not_a_fused_one():
    """A GPU may contract a*b + c into one fused multiply-add, rounding once where the CPU rounds twice. lightfed's
    client step and the server's replay both apply theta <- theta - round(coef * z) as two separate IEEE ops (two
    kernels: nothing can fuse them), so a GPU client and a CPU server rebuild the same bits. The fused form differs
    on a sizeable share of elements: it would break the replay's digest, which is why it is never used."""
    g = torch.Generator().manual_seed(0)
    theta = torch.randn(200_000, generator=g)
    coef = 0.0123456789
    got = theta.clone()
    zo.apply_update({"w": got}, 99, coef)
    z = zo.direction(99, 0, theta.shape)
    c = np.float32(coef)
    two_step = (theta.numpy() - (z.numpy() * c).astype(np.float32)).astype(np.float32)        # IEEE, twice rounded
    fused = (theta.numpy().astype(np.float64) - z.numpy().astype(np.float64) * np.float64(c)).astype(np.float32)  # FMA
    assert np.array_equal(got.numpy(), two_step)
    assert (fused != two_step).mean() > 0.01
    torch_fused = torch.addcmul(theta, z, torch.tensor(c), value=-1.0)    # what a fused kernel would write
    assert not torch.equal(torch_fused, got) or (fused == two_step).all()


def test_a_client_whose_update_was_fused_is_refused_and_a_canonical_one_accepted_by_the_replay():
    """The server's acceptance rests on the canonical form: the same scalars applied by the fused form give
    another model, whose digest the replay refuses; the canonical client is accepted."""
    T = tiny_task("sentiment")
    cfg = tiny_config("sentiment", "mezo", lr=1e-2, method_options={"trainable": "head."})
    m = methods.build(cfg)
    model = m.prepare(copy.deepcopy(T.model))
    state = m.init_state(model)
    up, _ = P.client_round(m, model, P.broadcast(m, state, 1), subset(T.train, range(16)),
                           ClientContext(0, 1, 5, cfg, T.loss, {}), cfg.max_message_bytes)
    f = __import__("lightfed.wire", fromlist=["decode"]).decode(up, P.up_schema(m), kind="mezo/up", max_bytes=10**6)
    m.validate(state, dict(f), 1)                                    # canonical: accepted
    fused = {n: state[n].detach().clone().double() for n in m.names}
    for blk, s, coef in m.updates_of(1, f):
        for i, n in enumerate(m.layout[blk]):
            fused[n] -= zo.direction(s, i, fused[n].shape).double() * float(np.float32(coef))
    fused = {n: v.float() for n, v in fused.items()}
    assert zo.digest(fused) != f["digest"]                           # a device that fused would be refused


_DRAW = ("import json, sys, torch; from lightfed.seeds import counter_normal;"
         "print(json.dumps(counter_normal((5, 7001), 2**62 + 11).view(-1)[::97].tolist()))")


def test_counter_draws_are_the_same_numbers_in_another_process_and_in_integer_numpy():
    z = seeds.counter_normal((5, 7001), 2**62 + 11)
    other = subprocess.run([sys.executable, "-c", _DRAW], capture_output=True, text=True, check=True,
                           env={**os.environ, "ATEN_CPU_CAPABILITY": "default"})
    assert json.loads(other.stdout) == z.view(-1)[::97].tolist()
    assert abs(float(z.mean())) < 0.02 and abs(float(z.var()) - 1) < 0.03 and float(z.abs().max()) <= 2 * 3 ** 0.5
    # chunking does not change the numbers
    old = seeds.COUNTER_CHUNK
    try:
        seeds.COUNTER_CHUNK = 1000
        assert torch.equal(seeds.counter_normal((5, 7001), 2**62 + 11), z)
    finally:
        seeds.COUNTER_CHUNK = old


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_counter_draws_on_the_gpu_equal_the_cpu_ones():
    z = seeds.counter_normal((3, 100_003), 77)
    assert torch.equal(seeds.counter_normal((3, 100_003), 77, "cuda").cpu(), z)


def test_a_zeroth_order_run_with_counter_draws_replays_and_learns(tmp_path):
    tiny_task("sentiment")
    s = local.run(tiny_config("sentiment", "decomfl", tmp_path, lr=1e-2, rounds=2, method_options={"z": "counter"}),
                  log=lambda *a: None)
    recs = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(r["accepted"] == len(r["clients"]) and not r["rejected"] for r in recs[1:])
    assert np.isfinite(s["final"])


@pytest.mark.parametrize("name", list(methods.METHODS))
def test_every_method_runs_a_round_on_the_synthetic_twins_that_need_no_asset(name):
    """The `synthetic` task (random data on the tiny twins, no asset) is what scripts/gpu_check.sh runs on a GPU
    machine that has none of lightfed's assets: every method must run there."""
    from lightfed import devicecheck as gpu_check
    for kind in [gpu_check.KIND.get(name, "lm")] + (["image"] if name in gpu_check.CONV else []):
        r = gpu_check._round(name, kind, "cpu")
        assert r["accepted"] == 1 and len(r["up"]) > 0


def test_flower_nodes_may_compute_on_their_own_device_and_ray_is_asked_for_gpus_only_with_cuda():
    pytest.importorskip("flwr")
    from lightfed.engine.flower.config import digest, options
    a = tiny_config("sentiment", "fedavg", device="cpu")
    b = tiny_config("sentiment", "fedavg", device="auto")
    assert digest(a) == digest(b)                       # a node's device is its own: the server's config matches
    assert digest(a) != digest(tiny_config("sentiment", "fedavg", dtype="bf16"))   # the precision is the run's
    if not torch.cuda.is_available():
        with pytest.raises(C.ConfigError, match="client_gpus = 0.5, but torch sees no CUDA device"):
            options(tiny_config("sentiment", "fedavg", engine_options={"client_gpus": 0.5}))


# Every method on one of its tasks, and each option under which a client combines what it received with its model
# (FedProx's anchor, FLITE's delta, PowerSGD's and top-k's residuals, FedALA's mix, FedSSI's importance, DP's clip),
# or the server treats uploads otherwise (a robust rule, secure aggregation).
DOWNLINK = [(m, t, {}) for m, t in ONE_TASK] + [
    ("lora", "sentiment", {"method_options": {"mu": 0.1}}),
    ("flite", "sentiment", {"method_options": {"delta": True}}),
    ("powersgd", "sentiment", {"method_options": {"factors": "own"}}),
    ("fedavg", "sentiment", {"dp_clip": 0.5, "dp_noise": 1.0}),
    ("flite", "sentiment", {"method_options": {"delta": True}, "dp_clip": 0.5, "dp_noise": 1.0}),
    ("decomfl", "sentiment", {"lr": 1e-2, "local_steps": 1, "dp_clip": 0.5, "dp_noise": 1.0, "method_options": {"z": "counter"}}),
    ("fedspzo", "sentiment", {"lr": 1e-2, "local_steps": 1, "method_options": {"z": "counter", "down": "seeds"}}),
    ("fedavg", "sentiment", {"robust": "median"}),
    ("lora", "sentiment", {"secagg": True, "clients": 3, "fraction": 1.0}),
]


@pytest.mark.parametrize("name,task,extra", DOWNLINK, ids=[f"{m}-{t}-{'-'.join(map(str, e.values())) or 'default'}"
                                                         for m, t, e in DOWNLINK])
def test_a_client_on_a_gpu_receives_and_combines_tensors_on_its_device_only(name, task, extra, monkeypatch):
    """On a fake GPU (tests/fake_device.py: every op a real GPU would refuse for mixing devices fails here too), two
    rounds of three clients: every tensor handed to `client_update` (the decoded downlink and the client's own state)
    lives on the device, no op inside mixes devices, the uploads are encoded and the server aggregates them on the
    CPU, and what a client keeps between rounds (checkpointed, so loaded on the host after a resume) is on the host."""
    from fake_device import FakeCuda
    from lightfed import secagg
    from lightfed.seeds import derive
    T = tiny_task(task)
    cfg = tiny_config(task, name, device="cuda", **extra)
    m = methods.build(cfg)
    with seeded(0):
        model = m.prepare(copy.deepcopy(T.model))
    state = m.init_state(model)
    fk, handed = FakeCuda(), []
    update = m.client_update

    def spy(model, down, data, ctx):
        handed.append(sorted(k for k, v in {**down, **ctx.state}.items() if torch.is_tensor(v) and not fk.on_device(v)))
        return update(model, down, data, ctx)

    monkeypatch.setattr(m, "client_update", spy)
    kept: dict[int, dict] = {}
    with fk.installed(monkeypatch):
        device.place(model, cfg.device, cfg.dtype)
        for rnd in (1, 2):
            ids = [0, 1, 2]
            sec = secagg.Round(ids, cfg.secagg_threshold) if cfg.secagg else None
            uploads = []
            for cid in ids:
                ctx = ClientContext(cid, rnd, derive(cfg.seed, rnd, cid), cfg, T.loss, kept.setdefault(cid, {}))
                up, _ = P.client_round(m, model, P.broadcast(m, state, rnd, cid), subset(T.train, range(8 * cid, 8 * cid + 8)),
                                       ctx, cfg.max_message_bytes)
                uploads.append((cid, sec.mask(cid, up, m, P.up_schema(m)) if sec else up))
            state, report = (sec.aggregate(m, P.up_schema(m), state, rnd, ids) if sec else
                             P.aggregate(m, state, uploads, rnd, max_bytes=cfg.max_message_bytes, sampled=ids))
            assert report["accepted"] == 3 and not report["rejected"], report
            assert not any(fk.on_device(v) for v in state.values() if torch.is_tensor(v)), "the server's state: CPU"
            assert not any(fk.on_device(v) for s in kept.values() for v in s.values() if torch.is_tensor(v))
    assert len(handed) == 6 and handed == [[]] * 6, f"tensors handed to client_update on the host: {handed}"


def test_lightfed_check_runs_its_parts_on_the_cpu_and_writes_its_report(tmp_path):
    """`lightfed check` (what scripts/gpu_check.sh runs on a GPU machine) as a dry run on the CPU: the zeroth-order
    replay part, its report written where --out says."""
    from lightfed import cli
    assert cli.main(["check", "--device", "cpu", "--parts", "replay", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "gpu_check.json").read_text())
    assert len(res["replay"]) == 5 and all(r["ok"] for r in res["replay"]), res["replay"]
    assert res["methods"] == [] and "## Zeroth order across devices" in (tmp_path / "gpu_check.md").read_text()


def test_a_bf16_run_on_a_cpu_without_native_bf16_is_warned_and_keeps_its_setting(monkeypatch):
    """bf16 matmuls on a CPU without AVX-512 fall back to a generic loop (~5x slower than fp32, measured on an AVX2
    EPYC): `lightfed run` says so, names the fix, and runs what the user set; fp32, or an AVX-512 CPU, is not warned."""
    from lightfed import cli
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    cfg = tiny_config("sentiment", "fedavg", device="cpu", dtype="bf16")
    w = cli.slow_bf16(cfg)
    assert "AVX2" in w and "--set dtype=fp32" in w and cfg.dtype == "bf16"
    assert cli.slow_bf16(tiny_config("sentiment", "fedavg", device="cpu")) is None
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert cli.slow_bf16(cfg) is None
