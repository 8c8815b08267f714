"""lightfed's device check: what a person with a CUDA GPU for a few minutes runs, needing no lightfed asset.

    lightfed check --device cuda --out DIR         # on the GPU machine (scripts/gpu_check.sh sets up a venv on its
                                                   # own torch, then runs this); DIR/gpu_check.{json,md}
    lightfed check --device cpu                    # a dry run: every part on the CPU, at small sizes

Parts (each timed; the whole under 8 minutes on one GPU):
1. methods  every method one round on the synthetic tiny twins (task `synthetic`: random data, no asset) on the
            device, and the same round on the CPU: did it run, and are the messages the CPU's bytes?
2. replay   zeroth order across devices: a client trains on the device (directions `portable` and `counter`), a
            server on the CPU replays its scalars: accepted (digest equal) or refused; counter draws bit-equal.
3. stream   FedNL on SmolLM2-135M's architecture (random weights: no download) streaming 1K..16K tokens in 512-token
            chunks on the device: peak device memory (flat?) and tokens/s.
4. speed    tokens/s of forward and forward+backward on that architecture, fp32 and bf16, on the device and on this
            machine's CPU side by side (batch 4 x 512 tokens; the CPU with a shorter batch).
"""
from __future__ import annotations

import copy
import json
import platform
import sys
import time
from pathlib import Path

import torch

SMOLLM2 = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
               num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0, tie_word_embeddings=True,
               rms_norm_eps=1e-5)          # SmolLM2-135M's architecture (its config.json), random weights
KIND = {"vera": "clf", "probe": "clf"}     # every other method on the LM twin
CONV = ("fedavg", "flite", "lora", "topk", "powersgd")   # ... and these on the ResNet-18 twin too


# options under which a client combines what it received with its model (issue 45: each crashed on a GPU)
VARIANTS = [("lora", {"method_options": {"mu": 0.1}}), ("flite", {"method_options": {"delta": True}}),
            ("powersgd", {"method_options": {"factors": "own"}}), ("fedavg", {"dp_clip": 0.5, "dp_noise": 1.0}),
            ("flite", {"method_options": {"delta": True}, "dp_clip": 0.5, "dp_noise": 1.0})]


def _round(name: str, kind: str, dev: str, dtype: str = "fp32", extra: dict | None = None) -> dict:
    """Two rounds of one client (what it keeps between rounds is used in the second); the second round's messages."""
    from lightfed import config as C, device, methods
    from lightfed.data.tensors import subset
    from lightfed.engine import protocol as P
    from lightfed.methods.base import ClientContext
    from lightfed.models.backbones import seeded
    from lightfed.tasks import synthetic
    lr = {"lr": 1e-3} if methods.METHODS[name].lr else {}                # probe has none (a closed form)
    cfg = C.from_dict({"task": "synthetic", "method": name, "clients": 2, "batch_size": 8, "local_steps": 2, **lr,
                       "device": dev, "dtype": dtype, "task_options": {"kind": kind}, **(extra or {})})
    T = synthetic.build(synthetic.Options(kind=kind), 0)
    m = methods.build(cfg)
    with seeded(0):
        model = device.place(m.prepare(copy.deepcopy(T.model)), dev, dtype)
    state, kept = m.init_state(model), {}
    t = time.perf_counter()
    for rnd in (1, 2):
        down = P.broadcast(m, state, rnd, 0)
        up, stats = P.client_round(m, model, down, subset(T.train, range(16)), ClientContext(0, rnd, 5 + rnd, cfg, T.loss, kept),
                                   cfg.max_message_bytes)
        state, report = P.aggregate(m, state, [(0, up)], rnd, max_bytes=cfg.max_message_bytes, sampled=[0])
    return {"up": up, "down": down, "seconds": time.perf_counter() - t, "accepted": report["accepted"]}


