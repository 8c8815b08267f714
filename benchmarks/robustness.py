"""Hardening, measured (issue #12): malformed messages, secure aggregation's cost, DP, dropouts.

    python benchmarks/robustness.py --parts fuzz,secagg            # minutes
    python benchmarks/robustness.py --parts dp,dropout --seeds 0,1,2   # real MiniLM runs, ~100 s each on one core
    python benchmarks/robustness.py --parts hostile --seeds 0         # 30 runs (~40 min on 2 cores) a seed
    python benchmarks/robustness.py --render                        # markdown + plots again from the JSON

Parts:
- fuzz (engine/fuzz.py; tests/test_robust.py runs it at 60 a kind): every message kind of every method (uplink, broadcast, seed-only downlink) and of secure
  aggregation, built for real on the tiny twin models (the schemas have the real structure), mutated N times
  each (byte flips, cuts, insertions, deletions, with the stale CRC and with a recomputed one, garbage
  with a valid magic and CRC). An uplink goes through the server's `aggregate`, a downlink through the
  client's `client_round`. Counted: crashes (any exception other than a refusal), server or client state
  changed by a refused message, refusals whose reason names the field (or header / CRC / trailer), and
  mutants that are still well-formed messages (accepted as such: not malformed).
- secagg: bytes and seconds of a round with secure aggregation vs plain, at MiniLM's dense size, FLITE's
  latent and a LoRA-sized update, 10 clients, with 0 and 3 dropped.
- dp: final accuracy vs epsilon for FedAvg+LoRA and FLITE on sentiment (MiniLM), 3 seeds each, at one clip
  for both (C = 0.5) and at a clip near each method's own update norm.
- dropout: accuracy by round with 0% and 30% of clients failing per round plus stragglers past a 2x
  deadline, FedAvg+LoRA and FLITE on sentiment.
- hostile: 0, 1 or 2 of 10 clients hostile (a x10 sign flip or a x1000 update; the zeroth-order client applies
  its forged scalars itself, so its digest is valid: a forged replay), FedAvg, FLITE and FedSPZO, with the plain
  mean and with the coordinate-wise median.
"""
from __future__ import annotations

import argparse
import copy
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import common  # noqa: E402
from common import RESULTS, meta, verdict, write  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))


def part_fuzz(n: int, only: set | None = None) -> dict:
    """Every message kind of every method (tiny twins) and of secure aggregation, n mutants each (engine/fuzz.py)."""
    import torch
    from conftest import tiny_config, tiny_task
    from lightfed import methods
    from lightfed.engine import fuzz
    torch.set_num_threads(1)
    rng = random.Random(0)
    out = {}
    for name in methods.METHODS:
        if only is not None and not any(k.split("/")[0] == name for k in only):
            continue
        task = "austen" if name == "fednl" else "sentiment"
        T = tiny_task(task)
        cfg = tiny_config(task, name, method_options={"down": "seeds"} if name in ("decomfl", "mezo", "fedspzo", "zoflite") else {})
        for kind, r in fuzz.method_receivers(methods.build(cfg), copy.deepcopy(T.model), T.train, cfg, T.loss).items():
            if only is None or f"{name}/{kind}" in only:
                out[f"{name}/{kind}"] = c = fuzz.tally(n, rng, r)
                print(f"[fuzz] {name}/{kind}: {c['mutants']} mutants, {c['refused']} refused ({c['named']} naming the field), "
                      f"{c['well_formed']} well-formed, {c['crashes']} crashes, {c['state_changed']} state changes, "
                      f"{c['bytes']} B, {c['seconds']:.1f} s", file=sys.stderr, flush=True)
    if only is None or any(k.startswith("secagg/") for k in only):
        out.update({f"secagg/{k}": fuzz.tally(n, rng, r) for k, r in fuzz.secagg_receivers().items()})
    return {"per_kind": n, "kinds": out}


