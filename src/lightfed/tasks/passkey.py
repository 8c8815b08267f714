"""`passkey`: find a 7-digit pass key hidden in a long Austen haystack (data/passkey.py), the input streamed in
`window`-token chunks with attention local to each chunk, so a needle outside the question's chunk is reachable
only through a memory that carries across chunks (FedNL's). `window = 0`: full attention over the whole stream
(the reference a user would otherwise run, its KV cache growing with the length).

Train: `train_size` streams of `train_chunks` x `unit` tokens, the needle in a uniformly drawn chunk other than
the question's, the loss on the answer's 8 tokens (' ' and the 7 digits). Test: `test_per_cell` streams per (length, depth) cell,
lengths in chunks of `unit` tokens, depth 1.0 = the needle in the question's own chunk (reported apart). Metric:
exact match (every answer token right, the leading space too, teacher forced: the same as greedy decoding writing the
answer first; `generated` checks it by decoding), the mean over all cells; `details` gives it per cell.
`curriculum = "2,4,8"`: the training streams grow through these lengths over the rounds (RMT's curriculum over the
number of segments), each stage its own draws, the last train_chunks long.

`templates`: "passkey" (the above), or a comma-separated list of it and data/niah.TASKS names, or "all" (the seven of
TEMPLATES7): RULER's needles and questions in the same geometry (data/passkey.py), `train_size` streams of each; the
domain of a stream is its template (partition = domain: one client per template; holdout: an unseen template).
A (length, depth) where a template's largest draw would not fit its chunks fails when the task is built, for every
seed alike, naming the template and the sizes.
"""
from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass

import numpy as np
import torch

from lightfed.config import ConfigError
from lightfed.data import datasets, niah
from lightfed.data import passkey as P
from lightfed.models import backbones, lm
from lightfed.tasks.base import Task, eval_mode

# "all": the headline pass key and six of RULER's templates (niah.md: choose seven). multikey_3 (uuid keys and values)
# is left out: its question and answer alone take up to 137 SmolLM2 tokens, more than a chunk of 128; single_2 is the
# pass key with a key (the pass key stands for it). At 128-token chunks, single_3 and multiquery cannot hold their
# needle in the question's own chunk (depth 1) on every draw, so depth 1 is refused for them (data/passkey.py).
TEMPLATES7 = ("passkey", "single_3", "multikey_1", "multikey_2", "multivalue", "multiquery", "single_1")


