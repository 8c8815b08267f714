"""The passkey task's streams: exact geometry, the gold needle in the chunk its depth names, answers as targets,
evaluation needles never trained on; RULER's templates in the same geometry (domain = template)."""
import json

import numpy as np
import pytest
import torch

from conftest import tiny_config
from lightfed import assets, config as C, tasks
from lightfed.data import niah
from lightfed.engine import local
from lightfed.tasks import passkey as PK


@pytest.fixture(scope="module")
def tok():
    try:
        from lightfed.models import backbones
        return backbones.smollm2_tokenizer("")
    except assets.AssetMissing as e:
        pytest.skip(str(e))


def _find(ids: list[int], sub: list[int]) -> int:
    return next(i for i in range(len(ids) - len(sub) + 1) if ids[i:i + len(sub)] == sub)


def _gold_needle(tok, name: str, s) -> list[int]:
    """The tokens of the stream's first gold needle (its key read off the question)."""
    text = tok.decode(s.ids)
    q = text.rsplit("\n\n", 1)[1]
    key = q.split(" for ", 1)[1].split(" mentioned")[0].split(",")[0].split(" and ")[0]
    first = s.value.split(", ")[0]
    return tok(" " + niah.needle(niah.TASKS[name].value, key, first), add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("name", PK.TEMPLATES7)
def test_every_template_stream_is_exact_and_its_gold_needle_sits_in_the_chunk_its_depth_names(tok, name):
    # depth 1 is refused where the question and answer may not leave the needle room (a uuid can take 37 tokens)
    depths = "0,0.5" if name in ("multiquery", "single_3") else "0,0.5,1"
    o = PK.Options(templates=name, unit=128, window=128, lengths="4,8", depths=depths, test_per_cell=3)
    ss = PK.streams(o, tok, "eval", template=name)
    assert len(ss) == 2 * len(o.deps()) * 3
    for s in ss:
        ids = s.ids.tolist()
        assert len(ids) == s.chunks * 128
        want = s.chunks - 1 if s.depth >= 1 else min(int(s.depth * (s.chunks - 1)), s.chunks - 2)
        assert s.needle_chunk == want
        if name == "passkey":
            n = tok(" The pass key is {v}. Remember it. {v} is the pass key.".format(v=s.value), add_special_tokens=False)["input_ids"]
        else:
            n = _gold_needle(tok, name, s)
        at = _find(ids, n)
        assert at // 128 == want and (at + len(n) - 1) // 128 == want          # wholly inside its chunk
        # the targets are the answer, at the very end, and spell the gold values
        t = torch.nonzero(s.targets).flatten()
        assert t.max() == len(ids) - 1
        assert tok.decode(s.ids[s.targets]).replace(",", "").replace(" ", "") == s.value.replace(", ", "")


@pytest.mark.parametrize("name", ["multivalue", "multiquery", "single_3", "passkey"])
def test_each_answer_token_is_marked_with_the_gold_it_spells_and_golds_found_counts_them(tok, name, monkeypatch):
    """gold_of: the tokens marked k spell gold k, the rest of the targets are separators. scores: with every answer
    token predicted, exact match 1 and every gold found; one token of one gold wrong: exact 0, that gold lost; a
    separator wrong: exact 0, every gold found (RULER's string-match-all reads the values, not the commas)."""
    from lightfed.models import streaming
    o = PK.Options(templates=name, unit=128, window=128, lengths="4", depths="0", test_per_cell=2)
    ss = PK.streams(o, tok, "eval", template=name)
    golds = ss[0].value.split(", ")
    if name == "passkey":
        assert ss[0].gold_of is None
    else:
        g = ss[0].gold_of
        assert [tok.decode(ss[0].ids[g == k]).strip() for k in range(len(golds))] == golds
        assert set(tok.decode(ss[0].ids[ss[0].targets & (g < 0)]).replace(" ", "")) <= {","}
        assert not ((g >= 0) & ~ss[0].targets).any()                       # a gold's tokens are all targets

    class Oracle(torch.nn.Module):                  # the hidden state is the next token itself; lm_head one-hots it
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(1))

        def forward(self, h):                       # (n, 1) -> (n, vocab)
            return torch.nn.functional.one_hot(h[:, 0].long(), len(tok)).float()

    model = torch.nn.Module()
    model.lm_head = Oracle()
    wrong: dict[int, int] = {}                      # stream index -> position whose next-token prediction is wrong

    def hidden(m, ids, window, targets=None, reset=False):
        nxt = torch.cat([ids[:, 1:], ids[:, :1]], 1).clone()
        for r in range(len(ids)):
            i = next(i for i, s in enumerate(ss) if torch.equal(s.ids, ids[r]))
            if i in wrong:
                nxt[r, wrong[i] - 1] += 1
        return nxt[..., None].float()
    monkeypatch.setattr(streaming, "hidden", hidden)
    assert PK.scores(model, ss[:2], 128) == [(1.0, 1.0), (1.0, 1.0)]
    if name == "passkey":
        return
    t = torch.nonzero(ss[1].targets).flatten()
    wrong[1] = int(t[(ss[1].gold_of[t] == min(1, len(golds) - 1))][0])     # a token of gold 1 (or the only gold)
    assert PK.scores(model, ss[:2], 128) == [(1.0, 1.0), (0.0, (len(golds) - 1) / len(golds))]
    if len(golds) > 1:
        wrong[1] = int(t[ss[1].gold_of[t] < 0][0])                           # a comma
        assert PK.scores(model, ss[:2], 128) == [(1.0, 1.0), (0.0, 1.0)]


