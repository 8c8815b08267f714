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

import torch
from torch.utils.flop_counter import flop_registry, register_flop_formula, sdpa_backward_flop_count, sdpa_flop_count

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
    """with PeakRSS() as m: work()   ->  m.peak (bytes), m.rise (peak - RSS at entry)."""

    def __enter__(self):
        try:
            _CLEAR.write_text("5")     # reset VmHWM to the current RSS
        except OSError:
            pass
        self.start = rss_bytes()
        self.peak = self.rise = None
        return self

    def __exit__(self, *exc):
        kb = _status_kb("VmHWM")
        if kb is not None and self.start is not None:
            self.peak = kb * 1024
            self.rise = max(0, self.peak - self.start)
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