def part_secagg() -> dict:
    """Bytes and seconds per round: the protocol vs plain fp32 uploads, 10 clients, 0 and 3 dropped."""
    import torch
    from lightfed import secagg
    from lightfed.wire import Spec, encode
    rows = []
    for label, dim in (("FLITE latent (MiniLM, r = 6)", 1296), ("LoRA q,v r = 8 (MiniLM)", 73728), ("MiniLM dense", 22_713_216)):
        dim_note, dim = dim, min(dim, 5_000_000)   # seconds scale linearly; bytes are computed at the real size below
        spec = {"w": Spec("tensor", (dim,), "fp32"), "_n": Spec("int", lo=1, hi=2**32 - 1)}
        for drop in (0, 3):
            U = list(range(10))
            x = {i: torch.randn(dim) * 0.01 for i in U}
            plain = encode({"w": x[0]}, {"w": Spec("tensor", (dim,), "fp32")}, kind="plain/up")
            t = time.perf_counter()
            r = secagg.Round(U)
            t_setup = time.perf_counter() - t
            t = time.perf_counter()
            for i in U[drop:]:
                r.mask(i, encode({"w": x[i], "_n": 10}, spec, kind="m/up"), type("M", (), {"name": "m"}), spec)
            t_mask = (time.perf_counter() - t) / (10 - drop)
            t = time.perf_counter()
            total = r.server.unmask(r.masked, dim + 1, lambda i, req: r.clients[i].unmask(req))
            t_unmask = time.perf_counter() - t
            mean, n = secagg.from_fixed(total, ["w"], {"w": (dim,)})
            want = torch.stack([x[i] for i in U[drop:]]).double().mean(0)
            err = float((mean["w"].double() - want).abs().max())
            over = r.overhead(U[-1])
            scale = dim_note / dim
            rows.append({"update": label, "coordinates": dim_note, "dropped": drop, "plain_up_bytes": round(len(plain) * scale),
                         "masked_up_bytes": round(len(r.masked[U[-1]]) * scale), "protocol_up_bytes": over["up"],
                         "protocol_down_bytes": over["down"], "setup_s": t_setup, "mask_s_per_client": t_mask * scale,
                         "unmask_s": t_unmask * scale, "max_abs_error_vs_plain_mean": err,
                         "measured_at_coordinates": dim})
            print(f"[secagg] {label} dropped {drop}: {rows[-1]}", file=sys.stderr, flush=True)
    return {"clients": 10, "rows": rows}