def part_methods(dev: str) -> list[dict]:
    from lightfed import methods
    rows = []
    cases = [(n, k, None) for n in methods.METHODS for k in [KIND.get(n, "lm")] + (["image"] if n in CONV else [])]
    for name, kind, extra in cases + [(n, KIND.get(n, "lm"), e) for n, e in VARIANTS]:
        r = {"method": name + (f" {extra}" if extra else ""), "task": f"synthetic/{kind}"}
        try:
            g, c = _round(name, kind, dev, extra=extra), _round(name, kind, "cpu", extra=extra)
            r.update(ok=g["accepted"] == 1, seconds=g["seconds"], cpu_seconds=c["seconds"], up_bytes=len(g["up"]),
                     same_down=g["down"] == c["down"], same_up=g["up"] == c["up"])
        except Exception as e:  # noqa: BLE001 - reported, the check goes on
            r.update(ok=False, error=repr(e)[:300])
        rows.append(r)
        print(f"[gpu_check] {name} {kind}: {r}", file=sys.stderr, flush=True)
    return rows


def part_replay(dev: str) -> list[dict]:
    from lightfed import config as C, device, methods, seeds
    from lightfed.data.tensors import subset
    from lightfed.engine import protocol as P
    from lightfed.methods.base import ClientContext
    from lightfed.tasks import synthetic
    rows = []
    z = seeds.counter_normal((3, 100_003), 77)
    rows.append({"check": "counter draws on the device == on the CPU",
                 "ok": bool(torch.equal(seeds.counter_normal((3, 100_003), 77, dev).cpu(), z))})
    for name, draw in (("decomfl", "portable"), ("decomfl", "counter"), ("fedspzo", "counter"), ("zoflite", "counter")):
        T = synthetic.build(synthetic.Options(kind="lm"), 0)
        mk = lambda d: C.from_dict({"task": "synthetic", "method": name, "clients": 2, "batch_size": 8, "local_steps": 3,   # noqa: E731
                                    "lr": 1e-3, "device": d, "method_options": {"z": draw}, "task_options": {"kind": "lm"}})
        client, server = methods.build(mk(dev)), methods.build(mk("cpu"))
        cm = device.place(client.prepare(copy.deepcopy(T.model)), dev, "fp32")
        server.prepare(copy.deepcopy(T.model))
        state = client.init_state(cm)                       # the server's state: CPU tensors
        down = P.broadcast(server, state, 1)
        up, _ = P.client_round(client, cm, down, subset(T.train, range(16)), ClientContext(0, 1, 5, mk(dev), T.loss, {}),
                               10**9)
        _, report = P.aggregate(server, state, [(0, up)], 1, max_bytes=10**9)
        rows.append({"check": f"{name} (z={draw}): client on {dev}, server on the CPU replays", "ok": report["accepted"] == 1,
                     "refused": [r["error"] for r in report["rejected"]]})
        print(f"[gpu_check] replay {rows[-1]}", file=sys.stderr, flush=True)
    return rows


def _smollm2(dev: str, dtype=torch.float32):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**SMOLLM2)).to(dev, dtype)


def part_stream(dev: str, lengths: list[int]) -> list[dict]:
    from lightfed.methods.fednl import choose_layers
    from lightfed.models import delta_memory, streaming
    model = _smollm2(dev)
    model.requires_grad_(False)
    delta_memory.attach(model, choose_layers("auto", 5, 30), r=8, chunk=64)
    model.to(dev).eval()
    rows = []
    for n in lengths:
        ids = torch.randint(0, SMOLLM2["vocab_size"], (1, n), device=dev)
        if dev.startswith("cuda"):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        nll, state = streaming.stream_nll(model, ids, 512)
        if dev.startswith("cuda"):
            torch.cuda.synchronize()
        s = time.perf_counter() - t
        rows.append({"tokens": n, "tokens_per_s": n / s, "memory_state_bytes": state,
                     "device_peak_bytes": torch.cuda.max_memory_allocated() if dev.startswith("cuda") else None})
        print(f"[gpu_check] stream {rows[-1]}", file=sys.stderr, flush=True)
    return rows


