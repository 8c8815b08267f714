"""Tables and plots of run summaries."""
from __future__ import annotations

from pathlib import Path


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
        rows.append({"task": s["task"], "method": s["method"], s["metric"]: f"{s['initial']:.4f} -> {s['final']:.4f}",
                     "up / client / round": human_bytes(b["up_per_client_round"]),
                     "down / client / round": human_bytes(b["down_per_client_round"]),
                     "trainable": f"{s['trainable_params']:,}",
                     "client peak RSS": human_bytes(m["client_rss_peak_bytes"]),
                     "client GFLOPs / round": f"{(s['flops']['per_client_round'] or 0) / 1e9:.1f}"})
    ref = next((s for s in summaries if s["method"] == "fedavg"), None)
    if ref is not None and len(summaries) > 1:   # how many times less each method uploads than FedAvg
        for r, s in zip(rows, summaries):
            r["upload vs FedAvg"] = f"{ref['bytes']['up_per_client_round'] / s['bytes']['up_per_client_round']:,.0f}x smaller"
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
