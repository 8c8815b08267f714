"""Where a run computes, and in which precision: `device` and `dtype` of the run config.

    device  auto (CUDA when torch sees one, else the CPU) | cpu | cuda | cuda:N
    dtype   fp32 | bf16: the FROZEN weights are stored in bfloat16 and every forward runs under torch.autocast
            (bf16 matmuls and convolutions); trainable parameters, optimizer state and everything that crosses
            the wire stay float32. On CPUs with AMX or AVX512-BF16 bf16 runs ~2-3x faster than fp32.

Clients train and the engines evaluate on the device; the wire is device-free (messages are encoded from and
decoded to CPU tensors) and the server's state and aggregation stay on the CPU. Batches reach the device through
`data.tensors.batches`, which moves each batch to `current()`: the device of the `using` block it runs in.
"""
from __future__ import annotations

import contextlib
import contextvars

import torch

from lightfed.config import ConfigError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
_CURRENT: contextvars.ContextVar[torch.device] = contextvars.ContextVar("lightfed_device", default=torch.device("cpu"))


def check(device: str, dtype: str) -> None:
    """A bad value, or CUDA asked for where there is none, fails here: before any work."""
    if dtype not in DTYPES:
        raise ConfigError(f"dtype = {dtype!r}: use one of {', '.join(DTYPES)}")
    if device in ("auto", "cpu"):
        return
    if not (device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit())):
        raise ConfigError(f"device = {device!r}: use auto, cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise ConfigError(f"device = {device!r}, but torch sees no CUDA device (torch {torch.__version__}, "
                          f"{'a CPU-only build' if torch.version.cuda is None else 'CUDA ' + torch.version.cuda}); "
                          "use device = auto or cpu")
    n = int(device[5:]) if device.startswith("cuda:") else 0
    if n >= torch.cuda.device_count():
        raise ConfigError(f"device = {device!r}: torch sees {torch.cuda.device_count()} CUDA device(s) (0..)")


def resolve(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def place(model: torch.nn.Module, device: str, dtype: str) -> torch.nn.Module:
    """Move the (prepared) model to its device; with bf16, its frozen weights to bfloat16 (trainable ones stay fp32,
    and so does the base of a parametrized tensor, e.g. FedNL's theta_0 under its latent map: what trains is its sum)."""
    model.to(resolve(device))
    if dtype == "bf16":
        for n, p in model.named_parameters():
            if not p.requires_grad and p.is_floating_point() and ".parametrizations." not in n:
                p.data = p.data.to(torch.bfloat16)
    return model


def current() -> torch.device:
    return _CURRENT.get()


@contextlib.contextmanager
def using(device: str, dtype: str):
    """Compute on `device` (batches move there) and, with bf16, under autocast, inside the block."""
    dev = resolve(device)
    token = _CURRENT.set(dev)
    try:
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dtype == "bf16"):
            yield dev
    finally:
        _CURRENT.reset(token)


def to(x, dev: torch.device | None = None):
    """A tensor or a dict of tensors on `dev` (default: current())."""
    dev = dev or current()
    if isinstance(x, dict):
        return {k: to(v, dev) for k, v in x.items()}
    return x.to(dev) if torch.is_tensor(x) and x.device != dev else x
