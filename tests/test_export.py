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
    assert cli.main(["export", str(tmp_path / "run"), "--to", str(tmp_path / "x")]) == 2
    assert "not a transformers architecture" in capsys.readouterr().err
    assert cli.main(["export", str(tmp_path / "nothing"), "--to", str(tmp_path / "x")]) == 2
