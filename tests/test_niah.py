"""Needle-in-a-haystack prompts (lightfed.data.niah) on the real Austen text and SmolLM2 tokenizer."""

import re

import numpy as np
import pytest

from lightfed import assets
from lightfed.data import niah

# one needle sentence: kind, key, value (keys and values are lowercase words, digits and hyphens)
NEEDLE = re.compile(r"One of the special magic (numbers|words|uuids) for ([0-9a-z-]+) is: ([0-9a-z-]+)\.")
GEN = 32


@pytest.fixture(scope="module")
def tok():
    try:
        from lightfed.models.backbones import smollm2_tokenizer
        return smollm2_tokenizer()
    except assets.AssetMissing as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def hay():
    try:
        from lightfed.data.datasets import load_austen
        books = load_austen()
    except assets.AssetMissing as e:
        pytest.skip(str(e))
    return {split: niah.haystack_split(books, split) for split in niah.SPLITS}


_CACHE = {}


def samples(task, length, tok, hay, seed=0, split="eval", n=5):
    """n samples (depths 0, .25, .5, .75, 1 for n=5), built once per test module."""
    k = (task, length, seed, split, n)
    if k not in _CACHE:
        _CACHE[k] = niah.make_samples(task, length, tok, hay[split], n, seed, split=split)
    return _CACHE[k]


def count(tok, text):
    return len(tok(text, add_special_tokens=False)["input_ids"])


def parts(prompt):
    """(instruction, haystack, question + answer prefix): the prompt's three blank-line-separated parts."""
    a, b = prompt.index("\n\n"), prompt.rindex("\n\n")
    return prompt[:a], prompt[a + 2:b], prompt[b + 2:]


def measured_depths(s):
    """Where each gold's needle sits: its offset in the haystack with the inserted needles taken
    out, over that haystack's length (book tasks insert every needle; needle-only haystacks just
    the gold ones)."""
    hay = parts(s.prompt)[1]
    book = niah.TASKS[s.task].haystack != "needles"
    inserted = [m for m in NEEDLE.finditer(hay) if book or m.group(3) in s.golds]
    removed, at = 0, {}
    for m in inserted:
        at[m.group(3)] = m.start() - removed
        removed += len(m.group(0)) + 1  # the sentence and the space that joins it
    return [at[g] / (len(hay) - removed) for g in s.golds]


# -----------------------------------------------------------------------------
# every task of TASKS7 at 1K and 2K tokens

@pytest.mark.parametrize("length", [1024, 2048])
@pytest.mark.parametrize("task", niah.TASKS7)
def test_prompt_fits_and_fills_budget(task, length, tok, hay):
    for s in samples(task, length, tok, hay):
        assert s.task == task and s.length == length
        assert s.n_tokens == count(tok, s.prompt)
        assert s.n_tokens + GEN <= length, (s.n_tokens, length)
        assert s.n_tokens + GEN > 0.8 * length, (s.n_tokens, length)  # the haystack fills the budget


@pytest.mark.parametrize("length", [1024, 2048])
@pytest.mark.parametrize("task", niah.TASKS7)
def test_needles_golds_and_question(task, length, tok, hay):
    t = niah.TASKS[task]
    for s in samples(task, length, tok, hay):
        head, haystack, tail = parts(s.prompt)
        needles = [m.groups() for m in NEEDLE.finditer(s.prompt)]
        assert len(s.golds) == t.n_queries * t.n_values == len(s.depths)
        assert len(s.keys) == t.n_queries == len(set(s.keys))
        assert len(set(s.golds)) == len(s.golds)
        assert all(kind == t.value for kind, _, _ in needles)
        assert f"special magic {t.value}" in head
        # each gold appears once in the whole prompt, as the value of a needle of an asked key
        for g in s.golds:
            assert s.prompt.count(g) == 1, g
            assert [k for _, k, v in needles if v == g][0] in s.keys
        # each asked key has exactly its gold values, all needles have distinct values
        for k in s.keys:
            assert sorted(v for _, kk, v in needles if kk == k) == sorted(
                g for g, kk in zip(s.golds, np.repeat(s.keys, t.n_values)) if kk == k)
        assert len({v for _, _, v in needles}) == len(needles)
        # needles sit between sentences; the book text is whole sentences
        for m in NEEDLE.finditer(haystack):
            before, after = haystack[:m.start()], haystack[m.end():]
            assert before == "" or re.search(r"[.!?][\"')\]_]* $", before), before[-80:]
            assert after == "" or re.match(r"(\s+|--)[A-Z\"'(_]", after), after[:80]
        text = NEEDLE.sub("", haystack).strip()
        assert text == "" or (re.match(r"[A-Z\"'(_]", text) and re.search(r"[.!?][\"')\]_]*$", text))
        if t.haystack == "book":
            assert len(needles) == t.n_keys * t.n_values
        else:
            assert len(needles) > 5  # distractor needles fill the haystack
        # the question (and the answer prefix) names the asked key(s), in order
        who = s.keys[0] if len(s.keys) == 1 else ", ".join(s.keys[:-1]) + " and " + s.keys[-1]
        plural = len(s.golds) > 1
        one = t.value if plural else t.value[:-1]
        assert tail == (f"What {'are all' if plural else 'is'} the special magic {one} for {who} mentioned "
                        f"in the provided text? The special magic {one} for {who} mentioned in the "
                        f"provided text {'are' if plural else 'is'}")


