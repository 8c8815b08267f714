"""Why did FedNL's seed 2 in the passkey grid score below seeds 0 and 1? Score the final global model of seeds 2 and 0
(the model the clients receive) on (a) its own training streams, (b) validation streams (the training split's haystack
and even-last-digit passkeys, other draws), (c) the test cells at 4 chunks: exact match and accuracy per answer digit.

    python benchmarks/fednl_passkey_diag.py        # after the passkey grid (runs/fednl_retrieval); ~7 min, one thread
"""
import json, sys
from pathlib import Path
import torch
sys.path.insert(0, "benchmarks")
import fednl_retrieval as R
from lightfed import device
from lightfed.models import backbones
from lightfed.tasks import passkey
torch.set_num_threads(1)
tok = backbones.smollm2_tokenizer(); tok.model_max_length = 10**9
out = {}
for seed in (2, 0):
    s = json.loads(Path(f"runs/fednl_retrieval/fednl-s{seed}/summary.json").read_text())
    m = R.final_model(s); m.eval()
    o = passkey.Options(**{**R.TASK, "lengths": "4", "depths": "0,0.25,0.5,0.75", "test_per_cell": 20})
    sets = {"train (first 80 training streams)": passkey.streams(o, tok, "train")[:80],
            "validation (train-split haystack, other passkeys)": passkey.streams(o, tok, "eval", True),
            "test (eval haystack, odd last digit)": passkey.streams(o, tok, "eval")}
    r = {}
    for name, ss in sets.items():
        with device.using("cpu", "bf16"):
            hits = R.digit_hits(m, torch.stack([x.ids for x in ss]), torch.stack([x.targets for x in ss]))
        r[name] = {"exact_match": hits.all(1).float().mean().item(), "digit_acc_per_position": hits.float().mean(0).tolist()}
        print(seed, name, r[name], flush=True)
    out[f"s{seed}"] = r
res = Path("benchmarks/results/fednl_passkey_diag")
res.with_suffix(".json").write_text(json.dumps(out, indent=1))
L = ["# FedNL passkey grid: the final global models on training, validation and test streams (4 chunks)\n",
     "Command: `python benchmarks/fednl_passkey_diag.py`. bf16 forwards, teacher-forced argmax per answer digit.\n",
     "| seed | streams | exact match | accuracy per digit (1st..7th) |", "|---|---|---|---|"]
for k, r in out.items():
    for name, v in r.items():
        L.append(f"| {k} | {name} | {v['exact_match']:.3f} | {', '.join(f'{x:.2f}' for x in v['digit_acc_per_position'])} |")
res.with_suffix(".md").write_text("\n".join(L) + "\n")