def render(res: dict) -> str:
    L = [f"# Robustness (issue #12)\n\nCommand: `{res['meta']['command']}` ({res['meta']['date']}, torch {res['meta']['torch']})\n"]
    if "fuzz" in res:
        f = res["fuzz"]
        tot = {k: sum(c[k] for c in f["kinds"].values()) for k in ("mutants", "refused", "named", "well_formed", "crashes", "state_changed")}
        L += [f"## Fuzzing: {f['per_kind']:,} mutants per message kind, {len(f['kinds'])} kinds\n",
              f"Total: {tot['mutants']:,} mutants; **{tot['crashes']} crashes**, **{tot['state_changed']} state changes**; "
              f"{tot['refused']:,} refused, {tot['named']:,} of them naming the field (or header / CRC / trailer); "
              f"{tot['well_formed']:,} mutants were still well-formed messages (accepted as such).\n",
              "| kind | bytes | mutants | refused | naming the field | well-formed | crashes | state changes |", "|---|---|---|---|---|---|---|---|"]
        for k, c in f["kinds"].items():
            L.append(f"| {k} | {c['bytes']:,} | {c['mutants']:,} | {c['refused']:,} | {c['named']:,} | {c['well_formed']:,} | "
                     f"{c['crashes']} | {c['state_changed']} |")
        crashed = {k: sorted({e for e in c["examples"] if e.startswith("CRASH")}) for k, c in f["kinds"].items() if c["crashes"]}
        if crashed:
            L += ["", "Crashes (an exception other than a refusal), each a bug this run found:", ""]
            L += [f"- {k}: " + "; ".join(f"`{e[6:]}`" for e in v) for k, v in crashed.items()]
            if "fuzz_recheck" in res:
                L += ["", "All are fixed (FedALA's convergence check on a non-finite loss; a malformed seed record now refused as "
                          "a wire error naming it; secure aggregation's keys and shares checked for length, and a bad inbox "
                          "no longer empties the shares a client held): see the recheck below."]
        L.append("")
    if "fuzz_recheck" in res:
        f = res["fuzz_recheck"]
        L += ["## Fuzzing again: the kinds that crashed (after the fixes) and every kind whose message changed since "
              "(secure aggregation's roster now carries U and t; PowerSGD's shared factors; FLITE's default map sends "
              "its head; the new zoflite_split)\n",
              f"Command: `{f.get('command', '')}`\n",
              "| kind | mutants | refused | naming the field | well-formed | crashes | state changes |", "|---|---|---|---|---|---|---|"]
        for k, c in f["kinds"].items():
            L.append(f"| {k} | {c['mutants']:,} | {c['refused']:,} | {c['named']:,} | {c['well_formed']:,} | {c['crashes']} | {c['state_changed']} |")
        L.append("")
    if "secagg" in res:
        L += [f"## Secure aggregation: cost per round, {res['secagg']['clients']} clients\n",
              "Bytes per client per round. The masked input is 8 bytes per coordinate plus the sample count; the protocol's "
              "own messages (keys, encrypted shares, the unmask round) are counted separately. Seconds at the largest size are "
              "measured at 5M coordinates and scaled linearly (stated in the JSON).\n",
              "| update | coordinates | dropped | plain fp32 up | masked up | protocol up | protocol down | setup s | mask s / client | unmask s | max error vs plain mean |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in res["secagg"]["rows"]:
            L.append(f"| {r['update']} | {r['coordinates']:,} | {r['dropped']} | {r['plain_up_bytes']:,} | {r['masked_up_bytes']:,} | "
                     f"{r['protocol_up_bytes']:,} | {r['protocol_down_bytes']:,} | {r['setup_s']:.3f} | {r['mask_s_per_client']:.3f} | "
                     f"{r['unmask_s']:.3f} | {r['max_abs_error_vs_plain_mean']:.1e} |")
        L.append("")
    for part in ("dp", "dropout", "hostile"):
        if part in res:
            r = res[part]
            L += [_runs_md(part, r["rows"], r.get("clips")), "", f"Command: `{r.get('command', '')}` ({r.get('seconds', 0) / 60:.0f} min; runs already "
                  f"made with the same config are reused). Plot: `robustness_{part}.png`.", ""]
    return "\n".join(L)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="fuzz,secagg")
    ap.add_argument("--per-kind", type=int, default=10_000)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--finished", action="store_true", help="dp / dropout / hostile: report the runs that finished "
                    "(each row says over how many seeds), run nothing")
    ap.add_argument("--kinds", default="", help="fuzz: only these message kinds (e.g. fedala/down), as part 'fuzz_recheck'")
    common.add_args(ap)
    a = ap.parse_args()
    common.configure(a)
    path = RESULTS / "robustness.json"
    res = json.loads(path.read_text()) if path.exists() else {}
    if not a.render:
        res["meta"] = meta("python benchmarks/robustness.py " + " ".join(sys.argv[1:]))
        seeds = [int(s) for s in a.seeds.split(",")]
        for p in a.parts.split(","):
            t = time.time()
            runs = ("dp", "dropout", "hostile")        # --from-runs: the shared flag, read as --finished here
            res[p] = (part_runs(p, seeds, a.workers, a.finished or a.from_runs) if p in runs else
                      {"fuzz": lambda: part_fuzz(a.per_kind), "fuzz_recheck": lambda: part_fuzz(a.per_kind, set(a.kinds.split(","))),
                       "secagg": part_secagg}[p]())
            res[p]["seconds"] = time.time() - t
            res[p]["command"] = res["meta"]["command"]
            write("robustness", res, render(res))
            plots(res)
    write("robustness", res, render(res))
    plots(res)
    print(RESULTS / "robustness.md")