@pytest.mark.parametrize("split", ["train", "eval"])
def test_a_templates_size_bound_holds_for_every_draw_so_a_geometry_fails_for_every_seed_or_none(tok, split):
    """The draw-free bound (Builder.template_sizes) is never below what 300 draws of each template take; multiquery's
    question and answer (up to 106 tokens drawn) beside its needle (up to 24) overflow a 128-token chunk at depth 1 on
    some draws only, so depth 1 is refused for every seed and data_seed, before any stream is drawn."""
    b = PK._builder(tok, split, 128)
    for name in [*PK.TEMPLATES7[1:], "multikey_3"]:
        t, rng = niah.TASKS[name], np.random.default_rng(7)
        head, gold, tail, total = b.template_sizes(name)
        assert head == len(b._enc(niah._instruction(t.value)))
        for _ in range(300):
            used: dict = {}
            keys = niah._unique(t.key, t.n_keys, rng, split, used)
            values = [niah._unique(t.value, t.n_values, rng, split, used) for _ in keys]
            golds = [v for vs in values[:t.n_queries] for v in vs]
            needles = [len(b._enc(" " + niah.needle(t.value, k, v))) for k, vs in zip(keys, values) for v in vs]
            q = b._enc("\n\n" + niah._question(t.value, keys[:t.n_queries], len(golds))) + b._enc(" " + ", ".join(golds))
            assert needles[0] <= gold and len(q) <= tail and sum(needles) <= total, name
    for data_seed in (0, 1, 2):
        o = PK.Options(templates="multiquery", unit=128, window=128, lengths="4", depths="0,1", test_per_cell=40,
                       data_seed=data_seed)
        with pytest.raises(ValueError, match=r"multiquery: a 128-token chunk cannot hold its needle .* at depth 1 of 4"):
            PK.streams(o, tok, "eval", template="multiquery")


def test_evaluation_keys_and_values_were_never_trained_on(tok):
    for name in ("passkey", "multivalue", "single_3"):
        o = PK.Options(templates=name, unit=128, window=128, train_size=40, lengths="4", depths="0,0.5", test_per_cell=10)
        tr = {v for s in PK.streams(o, tok, "train", template=name) for v in s.value.split(", ")}
        ev = {v for s in PK.streams(o, tok, "eval", template=name) for v in s.value.split(", ")}
        assert tr and ev and not tr & ev
        for s in PK.streams(o, tok, "train", template=name):
            assert s.needle_chunk < s.chunks - 1                              # training needles: outside the question's chunk


def test_the_pass_keys_streams_do_not_change_when_other_templates_join(tok):
    a = PK.Options(templates="passkey", train_size=8, lengths="4", depths="0,1", test_per_cell=2)
    b = PK.Options(templates="all", train_size=8, lengths="4", depths="0,1", test_per_cell=2)
    for split in ("train", "eval"):
        x, y = PK.streams(a, tok, split), PK.streams(b, tok, split, template="passkey")
        assert all(torch.equal(s.ids, t.ids) and torch.equal(s.targets, t.targets) for s, t in zip(x, y))