@pytest.mark.parametrize("length", [1024, 2048])
@pytest.mark.parametrize("task", niah.TASKS7)
def test_depths_where_asked(task, length, tok, hay):
    # the first gold goes at the requested depth, snapped to the nearest sentence end: Austen's
    # longest sentences are ~1200 characters (~300 tokens), so allow ~half of one
    tol = {1024: 0.15, 2048: 0.08}[length]
    ss = samples(task, length, tok, hay)
    assert [s.depths[0] for s in ss] == [0.0, 0.25, 0.5, 0.75, 1.0]
    for s in ss:
        got = measured_depths(s)
        for want, d in zip(s.depths, got):
            assert 0.0 <= want <= 1.0
            assert abs(d - want) <= tol, (s.depths, got)


def test_one_4096_sample(tok, hay):
    s = niah.make_sample("multiquery", 4096, tok, hay["eval"], np.random.default_rng(3), depth=0.3)
    assert 0.8 * 4096 < s.n_tokens + GEN <= 4096 and s.n_tokens == count(tok, s.prompt)
    assert abs(measured_depths(s)[0] - 0.3) <= 0.05
    assert all(s.prompt.count(g) == 1 for g in s.golds) and len(s.golds) == 4


def test_single_1_is_filler(tok, hay):
    s = niah.make_sample("single_1", 1024, tok, "", np.random.default_rng(0), depth=0.5)
    haystack = NEEDLE.sub("", parts(s.prompt)[1])
    assert set(re.split(r"(?<=\.)\s+", haystack.strip())) <= set(re.split(r"(?<=\.)\s+", niah.FILLER))
    assert 0.8 * 1024 < s.n_tokens + GEN <= 1024


@pytest.mark.parametrize("task", ["multikey_2", "multikey_3"])
def test_needle_only_haystack_has_no_book_text(task, tok, hay):
    for s in samples(task, 1024, tok, hay):
        head, haystack, tail = parts(s.prompt)
        one = r"One of the special magic \w+ for [0-9a-z-]+ is: [0-9a-z-]+\."
        assert re.fullmatch(f"{one}(?: {one})*", haystack), haystack[:300]
        assert "Austen" not in s.prompt and "Emma" not in s.prompt


# -----------------------------------------------------------------------------
# determinism, train/eval disjointness

def test_same_seed_same_samples(tok, hay):
    for task in ("single_3", "multikey_2", "multivalue"):
        a = niah.make_samples(task, 1024, tok, hay["eval"], 3, seed=7)
        b = niah.make_samples(task, 1024, tok, hay["eval"], 3, seed=7)
        c = niah.make_samples(task, 1024, tok, hay["eval"], 3, seed=8)
        assert a == b
        assert all(x.golds != y.golds and x.keys != y.keys for x, y in zip(a, c))
        assert all(x.prompt != y.prompt for x, y in zip(a, c))


