"""A task = data + pretrained backbone + loss + metric. Four real tasks, each with a tiny twin.

| task      | data (offline)                      | backbone                      | metric      |
|-----------|-------------------------------------|-------------------------------|-------------|
| sentiment | tweets, positive vs negative        | all-MiniLM-L6-v2 + linear head| accuracy    |
| trivia    | 4-way multiple choice, 54 subjects  | SmolLM2-135M, option log-lik  | accuracy    |
| austen    | six novels, next-token prediction   | SmolLM2-135M                  | perplexity  |
| fmnist    | Fashion-MNIST, all 10 classes       | GroupNorm ResNet pretrained by lightfed on classes 0-4 of a disjoint half | accuracy |

Data are dicts of equally long tensors (`Data`); a batch is the same dict indexed by rows.
`tiny = true` swaps the backbone for a random twin of a few thousand weights (tests only).
"""
from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from lightfed import assets
from lightfed.config import ConfigError, check_options
from lightfed.data import datasets
from lightfed.data.tensors import Data, batches, size, subset
from lightfed.models import backbones
from lightfed.models.backbones import label_scores, seeded



@dataclass
class Task:
    name: str
    metric: str
    higher_is_better: bool
    model: nn.Module                      # the pretrained starting point (head initialised from the seed)
    train: Data
    test: Data
    labels: np.ndarray                    # per training example: what Dirichlet splits on
    domains: np.ndarray | None            # per training example: what `domain` splits on
    loss: Callable[[nn.Module, Data], torch.Tensor]
    evaluate: Callable[[nn.Module, Data], float]
    info: dict
    test_domains: np.ndarray | None = None   # per test example: its domain (per-domain and per-client scores)
    details: Callable[[nn.Module, Data], dict] | None = None   # {domain: {cell: [per-example scores]}}: the metric
                                                               # and its breakdown in one pass (NIAH: template x length)


@torch.no_grad()
def _accuracy(predict: Callable[[Data], torch.Tensor], data: Data, batch_size: int = 128) -> float:
    correct = 0
    for b in batches(data, batch_size):
        correct += (predict(b).argmax(-1) == b["labels"]).sum().item()
    return correct / size(data)


def _eval_mode(fn):
    def wrapped(model, data):
        was = model.training
        model.eval()
        try:
            return fn(model, data)
        finally:
            model.train(was)
    return wrapped


def encode_texts(tok, texts: list[str], labels, max_len: int) -> Data:
    """An encoder classifier's examples: token ids and mask padded to max_len, and labels."""
    enc = tok(texts, padding="max_length", truncation=True, max_length=max_len, return_tensors="pt")
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
            "labels": torch.as_tensor(labels, dtype=torch.long)}


def clf_loss(m, b):
    return F.cross_entropy(m(b["input_ids"], b["attention_mask"]), b["labels"])


@_eval_mode
def clf_evaluate(m, data):
    return _accuracy(lambda b: m(b["input_ids"], b["attention_mask"]), data)


def _balanced_pick(labels: np.ndarray, per_class: int, rng) -> np.ndarray:
    out = []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        if len(idx) < per_class:
            raise ConfigError(f"only {len(idx)} examples of class {c}; lower train_size/test_size")
        out.append(rng.choice(idx, per_class, replace=False))
    return np.concatenate(out)


# --- sentiment --------------------------------------------------------------------------------
@dataclass
class SentimentOptions:
    tiny: bool = False
    model: str = ""                # a local Hugging Face model folder (or .gguf file) instead of the default backbone
    train_size: int = 4000   # balanced positive/negative
    test_size: int = 1000    # balanced, disjoint from train, fixed by data_seed
    max_len: int = 40        # tokens; tweets are short (95% fit)
    data_seed: int = 0
    pretrained: bool = True  # False: the same architecture from random weights (ablations)

    def check(self):
        if self.train_size < 2 or self.test_size < 2 or self.train_size % 2 or self.test_size % 2:
            raise ConfigError("sentiment: train_size and test_size must be even and >= 2 (classes are balanced)")
        if not 8 <= self.max_len <= 512:
            raise ConfigError(f"sentiment: max_len = {self.max_len} must be in [8, 512]")