def test_a_template_too_big_for_the_chunk_or_an_unknown_name_fails_before_any_work():
    with pytest.raises(C.ConfigError, match=r"multikey_3: a 128-token chunk cannot hold"):
        tasks.build("passkey", {"tiny": True, "templates": "multikey_3", "unit": 128, "window": 128, "train_size": 2,
                                "lengths": "4", "depths": "0", "test_per_cell": 1}, 0)
    with pytest.raises(C.ConfigError, match=r"templates = 'passkey,nope'"):
        local.check(tiny_config("passkey", "fedavg", task_options={"templates": "passkey,nope"}))


def test_templates_are_domains_one_client_each_and_a_held_out_one_is_scored(tmp_path):
    o = {"tiny": True, "templates": "passkey,multikey_1,multivalue", "unit": 128, "window": 128, "train_size": 4,
         "train_chunks": 2, "lengths": "2", "depths": "0,1", "test_per_cell": 2}
    cfg = tiny_config("passkey", "fednl", tmp_path, task_options=o, clients=3, partition="domain",
                      holdout="2", fraction=1.0, rounds=1, local_steps=1, batch_size=2,
                      method_options={"layers": "1", "n_layers": 1, "chunk": 64})
    s = local.run(cfg, log=lambda *a: None)
    assert set(s["per_domain"]) == {"passkey", "multikey_1", "multivalue"}
    assert set(s["cells"]["multivalue"]) == {"2/0", "2/1"}
    hist = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines() if json.loads(l)["round"] > 0]
    assert all(c["id"] != 2 for h in hist for c in h["clients"])              # the held-out template never trains


def test_lm_weight_adds_the_streams_other_tokens_nll_from_the_same_forward():
    from lightfed.models import backbones, lm
    torch.manual_seed(0)
    model = backbones.smollm2(True, 0).eval()
    ids = torch.randint(0, model.config.vocab_size, (2, 24))
    tm = torch.zeros(2, 24, dtype=torch.bool)
    tm[:, -3:] = True
    with torch.no_grad():
        logp = model(input_ids=ids).logits[:, :-1].float().log_softmax(-1)          # full attention: window = T
        nll = -logp.gather(2, ids[:, 1:, None])[..., 0]                             # (2, 23)
        want = nll[tm[:, 1:]].mean() + 0.3 * nll[~tm[:, 1:]].mean()
        got = lm.target_nll(model, ids, tm, 24, lm_weight=0.3)
        only = lm.target_nll(model, ids, tm, 24)
    assert torch.allclose(got, want, atol=1e-4) and torch.allclose(only, nll[tm[:, 1:]].mean(), atol=1e-4)


def test_a_curriculum_trains_short_streams_first_in_the_same_rows_and_ends_at_train_chunks(tmp_path, monkeypatch):
    """curriculum "2,4": the first half of the rounds draws 2-chunk streams, the rest train_chunks' (the very streams
    of a run without a curriculum); same rows, labels and templates per row; what each client round trained on is
    the stage's length; a curriculum that does not end at train_chunks fails before any work."""
    o = {"tiny": True, "templates": "passkey,multikey_1", "unit": 128, "window": 128, "train_size": 4,
         "train_chunks": 4, "lengths": "2", "depths": "0", "test_per_cell": 1}
    T = tasks.build("passkey", {**o, "curriculum": "2,4"}, 0)
    plain = tasks.build("passkey", o, 0)
    first, last = T.train_at(1, 4), T.train_at(4, 4)
    assert first["input_ids"].shape == (8, 2 * 128) and T.train_at(2, 4)["input_ids"].shape == (8, 2 * 128)
    assert all(torch.equal(last[k], plain.train[k]) for k in last) and T.train_at(3, 4) is last
    assert torch.equal(first["labels"], plain.train["labels"]) and plain.train_at(1, 4) is plain.train
    assert (first["target_mask"].sum(1) > 0).all()                                   # every short stream has its answer
    assert T.info["curriculum_chunks"] == [2, 4] and "curriculum_chunks" not in plain.info
    seen = []
    cfg = tiny_config("passkey", "fednl", tmp_path, task_options={**o, "curriculum": "2,4"}, clients=2,
                      partition="domain", fraction=1.0, rounds=2, local_steps=1, batch_size=2,
                      method_options={"layers": "1", "n_layers": 1, "chunk": 64})
    from lightfed.engine import protocol as P
    orig = P.client_round
    def spy(method, model, down, data, ctx, max_bytes):                          # what each client round trains on
        seen.append((ctx.round, data["input_ids"].shape[1]))
        return orig(method, model, down, data, ctx, max_bytes)
    monkeypatch.setattr(P, "client_round", spy)
    local.run(cfg, log=lambda *a: None)
    assert sorted(set(seen)) == [(1, 256), (2, 512)]
    for bad in ("2,3", "4,2", "1,4", "2,x"):
        with pytest.raises(C.ConfigError, match="curriculum"):
            local.check(tiny_config("passkey", "fedavg", task_options={**o, "curriculum": bad}))