def part_speed(dev: str, cpu_tokens: int) -> list[dict]:
    rows = []
    for where, B, T in ((dev, 4, 512), ("cpu", 1, cpu_tokens)):
        for dtype in ("fp32", "bf16"):
            model = _smollm2(where)
            ids = torch.randint(0, SMOLLM2["vocab_size"], (B, T), device=where)
            out = {"device": where, "dtype": dtype, "batch": [B, T]}
            for mode in ("forward", "forward+backward"):
                times = []
                for _ in range(3):
                    t = time.perf_counter()
                    with torch.autocast(torch.device(where).type, dtype=torch.bfloat16, enabled=dtype == "bf16"):
                        if mode == "forward":
                            with torch.no_grad():
                                model(input_ids=ids)
                        else:
                            model(input_ids=ids, labels=ids).loss.backward()
                    if where.startswith("cuda"):
                        torch.cuda.synchronize()
                    times.append(time.perf_counter() - t)
                out[f"{mode} tokens/s"] = B * T / min(times[1:])
            rows.append(out)
            print(f"[gpu_check] speed {out}", file=sys.stderr, flush=True)
            del model
    return rows


def render(res: dict) -> str:
    L = [f"# GPU check ({res['device_name']})\n", f"Command: `{res['meta']['command']}`; date {res['meta']['date']}; torch "
         f"{res['meta']['torch']}; {res['seconds']:.0f} s in all.\n", "## Every method, one round on the synthetic twins\n",
         "| method | task | ran | s (device / CPU) | up bytes | same bytes as the CPU (down / up) |", "|---|---|---|---|---|---|"]
    for r in res["methods"]:
        L.append(f"| {r['method']} | {r['task']} | {'yes' if r['ok'] else 'NO: ' + r.get('error', '')[:80]} | "
                 f"{r.get('seconds', 0):.2f} / {r.get('cpu_seconds', 0):.2f} | {r.get('up_bytes', '-')} | "
                 f"{r.get('same_down', '-')} / {r.get('same_up', '-')} |")
    L += ["", "Uploads may differ from the CPU's where a device's kernels round otherwise (a first-order update is not "
          "replayed); the broadcast never does.", "", "## Zeroth order across devices\n", "| check | result |", "|---|---|"]
    L += [f"| {r['check']} | {'ok' if r['ok'] else 'FAILED ' + str(r.get('refused', ''))[:120]} |" for r in res["replay"]]
    L += ["", "## FedNL streaming on SmolLM2-135M's architecture (random weights), 512-token chunks\n",
          "| tokens | tokens/s | memory state | peak device memory |", "|---|---|---|---|"]
    def mb(x):
        return "-" if x is None else f"{x / 2**20:,.0f} MB"
    L += [f"| {r['tokens']} | {r['tokens_per_s']:,.0f} | {r['memory_state_bytes']:,} B | {mb(r['device_peak_bytes'])} |"
          for r in res["stream"]]
    L += ["", "## Throughput on SmolLM2-135M's architecture\n", "| device | dtype | batch | forward tokens/s | forward+backward tokens/s |",
          "|---|---|---|---|---|"]
    L += [f"| {r['device']} | {r['dtype']} | {r['batch'][0]} x {r['batch'][1]} | {r['forward tokens/s']:,.0f} | "
          f"{r['forward+backward tokens/s']:,.0f} |" for r in res["speed"]]
    return "\n".join(L) + "\n"


def run(dev: str = "cuda", lengths=(1024, 2048, 4096, 8192, 16384), cpu_tokens: int = 256,
        parts=("methods", "replay", "stream", "speed"), out: str | Path = "gpu_check", command: str = "") -> Path:
    """Run the check's parts on `dev`; write out/gpu_check.{json,md}; -> the markdown's path."""
    from lightfed import device
    device.check(dev, "fp32")
    t0 = time.time()
    res = {"meta": {"command": command, "date": time.strftime("%Y-%m-%d %H:%M"), "torch": torch.__version__,
                    "machine": platform.machine(), "python": platform.python_version()},
           "device_name": torch.cuda.get_device_name(0) if dev.startswith("cuda") else "CPU (dry run)",
           "methods": part_methods(dev) if "methods" in parts else [],
           "replay": part_replay(dev) if "replay" in parts else [],
           "stream": part_stream(dev, list(lengths)) if "stream" in parts else [],
           "speed": part_speed(dev, cpu_tokens) if "speed" in parts else []}
    res["seconds"] = time.time() - t0
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(res, indent=1))
    (out / "gpu_check.md").write_text(render(res))
    return out / "gpu_check.md"