@dataclass
class Options:
    tiny: bool = False
    model: str = ""              # a local Hugging Face causal LM folder (or .gguf) instead of SmolLM2
    unit: int = 64               # tokens per chunk of a stream (its geometry: lengths count these)
    window: int = 64             # attention window in tokens; 0: full attention over the whole stream
    train_chunks: int = 4        # training stream length, in chunks
    curriculum: str = ""         # e.g. "2,4,8": the training streams' length in chunks grows through these over the
                                 # rounds (equal stages, shortest first; it ends at train_chunks); "": train_chunks
    train_size: int = 256        # training streams
    lengths: str = "4,8,16,32"   # test stream lengths, in chunks
    depths: str = "0,0.25,0.5,0.75,1"   # needle depths (1: the question's own chunk)
    test_per_cell: int = 20
    validation: bool = False     # test on streams built from the training split (its haystack, its passkeys): the set
                                 # on which settings are chosen, never the evaluation split
    data_seed: int = 0
    templates: str = "passkey"   # passkey | comma-separated names (passkey, data/niah.TASKS) | all (TEMPLATES7)
    lm_weight: float = 0.0       # > 0: the training loss adds lm_weight x the NLL of every other token of the stream
                                 # (the memory learns to answer without harming language modelling along the stream)

    def names(self) -> list[str]:
        return list(TEMPLATES7) if self.templates == "all" else [t.strip() for t in self.templates.split(",")]

    def check(self):
        bad = [t for t in self.names() if t != "passkey" and t not in niah.TASKS]
        if bad or len(set(self.names())) != len(self.names()):
            raise ConfigError(f"passkey: templates = {self.templates!r}: use passkey, all, or distinct names from "
                              f"passkey, {', '.join(niah.TASKS)}")
        try:
            lens, deps = self.lens(), self.deps()
        except ValueError:
            raise ConfigError(f"passkey: lengths = {self.lengths!r}, depths = {self.depths!r}: comma-separated numbers") from None
        if min(lens) < 2 or self.train_chunks < 2:
            raise ConfigError("passkey: lengths and train_chunks count chunks and must be >= 2 (the question has its own)")
        if not all(0 <= d <= 1 for d in deps):
            raise ConfigError(f"passkey: depths = {self.depths!r} must lie in [0, 1]")
        if self.unit < 48 or self.window < 0 or 0 < self.window < self.unit or self.window % self.unit:
            raise ConfigError(f"passkey: unit = {self.unit} (>= 48) and window = {self.window} (0, or a multiple of unit)")
        if self.lm_weight < 0:
            raise ConfigError(f"passkey: lm_weight = {self.lm_weight}: must be >= 0")
        if self.train_size < 1 or self.test_per_cell < 1:
            raise ConfigError("passkey: train_size and test_per_cell must be >= 1")
        try:
            stages = self.stages()
        except ValueError:
            raise ConfigError(f"passkey: curriculum = {self.curriculum!r}: comma-separated chunk counts") from None
        if stages != sorted(set(stages)) or stages[0] < 2 or stages[-1] != self.train_chunks:
            raise ConfigError(f"passkey: curriculum = {self.curriculum!r}: increasing chunk counts >= 2 that end at "
                              f"train_chunks = {self.train_chunks}")

    def stages(self) -> list[int]:
        """The training streams' length in chunks, stage by stage (one stage: train_chunks)."""
        return [int(x) for x in self.curriculum.split(",")] if self.curriculum else [self.train_chunks]

    def lens(self) -> list[int]:
        return [int(x) for x in self.lengths.split(",")]

    def deps(self) -> list[float]:
        return [float(x) for x in self.depths.split(",")]


@functools.lru_cache(maxsize=4)
def _builder(tok, split: str, unit: int) -> P.Builder:      # the split's haystack tokenised once for every template
    return P.Builder(tok, niah.haystack_split(datasets.load_austen(), split), unit, split)


def streams(o: Options, tok, split: str, validation: bool = False, template: str = "passkey",
            chunks: int = 0) -> list[P.Stream]:
    """The task's streams of one template: the training set (split "train", `chunks` long: train_chunks by default)
    or the test cells (split "eval"; with validation, built from the training split's haystack and keys/values with
    other draws). The pass key's draws do not depend on the other templates asked for; each other template's draws
    are its own ([..., crc32(name)]); a curriculum's shorter training streams are draws of their own ([..., chunks])."""
    src = "train" if validation else split
    b = _builder(tok, src, o.unit)
    n = chunks or o.train_chunks
    own = ([] if template == "passkey" else [zlib.crc32(template.encode())]) + ([n] if n != o.train_chunks else [])
    if template != "passkey":       # every geometry the split can draw, checked before any draw
        for L, d, c in ([(n, k / (n - 1), k) for k in range(n - 1)] if split == "train" else
                        [(L, d, None) for L in o.lens() for d in o.deps()]):
            b.check_template(template, L, d, c)
    if split == "train":            # the needle's chunk drawn by index: every chunk but the question's equally often
        rng = np.random.default_rng([o.data_seed, 21, *own])
        if template != "passkey":
            return [b.template_stream(template, n, c / (n - 1), rng, chunk=c)
                    for c in (int(rng.integers(0, n - 1)) for _ in range(o.train_size))]
        vals = b.values(o.train_size, rng)
        return [b.stream(n, c / (n - 1), v, rng, chunk=c) for c, v in ((int(rng.integers(0, n - 1)), v) for v in vals)]
    out = []
    for i, L in enumerate(o.lens()):
        for j, d in enumerate(o.deps()):
            rng = np.random.default_rng([o.data_seed, 23 if validation else 22, i, j, *own])
            out += ([b.template_stream(template, L, d, rng) for _ in range(o.test_per_cell)] if template != "passkey"
                    else [b.stream(L, d, v, rng) for v in b.values(o.test_per_cell, rng)])
    return out


