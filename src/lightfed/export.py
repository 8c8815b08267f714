"""`lightfed export RUN_DIR --to DIR`: the run's final global model, as the clients receive it, in a folder
that transformers loads with from_pretrained.

- FLITE / ZO-FLITE: W + A Z B^T materialised into every latent layer, the layers unwrapped (plain weights).
- LoRA-family (lora, fedala, fedssi, local_only): W + (alpha / r) B A merged by PEFT, unwrapped;
  `--adapter` instead writes the adapters alone (adapter_model.safetensors + adapter_config.json, as PEFT
  saves them) next to the base model's name.
- Weight-space methods (fedavg, fedprox, top-k, PowerSGD, the zeroth-order ones): the weights as they are.
- FedNL: the frozen base model (save_pretrained, without its memory branches: from_pretrained gives the base) + the
  trained rules theta in memory.safetensors + the memory's config in lightfed.json; `lightfed.load(DIR)` rebuilds the
  model that streams (memory branches attached, theta loaded) and answers with `.ask` (`lightfed ask`).
  `base_ref`: the base is not copied; lightfed.json names the local folder it was loaded from.
- Personalised methods: `--client K` exports client K's own model (FedALA's mix, local-only's own adapters);
  local-only without it is refused (its server state never moves: the "global" model is the untrained start),
  FedALA without it exports the global aggregate and says so. `lightfed.json` names which model it is.

What is written, by backbone:
  causal LM (SmolLM2)     AutoModelForCausalLM.from_pretrained(DIR) + the tokenizer
  MiniLM classifier       AutoModel.from_pretrained(DIR) (the encoder) + the tokenizer + head.safetensors:
                          logits = head(masked mean of the last hidden states), see `load_classifier`
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn as nn
from safetensors.torch import load_file, save_file

from lightfed import assets
from lightfed import config as C
from lightfed import methods
from lightfed.models import backbones, latent


def merge_latent(model: nn.Module) -> nn.Module:
    """FLITE's map baked in: every LatentLayer replaced by its base layer with weight W + dW; z removed."""
    merged = latent.materialize(model)
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    for name, m in latent.latent_layers(model):
        if emb is not None and m.base.weight is emb.weight:      # a tied LM head: its delta is its own, untie it
            m.base.weight = nn.Parameter(merged[f"{name}.weight"].clone(), requires_grad=False)
            model.config.tie_word_embeddings = False
        else:
            with torch.no_grad():
                m.base.weight.copy_(merged[f"{name}.weight"])
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, m.base)
    del model._parameters["z"]
    return model


def merge_lora(model: nn.Module) -> nn.Module:
    """PEFT's LoRA layers merged into their base layers and unwrapped."""
    from peft.tuners.lora import LoraLayer
    for name, m in [(n, m) for n, m in model.named_modules() if isinstance(m, LoraLayer)]:
        m.merge()
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, m.get_base_layer())
    return model


def lora_adapters(model: nn.Module, method) -> tuple[dict, dict]:
    """(adapter tensors in PEFT's file layout, adapter_config.json) of a LoRA-family model."""
    o = method.opts
    tensors = {"base_model.model." + n.replace(".default", ""): p.detach().contiguous()   # PEFT's key layout
               for n, p in model.named_parameters() if "lora_" in n}
    cfg = {"peft_type": "LORA", "r": o.r, "lora_alpha": o.alpha, "lora_dropout": o.dropout,
           "target_modules": sorted({n.split(".lora_")[0].rsplit(".", 1)[-1] for n in tensors}), "bias": "none"}
    return tensors, cfg