@pytest.mark.parametrize("name", ["passkey", "single_1"])
def test_training_needles_are_placed_by_chunk_index_so_every_chunk_but_the_questions_holds_them(tok, name):
    """A chunk index drawn k, turned into the float depth k / (n - 1) and floored back, came out k - 1 for some k from
    23 chunks on (23 x 22 / 22 < 22 in floating point): chunk 21 held two chunks' needles and one chunk none. The
    needle's chunk is the index drawn, and the pass key's streams at 4 chunks (every stored result) are unchanged."""
    n = 24
    o = PK.Options(templates=name, train_chunks=n, train_size=400, lengths="24", depths="0", test_per_cell=1)
    ss = PK.streams(o, tok, "train", template=name)
    counts = np.bincount([s.needle_chunk for s in ss], minlength=n)
    assert counts[n - 1] == 0 and (counts[:n - 1] > 0).all(), counts.tolist()
    for s in ss[:20]:       # the needle's tokens lie in the chunk it names
        W = o.unit
        chunk = s.ids[s.needle_chunk * W:(s.needle_chunk + 1) * W].tolist()
        want = tok(" " + s.value.split(", ")[0], add_special_tokens=False)["input_ids"][1:]
        assert any(chunk[i:i + len(want)] == want for i in range(W - len(want) + 1))
    assert all(PK.P.chunk_of(4, k / 3) == k for k in range(3))      # at 4 chunks the old rule gave the same chunks


def test_needle_moved_and_alone_rebuild_a_stream_from_its_own_chunks():
    """The needle edits (benchmarks/fednl_retrieval.WHY): the needle's chunk moved next to the question keeps every chunk (only their order, hence the order
    of the memory's writes, changes), and is the stream itself when the needle was already there; alone keeps the
    needle's chunk and the question's. The cell stays the one the stream was drawn in."""
    import torch
    from lightfed.data.passkey import Stream, needle_alone, needle_moved
    from lightfed.tasks import passkey
    U, n = 3, 4
    ids = torch.arange(n * U)
    tgt = torch.zeros(n * U, dtype=torch.bool)
    tgt[-2:] = True
    chunk = lambda x, j: x[j * U:(j + 1) * U].tolist()      # noqa: E731
    s = Stream(ids, tgt, n, 0.0, 0, "1234567")
    m = needle_moved(s, U)
    assert [chunk(m.ids, j) for j in range(n)] == [chunk(ids, 1), chunk(ids, 2), chunk(ids, 0), chunk(ids, 3)]
    assert m.targets.tolist() == tgt.tolist() and m.needle_chunk == 2 and passkey.cell(m) == passkey.cell(s) == "4/0"
    last = Stream(ids, tgt, n, 0.75, 2, "1234567")
    assert needle_moved(last, U).ids.tolist() == ids.tolist()
    a = needle_alone(Stream(ids, tgt, n, 0.5, 1, "1234567", gold_of=ids % 2), U)
    assert a.ids.tolist() == chunk(ids, 1) + chunk(ids, 3) and a.gold_of.tolist() == [x % 2 for x in a.ids.tolist()]
    assert a.targets.tolist() == [False] * (2 * U - 2) + [True] * 2 and a.needle_chunk == 0
