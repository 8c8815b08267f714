"""Are two results folders the same run? (final state bit for bit, metrics, bytes per client and round)"""
from __future__ import annotations

import json
from pathlib import Path

MEASURED = ("rss_peak", "rss_rise", "flower")      # per-client fields that are measurements, not results


def compare(a: str | Path, b: str | Path) -> list[str]:
    """Differences between two results folders: final global state (bit for bit), metric history, and
    per round: sampled clients, their byte counts and stats, accepted / refused. [] = the same run."""
    import torch
    from safetensors.torch import load_file

    def final_state(d: Path):
        meta = json.loads((d / "ckpt" / "latest.json").read_text())
        return load_file(d / "ckpt" / meta["dir"] / "state.safetensors")

    a, b = Path(a), Path(b)
    diffs = []
    sa, sb = final_state(a), final_state(b)
    if sa.keys() != sb.keys() or not all(torch.equal(sa[k], sb[k]) for k in sa):
        diffs.append("final global state differs")
    ra = [json.loads(l) for l in (a / "metrics.jsonl").read_text().splitlines()]
    rb = [json.loads(l) for l in (b / "metrics.jsonl").read_text().splitlines()]
    if len(ra) != len(rb):
        return diffs + [f"{len(ra)} vs {len(rb)} rounds recorded"]
    metric = json.loads((a / "summary.json").read_text())["metric"]
    for x, y in zip(ra, rb):
        r = x["round"]
        if x.get(metric) != y.get(metric):
            diffs.append(f"round {r}: {metric} {x.get(metric)} vs {y.get(metric)}")
        if r == 0:
            continue
        cx = {c["id"]: {k: v for k, v in c.items() if k not in MEASURED} for c in x["clients"]}
        cy = {c["id"]: {k: v for k, v in c.items() if k not in MEASURED} for c in y["clients"]}
        if cx.keys() != cy.keys():
            diffs.append(f"round {r}: clients {sorted(cx)} vs {sorted(cy)}")
        for cid in sorted(cx.keys() & cy.keys()):
            for k in ("up", "down"):
                if cx[cid][k] != cy[cid][k]:
                    diffs.append(f"round {r}: client {cid}: {k} {cx[cid][k]} vs {cy[cid][k]} bytes")
            if {k: v for k, v in cx[cid].items() if k not in ("up", "down")} != \
                    {k: v for k, v in cy[cid].items() if k not in ("up", "down")}:
                diffs.append(f"round {r}: client {cid}: stats differ")
        if x["accepted"] != y["accepted"] or [e["id"] for e in x["rejected"]] != [e["id"] for e in y["rejected"]]:
            diffs.append(f"round {r}: accepted/refused differ")
    return diffs