def export(run_dir: str | Path, to: str | Path, adapter: bool = False, client: int | None = None, device: str = "cpu",
           base_ref: bool = False) -> dict:
    """Write the run's final model to `to`. device: where it is rebuilt (the run's recorded device is not needed);
    its weights are written in float32 whatever dtype trained them (a bf16 run's frozen weights are the base's fp32)."""
    from lightfed.engine import local
    from lightfed.engine import protocol as P

    run_dir, to = Path(run_dir), Path(to)
    if not (run_dir / "config.json").is_file() or not (run_dir / "ckpt" / "latest.json").is_file():
        raise C.ConfigError(f"{run_dir}: no config.json + ckpt/latest.json: not a lightfed run folder")
    cfg = local.load_config(run_dir)
    cfg.device, cfg.dtype = device, "fp32"
    if base_ref and cfg.method != "fednl":
        raise C.ConfigError(f"--base-ref: {cfg.method} changes the base's weights; only a fednl export can leave them out")
    rnd, state, client_states, _ = local.load_checkpoint(run_dir)
    M = methods.METHODS[cfg.method]
    if client is None and not M.federated:
        raise C.ConfigError(f"{cfg.method}: no global model to export (the server's state never moves: it is the untrained "
                            f"start); export one client's own model with --client K (trained: {sorted(client_states)})")
    if client is not None and not M.personalised:
        raise C.ConfigError(f"--client {client}: every {cfg.method} client uses the global model; export it without --client")
    if client is not None and client not in client_states:
        raise C.ConfigError(f"--client {client}: that client never trained in this run (trained: {sorted(client_states)})")
    S = local.build(cfg)
    if client is None:
        S.method.load(S.model, P.received(S.method, state, rnd + 1, cfg.max_message_bytes))
        which = "global" + (f" (the server's aggregate; each {cfg.method} client uses its own model: --client K)"
                            if M.personalised else "")
    else:
        S.method.personal(S.model, state, client_states[client])
        which = f"client {client}'s own"
    model = S.model.eval()
    to.mkdir(parents=True, exist_ok=True)
    meta = {"run": str(run_dir), "round": rnd, "task": cfg.task, "method": cfg.method, "model": which,
            **use_settings(cfg, S.task)}
    if cfg.method == "fednl":
        return export_fednl(model, S.method, cfg, to, base_ref, meta)
    peft_family = cfg.method in ("lora", "fedala", "fedssi", "local_only")
    if adapter:
        if not peft_family:
            raise C.ConfigError(f"--adapter: {cfg.method} has no LoRA adapters; export merged weights instead")
        tensors, acfg = lora_adapters(model, S.method)
        save_file(tensors, to / "adapter_model.safetensors")
        if isinstance(model, backbones.TextClassifier):        # its trained head is not an adapter: beside it
            save_file({k: v.contiguous() for k, v in model.head.state_dict().items()}, to / "head.safetensors")
        (to / "adapter_config.json").write_text(json.dumps({**acfg, "base_model_name_or_path": S.task.info["backbone"]}, indent=1))
        (to / "lightfed.json").write_text(json.dumps({**meta, "kind": "adapter"}, indent=1))
        return {"kind": "adapter", "dir": str(to), "tensors": len(tensors), "model": which}
    if latent.latent_layers(model):
        model = merge_latent(model)
    if peft_family:
        model = merge_lora(model)
    if isinstance(model, backbones.TextClassifier):
        model.encoder.save_pretrained(to)
        save_file({k: v.contiguous() for k, v in model.head.state_dict().items()}, to / "head.safetensors")
        backbones.minilm_tokenizer(cfg.task_options.get("model", "")).save_pretrained(to)
        kind = "encoder + head"
    elif hasattr(model, "save_pretrained"):
        model.save_pretrained(to)
        backbones.smollm2_tokenizer(cfg.task_options.get("model", "")).save_pretrained(to)
        kind = "causal LM"
    else:
        raise C.ConfigError(f"export: a {type(model).__name__} is not a transformers model (task {cfg.task})")
    (to / "lightfed.json").write_text(json.dumps({**meta, "kind": kind}, indent=1))
    return {"kind": kind, "dir": str(to), "round": rnd, "model": which}


def use_settings(cfg: C.RunConfig, task) -> dict:
    """What a user of the model needs from its training task: a classifier's classes and input length, a causal LM's
    attention window (streamed tasks: attention local to `window`-token chunks; 0: full attention)."""
    o = cfg.task_options
    if "classes" in task.info:
        return {"classes": task.info["classes"], "max_len": int(task.train["input_ids"].shape[1])}
    window = task.info.get("window", o.get("window", 0))
    return {"window": window if isinstance(window, int) else 0}


def export_fednl(model: nn.Module, method, cfg: C.RunConfig, to: Path, base_ref: bool, meta: dict) -> dict:
    """The base (or a reference to its local folder), theta in memory.safetensors, the memory's config."""
    from lightfed.models import delta_memory, latent
    if method.opts.latent_r:             # theta = theta_0 + map(z): baked into plain parameters, the layout loaders read
        latent.bake_params(model)
    else:
        assert {n for n, _ in model.named_parameters() if ".memory." in n} == set(method.trainable(model))
    mem = {n: p.detach().contiguous() for n, p in model.named_parameters() if ".memory." in n}
    o = method.opts
    memory = {"layers": [b.layer for b in delta_memory.branches(model)], "r": o.r, "r_k": o.r_k, "chunk": o.chunk,
              "forget": o.forget > 0}
    if base_ref:
        base = cfg.task_options.get("model") or (None if cfg.task_options.get("tiny") else str(assets.smollm2_dir()))
        if not base:
            raise C.ConfigError("--base-ref: this run's base is a random tiny twin with no folder; export it whole")
        base = str(Path(base).resolve())
    else:
        model.save_pretrained(to, state_dict={k: v for k, v in model.state_dict().items() if ".memory." not in k})
        backbones.smollm2_tokenizer(cfg.task_options.get("model", "")).save_pretrained(to)
        base = "."
    save_file(mem, to / "memory.safetensors")
    (to / "lightfed.json").write_text(json.dumps({**meta, "kind": "fednl", "base": base, "memory": memory}, indent=1))
    return {"kind": "fednl", "dir": str(to), "round": meta["round"], "model": meta["model"], "theta": sum(v.numel() for v in mem.values())}


def load_classifier(d: str | Path) -> backbones.TextClassifier:
    """An exported MiniLM classifier: the encoder from_pretrained + its head (mean pooling, as trained)."""
    from transformers import AutoModel
    enc = AutoModel.from_pretrained(d)
    head = load_file(Path(d) / "head.safetensors")
    model = backbones.TextClassifier(enc, head["weight"].shape[0])
    model.head.load_state_dict(head)
    return model.eval()
