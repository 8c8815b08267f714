"""Your own model: a local Hugging Face folder (written here from a random config) through --model, with
every kind of method; a hub name without a local folder is refused with what to do."""
import pytest
import torch

from conftest import TINY
from lightfed import assets, cli, config
from lightfed.engine import local
from lightfed.models import backbones


@pytest.fixture(scope="module")
def my_llama(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM
    try:
        tok = backbones.smollm2_tokenizer()
    except assets.AssetMissing as e:
        pytest.skip(str(e))
    d = tmp_path_factory.mktemp("my-llama")
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=48, intermediate_size=96, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True)
    torch.manual_seed(3)
    LlamaForCausalLM(cfg).save_pretrained(d)
    tok.save_pretrained(d)
    return d


@pytest.mark.parametrize("method", ["fedavg", "lora", "flite", "fedspzo", "fednl"])
def test_a_local_folder_runs_through_every_kind_of_method(my_llama, tmp_path, method):
    opts = {**{k: v for k, v in TINY["austen"].items() if k != "tiny"}, "model": str(my_llama)}
    cfg = config.from_dict({"task": "austen", "method": method, "clients": 2, "rounds": 1, "batch_size": 4,
                            "local_steps": 1, "lr": 1e-3, "progress": False, "task_options": opts, "out": str(tmp_path)})
    s = local.run(cfg, log=lambda *a: None)
    assert s["model_params"] > 0 and s["bytes"]["up_per_client_round"] > 0
    import json
    info = json.loads((tmp_path / "setup.json").read_text())
    assert info["task"]["backbone"] == str(my_llama) and info["model_params"] >= 3 * 48 * 48


@pytest.mark.parametrize("method", ["lora", "fedspzo", "fednl"])
def test_another_architecture_qwen2_finds_its_targets_and_layers(tmp_path, method):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    try:
        tok = backbones.smollm2_tokenizer()
    except assets.AssetMissing as e:
        pytest.skip(str(e))
    d = tmp_path / "my-qwen"
    torch.manual_seed(4)
    Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)).save_pretrained(d)
    tok.save_pretrained(d)
    opts = {**{k: v for k, v in TINY["austen"].items() if k != "tiny"}, "model": str(d)}
    cfg = config.from_dict({"task": "austen", "method": method, "clients": 2, "rounds": 1, "batch_size": 4, "local_steps": 1,
                            "lr": 1e-3, "progress": False, "task_options": opts, "out": str(tmp_path / "run")})
    s = local.run(cfg, log=lambda *a: None)
    assert s["bytes"]["up_per_client_round"] > 0 and s["final"] > 0


def test_cli_model_flag_and_hub_names_are_refused_with_the_fix(tmp_path, capsys):
    rc = cli.main(["run", "--task", "austen", "--method", "fedavg", "--model", "HuggingFaceTB/SmolLM2-360M",
                   "--rounds", "1", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and "no such local folder" in err and "huggingface-cli download HuggingFaceTB/SmolLM2-360M" in err
    (tmp_path / "empty").mkdir()
    with pytest.raises(config.ConfigError, match="config.json"):
        assets.user_model(str(tmp_path / "empty"))


def test_a_gguf_file_is_a_model_too():
    """--model may name a .gguf file (here: the SmolLM2 GGUF that the asset package ships), dequantised on load."""
    try:
        gguf = assets.smollm2_gguf()
    except assets.AssetMissing as e:
        pytest.skip(str(e))
    folder, name = assets.user_model(str(gguf))
    assert (folder, name) == (gguf.parent, gguf.name)
    model = backbones.smollm2(False, 0, str(gguf))
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.num_hidden_layers == 30
    assert len(backbones.smollm2_tokenizer(str(gguf))) == model.config.vocab_size


def test_a_transformers_older_than_the_cache_keyword_is_refused_by_name():
    """Review defect 2: transformers 5.23 and older take the KV cache as past_key_values and would drop our
    `cache=` silently; the floor is checked and named."""
    from lightfed.models import backbones
    backbones.require_transformers("5.24.0")
    with pytest.raises(ImportError, match=r"transformers >= 5.24 \(found 5.23.0\).*pip install 'transformers>=5.24'"):
        backbones.require_transformers("5.23.0")
    with pytest.raises(ImportError):
        backbones.require_transformers("4.57.6")


def test_the_streaming_decode_uses_its_kv_cache():
    """The last chunk's KV cache is what the answer's tokens attend to: greedy decoding with the cache gives
    the tokens a full forward over prompt + answer would choose (a dropped cache would not)."""
    import torch
    from lightfed.models import backbones, streaming
    m = backbones.smollm2(True, 0).eval()
    ids = torch.randint(0, 49152, (1, 20), generator=torch.Generator().manual_seed(0))
    new = streaming.generate(m, ids, window=64, max_new=5)
    seq = ids
    with torch.no_grad():
        for t in new:
            assert int(m(input_ids=seq).logits[0, -1].argmax()) == t
            seq = torch.cat([seq, torch.tensor([[t]])], 1)