def plots(res: dict) -> None:
    """robustness_{dp,dropout,hostile}.png from the JSON's rows."""
    plt = common.pyplot()
    if "dp" in res:
        rows = res["dp"]["rows"]
        fig, ax = plt.subplots(figsize=(6, 4))
        for i, method in enumerate(sorted({k.split("|")[0] for k in rows})):
            pts = sorted((r["eps"][0], r["mean"], r["std"]) for k, r in rows.items()
                         if k.startswith(method + "|C=") and r["n"] and r["eps"] and r["eps"][0] is not None)
            if pts:
                x, y, e = zip(*pts)
                ax.errorbar(x, y, yerr=e, marker="o", capsize=3, color=f"C{i}",
                            label=f"{method}, clip C = {res['dp']['clips'][method]['C']:g} (from its update norms)")
            ref = rows.get(f"{method}|clean")
            if ref and ref["n"]:
                ax.axhline(ref["mean"], ls="--", color=f"C{i}", lw=1, label=f"{method}, no DP (clean)")
        ax.set_xscale("log")
        eps = sorted({r["eps"][0] for r in rows.values() if r["eps"] and r["eps"][0] is not None})
        ax.set_xticks(eps, [f"{e:.1f}" for e in eps])
        ax.minorticks_off()
        ax.set(xlabel="epsilon (delta 1e-5, whoever sees the sum)", ylabel="final test accuracy",
               title="sentiment (MiniLM): accuracy vs epsilon, mean +- std over seeds")
        ax.legend(fontsize=7, loc="lower right")
        common.save(fig, RESULTS / "robustness_dp.png")
    if "dropout" in res:
        fig, ax = plt.subplots(figsize=(6, 4))
        for i, (k, r) in enumerate(res["dropout"]["rows"].items()):
            if not r["history"]:
                continue
            rounds = [h["round"] for h in r["history"][0]]
            acc = np.array([[h["accuracy"] for h in hist] for hist in r["history"]])
            ax.plot(rounds, acc.mean(0), marker="o", color=f"C{i // 2}", ls="-" if i % 2 == 0 else ":",
                    label=f"{k} ({len(acc)} seeds)")
            ax.fill_between(rounds, acc.min(0), acc.max(0), color=f"C{i // 2}", alpha=0.15)
        ax.set(xlabel="round", ylabel="test accuracy", title="sentiment (MiniLM): dropouts and stragglers (mean, min-max)")
        ax.legend(fontsize=8)
        common.save(fig, RESULTS / "robustness_dropout.png")
    if "hostile" in res:
        rows = res["hostile"]["rows"]
        methods = list(dict.fromkeys(k.split("|")[0] for k in rows))
        fig, axes = plt.subplots(1, len(methods), figsize=(5 * len(methods), 4), sharey=True, squeeze=False)
        for ax, method in zip(axes[0], methods):
            settings = list(dict.fromkeys(k.split("|", 1)[1].rsplit("|", 1)[0] for k in rows if k.startswith(method + "|")))
            x = np.arange(len(settings))
            for j, agg in enumerate(("mean", "median")):
                rr = [rows.get(f"{method}|{st}|{agg}") for st in settings]
                ax.bar(x + (j - 0.5) * 0.4, [r["mean"] if r else np.nan for r in rr], 0.4,
                       yerr=[r["std"] if r else 0 for r in rr], capsize=2, label=f"aggregate: {agg}")
            ax.set_xticks(x, [st.replace("|", "\n") for st in settings], fontsize=7)
            ax.set_title(method)
            ax.axhline(0.5, color="grey", lw=0.8, ls=":")
        axes[0][0].set_ylabel("final test accuracy")
        axes[0][0].legend(fontsize=8)
        fig.suptitle("sentiment (MiniLM): 0, 1 or 2 of 10 clients hostile")
        common.save(fig, RESULTS / "robustness_hostile.png")


# --- runs on the real task: DP, dropouts, hostile clients ------------------------------------------
TASK = {"train_size": 1000, "test_size": 500, "max_len": 32}          # sentiment, real MiniLM; 500 test: 0.2 pp each
# sized for 2 CPU cores (~30 min of wall per seed for the three grids, 2 runs side by side): every sampled
# client takes 5 steps of 16 tweets a round, all 10 clients every round, 6 rounds
BASE = {"task": "sentiment", "clients": 10, "fraction": 1.0, "rounds": 6, "batch_size": 16, "local_steps": 5,
        "progress": False, "task_options": TASK}
ZO_TRAINABLE = "layer.4.,layer.5."     # as in zoflite_claims: the last two layers, from the probed head
METHODS = {"FedAvg+LoRA": ("lora", {}, 3e-4), "FLITE": ("flite", {}, 1e-2), "FedAvg": ("fedavg", {}, 3e-5),
           # from the federated probe's head (~0.8; from a random head ZO stays at chance whatever the clients send),
           # at zoflite_claims' calibrated lr for these weights
           "FedSPZO": ("fedspzo", {"trainable": ZO_TRAINABLE, "z": "fast", "split": 1, "P1": 1, "Ps": 2}, 1e-5)}
