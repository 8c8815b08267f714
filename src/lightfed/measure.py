"""Measurements every run makes: peak memory of a local update, wall time.

Peak memory is the process's resident-set high-water mark (Linux VmHWM) during the update,
reset just before it through /proc/self/clear_refs; we report the peak and its rise above the
resident set at the start. Where /proc is missing, both are None. (Bytes are counted by the
engine from the encoded messages; FLOPs by the local optimizers, with torch's FlopCounterMode.)

FlopCounterMode has no formula for the fused attention kernel torch's CPU SDPA takes in eval
mode (aten._scaled_dot_product_flash_attention_for_cpu, and its backward), so it counted 0 for
the attention matmuls there; importing this module registers torch's own SDPA formulas for it.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import (FlopCounterMode, flop_registry, register_flop_formula, sdpa_backward_flop_count,
                                      sdpa_flop_count)

_CPU_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_CPU_FLASH_BWD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward

if _CPU_FLASH not in flop_registry:
    @register_flop_formula(_CPU_FLASH)
    def _cpu_flash_flop(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
        return sdpa_flop_count(query_shape, key_shape, value_shape)   # 2 matmuls: QK^T and PV

if _CPU_FLASH_BWD not in flop_registry:
    @register_flop_formula(_CPU_FLASH_BWD)
    def _cpu_flash_bwd_flop(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
        return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)

_STATUS = Path("/proc/self/status")
_CLEAR = Path("/proc/self/clear_refs")


def _status_kb(key: str) -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def rss_bytes() -> int | None:
    kb = _status_kb("VmRSS")
    return None if kb is None else kb * 1024


class PeakRSS:
    """with PeakRSS() as m: work()   ->  m.peak (bytes), m.rise (peak - RSS at entry); on a CUDA device also
    m.device_peak: the allocator's high-water mark during the work (torch.cuda.max_memory_allocated), else None."""

    def __init__(self, device: torch.device | None = None):
        self.device = device if device is not None and device.type == "cuda" else None

    def __enter__(self):
        try:
            _CLEAR.write_text("5")     # reset VmHWM to the current RSS
        except OSError:
            pass
        if self.device is not None:
            torch.cuda.reset_peak_memory_stats(self.device)
        self.start = rss_bytes()
        self.peak = self.rise = self.device_peak = None
        return self

    def __exit__(self, *exc):
        kb = _status_kb("VmHWM")
        if kb is not None and self.start is not None:
            self.peak = kb * 1024
            self.rise = max(0, self.peak - self.start)
        if self.device is not None:
            self.device_peak = torch.cuda.max_memory_allocated(self.device)
        return False


class Clock:
    """Accumulates named wall-clock spans:  with clock("client"): ..."""

    def __init__(self):
        self.total: dict[str, float] = {}

    def __call__(self, name: str):
        clock = self

        class _Span:
            def __enter__(self):
                self.t = time.perf_counter()

            def __exit__(self, *exc):
                clock.total[name] = clock.total.get(name, 0.0) + time.perf_counter() - self.t
                return False

        return _Span()


# --- FLOPs and live tensor bytes of one call (the zeroth-order methods' accounting) ------------------
# count_flops(fn): torch's FlopCounterMode over one call (matmul / bmm / addmm / convolution / attention kernels;
# element-wise ops, norms, softmax, random draws and perturbation arithmetic are not counted).
# peak_live_bytes(fn, exclude): the peak total size of the tensor storages created by aten ops during fn that are
# alive at the same time (kernel-internal scratch not included).
def count_flops(fn: Callable):
    """(fn(), FLOPs of that call as torch's FlopCounterMode counts them)."""
    with FlopCounterMode(display=False) as fc:
        out = fn()
    return out, fc.get_total_flops()


class _LiveBytes(TorchDispatchMode):
    def __init__(self, exclude: set[int]):
        super().__init__()
        self.exclude, self.live, self.now, self.peak = exclude, {}, 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for ptr in [k for k, (w, _) in self.live.items() if w.expired()]:
            self.now -= self.live.pop(ptr)[1]
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                s = t.untyped_storage()
                ptr = s.data_ptr()
                if ptr and ptr not in self.exclude and ptr not in self.live:
                    self.live[ptr] = (StorageWeakRef(s), s.nbytes())
                    self.now += s.nbytes()
        self.peak = max(self.peak, self.now)
        return out


def storage_ptrs(*trees) -> set[int]:
    """Data pointers of every tensor storage in the given pytrees (params, batches, boundaries)."""
    return {t.untyped_storage().data_ptr() for tr in trees for t in tree_leaves(tr) if isinstance(t, torch.Tensor)}


def tensor_bytes(*trees) -> int:
    """Bytes of the distinct storages in the given pytrees."""
    seen = {}
    for tr in trees:
        for t in tree_leaves(tr):
            if isinstance(t, torch.Tensor):
                s = t.untyped_storage()
                seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


@torch.no_grad()
def peak_live_bytes(fn: Callable, exclude: set[int]):
    """(fn(), peak bytes of tensors created during fn and alive at once; `exclude`: storages not to count)."""
    mode = _LiveBytes(exclude)
    with mode:
        out = fn()
    return out, mode.peak


def z_bytes(params: dict, shared: dict | None = None) -> int:
    """Transient memory of one perturbation or update: the largest parameter's perturbed copy, one
    float64 chunk while drawing, plus held copies of shared (tied) parameters."""
    if not params:
        return 0
    big = max(params.values(), key=lambda p: p.numel())
    held = sum(p.numel() * p.element_size() for p in (shared or {}).values())
    from lightfed.seeds import CHUNK
    return big.numel() * big.element_size() + 8 * min(CHUNK, big.numel()) + held
