r"""lightfed's command line.

    lightfed run                      the main job: a short real federated fine-tuning on `sentiment`
    lightfed run --task T --method M1,M2 --clients 10 --rounds 5 --partition dirichlet:0.1 \
                 --opt mu=0.01 --task-opt train_size=2000 --set lr=1e-4 --out runs/x
    lightfed run --config run.toml    (flags given as well override the file)
    lightfed run --resume runs/x      continue an interrupted run to the same final result
    lightfed run --engine flower-sim  the same run on Flower's Simulation Engine (docs/flower.md)
    lightfed list                     tasks and methods with their options
    lightfed pretrain fmnist          build lightfed's own Fashion-MNIST base (cached)
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
    sub.add_parser("list", help="tasks and methods with their options")
    pt = sub.add_parser("pretrain", help="pretrain lightfed's own base for a task (fmnist)")
    pt.add_argument("task", choices=["fmnist"])
    pt.add_argument("--arch", default="resnet18", help="resnet18 (FLITE's paper scale, ~11M weights) | small")
    pt.add_argument("--epochs", type=int, default=0, help="0: the arch's default")
    return p


def build_configs(a: argparse.Namespace) -> list[C.RunConfig]:
    """Flags -> validated configs (one per method). Everything is checked before any work."""
    from lightfed.engine import local

    plain = not any([a.task, a.method, a.clients, a.rounds, a.partition, a.seed is not None, a.config, a.opt,
                     a.task_opt, a.set, a.model, a.data])
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
    cfg.progress = not a.no_progress
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


def table(summaries: list[dict]) -> str:
    from lightfed.report import results_table
    return results_table(summaries)


def cmd_run(a) -> int:
    from lightfed.engine import local

    if a.resume:
        if a.engine == "flower-sim":
            from lightfed.engine import flower_app
            if not (Path(a.resume) / "config.json").is_file():
                raise C.ConfigError(f"--resume {a.resume!r}: no config.json there")
            s = flower_app.run_simulation(C.load_json(Path(a.resume) / "config.json"), resume=True)
        else:
            s = local.run(resume=a.resume)
        print(table([s]))
        return 0
    cfgs = build_configs(a)
    if a.engine == "flower-sim":
        from lightfed.engine import flower_app
        for c in cfgs:
            flower_app.options(c)          # engine_options, checked before any work
    summaries = []
    for c in cfgs:
        print(f"lightfed: {c.task} / {c.method}: {c.clients} clients, {c.rounds} rounds, partition {c.partition}",
              file=sys.stderr)
        if a.engine == "flower-sim":
            summaries.append(flower_app.run_simulation(c))
        else:
            summaries.append(local.run(c))
        print(f"lightfed: results in {summaries[-1]['out']}", file=sys.stderr)
    print(table(summaries))
    if len({s["metric"] for s in summaries}) == 1:
        from lightfed.report import make_report
        first = Path(summaries[0]["out"])
        r = make_report([s["out"] for s in summaries], (first.parent if len(summaries) > 1 else first) / "report")
        print(f"lightfed: report: {r['html']}", file=sys.stderr)
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
        decay = f", lr_decay {m.lr_decay}" if m.lr_decay != "none" else ""
        print(f"  {name:14s} {f'lr {m.lr:g}' if m.lr else 'no lr (closed form)'}{decay}; {opts(m.Options)}")
        if getattr(m, "defaults_why", ""):
            print(f"  {'':14s} ({m.defaults_why})")
    print("partitions: iid | dirichlet:ALPHA | domain (trivia: subject groups; austen: novels)")
    print("lr: each method's recommended lr, used when the run sets none (lr = 0); --set lr=X always wins; likewise "
          "lr_decay (none unless shown; --set lr_decay=none|cosine)")
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
        if a.cmd == "export":
            from lightfed.export import export
            r = export(a.run, a.to, a.adapter, a.client)
            print(f"lightfed: exported the {r['model']} model ({r['kind']}) to {r['dir']}", file=sys.stderr)
            return 0
        if a.cmd == "report":
            from lightfed.report import make_report
            r = make_report(a.runs, a.out or Path(a.runs[0]) / "report", a.html)
            print(r["table"])
            print(f"lightfed: report: {r['html']} (plots: {', '.join(r['images'])})", file=sys.stderr)
            return 0
        if a.cmd == "pretrain":
            from lightfed.tasks import fmnist
            fmnist.Options(arch=a.arch, pretrain_epochs=a.epochs).check()
            epochs = a.epochs or fmnist.ARCHS[a.arch][3]
            fmnist.pretrained_base(a.arch, epochs)
            print(json.dumps(fmnist.base_report(a.arch, epochs), indent=1))
            return 0
    except (C.ConfigError, AssetMissing) as e:
        print(f"lightfed: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
