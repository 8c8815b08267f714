"""lightfed export: the final global model as a transformers folder; loaded back, it scores what the run scored."""
import json

import pytest
import torch

from conftest import tiny_config, tiny_task
from lightfed import cli
from lightfed.engine import local
from lightfed.export import load_classifier


@pytest.mark.parametrize("method", ["fedavg", "flite", "lora"])
def test_a_causal_lm_exports_and_loads_with_from_pretrained(tmp_path, method):
    from transformers import AutoModelForCausalLM
    T = tiny_task("austen")
    s = local.run(tiny_config("austen", method, tmp_path / "run", rounds=1), log=lambda *a: None)
    assert cli.main(["export", str(tmp_path / "run"), "--to", str(tmp_path / "hf")]) == 0
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    assert type(model).__name__ == "LlamaForCausalLM" and not any("lora" in n or n == "z" for n, _ in model.named_parameters())
    got = T.evaluate(model, T.test)
    assert got == pytest.approx(s["final"], rel=1e-5)
    assert json.loads((tmp_path / "hf" / "lightfed.json").read_text())["method"] == method


@pytest.mark.parametrize("method", ["flite", "lora"])
def test_a_classifier_exports_and_predicts_the_same(tmp_path, method):
    T = tiny_task("sentiment")
    s = local.run(tiny_config("sentiment", method, tmp_path / "run", rounds=1), log=lambda *a: None)
    assert cli.main(["export", str(tmp_path / "run"), "--to", str(tmp_path / "hf")]) == 0
    assert T.evaluate(load_classifier(tmp_path / "hf"), T.test) == s["final"]


def test_lora_adapters_export_in_peft_layout_and_peft_loads_them(tmp_path):
    import copy
    from peft import PeftModel
    T = tiny_task("austen")
    s = local.run(tiny_config("austen", "lora", tmp_path / "run", rounds=1), log=lambda *a: None)
    assert cli.main(["export", str(tmp_path / "run"), "--to", str(tmp_path / "ad"), "--adapter"]) == 0
    cfg = json.loads((tmp_path / "ad" / "adapter_config.json").read_text())
    assert cfg["target_modules"] == ["q_proj", "v_proj"] and cfg["peft_type"] == "LORA"
    model = PeftModel.from_pretrained(copy.deepcopy(T.model), tmp_path / "ad")     # the base model + the adapters
    assert T.evaluate(model, T.test) == s["final"]


def test_export_refuses_what_it_cannot_write(tmp_path, capsys):
    tiny_task("austen")
    local.run(tiny_config("austen", "fednl", tmp_path / "run", rounds=1), log=lambda *a: None)
    assert cli.main(["export", str(tmp_path / "run"), "--to", str(tmp_path / "x"), "--base-ref"]) == 2
    assert "random tiny twin with no folder" in capsys.readouterr().err          # nothing to refer to
    assert cli.main(["export", str(tmp_path / "nothing"), "--to", str(tmp_path / "x")]) == 2


def test_personalised_runs_export_the_clients_own_model_when_asked(tmp_path, capsys):
    """local-only has no global model (its server state never moves): refused without --client; --client K writes
    client K's own adapters merged, which score what the run's per-client evaluation scored."""
    from transformers import AutoModelForCausalLM
    T = tiny_task("austen")
    s = local.run(tiny_config("austen", "local_only", tmp_path / "run", rounds=1, fraction=1.0, clients=2), log=lambda *a: None)
    assert cli.main(["export", str(tmp_path / "run"), "--to", str(tmp_path / "x")]) == 2
    assert "no global model" in capsys.readouterr().err
    assert not (tmp_path / "x" / "config.json").exists()
    for k in (0, 1):
        assert cli.main(["export", str(tmp_path / "run"), "--to", str(tmp_path / f"c{k}"), "--client", str(k)]) == 0
        assert json.loads((tmp_path / f"c{k}" / "lightfed.json").read_text())["model"] == f"client {k}'s own"
        got = T.evaluate(AutoModelForCausalLM.from_pretrained(tmp_path / f"c{k}", dtype=torch.float32), T.test)
        assert got == pytest.approx(s["per_client"][str(k)]["perplexity"], rel=1e-5)
        assert got != pytest.approx(s["initial"], rel=1e-6)            # trained, not the pretrained start
    assert cli.main(["export", str(tmp_path / "run"), "--to", str(tmp_path / "y"), "--client", "7"]) == 2
    assert "never trained" in capsys.readouterr().err


def test_fedala_exports_the_global_model_saying_so_or_a_clients_own(tmp_path, capsys):
    tiny_task("austen")
    s = local.run(tiny_config("austen", "fedala", tmp_path / "run", rounds=2, fraction=1.0, clients=2), log=lambda *a: None)
    assert cli.main(["export", str(tmp_path / "run"), "--to", str(tmp_path / "g")]) == 0
    assert json.loads((tmp_path / "g" / "lightfed.json").read_text())["model"].startswith("global (the server's aggregate")
    assert "exported the global" in capsys.readouterr().err
    assert cli.main(["export", str(tmp_path / "run"), "--to", str(tmp_path / "c1"), "--client", "1"]) == 0
    from transformers import AutoModelForCausalLM
    got = tiny_task("austen").evaluate(AutoModelForCausalLM.from_pretrained(tmp_path / "c1", dtype=torch.float32),
                                       tiny_task("austen").test)
    assert got == pytest.approx(s["per_client"]["1"]["perplexity"], rel=1e-5)


def test_export_of_a_shared_model_refuses_a_client(tmp_path, capsys):
    tiny_task("austen")
    local.run(tiny_config("austen", "lora", tmp_path / "run", rounds=1), log=lambda *a: None)
    assert cli.main(["export", str(tmp_path / "run"), "--to", str(tmp_path / "x"), "--client", "0"]) == 2
    assert "uses the global model" in capsys.readouterr().err