DP_NOISE = [0.0, 0.3, 1.0, 3.0]                 # z; 0.0 with the clip = clipping only
DP_METHODS = ("FedAvg+LoRA", "FLITE")
# The clip C of each method is fixed BEFORE any DP run, by a rule on training updates alone (never on test
# accuracy): the median of its clients' update norms in its clean runs (a clip of 1e9 that never binds, z = 0, which
# records the norms before clipping), to 2 significant digits.
NEVER_BINDS = 1e9
ATTACKS = ["sign-flip x10", "large-norm x1000"]


def runs_grid(kind: str, seeds, clips: dict | None = None) -> list[tuple[str, dict]]:
    g = []
    for seed in seeds:
        def run(label, method, extra):
            m, opts, lr = METHODS[method]
            c = {**BASE, "method": m, "method_options": opts, "lr": lr, "seed": seed, **extra}
            if m == "fedspzo":          # from its seed's probe (common.chained: the probe's store folder)
                c["init"] = f"probe s{seed}"
            g.append((f"{kind}|{label}|s{seed}", c))
        if kind == "dp_clean":           # stage 1: clean runs that record the update norms
            for method in DP_METHODS:
                run(f"{method}|clean", method, {"dp_clip": NEVER_BINDS, "dp_noise": 0.0})
        elif kind == "dp":               # stage 2: at each method's clip, fixed from stage 1 (clips[method])
            for method in DP_METHODS:
                for z in DP_NOISE:
                    run(f"{method}|C={clips[method]:g}|z={z:g}", method, {"dp_clip": clips[method], "dp_noise": z})
        elif kind == "dropout":
            for method in ("FedAvg+LoRA", "FLITE"):
                run(f"{method}|no faults", method, {})
                run(f"{method}|30% dropout + stragglers", method, {"dropout": 0.3, "straggle": 1.0, "deadline": 2.0})
        elif kind == "hostile":
            for method in ("FedAvg", "FLITE", "FedSPZO"):
                for robust in ("mean", "median"):
                    run(f"{method}|0 hostile|{robust}", method, {"robust": robust})
                    for attack in ATTACKS:
                        for h in (1, 2):
                            run(f"{method}|{h} hostile|{attack}|{robust}", method, {"robust": robust,
                                "engine_options": {"hostile": h, "attack": attack}})
    return g


def probes(seeds) -> list[tuple[str, dict]]:
    """The federated linear probes FedSPZO's hostile runs start from (one round, forward only)."""
    return [(f"probe s{s}", {**BASE, "method": "probe", "rounds": 1, "local_steps": 0, "lr": 0.0, "seed": s}) for s in seeds]


def _hostile_one(args):
    """A run with clients 0..h-1 hostile (hostile runs only): dense / latent methods send
    received + s * (update - received); zeroth-order ones apply s * their scalars themselves, so the
    digest they send is valid (a forged replay the server cannot tell from an honest one)."""
    label, c = args
    import torch
    torch.set_num_threads(1)
    from lightfed import config as C, methods
    from lightfed.engine import local
    from lightfed.methods.zo_server import SeedReplay
    from lightfed.optim import zeroth_order as zo
    eo = dict(c.get("engine_options", {}))
    h, attack = eo.pop("hostile", 0), eo.pop("attack", "")
    cfg = C.from_dict({**c, "engine_options": eo})
    s = -10.0 if attack.startswith("sign") else 1000.0
    cls = methods.METHODS[cfg.method]
    if h and issubclass(cls, SeedReplay):
        orig_update = cls.client_update

        def update(self, model, down, data, ctx, _o=orig_update):
            if ctx.cid >= h:
                return _o(self, model, down, data, ctx)
            run = self.step.run

            def hostile(m, model_, batch, k, rs, loss):
                row, losses, f = run(m, model_, batch, k, rs, loss)
                return {key: [zo.f32(x * s) for x in v] for key, v in row.items()}, losses, f   # on the wire's grid
            self.step.run = hostile
            try:
                return _o(self, model, down, data, ctx)
            finally:
                del self.step.run
        cls.client_update = update
    elif h:
        orig_update = cls.client_update

        def update(self, model, down, data, ctx, _o=orig_update):
            up, st = _o(self, model, down, data, ctx)
            if ctx.cid < h:
                up = {k: down[k] + s * (v - down[k]) if k in down and torch.is_tensor(v) else v for k, v in up.items()}
            return up, st
        cls.client_update = update
    from lightfed import provenance
    try:
        with provenance.Trace() as tr:
            out = local.run(cfg, log=lambda *a: None)
        out["label"] = label
        out["bench"] = common.record(c, tr.fingerprint())               # the run's full config, hostility included
        print(f"[bench] done {label}: {out['initial']:.4f} -> {out['final']:.4f}", file=sys.stderr, flush=True)
        return out
    except Exception as e:  # noqa: BLE001
        return {"label": label, "error": repr(e), "config": c}


