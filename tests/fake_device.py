"""A GPU on a CPU-only machine, for tests: `FakeCuda` computes everything on the CPU but knows, for every tensor,
whether it lives on the device (cuda:0) or on the host, and fails every op that a real GPU would refuse.

On the device: a model's parameters and buffers once `device.place` puts it there (patched by `installed`), the
result of `x.to("cuda")` / `x.cuda()` / `x.to(t)` for a device tensor t, a factory's output given `device="cuda"`,
and the output of any op that read a device tensor. Everything else is on the host, as on a GPU machine (a tensor
decoded from bytes, one made by a factory without a device, a checkpoint's). Refused, as a GPU refuses them: an op
mixing a device tensor and a host tensor of one or more dimensions (a 0-dim host tensor is a scalar there), and
`.numpy()` of a device tensor. Allowed, as there: `copy_` across devices and host index tensors. `.device` of a
device tensor says cuda:0, so `t.to(p.device)` and `zeros(..., device=p.device)` behave as they would there.
"""
from __future__ import annotations

import contextlib

import torch
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakTensorKeyDictionary

CUDA, CPU = torch.device("cuda", 0), torch.device("cpu")


class DeviceMix(RuntimeError):
    """What a GPU would raise: tensors on two devices in one op."""


def _is_cuda(d) -> bool:
    return d is not None and torch.device(d).type == "cuda"


def _tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from _tensors(y)


class FakeCuda(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.dev = WeakTensorKeyDictionary()         # tensor -> True: it lives on the device (absent: the host)

    def on_device(self, t) -> bool:
        return self.dev.get(t, False)

    def _move(self, t: torch.Tensor, to_device: bool, dtype=None) -> torch.Tensor:
        y = t if dtype is None else t.to(dtype)
        if y is t:                                   # a new tensor object, as a real move makes (autograd kept)
            y = t.view_as(t)
        if to_device:
            self.dev[y] = True
        return y

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", "")
        if func == torch.Tensor.device.__get__:
            return CUDA if self.on_device(args[0]) else CPU
        if func == torch.Tensor.is_cuda.__get__:
            return self.on_device(args[0])
        if func is torch.Tensor.to:
            t, rest = args[0], args[1:]
            if rest and isinstance(rest[0], torch.Tensor):          # x.to(other): other's device and dtype
                return self._move(t, self.on_device(rest[0]), rest[0].dtype)
            dev, dtype, _, _ = torch._C._nn._parse_to(*rest, **kwargs)
            return self._move(t, self.on_device(t) if dev is None else _is_cuda(dev), dtype)
        if func is torch.Tensor.cuda:
            return self._move(args[0], True)
        if func is torch.Tensor.cpu:
            return self._move(args[0], False)
        if func is torch.Tensor.numpy and self.on_device(args[0]):
            raise DeviceMix("can't convert cuda:0 device type tensor to numpy (call .cpu() first)")
        factory = None
        if kwargs.get("device") is not None:         # a factory (or .new_*) told where: its output lives there
            factory, kwargs["device"] = _is_cuda(kwargs["device"]), "cpu"
        if func is not torch.Tensor.copy_:           # a copy may cross devices
            if name == "__getitem__":                # host index tensors are fine
                checked = ()
            elif name == "__setitem__":
                checked = (args[0], args[2]) if not isinstance(args[1], torch.Tensor) else (args[0],)
            else:
                checked = (args, kwargs)
            big = [t for t in _tensors(checked) if t.dim() > 0]
            if len({self.on_device(t) for t in big}) > 1:
                raise DeviceMix(f"{name or func}: tensors on cuda:0 and cpu in one op (shapes "
                                f"{[tuple(t.shape) for t in big if self.on_device(t)]} on cuda, "
                                f"{[tuple(t.shape) for t in big if not self.on_device(t)]} on cpu)")
        out = func(*args, **kwargs)
        ondev = factory if factory is not None else (
            self.on_device(args[0]) if name == "__getitem__" else any(self.on_device(t) for t in _tensors((args, kwargs))))
        if ondev:
            for t in _tensors(out):
                self.dev[t] = True
        return out

    @contextlib.contextmanager
    def installed(self, monkeypatch):
        """Inside: device "cuda" (or "auto") is this one; `lightfed.device.place` puts a model's tensors on it."""
        from lightfed import device

        def place(model, dev, dtype):
            for t in list(model.parameters()) + list(model.buffers()):
                self.dev[t] = True
            return model

        monkeypatch.setattr(device, "place", place)
        monkeypatch.setattr(device, "resolve", lambda d: CUDA if d in ("auto", "cuda", "cuda:0") else torch.device(d))
        with self:
            yield self
