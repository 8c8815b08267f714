"""Tensor codecs: a flat float tensor <-> (payload bytes, scale).

    codec  bytes/elem  payload (always little-endian)                  scale
    fp32   4           IEEE float32                                    1.0
    bf16   2           bfloat16 (x.to(torch.bfloat16), round-to-even)  1.0
    int8   1           q = int8 in [-127, 127], x ~= q * scale         max|x| / 127
    int4   1/2         q in [-7, 7] stored as q + 8 in a nibble:       max|x| / 7
                       element 2i -> low nibble, 2i+1 -> high nibble
                       of byte i; an odd count pads the last high
                       nibble with 8 (= zero)
    int4g  1/2 + 1/8   ceil(n / 32) float32 scales, one per group of    1.0 (in the payload)
                       32 elements (max|x| / 7 over the group), then
                       the int4 nibbles as above

int8/int4 are symmetric per-tensor; int4g per group of GROUP = 32 elements, so a small value is rounded against the
largest of its own group, not of the whole tensor (a latent tensor whose layers differ in size keeps its small ones). The scale is rounded to float32 (that is what the
wire carries) *before* it is used, so encoder and decoder agree exactly; an all-zero
tensor gets scale 1.0.
Rounding of x / scale:
  - generator=None: round to nearest (ties to even); error <= scale/2 per element.
  - generator given: stochastic rounding q = floor(x/scale + u), u ~ U[0, 1) drawn from
    that generator. E[q] = x/scale, so the dequantised value is unbiased, and the same
    generator state gives the same bytes. Error < scale per element.
fp32/bf16 ignore the generator.
"""

import numpy as np
import torch

CODECS = ("fp32", "bf16", "int8", "int4", "int4g")
_QMAX = {"int8": 127, "int4": 7}
GROUP = 32                  # int4g: elements per scale