def part_runs(kind: str, seeds, workers, finished_only: bool = False) -> dict:
    if kind == "dp":                     # stage 1 fixes each method's clip from its clean runs' update norms
        clean = part_runs("dp_clean", seeds, workers, finished_only)
        norms = {m: [x for k, r in clean["rows"].items() if k.startswith(m + "|") for x in r.get("norms", [])] for m in DP_METHODS}
        clips = {m: float(f"{np.median(v):.2g}") for m, v in norms.items() if v}
        out = _runs(kind, runs_grid(kind, seeds, clips), workers, finished_only)
        out["rows"] = {**clean["rows"], **out["rows"]}
        out["clips"] = {m: {"C": clips.get(m), "median_norm": float(np.median(v)) if v else None, "norms": len(v)}
                        for m, v in norms.items()}
        out["markdown"] = _runs_md(kind, out["rows"], out["clips"])
        return out
    return _runs(kind, runs_grid(kind, seeds), workers, finished_only, probes(seeds) if kind == "hostile" else [])


def _runs(kind: str, g, workers, finished_only: bool, starts=()) -> dict:
    sums = common.chained(list(starts), g, workers, finished_only, runner=_hostile_one if kind == "hostile" else None,
                          fresh_process=kind == "hostile")[1]
    rows = {}
    for (label, c), s in zip(g, sums):
        key = label.rsplit("|", 1)[0].split("|", 1)[1]
        r = rows.setdefault(key, {"finals": [], "initial": [], "errors": [], "eps": [], "history": [], "dropped": []})
        if "error" in s:
            r["errors"].append(s["error"])
            continue
        r["finals"].append(s["final"])
        r["initial"].append(s["initial"])
        r["history"].append(s["history"])
        if s.get("dp"):
            r["eps"].append(s["dp"].get("epsilon"))
        r["dropped"].append(sum(len(v) for v in (s.get("dropped_by_round") or {}).values()))
        if kind in ("dp", "dp_clean") and c.get("dp_clip"):   # the clients' update norms before clipping (privacy.clip)
            cl = [x for rec in common.records(s["out"]) for x in rec.get("clients", [])]
            r.setdefault("norms", []).extend(x["dp_norm"] for x in cl if "dp_norm" in x)
            r.setdefault("clipped", []).extend(bool(x["dp_clipped"]) for x in cl if "dp_clipped" in x)
    for r in rows.values():
        f = np.array(r["finals"]) if r["finals"] else np.array([np.nan])
        r["mean"], r["std"], r["n"] = float(f.mean()), float(f.std(ddof=1)) if len(f) > 1 else 0.0, len(r["finals"])
    return {"task": "sentiment", "task_options": TASK, "base": BASE, "methods": METHODS,
            "seeds": sorted({c["seed"] for _, c in g}), "rows": rows, "markdown": _runs_md(kind, rows)}


