r"""lightfed's command line.

    lightfed run                      the main job: a short real federated fine-tuning on `sentiment`
    lightfed run --task T --method M1,M2 --clients 10 --rounds 5 --partition dirichlet:0.1 \
                 --opt mu=0.01 --task-opt train_size=2000 --set lr=1e-4 --out runs/x
    lightfed run --config run.toml    (flags given as well override the file)
    lightfed run --resume runs/x      continue an interrupted run to the same final result
    lightfed run --engine flower-sim  the same run on Flower's Simulation Engine (docs/flower.md)
    lightfed list                     tasks and methods with their options
    lightfed pretrain fmnist          build lightfed's own Fashion-MNIST base (cached)
    lightfed export runs/x --to DIR   the final model as a folder (transformers loads it; FedNL: + its memory rules)
    lightfed ask DIR --file long.txt "What is the pass key? The pass key is"     a causal LM (FedNL: any length)
    lightfed predict DIR --file texts.csv             a classifier: one label per text
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from lightfed import config as C
from lightfed.assets import AssetMissing

# The main job: small enough for a few minutes on 2 cores, real model and data.
MAIN_JOB = {"task": "sentiment", "clients": 10, "rounds": 3, "fraction": 0.3, "batch_size": 16,   # each method at its lr
            "local_epochs": 1.0, "task_options": {"train_size": 1000, "test_size": 500, "max_len": 32}}
MAIN_METHODS = ["flite", "fedavg"]   # FLITE vs full-weight FedAvg, side by side


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lightfed", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run a federation (no arguments: the main job)")
    r.add_argument("--task")
    r.add_argument("--method", help="a method, or several separated by commas (run one after another)")
    r.add_argument("--clients", type=int)
    r.add_argument("--rounds", type=int)
    r.add_argument("--partition", help="iid | dirichlet:ALPHA | domain")
    r.add_argument("--seed", type=int)
    r.add_argument("--out", help="results folder (several methods: one sub-folder each)")
    r.add_argument("--config", help="a TOML file of run settings")
    r.add_argument("--resume", help="a results folder of an interrupted run")
    r.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE", help="a method option")
    r.add_argument("--task-opt", action="append", default=[], metavar="KEY=VALUE", help="a task option")
    r.add_argument("--data", metavar="FILE", help="your own data: task option data=FILE (textclf: a .csv/.jsonl/.parquet; "
                   "austen: a folder of .txt); without --task, textclf")
    r.add_argument("--model", metavar="PATH", help="your own local Hugging Face model folder (or .gguf file): task option model=PATH")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="any other run setting, e.g. lr=1e-4")
    r.add_argument("--no-progress", action="store_true")
    r.add_argument("--engine", choices=["local", "flower-sim"], default="local",
                   help="local: in-process (default); flower-sim: Flower's Simulation Engine, same bytes and result")
    rp = sub.add_parser("report", help="table, plots (PNG) and one self-contained HTML page of finished runs")
    rp.add_argument("runs", nargs="+", metavar="RUN_DIR")
    rp.add_argument("--out", help="folder for the plots (default: RUN_DIR/report of the first run)")
    rp.add_argument("--html", help="the HTML page (default: <out>/report.html)")
    ex = sub.add_parser("export", help="the run's final global model as a folder transformers loads (from_pretrained)")
    ex.add_argument("run", metavar="RUN_DIR")
    ex.add_argument("--to", required=True, metavar="DIR")
    ex.add_argument("--adapter", action="store_true", help="LoRA-family runs: write the adapters alone (PEFT layout)")
    ex.add_argument("--client", type=int, metavar="K", help="personalised runs (fedala, local): client K's own model")
    ex.add_argument("--set", action="append", default=[], metavar="device=D",
                    help="where the model is rebuilt to be written (default cpu, whatever device the run recorded)")
    ex.add_argument("--base-ref", action="store_true",
                    help="fednl: do not copy the base model; lightfed.json names the local folder it came from")
    ak = sub.add_parser("ask", help="ask a trained causal LM (an export or a run folder) a question about a text")
    ak.add_argument("model", metavar="DIR", help="a folder `lightfed export` wrote, or a finished run's folder")
    ak.add_argument("question", help="asked after the text; the model's greedy answer is printed")
    ak.add_argument("--file", help="the text (UTF-8, any length); without it, --text")
    ak.add_argument("--text", default="", help="the text itself")
    ak.add_argument("--window", type=int, help="tokens a chunk (default: the model's own; 0: all at once)")
    ak.add_argument("--max-new", type=int, default=32, help="the most tokens the answer takes")
    ak.add_argument("--reset", action="store_true", help="empty the memory at every chunk (the control)")
    ak.add_argument("--device", default="cpu")
    pr = sub.add_parser("predict", help="label texts with a trained classifier (an export or a run folder)")
    pr.add_argument("model", metavar="DIR")
    pr.add_argument("--file", required=True, help="a .txt file (one text a line) or a .csv/.jsonl/.parquet table")
    pr.add_argument("--column", default="text", help="a table's text column")
    pr.add_argument("--out", help="write a CSV (text, label) there instead of printing labels")
    pr.add_argument("--device", default="cpu")
    sub.add_parser("list", help="tasks and methods with their options")
    ck = sub.add_parser("check", help="every method, zeroth-order replay, FedNL streaming and speed on a device (no asset)")
    ck.add_argument("--device", default="cuda")
    ck.add_argument("--lengths", default="1024,2048,4096,8192,16384", help="FedNL streaming lengths (tokens)")
    ck.add_argument("--cpu-tokens", type=int, default=256, help="the CPU's batch length in the speed part")
    ck.add_argument("--parts", default="methods,replay,stream,speed")
    ck.add_argument("--out", default="gpu_check", help="folder of gpu_check.{json,md}")
    pt = sub.add_parser("pretrain", help="pretrain lightfed's own base for a task (fmnist)")
    pt.add_argument("task", choices=["fmnist"])
    pt.add_argument("--arch", default="resnet18", help="resnet18 (FLITE's paper scale, ~11M weights) | small")
    pt.add_argument("--epochs", type=int, default=0, help="0: the arch's default")
    pt.add_argument("--head", default="trained", help="trained (a 5-way head trained with the body) | orthogonal (a "
                    "frozen orthogonal 10-way head, rows 0-4 in pretraining: --task-opt base_head=orthogonal uses it)")
    return p


def build_configs(a: argparse.Namespace) -> list[C.RunConfig]:
    """Flags -> validated configs (one per method). Everything is checked before any work."""
    from lightfed.engine import local

    plain = not any([a.task, a.method, a.clients, a.rounds, a.partition, a.config, a.opt, a.task_opt, a.set, a.model,
                     a.data])           # --seed, --out and --no-progress keep the main job
    cfg = C.from_dict(MAIN_JOB) if plain else C.RunConfig()
    if a.config:
        cfg = C.load_toml(a.config, cfg)
    over = {k: v for k, v in {"task": a.task or ("textclf" if a.data and not a.config else None), "clients": a.clients,
                              "rounds": a.rounds, "partition": a.partition, "seed": a.seed}.items() if v is not None}
    over.update(dict(C.parse_assignment(s) for s in a.set))
    cfg = C.from_dict(over, cfg)
    cfg.method_options = {**cfg.method_options, **dict(C.parse_assignment(s) for s in a.opt)}
    cfg.task_options = {**cfg.task_options, **dict(C.parse_assignment(s) for s in a.task_opt),
                        **({"model": a.model} if a.model else {}), **({"data": a.data} if a.data else {})}
    if a.no_progress:
        cfg.progress = False
    names = a.method.split(",") if a.method else (MAIN_METHODS if plain else [cfg.method])
    out = []
    for m in names:
        c = dataclasses.replace(cfg, method=m.strip(), method_options=dict(cfg.method_options))
        base = a.out or cfg.out
        if base:
            c.out = str(Path(base) / c.method) if len(names) > 1 else base
        local.check(c)
        out.append(c)
    return out


def resume_config(a: argparse.Namespace) -> C.RunConfig:
    """--resume DIR: the run in DIR as it was configured; --rounds N continues it to N rounds, --set device=... computes
    elsewhere; any other flag would be ignored, so it is refused."""
    from lightfed.engine import local
    sets = dict(C.parse_assignment(x) for x in a.set)
    ignored = [flag for flag, given in (("--task", a.task), ("--method", a.method), ("--clients", a.clients),
                                        ("--partition", a.partition), ("--seed", a.seed is not None), ("--out", a.out),
                                        ("--config", a.config), ("--opt", a.opt), ("--task-opt", a.task_opt),
                                        ("--data", a.data), ("--model", a.model)) if given]
    ignored += [f"--set {k}" for k in sets if k != "device"]
    if ignored:
        raise C.ConfigError(f"--resume {a.resume}: {', '.join(ignored)} would be ignored: a resumed run keeps its own "
                            "config (DIR/config.json); with --resume give only --rounds N (continue to N rounds), "
                            "--set device=..., --engine or --no-progress")
    if "device" in sets and not isinstance(sets["device"], str):
        raise C.ConfigError(f"device = {sets['device']!r}: expected a string")
    cfg = local.resume_config(a.resume, a.rounds, sets.get("device"))
    if a.no_progress:
        cfg.progress = False
    try:
        local.check(cfg)
    except C.ConfigError as e:
        if "device" in str(e) and "device" not in sets:
            raise C.ConfigError(f"{e}. The run was recorded with device = {cfg.device!r}: --resume {a.resume} --set "
                                "device=cpu (or auto) continues it on this machine") from None
        raise
    return cfg


def table(summaries: list[dict]) -> str:
    from lightfed.report import results_table
    return results_table(summaries)


def slow_bf16(cfg: C.RunConfig) -> str | None:
    """A warning where a run computes in bf16 on a CPU without native bf16 kernels (no AVX-512: matmuls fall back to a
    generic loop, measured ~5x slower than fp32 on an AVX2 EPYC); the user's setting stands."""
    import torch
    from lightfed import device
    cap = torch.backends.cpu.get_cpu_capability()
    if cfg.dtype == "bf16" and device.resolve(cfg.device).type == "cpu" and not cap.startswith("AVX512"):
        return (f"lightfed: warning: dtype = bf16 on this CPU ({cap}: no native bf16 matmul) runs several times slower "
                "than fp32; --set dtype=fp32 computes the same model faster here")
    return None