@torch.no_grad()
def scores(model, ss: list[P.Stream], window: int, reset: bool = False, batch: int = 16) -> list[tuple[float, float]]:
    """Per stream (exact match, golds found): exact match = 1.0 when every answer token is the argmax given the
    tokens before it (teacher forcing), else 0.0; golds found = the fraction of the stream's gold values whose
    every token is (RULER's string-match-all, teacher-forced; = exact match for one gold). window 0: one chunk
    (full attention). reset: the memory emptied at every chunk (the control)."""
    from lightfed.models import streaming
    dev = model.lm_head.weight.device
    out = [(0.0, 0.0)] * len(ss)
    by_len: dict[tuple[int, int], list[int]] = {}
    for i, s in enumerate(ss):                      # a batch: one length and one answer size
        by_len.setdefault((len(s.ids), int(s.targets.sum())), []).append(i)
    for (T, _), idx in sorted(by_len.items()):
        for j in range(0, len(idx), batch):
            rows = idx[j:j + batch]
            ids = torch.stack([ss[i].ids for i in rows]).to(dev)                          # (B, T)
            tgt = torch.stack([ss[i].targets for i in rows]).to(dev)
            h = streaming.hidden(model, ids, window or T, targets=tgt, reset=reset)       # (B, T, d)
            sel = tgt[:, 1:]
            pred = model.lm_head(h[:, :-1][sel]).argmax(-1).view(len(rows), -1)           # (B, answer tokens)
            hit = pred == ids[:, 1:][sel].view(len(rows), -1)
            for r, i in enumerate(rows):
                g = ss[i].gold_of                                                       # (T,) or None: one gold
                g = hit.new_zeros(hit.shape[1], dtype=torch.long) if g is None else g[1:][ss[i].targets[1:]].to(dev)
                found = [bool(hit[r][g == k].all()) for k in range(int(g.max()) + 1)] or [bool(hit[r].all())]
                out[i] = (float(hit[r].all()), sum(found) / len(found))
    return out


@torch.no_grad()
def generated(model, ss: list[P.Stream], window: int, reset: bool = False) -> list[tuple[float, list[int]]]:
    """Per stream (exact match, the tokens written): the prompt (the stream without its answer) answered by greedy
    decoding (models/streaming.generate: the memory carries the chunks before the last; `reset`: emptied at every
    chunk), exact match = the answer's tokens are the first ones written. Equals `scores`' teacher-forced exact match
    (tests/test_fednl.py); it costs a forward per answer token."""
    from lightfed.models import streaming
    out = []
    for s in ss:
        n = int(s.targets.sum())                                        # the answer is the stream's last n tokens
        new = streaming.generate(model, s.ids[None, :-n], window or len(s.ids), n, reset=reset)
        out.append((float(new == s.ids[-n:].tolist()), new))
    return out


def exact_match(model, ss: list[P.Stream], window: int, reset: bool = False, batch: int = 16) -> list[float]:
    """1.0 per stream whose every answer token is the argmax (teacher forcing), else 0.0 (scores' first)."""
    return [x for x, _ in scores(model, ss, window, reset, batch)]