def payload_nbytes(codec: str, numel: int) -> int:
    """Exact payload size in bytes of `numel` elements under `codec`."""
    if codec == "fp32":
        return 4 * numel
    if codec == "bf16":
        return 2 * numel
    if codec == "int8":
        return numel
    if codec == "int4":
        return (numel + 1) // 2
    if codec == "int4g":
        return 4 * -(-numel // GROUP) + (numel + 1) // 2
    raise ValueError(f"unknown codec {codec!r}, expected one of {CODECS}")


def finite_range(x: torch.Tensor, dtype: torch.dtype | None = None) -> bool:
    """True if every element of x (after a cast to `dtype`, if given) is finite.
    aminmax propagates NaN and is ~30x faster than isfinite().all() on big tensors; the
    cast is monotonic, so casting min and max is enough."""
    if x.numel() == 0:
        return True
    lo, hi = torch.aminmax(x.detach())
    if dtype is not None:
        lo, hi = lo.to(dtype), hi.to(dtype)
    return bool(lo.isfinite() and hi.isfinite())


def quantize(x: torch.Tensor, codec: str, generator: torch.Generator | None = None) -> tuple[bytes, float]:
    """Encode x (any shape, flattened in row-major order) -> (payload, scale)."""
    arr, scale = quantize_array(x, codec, generator)
    return arr.tobytes(), scale


def quantize_array(x: torch.Tensor, codec: str, generator: torch.Generator | None = None) -> tuple[np.ndarray, float]:
    """quantize() without the final copy: the payload as a contiguous numpy array (which
    may share memory with x) whose raw bytes are the payload."""
    x = x.detach().reshape(-1).contiguous().cpu()  # 1-D views can be strided, e.g. x[::2]; the wire is device-free
    if codec == "fp32":
        return x.to("cpu", torch.float32).numpy().astype("<f4", copy=False), 1.0
    if codec == "bf16":
        bits = x.to("cpu", torch.bfloat16).view(torch.int16)  # raw bf16 bit patterns
        return bits.numpy().astype("<i2", copy=False), 1.0
    if codec == "int4g":
        return _int4_groups(x.float(), generator), 1.0
    if codec not in _QMAX:
        raise ValueError(f"unknown codec {codec!r}, expected one of {CODECS}")
    qmax = _QMAX[codec]
    x = x.float()
    if x.numel() == 0:
        return np.zeros(0, np.uint8), 1.0
    lo, hi = torch.aminmax(x)
    m = max(-lo.item(), hi.item())  # max |x|; NaN if any NaN
    if not np.isfinite(m):
        raise ValueError(f"{codec} cannot encode non-finite values")
    scale = float(np.float32(m / qmax))  # the wire stores float32: use exactly that value
    if scale == 0.0:
        scale = 1.0  # all zero (or all below ~1e-43): everything quantises to 0
    v = x / scale
    if generator is None:
        v.round_()  # to nearest, ties to even
    else:
        v.add_(torch.rand(v.shape, generator=generator, device=generator.device).to(v.device)).floor_()
    q = v.clamp_(-qmax, qmax).to(torch.int8).cpu().numpy()  # move 1 byte/elem, not 4
    if codec == "int8":
        return q, scale
    return _nibbles(q), scale


def _nibbles(q: np.ndarray) -> np.ndarray:
    """int8 codes in [-7, 7] -> int4's bytes (q + 8 a nibble, low first; an odd count padded with 8)."""
    u8 = (q + np.int8(8)).view(np.uint8)  # 1..15
    if u8.size % 2:
        u8 = np.append(u8, np.uint8(8))  # pad nibble = zero
    return u8[0::2] | (u8[1::2] << 4)


def _int4_groups(x: torch.Tensor, generator: torch.Generator | None) -> np.ndarray:
    """int4g: the float32 scale of each group of GROUP elements, then the int4 nibbles of x / its group's scale."""
    n = x.numel()
    if n == 0:
        return np.zeros(0, np.uint8)
    lo, hi = torch.aminmax(x)
    if not (lo.isfinite() and hi.isfinite()):
        raise ValueError("int4g cannot encode non-finite values")
    g = torch.cat([x, x.new_zeros(-n % GROUP)]).view(-1, GROUP)              # (groups, GROUP)
    scale = (g.abs().amax(1).double() / 7).float()                          # float32: what the wire carries
    scale[scale == 0] = 1.0                                                 # an all-zero group
    v = g / scale[:, None]
    if generator is None:
        v.round_()
    else:
        v.add_(torch.rand(v.shape, generator=generator, device=generator.device).to(v.device)).floor_()
    q = v.clamp_(-7, 7).to(torch.int8).reshape(-1)[:n].numpy()
    return np.concatenate([scale.numpy().astype("<f4").view(np.uint8), _nibbles(q)])


def dequantize(payload: bytes, codec: str, scale: float, numel: int) -> torch.Tensor:
    """Inverse of quantize: a flat float32 tensor of `numel` elements.
    Raises ValueError on a payload of the wrong length or with codes quantize never
    writes (int8 -128, int4 nibble 0, int4 pad nibble != 8)."""
    n = payload_nbytes(codec, numel)
    if len(payload) != n:
        raise ValueError(f"payload is {len(payload)} bytes, {codec} x {numel} needs {n}")
    if codec == "fp32":
        return torch.from_numpy(np.frombuffer(payload, "<f4").astype(np.float32))
    if codec == "bf16":
        bits = np.frombuffer(payload, "<i2").astype(np.int16)
        return torch.from_numpy(bits).view(torch.bfloat16).float()
    if codec == "int8":
        q = np.frombuffer(payload, np.int8)
        if q.min(initial=0) == -128:
            raise ValueError("int8 code -128 is out of range [-127, 127]")
    elif codec == "int4":
        q = _codes(payload, numel)
    else:  # int4g
        k = 4 * -(-numel // GROUP)
        scales = np.frombuffer(payload[:k], "<f4")
        if not (np.isfinite(scales).all() and (scales > 0).all()):
            raise ValueError("int4g group scale is not finite and positive")
        q = _codes(payload[k:], numel).astype(np.float32)
        q *= np.repeat(scales, GROUP)[:numel]
        return torch.from_numpy(q)
    return torch.from_numpy(q.astype(np.float32)) * scale


def _codes(payload: bytes, numel: int) -> np.ndarray:
    """int4's bytes -> the int8 codes in [-7, 7], refusing what _nibbles never writes."""
    b = np.frombuffer(payload, np.uint8)
    u8 = np.empty(2 * b.size, np.uint8)
    u8[0::2], u8[1::2] = b & 15, b >> 4
    if numel % 2 and u8[-1] != 8:
        raise ValueError(f"int4 padding nibble is {u8[-1]}, expected 8")
    u8 = u8[:numel]
    if u8.min(initial=1) == 0:
        raise ValueError("int4 code -8 is out of range [-7, 7]")
    return u8.view(np.int8) - np.int8(8)