def warn_slow_bf16(cfgs: list[C.RunConfig]) -> None:
    """slow_bf16's warning on stderr, once however many of the runs it concerns."""
    for w in {slow_bf16(c) for c in cfgs} - {None}:
        print(w, file=sys.stderr, flush=True)


def cmd_run(a) -> int:
    from lightfed.engine import local
    from lightfed.engine.lock import hold

    if a.resume:
        cfg = resume_config(a)
        warn_slow_bf16([cfg])
        with hold(a.resume):                 # refused while another process runs in that folder
            if a.engine == "flower-sim":
                from lightfed.engine import flower_app
                s = flower_app.run_simulation(cfg, resume=True)
            else:
                s = local.run(cfg, resume=a.resume)
        print(table([s]))
        return 0
    cfgs = build_configs(a)
    warn_slow_bf16(cfgs)
    if a.engine == "flower-sim":
        from lightfed.engine import flower_app
        for c in cfgs:
            flower_app.options(c)          # engine_options, checked before any work
    summaries = []
    for c in cfgs:
        print(f"lightfed: {c.task} / {c.method}: {c.clients} clients, {c.rounds} rounds, partition {c.partition}",
              file=sys.stderr)
        with hold(c.out):
            summaries.append(flower_app.run_simulation(c) if a.engine == "flower-sim" else local.run(c))
        print(f"lightfed: results in {summaries[-1]['out']}", file=sys.stderr)
    print(table(summaries))
    if len({s["metric"] for s in summaries}) == 1:
        from lightfed.report import make_report
        first = Path(summaries[0]["out"])
        r = make_report([s["out"] for s in summaries], (first.parent if len(summaries) > 1 else first) / "report")
        print(f"lightfed: report: {r['html']}", file=sys.stderr)
    return 0