def by_cell(model, o: Options, tok, window: int, reset: bool = False, edit=None) -> tuple[dict, dict]:
    """({template: {cell: exact match}}, {template: {cell: golds found}}) over the evaluation streams of every template
    of `o`, from one teacher-forced pass (scores). edit: each stream rebuilt by edit(stream, o.unit) first (e.g.
    data.passkey.needle_moved; its cell stays the one it was drawn in). The caller sets the device and precision."""
    out: tuple[dict, dict] = ({}, {})
    model.eval()
    for t in o.names():
        ss = streams(o, tok, "eval", template=t)
        xs = scores(model, [edit(x, o.unit) for x in ss] if edit else ss, window, reset=reset)
        for m in (0, 1):
            cells: dict[str, list[float]] = {}
            for s, x in zip(ss, xs):
                cells.setdefault(cell(s), []).append(x[m])
            out[m][t] = {k: float(np.mean(v)) for k, v in cells.items()}
    return out


def cell(s: P.Stream) -> str:
    return f"{s.chunks}/{s.depth:g}"


def build(o: Options, seed: int) -> Task:
    tok = backbones.smollm2_tokenizer(o.model)
    tok.model_max_length = 10**9
    names = o.names()
    try:
        train_t = {t: streams(o, tok, "train", template=t) for t in names}
        test_t = {t: streams(o, tok, "eval", o.validation, template=t) for t in names}
    except ValueError as e:
        raise ConfigError(f"passkey: {e}") from None
    train_s = [s for t in names for s in train_t[t]]
    test_s = [s for t in names for s in test_t[t]]
    tmpl = np.array([t for t in names for _ in test_t[t]])
    model = backbones.smollm2(o.tiny, seed, o.model)

    def loss(m, b):
        return lm.target_nll(m, b["input_ids"], b["target_mask"], o.window or b["input_ids"].shape[1], o.lm_weight)

    @eval_mode
    def details(m, data):       # {template: {"<chunks>/<depth>": [exact match per stream]}}
        idx = data["idx"].tolist()
        cells: dict[str, dict[str, list[float]]] = {}
        for i, x in zip(idx, exact_match(m, [test_s[i] for i in idx], o.window)):
            cells.setdefault(str(tmpl[i]), {}).setdefault(cell(test_s[i]), []).append(x)
        return cells

    @eval_mode
    def evaluate(m, data):
        return float(np.mean([x for t in details(m, data).values() for xs in t.values() for x in xs]))

    labels = torch.tensor([names.index(t) for t in names for _ in train_t[t]])

    def stacked(ss: list[P.Stream]) -> dict:
        return {"input_ids": torch.stack([s.ids for s in ss]), "target_mask": torch.stack([s.targets for s in ss]),
                "labels": labels}
    train = stacked(train_s)
    stages = o.stages()
    try:        # each stage's streams: the same templates in the same rows (labels, domains, shards), n chunks long
        by_stage = [stacked([s for t in names for s in streams(o, tok, "train", template=t, chunks=n)]) if n != o.train_chunks
                    else train for n in stages]
    except ValueError as e:
        raise ConfigError(f"passkey: curriculum: {e}") from None

    def curriculum(rnd: int, rounds: int) -> dict:     # rounds split into len(stages) equal stages, shortest first
        return by_stage[min(len(stages) - 1, (rnd - 1) * len(stages) // max(rounds, 1))]

    test = {"idx": torch.arange(len(test_s)), "labels": torch.tensor([names.index(t) for t in tmpl])}
    c = model.config
    kv = 2 * c.num_hidden_layers * c.num_key_value_heads * (c.hidden_size // c.num_attention_heads) * 4   # fp32 bytes/token
    domains = np.array([t for t in names for _ in train_t[t]])
    return Task("passkey", "exact_match", True, model, train, test, train["labels"].numpy(), domains, loss, evaluate,
                {"backbone": o.model or ("tiny-llama" if o.tiny else "SmolLM2-135M-Instruct"), "unit": o.unit,
                 "templates": names,
                 "window": o.window or "full", "lengths_chunks": o.lens(), "depths": o.deps(),
                 "train_tokens": o.train_chunks * o.unit, "kv_cache_bytes_per_token_fp32": kv,
                 **({"curriculum_chunks": stages} if len(stages) > 1 else {})},
                test_domains=tmpl, details=details, curriculum=curriculum if len(stages) > 1 else None)
