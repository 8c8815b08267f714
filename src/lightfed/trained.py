"""Use what you trained: `lightfed.load(PATH)` opens a folder `lightfed export` wrote, or a finished run's folder
(its final global model, as the clients receive it), and returns a model to use.

    m = lightfed.load("my-fednl")                       # FedNL: the base LM, its memory branches and trained rules
    m.ask("long.txt", "What is the pass key? The pass key is")      -> " 4817263"
    m = lightfed.load("my-classifier")                  # a text classifier (MiniLM + head)
    m.predict(["what a day", "never again"])            -> ["positive", "negative"]
    m = lightfed.load("runs/x/lora")                    # a run folder: the same, without exporting

`ask` streams a text of any length through the model: chunks of `window` tokens (attention local to a chunk, as the
model trained) go through the memory one after another, and the last chunk with the question and the answer share one
local KV cache; the memory's state lives in this process only (models/streaming.generate). A model without memory
(any other causal LM) with window 0 attends to the whole text at once. The answer is greedy decoding.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn

from lightfed import config as C
from lightfed import device as D
from lightfed import methods


@dataclass
class LM:
    """A causal LM (with FedNL's memory branches, or without) and its tokenizer; window 0: full attention."""
    model: nn.Module
    tok: object
    window: int
    info: dict

    def ids(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    @torch.no_grad()
    def ask(self, text: str | Path, question: str, window: int | None = None, max_new: int = 32,
            reset: bool = False, stop: str = "\n") -> str:
        """The greedy answer to `question` asked after `text` (a string, or a file: a Path or the name of an existing
        file). window: tokens a chunk (default: the model's own; 0: the whole prompt at once). max_new: the most
        tokens written; the answer ends at the end-of-text token or at `stop` ("" never). reset: the memory emptied
        at every chunk (the control: what the last chunk alone gives)."""
        from lightfed.models import streaming
        body = read_text(text)
        ids = torch.tensor([self.ids(body) + self.ids(question)])                   # (1, T)
        w = self.window if window is None else window
        if w < 0:
            raise C.ConfigError(f"window = {w}: tokens a chunk (> 0), or 0 for the whole prompt at once")
        done = (lambda new: stop in self.tok.decode(new)) if stop else None         # noqa: E731
        new = streaming.generate(self.model, ids, w or ids.shape[1], max_new, self.tok.eos_token_id, reset=reset, stop=done)
        answer = self.tok.decode(new)
        return answer.split(stop)[0] if stop else answer


@dataclass
class Classifier:
    """A text classifier (encoder + head, mean pooled) and its tokenizer; classes: the label names, if known."""
    model: nn.Module
    tok: object
    max_len: int
    classes: list | None
    info: dict

    @torch.no_grad()
    def scores(self, texts: list[str], batch: int = 64) -> torch.Tensor:
        """Class probabilities (N, C)."""
        dev = next(self.model.parameters()).device
        out = []
        for i in range(0, len(texts), batch):
            enc = self.tok(texts[i:i + batch], padding="max_length", truncation=True, max_length=self.max_len,
                           return_tensors="pt")
            out.append(self.model(enc["input_ids"].to(dev), enc["attention_mask"].to(dev)).float().softmax(-1).cpu())
        return torch.cat(out) if out else torch.empty(0, len(self.classes or []))

    def predict(self, texts: list[str]) -> list:
        """The most likely class of each text: its name where the classes are named, else its index."""
        idx = self.scores(texts).argmax(-1).tolist()
        return [self.classes[i] for i in idx] if self.classes else idx


def read_text(text: str | Path) -> str:
    """A Path, or a string naming an existing file, is read (UTF-8); any other string is the text itself."""
    if isinstance(text, Path) or (isinstance(text, str) and "\n" not in text and len(text) < 4096 and os.path.isfile(text)):
        p = Path(text)
        try:
            return p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise C.ConfigError(f"{p}: cannot read it as UTF-8 text ({e})") from None
    return text


def load(path: str | Path, device: str = "cpu") -> LM | Classifier:
    """An exported folder (lightfed.json + the model's files) or a finished run's folder, on `device`."""
    path = Path(path)
    D.check(device, "fp32")
    if (path / "ckpt" / "latest.json").is_file() and (path / "config.json").is_file():
        return _from_run(path, device)
    meta_file = path / "lightfed.json"
    if not meta_file.is_file():
        raise C.ConfigError(f"{path}: neither an exported model (lightfed.json) nor a run folder (config.json + ckpt/)")
    meta = json.loads(meta_file.read_text())
    kind = meta.get("kind")
    dev = D.resolve(device)
    if kind == "adapter":
        raise C.ConfigError(f"{path}: LoRA adapters alone (PEFT layout): load them with peft onto their base "
                            f"({meta.get('task')}), or export the merged model without --adapter")
    if kind == "encoder + head":
        from lightfed.export import load_classifier
        from transformers import AutoTokenizer
        return Classifier(load_classifier(path).to(dev), AutoTokenizer.from_pretrained(path), meta["max_len"],
                          meta.get("classes"), meta)
    if kind in ("causal LM", "fednl"):
        from transformers import AutoModelForCausalLM, AutoTokenizer
        base = path if kind == "causal LM" or meta["base"] == "." else Path(meta["base"])
        if not (base / "config.json").is_file():
            raise C.ConfigError(f"{path}: its base model folder {str(base)!r} is not there (config.json)")
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(base)
        if kind == "fednl":
            attach_memory(model, meta["memory"], path / "memory.safetensors")
        return LM(model.to(dev).eval(), tok, int(meta.get("window") or 0), meta)
    raise C.ConfigError(f"{path}: lightfed.json says kind {kind!r}, which this lightfed cannot load")


def attach_memory(model: nn.Module, memory: dict, theta_file: Path) -> None:
    """FedNL's memory branches on `model`, their trained rules theta loaded; every tensor of the file used, every
    parameter of the branches set."""
    from safetensors.torch import load_file
    from lightfed.models import delta_memory
    delta_memory.attach(model, memory["layers"], r=memory["r"], chunk=memory["chunk"], r_k=memory["r_k"],
                        forget=0.5 if memory["forget"] else 0.0)       # forget > 0 makes the gate; theta sets its value
    theta = load_file(theta_file)
    params = {n: p for n, p in model.named_parameters() if ".memory." in n}
    if set(theta) != set(params):
        raise C.ConfigError(f"{theta_file}: its tensors do not match the memory config (missing "
                            f"{sorted(set(params) - set(theta))[:3]}, unexpected {sorted(set(theta) - set(params))[:3]})")
    with torch.no_grad():
        for n, p in params.items():
            if tuple(theta[n].shape) != tuple(p.shape):
                raise C.ConfigError(f"{theta_file}: {n} has shape {tuple(theta[n].shape)}, the config makes {tuple(p.shape)}")
            p.copy_(theta[n])
    for p in model.parameters():
        p.requires_grad_(False)


def _from_run(run: Path, device: str) -> LM | Classifier:
    """A finished run's final global model (what `lightfed export` would write), without writing it."""
    from lightfed import export as E
    from lightfed.engine import local
    from lightfed.models import backbones
    cfg = local.load_config(run)
    if not methods.METHODS[cfg.method].federated:
        raise C.ConfigError(f"{run}: {cfg.method} has no global model; `lightfed export {run} --client K` writes a client's")
    S, rnd = local.final_model(run, device)
    model, cfg = S.model, S.cfg
    if E.latent.latent_layers(model):                       # FLITE's map baked in; LoRA merged: plain modules
        model = E.merge_latent(model)
    model = E.merge_lora(model)
    meta = {"run": str(run), "round": rnd, "task": cfg.task, "method": cfg.method, **E.use_settings(cfg, S.task)}
    if isinstance(model, backbones.TextClassifier):
        return Classifier(model, backbones.minilm_tokenizer(cfg.task_options.get("model", "")), meta["max_len"],
                          meta.get("classes"), meta)
    if hasattr(model, "lm_head"):
        return LM(model, backbones.smollm2_tokenizer(cfg.task_options.get("model", "")), meta.get("window", 0), meta)
    raise C.ConfigError(f"{run}: a {type(model).__name__} ({cfg.task}) takes no text; `lightfed export` its weights")