def cmd_ask(a) -> int:
    from lightfed.trained import LM, load
    if bool(a.file) == bool(a.text):
        raise C.ConfigError("ask: give the text with --file PATH or --text TEXT (one of them)")
    m = load(a.model, a.device)
    if not isinstance(m, LM):
        raise C.ConfigError(f"ask: {a.model} is a classifier; use `lightfed predict {a.model} --file ...`")
    text = Path(a.file) if a.file else a.text
    if a.file and not Path(a.file).is_file():
        raise C.ConfigError(f"ask: --file {a.file!r}: no such file")
    print(m.ask(text, a.question, window=a.window, max_new=a.max_new, reset=a.reset))
    return 0


def cmd_predict(a) -> int:
    import csv
    from lightfed.data.user import read_table
    from lightfed.trained import Classifier, load
    p = Path(a.file)
    if p.suffix == ".txt":
        if not p.is_file():
            raise C.ConfigError(f"predict: --file {a.file!r}: no such file")
        texts = [x for x in p.read_text(encoding="utf-8").splitlines() if x.strip()]
    else:
        texts = [str(x) for x in read_table(p, [a.column])[a.column]]
    m = load(a.model, a.device)
    if not isinstance(m, Classifier):
        raise C.ConfigError(f"predict: {a.model} is a causal LM; use `lightfed ask {a.model} ...`")
    labels = m.predict(texts)
    if a.out:
        with open(a.out, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["text", "label"])
            w.writerows(zip(texts, labels))
        print(f"lightfed: {len(texts)} texts labelled in {a.out}", file=sys.stderr)
    else:
        print("\n".join(map(str, labels)))
    return 0