def _tweet_split(o) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """Balanced positive/negative tweets: (texts, labels, train rows, test rows), fixed by o.data_seed."""
    texts, labels = datasets.load_tweets()
    labels = np.asarray(labels)
    rng = np.random.default_rng([o.data_seed, 10])
    pick = _balanced_pick(labels, (o.train_size + o.test_size) // 2, rng)
    pick = rng.permutation(pick)
    # put test_size/2 of each class in test
    test_idx = np.concatenate([pick[labels[pick] == c][: o.test_size // 2] for c in (0, 1)])
    return texts, labels, np.setdiff1d(pick, test_idx), test_idx


def sentiment(o: SentimentOptions, seed: int) -> Task:
    texts, labels, train_idx, test_idx = _tweet_split(o)
    tok = backbones.minilm_tokenizer(o.model)

    def encode(idx):
        return encode_texts(tok, [texts[i] for i in idx], labels[idx], o.max_len)

    if not o.pretrained and not o.tiny:  # the real architecture (its config), random weights
        encoder = backbones.minilm_random(seed, o.model)
    else:
        encoder = backbones.minilm(o.tiny, seed, o.model)
    with seeded(seed):
        model = backbones.TextClassifier(encoder, 2)


    train = encode(train_idx)
    return Task("sentiment", "accuracy", True, model, train, encode(test_idx), train["labels"].numpy(), None,
                clf_loss, clf_evaluate, {"backbone": o.model or ("tiny-bert" if o.tiny else "all-MiniLM-L6-v2"), "classes": ["negative", "positive"]})


# --- textclf (the user's own labelled texts) ----------------------------------------------------------
@dataclass
class TextClfOptions:
    data: str = ""                 # a CSV / JSON-lines / Parquet file of the user's (required)
    text_column: str = "text"
    label_column: str = "label"
    client_column: str = ""        # optional: names each example's client or domain (use partition = domain)
    test_fraction: float = 0.2     # held out at random (fixed by data_seed)
    max_len: int = 64
    tiny: bool = False
    model: str = ""                # a local encoder folder instead of all-MiniLM-L6-v2
    data_seed: int = 0

    def check(self):
        if not self.data:
            raise ConfigError("textclf: set data=FILE (--data FILE): a .csv, .jsonl or .parquet of text + label columns")
        if not 0 < self.test_fraction < 1:
            raise ConfigError(f"textclf: test_fraction = {self.test_fraction} must be in (0, 1)")
        if not 8 <= self.max_len <= 512:
            raise ConfigError(f"textclf: max_len = {self.max_len} must be in [8, 512]")


def textclf(o: TextClfOptions, seed: int) -> Task:
    """Text classification on the user's file: encoder + masked mean pooling + a linear head (as sentiment)."""
    from lightfed.data import user
    cols = user.read_table(o.data, [o.text_column, o.label_column], (o.client_column,))
    names = sorted({str(v) for v in cols[o.label_column]})
    if len(names) < 2:
        raise ConfigError(f"textclf: column {o.label_column!r} has one class ({names}); need >= 2")
    labels = np.array([names.index(str(v)) for v in cols[o.label_column]])
    doms = np.array([str(v) for v in cols[o.client_column]]) if o.client_column else None
    rng = np.random.default_rng([o.data_seed, 14])
    order = rng.permutation(len(labels))
    n_test = max(1, round(o.test_fraction * len(labels)))
    test_idx, train_idx = np.sort(order[:n_test]), np.sort(order[n_test:])
    tok = backbones.minilm_tokenizer(o.model)
    texts = [str(t) for t in cols[o.text_column]]

    def encode(idx):
        return encode_texts(tok, [texts[i] for i in idx], labels[idx], o.max_len)

    with seeded(seed):
        model = backbones.TextClassifier(backbones.minilm(o.tiny, seed, o.model), len(names))


    train = encode(train_idx)
    return Task("textclf", "accuracy", True, model, train, encode(test_idx), labels[train_idx],
                doms[train_idx] if doms is not None else None, clf_loss, clf_evaluate,
                {"backbone": o.model or ("tiny-bert" if o.tiny else "all-MiniLM-L6-v2"), "classes": names,
                 "data": str(o.data), "rows": len(labels)},
                test_domains=doms[test_idx] if doms is not None else None)


# --- psentiment (prompt-based: a causal LM scores the label words) -----------------------------------
@dataclass
class PromptSentimentOptions:
    tiny: bool = False
    model: str = ""                # a local Hugging Face model folder (or .gguf file) instead of the default backbone
    train_size: int = 2000
    test_size: int = 1000          # balanced; one example = 0.1 pp
    max_len: int = 64              # prompt tokens (the tweet is cut from its end to fit)
    template: str = "Tweet: {text}\nSentiment:"
    labels: str = " negative| positive"   # label words in class order, "|"-separated (each scored by its first token)
    data_seed: int = 0

    def check(self):
        if self.train_size < 2 or self.test_size < 2 or self.train_size % 2 or self.test_size % 2:
            raise ConfigError("psentiment: train_size and test_size must be even and >= 2 (classes are balanced)")
        if "{text}" not in self.template:
            raise ConfigError(f"psentiment: template {self.template!r} has no {{text}}")
        if len(self.labels.split("|")) != 2:
            raise ConfigError(f"psentiment: labels = {self.labels!r}: two label words, '|'-separated")
        if not 8 <= self.max_len <= 512:
            raise ConfigError(f"psentiment: max_len = {self.max_len} must be in [8, 512]")


def psentiment(o: PromptSentimentOptions, seed: int) -> Task:
    """The prompt-based setting of the zeroth-order line (MeZO, DeComFL, FedKSeed): the pretrained LM already
    ranks the label words above chance (zero-shot: round 0), fine-tuning moves it from there."""
    texts, labels, train_idx, test_idx = _tweet_split(o)
    tok = backbones.smollm2_tokenizer(o.model)
    words = o.labels.split("|")
    label_ids = torch.tensor([tok(w, add_special_tokens=False)["input_ids"][0] for w in words])
    if len(set(label_ids.tolist())) != len(words):
        raise ConfigError(f"psentiment: label words {words} share their first token")
    head, tail = o.template.split("{text}", 1)
    h_ids, t_ids = tok(head, add_special_tokens=False)["input_ids"], tok(tail, add_special_tokens=False)["input_ids"]
    room = o.max_len - len(h_ids) - len(t_ids)
    if room < 1:
        raise ConfigError(f"psentiment: the template takes {o.max_len - room} tokens, more than max_len = {o.max_len}")

    def encode(idx):
        ids = torch.full((len(idx), o.max_len), tok.pad_token_id, dtype=torch.long)
        attn = torch.zeros((len(idx), o.max_len), dtype=torch.long)
        n_tok = []
        for r, i in enumerate(idx):
            seq = h_ids + tok(texts[i], add_special_tokens=False)["input_ids"][:room] + t_ids
            ids[r, : len(seq)], attn[r, : len(seq)] = torch.tensor(seq), 1
            n_tok.append(len(seq))
        return {"input_ids": ids, "attention_mask": attn, "label_ids": label_ids.expand(len(idx), -1).clone(),
                "labels": torch.as_tensor(labels[idx], dtype=torch.long)}, n_tok

    model = backbones.smollm2(o.tiny, seed, o.model)

    def loss(m, b):
        return F.cross_entropy(label_scores(m, b["input_ids"], b["attention_mask"], b["label_ids"]), b["labels"])

    @_eval_mode
    def evaluate(m, data):
        return _accuracy(lambda b: label_scores(m, b["input_ids"], b["attention_mask"], b["label_ids"]), data, 32)

    (train, n_train), (test, n_test) = encode(train_idx), encode(test_idx)
    return Task("psentiment", "accuracy", True, model, train, test, train["labels"].numpy(), None, loss, evaluate,
                {"backbone": o.model or ("tiny-llama" if o.tiny else "SmolLM2-135M-Instruct"), "classes": ["negative", "positive"],
                 "template": o.template, "label_words": words, "label_token_ids": label_ids.tolist(),
                 "prompt_tokens_mean": float(np.mean(n_train + n_test))})


# --- trivia (multiple choice scored by a causal LM) -----------------------------------------------
@dataclass
class TriviaOptions:
    tiny: bool = False
    model: str = ""                # a local Hugging Face model folder (or .gguf file) instead of the default backbone
    train_size: int = 2000
    test_size: int = 500
    max_len: int = 48
    data_seed: int = 0

    def check(self):
        if self.train_size < 1 or self.test_size < 1:
            raise ConfigError("trivia: train_size and test_size must be >= 1")


def option_scores(lm: nn.Module, ids, attn, tmask) -> torch.Tensor:
    """Mean log-probability of each option's tokens.   ids, attn, tmask: (B, K, L) -> scores (B, K)

    tmask marks the option's tokens; only those positions go through the LM head (V = 49,152),
    which keeps memory at O(option tokens x V) instead of O(B K L V)."""
    B, K, L = ids.shape
    ids, attn, tmask = ids.view(B * K, L), attn.view(B * K, L), tmask.view(B * K, L)
    h = lm.model(input_ids=ids, attention_mask=attn).last_hidden_state     # (BK, L, d)
    sel = tmask[:, 1:]                                                      # token t is predicted at t-1
    logp = lm.lm_head(h[:, :-1][sel]).float().log_softmax(-1)               # (P, V)
    lp = logp.gather(1, ids[:, 1:][sel].unsqueeze(1)).squeeze(1)            # (P,)
    rows = sel.nonzero()[:, 0]
    total = torch.zeros(B * K, dtype=lp.dtype).index_add(0, rows, lp)
    count = torch.zeros(B * K, dtype=lp.dtype).index_add(0, rows, torch.ones_like(lp))
    return (total / count.clamp_min(1)).view(B, K)


def trivia(o: TriviaOptions, seed: int) -> Task:
    items = datasets.load_trivia()
    rng = np.random.default_rng([o.data_seed, 11])
    by_subject: dict[str, list[int]] = {}
    items = [it for it in items if "http" not in it["question"]]   # ~1,500 questions are only an image link
    for i, it in enumerate(items):
        by_subject.setdefault(it["subject"], []).append(i)
    questions = []  # (prompt, [4 options], correct index, subject)
    for i in rng.permutation(len(items)):
        it = items[i]
        accepted = {a.strip().lower() for a in it["answers"]}
        pool = [items[j]["answers"][0] for j in by_subject[it["subject"]] if j != i]
        pool = sorted({p for p in pool if p.strip().lower() not in accepted})
        if len(pool) < 3:
            continue
        opts = [it["answers"][0]] + [pool[k] for k in rng.choice(len(pool), 3, replace=False)]
        perm = rng.permutation(4)
        questions.append((f"Question: {it['question']}\nAnswer:", [opts[p] for p in perm],
                          int(np.flatnonzero(perm == 0)[0]), it["subject"]))
        if len(questions) == o.train_size + o.test_size:
            break
    if len(questions) < o.train_size + o.test_size:
        raise ConfigError(f"trivia: only {len(questions)} questions available")
    tok = backbones.smollm2_tokenizer(o.model)

    def encode(qs):
        n, L = len(qs), o.max_len
        ids = torch.full((n, 4, L), tok.pad_token_id, dtype=torch.long)
        attn = torch.zeros((n, 4, L), dtype=torch.long)
        tmask = torch.zeros((n, 4, L), dtype=torch.bool)
        for i, (prompt, opts, _, _) in enumerate(qs):
            p = tok(prompt, add_special_tokens=False)["input_ids"]
            for k, a in enumerate(opts):
                t = tok(" " + a, add_special_tokens=False)["input_ids"][: L // 2]
                seq = (p[-(L - len(t)):] + t) if len(p) + len(t) > L else p + t   # keep the answer, cut the question's start
                ids[i, k, : len(seq)] = torch.tensor(seq)
                attn[i, k, : len(seq)] = 1
                tmask[i, k, len(seq) - len(t): len(seq)] = True
        return {"input_ids": ids, "attention_mask": attn, "target_mask": tmask,
                "labels": torch.tensor([q[2] for q in qs])}

    train_q, test_q = questions[: o.train_size], questions[o.train_size:]
    model = backbones.smollm2(o.tiny, seed, o.model)

    def loss(m, b):
        return F.cross_entropy(option_scores(m, b["input_ids"], b["attention_mask"], b["target_mask"]), b["labels"])

    @_eval_mode
    def evaluate(m, data):
        return _accuracy(lambda b: option_scores(m, b["input_ids"], b["attention_mask"], b["target_mask"]), data, 32)

    train = encode(train_q)
    domains = np.array([datasets.subject_domain(q[3]) for q in train_q])
    return Task("trivia", "accuracy", True, model, train, encode(test_q), train["labels"].numpy(), domains,
                loss, evaluate, {"backbone": o.model or ("tiny-llama" if o.tiny else "SmolLM2-135M-Instruct"), "domains": sorted(set(domains))},
                test_domains=np.array([datasets.subject_domain(q[3]) for q in test_q]))


# --- austen (causal language modelling) ---------------------------------------------------------
@dataclass
class AustenOptions:
    tiny: bool = False
    model: str = ""                # a local Hugging Face model folder (or .gguf file) instead of the default backbone
    block_len: int = 128
    train_blocks: int = 1200  # sampled from the first 90% of each novel
    test_blocks: int = 120    # sampled from the last 10% of each novel
    data: str = ""            # instead of the novels: a folder of .txt files (one domain each), or a .csv / .jsonl /
                              # .parquet with a `text_column` (+ `client_column`: the domains; else one domain)
    text_column: str = "text"
    client_column: str = ""
    window: int = 0           # 0: a block in one forward; > 0: in chunks of `window` tokens, attention local to a
                              # chunk, FedNL's memory carrying across (the streaming setting, models/streaming.py)
    data_seed: int = 0

    def check(self):
        if self.window < 0 or 0 < self.window < 8:
            raise ConfigError(f"austen: window = {self.window}: 0 (whole blocks) or >= 8 tokens")
        if not 16 <= self.block_len <= 16384:
            raise ConfigError(f"austen: block_len = {self.block_len} must be in [16, 16384]")
        if self.train_blocks < 6 or self.test_blocks < 6:
            raise ConfigError("austen: train_blocks and test_blocks must be >= 6 (one per novel)")


def austen(o: AustenOptions, seed: int) -> Task:
    if o.data:
        from lightfed.data import user
        books = user.read_corpus(o.data, o.text_column, o.client_column)
    else:
        books = datasets.load_austen()
    tok = backbones.smollm2_tokenizer(o.model)
    tok.model_max_length = 10**9   # whole novels are tokenised once, then cut into blocks
    rng = np.random.default_rng([o.data_seed, 12])
    titles = sorted(books)
    train_x, train_d, test_x = [], [], []
    for b, title in enumerate(titles):
        ids = torch.tensor(tok(books[title], add_special_tokens=False)["input_ids"])
        blocks = ids[: len(ids) // o.block_len * o.block_len].view(-1, o.block_len)   # (nb, L)
        cut = int(len(blocks) * 0.9)
        ntr = o.train_blocks // len(titles) + (b < o.train_blocks % len(titles))
        nte = o.test_blocks // len(titles) + (b < o.test_blocks % len(titles))
        train_x.append(blocks[torch.as_tensor(np.sort(rng.choice(cut, ntr, replace=False)))])
        test_x.append(blocks[cut:][torch.as_tensor(np.sort(rng.choice(len(blocks) - cut, nte, replace=False)))])
        train_d += [b] * ntr
    model = backbones.smollm2(o.tiny, seed, o.model)

    def loss(m, b):
        if o.window:
            from lightfed.models import streaming
            return streaming.target_nll(m, b["input_ids"], torch.ones_like(b["input_ids"], dtype=torch.bool), o.window)
        return m(input_ids=b["input_ids"], labels=b["input_ids"]).loss

    @_eval_mode
    @torch.no_grad()
    def evaluate(m, data):   # perplexity = exp(mean token NLL) over all test tokens
        nll, n = 0.0, 0
        for b in batches(data, 8):
            k = b["input_ids"].numel() - len(b["input_ids"])
            nll += loss(m, b).item() * k
            n += k
        return float(np.exp(nll / n))

    domains = np.array([titles[d] for d in train_d])
    return Task("austen", "perplexity", False, model, {"input_ids": torch.cat(train_x)}, {"input_ids": torch.cat(test_x)},
                np.array(train_d), domains, loss, evaluate,
                {"backbone": o.model or ("tiny-llama" if o.tiny else "SmolLM2-135M-Instruct"), "novels": titles})


# --- fmnist (our own pretrained GroupNorm ResNet) -----------------------------------------------
@dataclass
class FmnistOptions:
    tiny: bool = False
    train_size: int = 6000     # from training images 30,000-59,999 (never seen in pretraining)
    test_size: int = 2000      # from the official test set
    pretrained: bool = True
    pretrain_epochs: int = 2   # pretraining: classes 0-4 of training images 0-29,999 (cached)
    data_seed: int = 0

    def check(self):
        if not 10 <= self.train_size <= 30000 or not 10 <= self.test_size <= 10000:
            raise ConfigError("fmnist: train_size in [10, 30000], test_size in [10, 10000]")


WIDTHS = (16, 32, 64)   # ~0.2M parameters, ~17 MFLOPs forward per image: pretrains in minutes on 2 cores


def _fm_x(x: torch.Tensor) -> torch.Tensor:   # uint8 (N, 28, 28) -> float (N, 1, 28, 28), standardised
    return ((x.float() / 255.0 - 0.2860) / 0.3530).unsqueeze(1)


def pretrain_fmnist(widths, epochs: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Our own base: train a GNResNet on classes 0-4 of the first 30,000 training images.
    Cached by (widths, epochs, seed); returns the backbone's state dict (head excluded)."""
    from safetensors.torch import load_file, save_file
    from tqdm import tqdm

    path = assets.cache_dir() / "models" / f"fmnist-gnresnet-{'-'.join(map(str, widths))}-e{epochs}-s{seed}.safetensors"
    if path.exists():
        return load_file(path)
    d = datasets.load_fmnist()
    keep = d["train_y"][:30000] < 5
    x, y = _fm_x(d["train_x"][:30000][keep]), d["train_y"][:30000][keep]
    with seeded(seed):
        net = backbones.GNResNet(widths, num_classes=5)
    opt = torch.optim.AdamW(net.parameters(), lr=2e-3, weight_decay=1e-4)
    g = torch.Generator().manual_seed(seed)
    print(f"lightfed: pretraining the fmnist base on {len(x)} images of classes 0-4, {epochs} epoch(s); "
          f"cached at {path}", file=sys.stderr)
    for _ in range(epochs):
        for b in tqdm(list(batches({"x": x, "y": y}, 128, g)), desc="pretrain fmnist", leave=False):
            opt.zero_grad()
            F.cross_entropy(net(b["x"]), b["y"]).backward()
            opt.step()
    state = {k: v.contiguous() for k, v in net.state_dict().items() if not k.startswith("head.")}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    save_file(state, tmp)
    tmp.replace(path)
    return state


def fmnist(o: FmnistOptions, seed: int) -> Task:
    d = datasets.load_fmnist()
    rng = np.random.default_rng([o.data_seed, 13])
    tr = 30000 + np.sort(rng.choice(30000, o.train_size, replace=False))
    te = np.sort(rng.choice(10000, o.test_size, replace=False))
    widths = (8, 16, 16) if o.tiny else WIDTHS
    with seeded(seed):
        model = backbones.GNResNet(widths, num_classes=10)   # fresh 10-way head
    if o.pretrained and not o.tiny:
        model.load_state_dict(pretrain_fmnist(widths, o.pretrain_epochs), strict=False)
    train = {"x": _fm_x(d["train_x"][tr]), "labels": d["train_y"][tr]}
    test = {"x": _fm_x(d["test_x"][te]), "labels": d["test_y"][te]}

    def loss(m, b):
        return F.cross_entropy(m(b["x"]), b["labels"])

    @_eval_mode
    def evaluate(m, data):
        return _accuracy(lambda b: m(b["x"]), data, 256)

    return Task("fmnist", "accuracy", True, model, train, test, train["labels"].numpy(), None, loss, evaluate,
                {"backbone": f"GNResNet{widths}", "pretrained": "random (tiny)" if o.tiny else
                 ("lightfed's own: classes 0-4 of train images 0-29,999" if o.pretrained else "random")})


# --- niah (needle in a haystack, RULER-style, streamed through a local attention window) -----------
@dataclass
class NiahOptions:
    tiny: bool = False
    model: str = ""                # a local Hugging Face model folder (or .gguf file) instead of the default backbone
    templates: str = "all"         # comma-separated names from data.niah.TASKS, or all (the seven of TASKS7)
    train_len: int = 1024          # tokens per training stream (train split: Austen's first 90%, its own keys/values)
    train_per_template: int = 16
    lengths: str = "1024,4096"     # evaluation lengths in tokens (eval split: Austen's last 10%)
    test_per_cell: int = 4         # samples per (template, length), needle depths spread over 0-100%
    window: int = 256              # attention window: every input goes through in chunks of this many tokens
    gen_tokens: int = 32
    data_seed: int = 0

    def check(self):
        from lightfed.data import niah
        names = niah.TASKS7 if self.templates == "all" else tuple(t.strip() for t in self.templates.split(","))
        bad = [t for t in names if t not in niah.TASKS]
        if bad:
            raise ConfigError(f"niah: unknown template(s) {bad}; templates: {', '.join(niah.TASKS)}")
        try:
            lens = [int(x) for x in self.lengths.split(",")]
        except ValueError:
            lens = [0]
        if min(lens) < 256 or self.train_len < 256:
            raise ConfigError(f"niah: lengths = {self.lengths!r}, train_len = {self.train_len}: use token counts >= 256")
        if self.window < 16 or self.train_per_template < 1 or self.test_per_cell < 1 or self.gen_tokens < 1:
            raise ConfigError("niah: window >= 16, train_per_template, test_per_cell and gen_tokens >= 1")


def niah(o: NiahOptions, seed: int) -> Task:
    """Train: each template's needles (train split) in `train_len`-token streams, loss on the answer's
    tokens, computed through the chunked stream (models/streaming.py), so only a model whose memory
    carries the needle across chunks can lower it. Test: the eval split at each length, answered
    greedily in the same chunked setting, scored by "string match all". Domain = template."""
    from lightfed.data import niah as N
    from lightfed.models import streaming

    names = list(N.TASKS7 if o.templates == "all" else [t.strip() for t in o.templates.split(",")])
    lengths = [int(x) for x in o.lengths.split(",")]
    books = datasets.load_austen()
    tok = backbones.smollm2_tokenizer(o.model)
    tok.model_max_length = 10**9
    hay_train, hay_eval = N.haystack_split(books, "train"), N.haystack_split(books, "eval")
    rows, doms = [], []
    for i, t in enumerate(names):
        for s_ in N.make_samples(t, o.train_len, tok, hay_train, o.train_per_template, seed=o.data_seed * 1000 + i,
                                 split="train", gen_tokens=o.gen_tokens):
            prompt, answer = N.training_text(s_)
            p = tok(prompt, add_special_tokens=False)["input_ids"]
            a = tok(answer, add_special_tokens=False)["input_ids"][: o.gen_tokens]
            rows.append((p + a, len(p)))
            doms.append(t)
    L = max(len(r) for r, _ in rows)
    ids = torch.full((len(rows), L), tok.pad_token_id, dtype=torch.long)
    tmask = torch.zeros((len(rows), L), dtype=torch.bool)
    for j, (r, n_prompt) in enumerate(rows):
        ids[j, : len(r)] = torch.tensor(r)
        tmask[j, n_prompt: len(r)] = True
    tests = [s_ for i, t in enumerate(names) for k, n in enumerate(lengths)
             for s_ in N.make_samples(t, n, tok, hay_eval, o.test_per_cell, seed=10**6 + o.data_seed * 1000 + 10 * i + k,
                                      split="eval", gen_tokens=o.gen_tokens)]
    prompts = [torch.tensor([tok(s_.prompt, add_special_tokens=False)["input_ids"]]) for s_ in tests]
    model = backbones.smollm2(o.tiny, seed, o.model)

    def loss(m, b):
        return streaming.target_nll(m, b["input_ids"], b["target_mask"], o.window)

    def scores(m, data) -> list[float]:
        out = []
        for i in data["idx"].tolist():
            new = streaming.generate(m, prompts[i], o.window, o.gen_tokens, tok.eos_token_id)
            out.append(N.score(tok.decode(new), tests[i].golds))
        return out

    @_eval_mode
    def evaluate(m, data):
        return float(np.mean(scores(m, data)))

    @_eval_mode
    def details(m, data):      # {template: {length: [score per sample]}}
        cells: dict[str, dict[str, list[float]]] = {}
        for i, sc in zip(data["idx"].tolist(), scores(m, data)):
            cells.setdefault(tests[i].task, {}).setdefault(str(tests[i].length), []).append(sc)
        return cells

    test = {"idx": torch.arange(len(tests)), "labels": torch.tensor([names.index(s_.task) for s_ in tests])}
    train = {"input_ids": ids, "target_mask": tmask, "labels": torch.tensor([names.index(d) for d in doms])}
    return Task("niah", "accuracy", True, model, train, test, train["labels"].numpy(), np.array(doms), loss, evaluate,
                {"backbone": o.model or ("tiny-llama" if o.tiny else "SmolLM2-135M-Instruct"), "templates": names, "lengths": lengths,
                 "window": o.window, "train_tokens_padded": int(tmask.shape[1]),
                 "test_tokens_mean": float(np.mean([s_.n_tokens for s_ in tests]))},
                test_domains=np.array([s_.task for s_ in tests]), details=details)


TASKS = {
    "sentiment": (SentimentOptions, sentiment),
    "psentiment": (PromptSentimentOptions, psentiment),
    "trivia": (TriviaOptions, trivia),
    "austen": (AustenOptions, austen),
    "fmnist": (FmnistOptions, fmnist),
    "niah": (NiahOptions, niah),
    "textclf": (TextClfOptions, textclf),
}


def options(name: str, given: dict):
    if name not in TASKS:
        raise ConfigError(f"unknown task {name!r}; tasks: {', '.join(TASKS)}")
    return check_options("task", name, TASKS[name][0], given)


def build(name: str, given: dict, seed: int) -> Task:
    opts = options(name, given)
    task = TASKS[name][1](opts, seed)
    task.info["options"] = dataclasses.asdict(opts)
    return task
