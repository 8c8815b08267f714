"""Prompt-based classification (psentiment): label-word scoring by hand, zero-shot on the real model,
the FedSPZO split on it, and every zeroth-order method through a round."""
import copy

import pytest
import torch

from conftest import tiny_config, tiny_task
from lightfed import methods, tasks
from lightfed.data.tensors import subset
from lightfed.engine import protocol as P
from lightfed.methods.base import ClientContext
from lightfed.models.lm import label_scores
from lightfed.models.split import split


def test_label_word_scores_equal_a_hand_computation():
    T = tiny_task("psentiment")
    b = subset(T.test, range(6))
    lm = T.model.eval()
    got = label_scores(lm, b["input_ids"], b["attention_mask"], b["label_ids"])
    logits = lm(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits           # (B, T, V)
    for i in range(6):
        last = int(b["attention_mask"][i].sum()) - 1
        assert b["attention_mask"][i, last] == 1 and (last == b["attention_mask"].shape[1] - 1 or b["attention_mask"][i, last + 1] == 0)
        assert torch.allclose(got[i], logits[i, last, b["label_ids"][i]], atol=1e-5)
    assert T.info["label_words"] == [" negative", " positive"] and T.info["prompt_tokens_mean"] > 5
    loss = T.loss(lm, b)
    assert torch.allclose(loss, torch.nn.functional.cross_entropy(got, b["labels"]))


@pytest.mark.parametrize("n", [1, 2])
def test_the_fedspzo_split_computes_the_same_loss(n):
    T = tiny_task("psentiment")
    model = copy.deepcopy(T.model).eval()
    b = subset(T.train, range(8))
    sp = split(model, "psentiment", n)
    assert torch.allclose(sp.loss(b), T.loss(model, b), atol=1e-6)
    assert "model.embed_tokens.weight" in sp.shared        # the tied embedding / lm_head stays with theta1


@pytest.mark.parametrize("name", ["mezo", "fedspzo", "decomfl", "fedzo", "lora"])
def test_zeroth_order_methods_run_on_the_prompt_task(name):
    T = tiny_task("psentiment")
    cfg = tiny_config("psentiment", name)
    m = methods.build(cfg)
    model = m.prepare(copy.deepcopy(T.model))
    state = m.init_state(model)
    up, stats = P.client_round(m, model, P.broadcast(m, state, 1), subset(T.train, range(16)),
                               ClientContext(0, 1, 3, cfg, T.loss, {}), cfg.max_message_bytes)
    new, report = P.aggregate(m, state, [(0, up)], 1, max_bytes=cfg.max_message_bytes)
    assert report["accepted"] == 1 and stats["flops"] > 0


def test_real_smollm2_zero_shot_is_above_chance():
    """The real SmolLM2-135M-Instruct, no training: 200 balanced tweets, label words ' negative' / ' positive'."""
    from lightfed import assets
    try:
        T = tasks.build("psentiment", {"train_size": 2, "test_size": 200, "max_len": 48}, 0)
    except assets.AssetMissing as e:
        pytest.skip(str(e))
    torch.set_num_threads(2)
    acc = T.evaluate(T.model, T.test)
    print(f"zero-shot accuracy {acc:.3f}")
    assert acc > 0.58, acc          # chance is 0.5; 0.58 is 2.3 standard errors above it at n = 200


@pytest.mark.parametrize("name,opts", [("fedavg", {}), ("lora", {}), ("fednl", {"layers": "0,1"})])
def test_shared_prompt_option_scores_equal_the_plain_ones(name, opts):
    """Trivia's evaluation runs each question's prompt once (KV cache and FedNL's memory state repeated per option):
    the same scores as every option's own full forward, with trained (non-zero) adapters, FedNL's gate open, and a
    question whose options do not share a prompt (scored the plain way)."""
    from lightfed.models.lm import option_scores, option_scores_shared
    T = tiny_task("trivia")
    model = methods.build(tiny_config("trivia", name, method_options=opts)).prepare(copy.deepcopy(T.model)).eval()
    g = torch.Generator().manual_seed(0)
    b = {k: v.clone() for k, v in T.test.items()}
    first = b["target_mask"].int().argmax(-1)
    assert bool((first == first[:, :1]).all())                          # trivia's encoding: one prompt for all options
    b["input_ids"][0, 2, 0] = (b["input_ids"][0, 2, 0] + 1) % 100         # question 0: one option's prompt differs
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.3 * torch.randn(p.shape, generator=g))
        plain = option_scores(model, b["input_ids"], b["attention_mask"], b["target_mask"])
        shared = option_scores_shared(model, b["input_ids"], b["attention_mask"], b["target_mask"], batch=3)
    assert (plain - option_scores(T.model, b["input_ids"], b["attention_mask"], b["target_mask"])).abs().max() > 1e-2
    assert torch.allclose(shared, plain, atol=1e-4), (shared - plain).abs().max()


def test_the_validation_split_keeps_the_train_rows_and_scores_tweets_outside_train_and_test(monkeypatch):
    """psentiment validation = true: the same train rows, a balanced test drawn from neither the train nor the test
    rows (settings chosen there never see the test set)."""
    from lightfed.data import datasets
    labels = [i % 3 == 0 for i in range(300)]           # 100 positive, 200 negative, every text its own
    monkeypatch.setattr(datasets, "load_tweets", lambda *a, **k: ([f"tweet number {i}" for i in range(300)], labels))
    o = {"tiny": True, "train_size": 60, "test_size": 40, "max_len": 16}
    real, val = tasks.build("psentiment", o, 0), tasks.build("psentiment", {**o, "validation": True}, 0)
    assert torch.equal(real.train["input_ids"], val.train["input_ids"])

    def rows(d):
        return {tuple(r.tolist()) for r in d["input_ids"]}
    assert len(rows(val.test)) == 40 and not rows(val.test) & (rows(real.train) | rows(real.test))
    assert val.test["labels"].sum() == 20                # balanced