def _needles(tok, hay, split):
    keys, values = set(), set()
    for task, n, seed in (("multikey_2", 5, 1), ("multikey_3", 12, 1), ("single_3", 4, 1), ("multiquery", 4, 1)):
        for s in samples(task, 1024, tok, hay, seed=seed, split=split, n=n):
            for _, k, v in (m.groups() for m in NEEDLE.finditer(s.prompt)):
                keys.add(k)
                values.add(v)
    return keys, values


def test_train_and_eval_needles_never_overlap(tok, hay):
    (ktr, vtr), (kev, vev) = _needles(tok, hay, "train"), _needles(tok, hay, "eval")
    assert min(len(ktr), len(vtr), len(kev), len(vev)) >= 200
    assert not ktr & kev and not vtr & vev and not (ktr | vtr) & (kev | vev)
    # the stated rules: numbers' last digit even/odd, uuid variant nibble 8/9 vs a/b, word halves
    for values, digits, variants, side in ((vtr, "02468", "89", 0), (vev, "13579", "ab", 1)):
        for v in values:
            if v.isdigit():
                assert len(v) == 7 and v[-1] in digits
            else:
                assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", v)
                assert v[19] in variants
    for keys, side in ((ktr, 0), (kev, 1)):
        for k in keys:
            if k.count("-") == 1:
                a, n = k.split("-")
                assert niah.ADJECTIVES.index(a) % 2 == side and niah.NOUNS.index(n) % 2 == side


def test_word_lists():
    for words in (niah.ADJECTIVES, niah.NOUNS):
        assert 140 <= len(words) <= 160 and len(set(words)) == len(words)
        assert all(w.isalpha() and w.islower() for w in words)
        assert not [(a, b) for a in words for b in words if a != b and a in b]
    assert not set(niah.ADJECTIVES) & set(niah.NOUNS)


# -----------------------------------------------------------------------------
# score, training text, splits, errors

def test_score():
    golds = ["1234567", "7654321"]
    assert niah.score(" 1234567, 7654321.", golds) == 1.0
    assert niah.score("I think it is 7654321 or so", golds) == 0.5
    assert niah.score("nothing here", golds) == 0.0
    assert niah.score("", golds) == 0.0
    u = "3f2a9c1e-5b7d-4e2f-9a1b-0c3d5e7f9a1b"
    assert niah.score(f"The uuid is {u.upper()}.", [u]) == 1.0
    assert niah.score("Fearless-Badger", ["fearless-badger"]) == 1.0


def test_training_text(tok, hay):
    s = samples("multivalue", 1024, tok, hay)[0]
    prompt, answer = niah.training_text(s)
    assert prompt == s.prompt and prompt.endswith(" are")
    assert answer == " " + ", ".join(s.golds) + "." and niah.score(answer, s.golds) == 1.0


def test_haystack_split():
    books = {"b": "0123456789", "a": "abcdefghij"}
    assert niah.haystack_split(books, "train") == "abcdefghi\n\n012345678"
    assert niah.haystack_split(books, "eval") == "j\n\n9"


def test_errors(tok, hay):
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="single_9"):
        niah.make_sample("single_9", 1024, tok, hay["eval"], rng)
    with pytest.raises(ValueError, match="single_9"):
        niah.make_samples("single_9", 1024, tok, hay["eval"], 2, 0)
    with pytest.raises(ValueError, match="test"):
        niah.make_sample("single_2", 1024, tok, hay["eval"], rng, split="test")
    with pytest.raises(ValueError, match="test"):
        niah.haystack_split({"a": "text"}, "test")
    with pytest.raises(ValueError, match=r"length 100 .*gen_tokens is 32"):
        niah.make_sample("multiquery", 100, tok, hay["eval"], rng)
    with pytest.raises(ValueError, match="depth 1.5"):
        niah.make_sample("single_2", 1024, tok, hay["eval"], rng, depth=1.5)
    with pytest.raises(ValueError, match="depth -0.1"):
        niah.make_sample("single_2", 1024, tok, hay["eval"], rng, depth=-0.1)
    with pytest.raises(ValueError, match="empty"):
        niah.make_sample("single_2", 1024, tok, "", rng)
    # the smallest length the spec promises still works for every task
    for task in niah.TASKS:
        s = niah.make_sample(task, 256, tok, hay["eval"], rng)
        assert s.n_tokens + GEN <= 256
