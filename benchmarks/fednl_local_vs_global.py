"""FedNL passkey grid, seed 2: is the model the clients receive below what local training reaches because of the
average, or because each client fits its own streams? From the final global model, run one more round for clients 1
and 3 (the last round's, the protocol's own client_round), and score on each client's own training streams and on the
other clients' streams: (a) the global model, (b) each client's local model, (c) the average of the two uploads.

    python benchmarks/fednl_local_vs_global.py      # ~10 min, one thread; results/fednl_local_vs_global.{json,md}
"""
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import fednl_retrieval as R  # noqa: E402
from lightfed import config as C, device
from lightfed.data.tensors import subset
from lightfed.engine import local, protocol as P
from lightfed.engine.local import derive_seed
from lightfed.methods.base import ClientContext
from lightfed.wire import decode

torch.set_num_threads(1)
RUN, ROUND, CLIENTS = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/fednl_retrieval/fednl-s2"), 11, (1, 3)
cfg = C.load_json(RUN / "config.json")
S = local.build(cfg)
rnd, state, _, _ = local.load_checkpoint(RUN)
M, model, T = S.method, S.model, S.task


def exact(fields, idx) -> float:
    M.load(model, fields)
    model.eval()
    ss = subset(T.train, idx)
    with device.using("cpu", cfg.dtype):
        hits = R.digit_hits(model, ss["input_ids"], ss["target_mask"], cfg.task_options.get("window", 64))
    return hits.all(1).float().mean().item()


down = P.broadcast(M, state, ROUND, None)
models = {"global (what the clients receive)": P.received(M, state, ROUND, cfg.max_message_bytes)}
ups, losses = [], {}
for cid in CLIENTS:
    ctx = ClientContext(cid, ROUND, derive_seed(cfg.seed, ROUND, cid), cfg, T.loss, {})
    up, stats = P.client_round(M, model, down, subset(T.train, S.shards[cid]), ctx, cfg.max_message_bytes)
    ups.append((cid, up))
    f = decode(up, P.up_schema(M), kind=f"{M.name}/up", max_bytes=cfg.max_message_bytes)
    models[f"client {cid}'s local model"] = {k: v for k, v in f.items() if k != P.EXAMPLES}
    losses[cid] = stats["train_loss"]
new, _ = P.aggregate(M, state, ups, ROUND, max_bytes=cfg.max_message_bytes)
models["the average of the two (the next global model)"] = P.received(M, new, ROUND + 1, cfg.max_message_bytes)
others = [i for c in range(cfg.clients) if c not in CLIENTS for i in S.shards[c]][:64]
sets = {f"client {c}'s streams": S.shards[c] for c in CLIENTS} | {"the other clients' streams (64)": others}
res = {"run": str(RUN), "round": ROUND, "clients": list(CLIENTS), "local_train_loss": losses,
       "exact_match": {m: {k: exact(f, idx) for k, idx in sets.items()} for m, f in models.items()}}
for m, r in res["exact_match"].items():
    print(m, r, flush=True)
out = Path("benchmarks/results/fednl_local_vs_global")
out.with_suffix(".json").write_text(json.dumps(res, indent=1))
L = ["# FedNL passkey, seed 2: local models against their average (training streams, 4 chunks)\n",
     f"Command: `python benchmarks/fednl_local_vs_global.py`. From {RUN}'s final global model, one more round ({ROUND}) "
     f"by clients {CLIENTS} through the protocol (20 steps each, local train loss per digit {losses}); exact match of "
     "the 7 digits, teacher forced, bf16.\n", "| model | " + " | ".join(sets) + " |", "|---|" + "---|" * len(sets)]
L += [f"| {m} | " + " | ".join(f"{r[k]:.3f}" for k in sets) + " |" for m, r in res["exact_match"].items()]
out.with_suffix(".md").write_text("\n".join(L) + "\n")