def cmd_list() -> int:
    from lightfed import methods, tasks

    def opts(cls):
        return ", ".join(f"{f.name}={getattr(cls(), f.name)!r}" for f in dataclasses.fields(cls)) or "(no options)"

    print("tasks:")
    for name, t in tasks.TASKS.items():
        print(f"  {name:10s} {opts(t.Options)}")
    print("methods:")
    for name, m in methods.METHODS.items():
        decay = (f", lr_decay {m.lr_decay}" if m.lr_decay != "none" else "") + (
            "; fp32 only (zeroth order: bf16 rounds its loss differences away), no optimizer setting" if m.zeroth_order
            else "" if m.optimizer else "; no optimizer setting")
        print(f"  {name:14s} {f'lr {m.lr:g}' if m.lr else 'no lr (closed form)'}{decay}; {opts(m.Options)}")
        if getattr(m, "defaults_why", ""):
            print(f"  {'':14s} ({m.defaults_why})")
    print("partitions: iid | dirichlet:ALPHA | domain (trivia: subject groups; austen: novels)")
    print("lr: each method's recommended lr, used when the run sets none (lr = 0); --set lr=X always wins; likewise "
          "lr_decay (none unless shown; --set lr_decay=none|cosine) and optimizer (adamw unless shown; --set "
          "optimizer=adamw|sgd); a setting a method cannot honour is refused")
    print("run settings (--set KEY=VALUE):", ", ".join(f"{k}={v!r}" for k, v in C.RunConfig().to_dict().items()
                                                       if k not in ("method_options", "task_options", "engine_options")))
    return 0


def main(argv=None) -> int:
    a = _parser().parse_args(argv)
    try:
        if a.cmd == "run":
            return cmd_run(a)
        if a.cmd == "list":
            return cmd_list()
        if a.cmd == "check":
            from lightfed import devicecheck
            print(devicecheck.run(a.device, [int(x) for x in a.lengths.split(",")], a.cpu_tokens, a.parts.split(","),
                                  a.out, "lightfed " + " ".join(sys.argv[1:] if argv is None else argv)))
            return 0
        if a.cmd == "export":
            from lightfed.export import export
            sets = dict(C.parse_assignment(x) for x in a.set)
            if set(sets) - {"device"}:
                raise C.ConfigError(f"export: --set {', '.join(sorted(set(sets) - {'device'}))}: only device=... can be set; "
                                    "the rest is the run's")
            r = export(a.run, a.to, a.adapter, a.client, device=str(sets.get("device", "cpu")), base_ref=a.base_ref)
            print(f"lightfed: exported the {r['model']} model ({r['kind']}) to {r['dir']}", file=sys.stderr)
            return 0
        if a.cmd == "ask":
            return cmd_ask(a)
        if a.cmd == "predict":
            return cmd_predict(a)
        if a.cmd == "report":
            from lightfed.report import make_report
            r = make_report(a.runs, a.out or Path(a.runs[0]) / "report", a.html)
            print(r["table"])
            print(f"lightfed: report: {r['html']} (plots: {', '.join(r['images'])})", file=sys.stderr)
            return 0
        if a.cmd == "pretrain":
            from lightfed.tasks import fmnist
            fmnist.Options(arch=a.arch, pretrain_epochs=a.epochs, base_head=a.head).check()
            epochs = a.epochs or fmnist.ARCHS[a.arch][3]
            fmnist.pretrained_base(a.arch, epochs, head=a.head)
            print(json.dumps(fmnist.base_report(a.arch, epochs, head=a.head), indent=1))
            return 0
    except (C.ConfigError, AssetMissing) as e:
        print(f"lightfed: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