def _runs_md(kind: str, rows: dict, clips: dict | None = None) -> str:
    title = {"dp": "Differential privacy: accuracy vs epsilon", "dropout": "Dropouts and stragglers",
             "hostile": "Hostile clients (0, 1, 2 of 10)", "dp_clean": "Clean runs"}[kind]
    L = [f"## {title}\n", f"sentiment (real MiniLM), {BASE['clients']} clients, {BASE['rounds']} rounds x "
         f"{BASE['local_steps']} steps, {TASK['test_size']} test tweets; mean +- std over seeds.\n",
         "| setting | round 0 | final accuracy | seeds | per seed" + {"dp": " | epsilon (delta 1e-5) | uploads clipped | "
                                                                       "change vs its own clean run (pp, per seed) |",
                                                                 "dropout": " | dropped clients (total, mean over seeds) |"}.get(kind, " |"),
         "|---|---|---|---|---|" + {"dp": "---|---|---|", "dropout": "---|"}.get(kind, "")]
    if kind == "hostile":
        L.insert(2, "Hostile clients are clients 0..h-1 (sampled every round: fraction 1). FedAvg and FLITE start from the "
                    "task's random head; FedSPZO (the last two layers, split 1) from the federated probe's head. "
                    "Aggregate: `robust = mean` (the weighted mean) or `median` (coordinate-wise; per step for ZO "
                    "scalars).\n")
    clean = {k.split("|")[0]: r for k, r in rows.items() if k.endswith("|clean")}

    def delta(k, r):                     # per seed, against the same seed's clean run of the same method
        c = clean.get(k.split("|")[0])
        return [a - b for a, b in zip(r["finals"], c["finals"])] if c and len(c["finals"]) == len(r["finals"]) else []
    if kind == "dp":
        notes = [f"The clip of each method was fixed before any DP run from its clean runs' update norms (the median, "
                 f"2 significant digits; a clip of {NEVER_BINDS:g} that never binds records them), never from test "
                 "accuracy: " + "; ".join(f"{m}: median norm {c['median_norm']:.3f} over {c['norms']} uploads -> C = {c['C']:g}"
                                          for m, c in (clips or {}).items() if c["C"]) + ".\n"]
        by_eps: dict = {}
        for k, r in rows.items():
            if r["eps"] and r["eps"][0] is not None and r["n"]:
                by_eps.setdefault(round(r["eps"][0], 2), {})[k.split("|")[0]] = (k, r)
        for e, ms_ in sorted(by_eps.items()):
            if {"FLITE", "FedAvg+LoRA"} <= set(ms_):
                (kf, f), (kl, lo) = ms_["FLITE"], ms_["FedAvg+LoRA"]
                df, dl = delta(kf, f), delta(kl, lo)
                notes.append(f"- epsilon {e:g}: accuracy FLITE {f['mean']:.3f} vs FedAvg+LoRA {lo['mean']:.3f}: FLITE higher "
                             f"**{verdict(f['finals'], lo['finals'], a_lower=False)}**; change vs its own clean run FLITE "
                             f"{100 * np.mean(df):+.1f} pp vs FedAvg+LoRA {100 * np.mean(dl):+.1f} pp: FLITE loses less "
                             f"**{verdict(df, dl, a_lower=False) if df and dl else 'not judged'}**")
        L[2:2] = notes + ["", "Epsilon depends on the noise multiplier, the sampling rate and the rounds only, the same for "
                                "both methods; what differs is the accuracy the noise leaves, and each method's clean accuracy "
                                "differs too (FedAvg+LoRA's clean run is the weaker), so both columns are given.\n"]
    for k, r in rows.items():
        eps = "–" if not r["eps"] else ("inf (clip only)" if r["eps"][0] is None else f"{r['eps'][0]:.2f}")
        init = f"{np.mean(r['initial']):.3f}" if r["initial"] else "–"
        seeds = ", ".join(f"{x:.3f}" for x in r["finals"]) + (f"; {len(r['errors'])} failed" if r["errors"] else "")
        clipped = f"{np.mean(r['clipped']):.0%}" if r.get("clipped") else "–"
        d = delta(k, r) if not k.endswith("|clean") else []
        dd = (f"{100 * np.mean(d):+.1f} ({', '.join(f'{100 * x:+.1f}' for x in d)})" if d else "–")
        extra = {"dp": f" {eps} | {clipped} | {dd} |", "dropout": f" {np.mean(r['dropped']) if r['dropped'] else 0:.0f} |"}.get(kind, "")
        L.append(f"| {k.replace('|', ' / ')} | {init} | {r['mean']:.4f} +- {r['std']:.4f} | {r['n']} | {seeds} |{extra}")
    return "\n".join(L)


if __name__ == "__main__":
    main()
