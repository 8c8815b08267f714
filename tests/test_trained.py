"""Use what you trained (issue 45): a FedNL run exported and loaded in a fresh process answers (`lightfed.load`,
`.ask`, `lightfed ask`); greedy answers are what the teacher-forced scores say; a classifier predicts (`lightfed
predict`)."""
import json
import subprocess
import sys

import pytest
import torch

from conftest import TINY, tiny_config, tiny_task
from lightfed import cli, load
from lightfed.engine import local
from lightfed.models import streaming
from lightfed.tasks import passkey as PK

TASK = {**TINY["passkey"], "lengths": "2,3", "depths": "0,0.5,1", "test_per_cell": 3}


@pytest.fixture(scope="module")
def fednl_run(tmp_path_factory):
    """A tiny FedNL trained on the pass key (a large lr and a started gate, so that its memory matters)."""
    tiny_task("passkey")
    out = tmp_path_factory.mktemp("fednl") / "run"
    local.run(tiny_config("passkey", "fednl", out, rounds=2, lr=5e-2, method_options={"gate": 0.5},
                          task_options=TASK), log=lambda *a: None)
    return out


def _teacher_argmax(model, s, window, reset=False):
    """The argmax at each answer position given the gold tokens before it."""
    h = streaming.hidden(model, s.ids[None], window, targets=s.targets[None], reset=reset)     # (1, T, d)
    return model.lm_head(h[0, :-1][s.targets[1:]]).argmax(-1).tolist()


@pytest.mark.parametrize("reset", [False, True])
def test_greedy_answers_write_the_teacher_forced_argmaxes(fednl_run, reset):
    """On every stream, greedy decoding (the KV cache path `lightfed ask` uses) writes the teacher-forced argmaxes up
    to and including the first wrong token, and the two exact matches are the same numbers."""
    m = load(fednl_run)
    o = PK.Options(**TASK)
    ss = PK.streams(o, m.tok, "eval")
    gen = PK.generated(m.model, ss, o.window, reset=reset)
    tf = PK.scores(m.model, ss, o.window, reset=reset)
    assert [e for e, _ in gen] == [e for e, _ in tf]
    memory_mattered = 0
    for s, (_, new) in zip(ss, gen):
        want, gold = _teacher_argmax(m.model, s, o.window, reset), s.ids[-len(new):].tolist()
        k = next((i for i, (a, b) in enumerate(zip(want, gold)) if a != b), len(want) - 1)
        assert new[:k + 1] == want[:k + 1], (new, want, gold)
        memory_mattered += want != _teacher_argmax(m.model, s, o.window, not reset)
    assert memory_mattered > 0, "the memory changed no prediction: the check would not see it"


def test_a_fednl_export_loads_in_a_fresh_process_and_answers_as_the_run(fednl_run, tmp_path, capsys):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM
    assert cli.main(["export", str(fednl_run), "--to", str(tmp_path / "x")]) == 0
    meta = json.loads((tmp_path / "x" / "lightfed.json").read_text())
    assert meta["kind"] == "fednl" and meta["window"] == TASK.get("window", PK.Options().window) and meta["base"] == "."
    theta = load_file(tmp_path / "x" / "memory.safetensors")
    run = load(fednl_run)
    assert set(theta) == {n for n, _ in run.model.named_parameters() if ".memory." in n}
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "x", dtype=torch.float32)    # transformers: the base alone
    assert not any(".memory." in n for n, _ in base.named_parameters())
    assert all(torch.equal(p, dict(run.model.named_parameters())[n]) for n, p in base.named_parameters())
    o = PK.Options(**TASK)
    s = PK.streams(o, run.tok, "eval")[4]                          # a needle outside the question's chunk
    text = run.tok.decode(s.ids[:-int(s.targets.sum()) - len(run.ids(PK.P.QUESTION))])
    (tmp_path / "doc.txt").write_text(text)
    want = run.ask(tmp_path / "doc.txt", PK.P.QUESTION, max_new=8, stop="")
    code = (f"import lightfed, json; m = lightfed.load({str(tmp_path / 'x')!r}); "
            f"print(json.dumps([m.ask({str(tmp_path / 'doc.txt')!r}, {PK.P.QUESTION!r}, max_new=8, stop=''), m.window]))")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(got.stdout) == [want, o.window]
    assert cli.main(["ask", str(tmp_path / "x"), "--file", str(tmp_path / "doc.txt"), PK.P.QUESTION, "--max-new", "8"]) == 0
    assert capsys.readouterr().out == want.split("\n")[0] + "\n"
    assert cli.main(["ask", str(tmp_path / "x"), PK.P.QUESTION]) == 2                  # no text given
    assert cli.main(["predict", str(tmp_path / "x"), "--file", str(tmp_path / "doc.txt")]) == 2   # not a classifier


def test_ask_streams_the_text_in_the_models_window_and_the_control_differs(fednl_run):
    """The same question over the same text: answered with the memory carried, and with it emptied every chunk, the
    model sees different things (a memory that changed nothing would answer alike); window 0 is one chunk."""
    m = load(fednl_run)
    s = PK.streams(PK.Options(**TASK), m.tok, "eval")[4]
    body = m.tok.decode(s.ids[:-int(s.targets.sum())])
    ids = torch.tensor([m.ids(body)])
    carried = streaming.generate(m.model, ids, m.window, 6)
    assert m.tok.decode(carried) == m.ask(body, "", max_new=6, stop="")
    assert m.tok.decode(streaming.generate(m.model, ids, m.window, 6, reset=True)) == m.ask(body, "", max_new=6, stop="", reset=True)
    assert m.ask(body, "", window=0, max_new=6, stop="") == m.tok.decode(streaming.generate(m.model, ids, ids.shape[1], 6))


def test_a_classifier_run_and_its_export_predict_the_same_labels(tmp_path, capsys):
    T = tiny_task("sentiment")
    local.run(tiny_config("sentiment", "lora", tmp_path / "run", rounds=1), log=lambda *a: None)
    assert cli.main(["export", str(tmp_path / "run"), "--to", str(tmp_path / "x")]) == 0
    texts = ["what a wonderful morning", "the worst service ever", "ok I guess"]
    (tmp_path / "t.txt").write_text("\n".join(texts) + "\n")
    a, b = load(tmp_path / "run"), load(tmp_path / "x")
    assert a.classes == ["negative", "positive"] and a.predict(texts) == b.predict(texts)
    assert torch.allclose(a.scores(texts), b.scores(texts), atol=1e-6)
    assert cli.main(["predict", str(tmp_path / "x"), "--file", str(tmp_path / "t.txt")]) == 0
    assert capsys.readouterr().out.split() == b.predict(texts)
    assert cli.main(["predict", str(tmp_path / "x"), "--file", str(tmp_path / "t.txt"), "--out", str(tmp_path / "p.csv")]) == 0
    assert (tmp_path / "p.csv").read_text().splitlines()[1:] == [f"{t},{y}" for t, y in zip(texts, b.predict(texts))]
    assert cli.main(["ask", str(tmp_path / "x"), "--text", "hi", "q"]) == 2                 # a classifier: no ask
