"""Tables and plots of run summaries; `lightfed report RUN_DIR ...`: PNG plots + one self-contained HTML page."""
from __future__ import annotations

import base64
import html
import json
from pathlib import Path

from lightfed.config import ConfigError


def human_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n:.2f} GB"


def markdown(rows: list[dict], columns: list[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def results_table(summaries: list[dict]) -> str:
    """method | metric initial -> final | bytes up / down per client per round | memory | FLOPs."""
    rows = []
    for s in summaries:
        b, m = s["bytes"], s["memory"]
        rows.append({"task": s["task"], "method": s["method"], s["metric"]: f"{'-' if s['initial'] is None else format(s['initial'], '.4f')} -> {s['final']:.4f}",
                     "up / client / round": human_bytes(b["up_per_client_round"]),
                     "down / client / round": human_bytes(b["down_per_client_round"]),
                     "trainable": f"{s['trainable_params']:,}",
                     "client peak RSS": human_bytes(m["client_rss_peak_bytes"]),
                     "client GFLOPs / round": f"{(s['flops']['per_client_round'] or 0) / 1e9:.1f}"})
    ref = next((s for s in summaries if s["method"] == "fedavg"), None)
    if ref is not None and len(summaries) > 1:   # how many times less each method uploads than FedAvg
        for r, s in zip(rows, summaries):
            r["upload vs FedAvg"] = ("the reference" if s is ref else
                                     f"{ref['bytes']['up_per_client_round'] / s['bytes']['up_per_client_round']:,.0f}x smaller")
    cols = list(rows[0]) if rows else []
    return markdown(rows, cols)


def plot_history(summaries: list[dict], path: str | Path, title: str = "") -> None:
    """Metric against round, one line per run."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for s in summaries:
        h = s["history"]
        ax.plot([x["round"] for x in h], [x[s["metric"]] for x in h], marker="o", label=s.get("label", s["method"]))
    ax.set_xlabel("round")
    ax.set_ylabel(summaries[0]["metric"] if summaries else "")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --- lightfed report ------------------------------------------------------------------------------
def load_run(d: str | Path) -> tuple[dict, list[dict]]:
    """(summary.json, metrics.jsonl records) of a finished run folder; a clear error otherwise."""
    d = Path(d)
    if not (d / "summary.json").is_file() or not (d / "metrics.jsonl").is_file():
        raise ConfigError(f"{d}: not a finished run (needs summary.json and metrics.jsonl)")
    return json.loads((d / "summary.json").read_text()), [json.loads(l) for l in (d / "metrics.jsonl").read_text().splitlines()]


def curves(summary: dict, records: list[dict]) -> dict[str, list[float]]:
    """Per evaluated round: round, metric, cumulative uplink bytes and client FLOPs (all clients) up to it."""
    metric, out = summary["metric"], {"round": [], "metric": [], "up": [], "flops": []}
    up = flops = 0.0
    for r in records:
        up += sum(c["up"] for c in r.get("clients", []))
        flops += sum(c.get("flops", 0) for c in r.get("clients", []))
        if metric in r:
            for k, v in (("round", r["round"]), ("metric", r[metric]), ("up", up), ("flops", flops)):
                out[k].append(v)
    return out


def _label(s: dict) -> str:
    name = Path(s["out"]).name
    return s.get("label") or (s["method"] if name == s["method"] else f"{s['method']} ({name})")


def pareto(points: list[tuple[float, float]], higher_is_better: bool) -> list[tuple[float, float]]:
    """The points no other point beats on both bytes (fewer) and metric, sorted by bytes."""
    sign = 1 if higher_is_better else -1
    front, best = [], -float("inf")
    for b, m in sorted(points):
        if sign * m > best:
            front.append((b, m))
            best = sign * m
    return front


def plots(runs: list[tuple[dict, list[dict]]], out: Path) -> list[Path]:
    """metric vs round, vs cumulative uplink bytes, vs cumulative client FLOPs, and the bytes Pareto front."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    metric = runs[0][0]["metric"]
    hib = metric != "perplexity"
    paths = []
    for key, xlabel, name, logx in (("round", "round", "metric_vs_round", False),
                                    ("up", "cumulative uplink bytes (all clients)", "metric_vs_bytes", True),
                                    ("flops", "cumulative client FLOPs", "metric_vs_flops", True)):
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for s, rec in runs:
            c = curves(s, rec)
            pts = [(x, y) for x, y in zip(c[key], c["metric"]) if key == "round" or x > 0]   # log axes: no round 0
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=_label(s))
        ax.set(xlabel=xlabel, ylabel=metric, xscale="log" if logx else "linear")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        paths.append(out / f"{name}.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    pts = [(s["bytes"]["up_per_client_round"], s["final"]) for s, _ in runs]
    for (s, _), (b, m) in zip(runs, pts):
        ax.scatter([b], [m])
        ax.annotate(_label(s), (b, m), fontsize=8, xytext=(4, 4), textcoords="offset points")
    front = pareto(pts, hib)
    ax.plot([b for b, _ in front], [m for _, m in front], "k--", lw=1, label="Pareto front")
    ax.set(xlabel="uplink bytes per client per round", ylabel=f"final {metric}", xscale="log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(out / "pareto_bytes.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def html_page(runs: list[tuple[dict, list[dict]]], images: list[Path], title: str = "lightfed report") -> str:
    """One page, no network: the run table and every plot embedded as a data: URI."""
    summaries = [s for s, _ in runs]
    table_md = results_table(summaries).splitlines()
    head = [c.strip() for c in table_md[0].strip("|").split("|")]
    body = [[c.strip() for c in l.strip("|").split("|")] for l in table_md[2:]]
    rows = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in body)
    imgs = "".join(f'<figure><img alt="{p.stem}" src="data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()}">'
                   f"<figcaption>{p.stem.replace('_', ' ')}</figcaption></figure>" for p in images)
    runs_list = "".join(f"<li>{html.escape(_label(s))}: <code>{html.escape(str(s['out']))}</code></li>" for s in summaries)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>"
            "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #bbb;"
            "padding:4px 8px}figure{display:inline-block;margin:1em}img{max-width:640px}</style></head><body>"
            f"<h1>{html.escape(title)}</h1><table><tr>{''.join(f'<th>{html.escape(h)}</th>' for h in head)}</tr>{rows}"
            f"</table><h2>Plots</h2>{imgs}<h2>Runs</h2><ul>{runs_list}</ul></body></html>")


def make_report(dirs: list[str | Path], out: str | Path, html_file: str | Path | None = None) -> dict:
    """Table (returned as markdown), PNG plots in `out`, and the HTML page (default out/report.html)."""
    runs = [load_run(d) for d in dirs]
    if len({s["metric"] for s, _ in runs}) > 1:
        raise ConfigError(f"runs measure different metrics {sorted({s['metric'] for s, _ in runs})}: report one task at a time")
    out = Path(out)
    images = plots(runs, out)
    page = Path(html_file) if html_file else out / "report.html"
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(html_page(runs, images))
    return {"table": results_table([s for s, _ in runs]), "images": [str(p) for p in images], "html": str(page)}
