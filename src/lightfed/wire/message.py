"""Wire messages: a dict of named fields <-> compact, checksummed bytes.

Every byte between server and client goes through encode/decode here; len(encode(...))
is what a method is charged. Only plain data crosses the wire (no pickle, no
torch.save, no eval), and decode validates everything against the receiver's schema
before it returns anything.

Binary layout, version 2 (little-endian; "varint" = unsigned LEB128, shortest form only):

    part       bytes          content
    header     2              magic b"LF"
               1              version (2)
               4              kind tag: the first 4 bytes of blake2b(utf-8 kind), e.g. "flite/up"
               varint         field count (<= 65535)
    per field  1 + n          name: uint8 length + utf-8 (n <= 255)
               1              type: 1 tensor, 2 int, 3 float, 4 bytes
      tensor   1              codec: 0 fp32, 1 bf16, 2 int8, 3 int4, 4 i64, 5 i32, 6 int4g (its scales in the payload)
               1 + varints    ndim (uint8), then each dim (< 2**32) as a varint
               4              scale (float32), int8/int4 only
               payload        payload_nbytes(codec, numel); i64/i32 raw integers
      int      1, 2, 4 or 8   the fewest bytes the spec's bounds allow (unsigned when lo >= 0;
                              no bounds: int64), so both ends know the width from the schema
      float    8              float64
      bytes    4 + len        uint32 length + data
    trailer    4              CRC32 (zlib.crc32) of everything before it

Overhead of a 1-field message with one 1-D int8/int4 tensor of 128 <= n < 16,384 elements:
8 (header) + 1 + len(name) + 3 (type, codec, ndim) + 2 (dim) + 4 (scale) + 4 (CRC) = 23 B for name
"z"; a FLITE upload adds the engine's sample count ("_n", a 4-byte int: 8 B) -> 31 B on 1,296 int4
latents (648 B): 4.8%.

Decode order: size <= max_bytes, CRC (so any flipped or missing byte is reported as
"<crc>"), magic/version, kind, then each field in schema order.
"""

import hashlib
import math
import struct
import zlib
from dataclasses import dataclass

import numpy as np
import torch

from .quantize import CODECS, dequantize, finite_range, payload_nbytes, quantize_array

MAGIC = b"LF"
VERSION = 2
KINDS = ("tensor", "int", "float", "bytes")  # type byte = index + 1
TENSOR_CODECS = ("fp32", "bf16", "int8", "int4", "i64", "i32", "int4g")  # codec byte = index (new codecs at the end)
assert set(CODECS) <= set(TENSOR_CODECS)
_INT = {"i64": ("<i8", torch.int64), "i32": ("<i4", torch.int32)}  # raw integer tensors
_SCALED = ("int8", "int4")  # codecs that carry a scale
_MIN_SIZE = 2 + 1 + 4 + 1 + 4  # no fields
_I64 = (-(2**63), 2**63 - 1)


class WireError(ValueError):
    """A message that cannot be encoded or must not be accepted. `.field` is the field
    name, or "<header>" / "<crc>" / "<trailer>" for message-level problems."""

    def __init__(self, field: str, reason: str):
        super().__init__(field, reason)
        self.field, self.reason = field, reason

    def __str__(self):
        where = self.field if self.field.startswith("<") else f"field {self.field!r}"
        return f"wire: {where}: {self.reason}"


@dataclass(frozen=True)
class Spec:
    """What the receiver expects for one field."""

    kind: str  # "tensor" | "int" | "float" | "bytes"
    shape: tuple[int, ...] | None = None  # tensor shape; None = any
    codec: str = "fp32"  # tensor codec: fp32 | bf16 | int8 | int4 (float), i64 | i32 (int)
    max_len: int | None = None  # bytes: maximum length
    finite: bool = True  # float tensors / floats must be finite
    lo: int | None = None  # ints and int tensors: inclusive bounds
    hi: int | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"Spec kind {self.kind!r} not in {KINDS}")
        if self.kind == "tensor" and self.codec not in TENSOR_CODECS:
            raise ValueError(f"Spec codec {self.codec!r} not in {TENSOR_CODECS}")
        if self.shape is not None:
            shape = tuple(int(d) for d in self.shape)
            if len(shape) > 255 or any(not 0 <= d < 2**32 for d in shape):
                raise ValueError(f"Spec shape {shape}: at most 255 dims, each in [0, 2**32)")
            object.__setattr__(self, "shape", shape)


Schema = dict[str, Spec]


def tensor_schema(tensors: dict[str, torch.Tensor], codec: str = "fp32") -> Schema:
    """Specs for a dict of example tensors: float tensors get `codec`, int ones i32/i64."""
    def spec(t):
        c = codec if t.is_floating_point() else ("i32" if t.dtype == torch.int32 else "i64")
        return Spec("tensor", tuple(t.shape), c)
    return {k: spec(t) for k, t in tensors.items()}


def _nbytes(codec: str, numel: int) -> int:
    return numel * int(_INT[codec][0][2:]) if codec in _INT else payload_nbytes(codec, numel)


def _utf8(s: str, field: str, what: str) -> bytes:
    b = s.encode("utf-8")
    if len(b) > 255:
        raise WireError(field, f"{what} is {len(b)} utf-8 bytes, at most 255")
    return bytes([len(b)]) + b


def kind_tag(kind: str) -> bytes:
    """The 4 bytes that stand for a message kind on the wire."""
    return hashlib.blake2b(kind.encode("utf-8"), digest_size=4).digest()


def kind_of(buf: bytes, kinds) -> str | None:
    """Which of `kinds` a message's header names (None: none of them, or no header); decode checks the rest."""
    tag = bytes(memoryview(buf)[3:7]) if len(buf) >= 7 else b""
    return next((k for k in kinds if kind_tag(k) == tag), None)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _int_format(spec: "Spec") -> str:
    """struct format of an int field: the fewest bytes that hold [lo, hi] (int64 without bounds)."""
    lo, hi = spec.lo, spec.hi
    if lo is not None and hi is not None:
        for w, u, s in ((1, "B", "b"), (2, "H", "h"), (4, "I", "i")):
            if lo >= 0 and hi < 2 ** (8 * w):
                return "<" + u
            if -(2 ** (8 * w - 1)) <= lo and hi < 2 ** (8 * w - 1):
                return "<" + s
    return "<q"


def _check_ints(name, spec, lo, hi, limits=_I64):
    """Check the range [lo, hi] of integer values against spec.lo/hi and the wire type."""
    if spec.lo is not None and lo < spec.lo:
        raise WireError(name, f"value {lo} < lower bound {spec.lo}")
    if spec.hi is not None and hi > spec.hi:
        raise WireError(name, f"value {hi} > upper bound {spec.hi}")
    if lo < limits[0] or hi > limits[1]:
        raise WireError(name, f"values [{lo}, {hi}] do not fit in [{limits[0]}, {limits[1]}]")


def encoded_size(schema: Schema, kind: str, *, worst_case: bool = False) -> int | None:
    """Exact len(encode(fields, schema, kind=kind)) for any valid fields, or None when
    it depends on the values (a tensor spec with shape None, or a bytes field).
    worst_case=True counts each bytes field at its max_len (None if it has none): use it
    as max_bytes for decode."""
    n = 2 + 1 + 4 + len(_varint(len(schema))) + 4
    for name, spec in schema.items():
        n += 1 + len(name.encode("utf-8")) + 1
        if spec.kind == "tensor":
            if spec.shape is None:
                return None
            n += 2 + sum(len(_varint(d)) for d in spec.shape) + (4 if spec.codec in _SCALED else 0)
            n += _nbytes(spec.codec, math.prod(spec.shape))
        elif spec.kind == "int":
            n += struct.calcsize(_int_format(spec))
        elif spec.kind == "float":
            n += 8
        else:  # bytes
            if not worst_case or spec.max_len is None:
                return None
            n += 4 + spec.max_len
    return n


def _encode_tensor(name, spec, v, generator):
    if not isinstance(v, torch.Tensor):
        raise WireError(name, f"expected a tensor, got {type(v).__name__}")
    shape = tuple(v.shape)
    if spec.shape is not None and shape != spec.shape:
        raise WireError(name, f"shape {shape} != expected {spec.shape}")
    if len(shape) > 255 or any(d >= 2**32 for d in shape):
        raise WireError(name, f"shape {shape}: at most 255 dims, each < 2**32")
    head = bytes([TENSOR_CODECS.index(spec.codec), len(shape)]) + b"".join(_varint(d) for d in shape)
    if spec.codec in _INT:  # raw integers
        if v.is_floating_point() or v.is_complex() or v.dtype == torch.bool:
            raise WireError(name, f"dtype {v.dtype} is not an integer type (codec {spec.codec})")
        fmt, dtype = _INT[spec.codec]
        v = v.detach().cpu()
        if v.numel():
            info = torch.iinfo(dtype)
            _check_ints(name, spec, v.min().item(), v.max().item(), (info.min, info.max))
        return [head, v.reshape(-1).contiguous().numpy().astype(fmt, copy=False)]
    if not v.is_floating_point():
        raise WireError(name, f"dtype {v.dtype} is not a float type (codec {spec.codec})")
    if spec.finite and not finite_range(v, torch.bfloat16 if spec.codec == "bf16" else None):
        raise WireError(name, f"non-finite values (as {spec.codec})")
    try:
        payload, scale = quantize_array(v, spec.codec, generator)  # joined without a copy
    except ValueError as e:
        raise WireError(name, str(e)) from None
    if spec.codec in _SCALED:
        head += struct.pack("<f", scale)
    return [head, payload]  # payload: a numpy array, joined without a copy


def encode(fields: dict, schema: Schema, *, kind: str, generator: torch.Generator | None = None) -> bytes:
    """Validate `fields` against `schema` and serialise them, in schema order.
    `generator` switches int8/int4 fields to (seeded) stochastic rounding."""
    for name in fields:
        if name not in schema:
            raise WireError(name, "not in schema")
    if len(schema) > 0xFFFF:
        raise WireError("<header>", f"{len(schema)} fields, at most 65535")
    parts = [MAGIC, bytes([VERSION]), kind_tag(kind), _varint(len(schema))]
    for name, spec in schema.items():
        if name not in fields:
            raise WireError(name, "missing")
        v = fields[name]
        parts += [_utf8(name, name, "name"), bytes([KINDS.index(spec.kind) + 1])]
        if spec.kind == "tensor":
            parts += _encode_tensor(name, spec, v, generator)
        elif spec.kind == "int":
            if not isinstance(v, int) or isinstance(v, bool):
                raise WireError(name, f"expected an int, got {type(v).__name__}")
            _check_ints(name, spec, v, v)
            parts.append(struct.pack(_int_format(spec), v))
        elif spec.kind == "float":
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                raise WireError(name, f"expected a float, got {type(v).__name__}")
            if spec.finite and not math.isfinite(v):
                raise WireError(name, f"non-finite value {v}")
            parts.append(struct.pack("<d", float(v)))
        else:  # bytes
            if not isinstance(v, (bytes, bytearray, memoryview)):
                raise WireError(name, f"expected bytes, got {type(v).__name__}")
            v = bytes(v)
            if len(v) > (spec.max_len if spec.max_len is not None else 2**32 - 1):
                raise WireError(name, f"{len(v)} bytes > max_len {spec.max_len}")
            parts += [struct.pack("<I", len(v)), v]
    crc = 0
    for p in parts:
        crc = zlib.crc32(p, crc)
    parts.append(struct.pack("<I", crc))
    return b"".join(parts)


def decode(buf: bytes, schema: Schema, *, kind: str, max_bytes: int) -> dict:
    """Parse and fully validate a message; returns {name: value} in schema order, with
    float tensors as float32 of their shape, int tensors as int64/int32. Raises
    WireError (and nothing else) on any problem, before returning anything."""
    try:
        mv = memoryview(buf).cast("B")
    except TypeError:
        raise WireError("<header>", f"expected bytes, got {type(buf).__name__}") from None
    n = len(mv)
    if n > max_bytes:
        raise WireError("<header>", f"message is {n} bytes > max_bytes {max_bytes}")
    if n < _MIN_SIZE:
        raise WireError("<header>", f"message is {n} bytes, shorter than the minimum {_MIN_SIZE}")
    (crc,) = struct.unpack_from("<I", mv, n - 4)
    if zlib.crc32(mv[: n - 4]) != crc:
        raise WireError("<crc>", "checksum mismatch (corrupted or truncated message)")

    pos, end = 0, n - 4  # read cursor; the body ends where the CRC starts

    def take(k, field, what):
        nonlocal pos
        if k > end - pos:
            raise WireError(field, f"truncated: {what} needs {k} bytes at offset {pos}, {end - pos} left")
        pos += k
        return mv[pos - k : pos]

    def read(fmt, field, what):
        return struct.unpack(fmt, take(struct.calcsize(fmt), field, what))

    def varint(field, what, limit):
        n = shift = 0
        while True:
            (b,) = take(1, field, what)
            n |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
            if n >= limit:
                raise WireError(field, f"{what}: varint exceeds {limit - 1}")
        if n >= limit:
            raise WireError(field, f"{what} {n} exceeds {limit - 1}")
        if shift > 7 and b == 0:
            raise WireError(field, f"{what}: varint not in its shortest form")
        return n

    def text(field, what):
        (k,) = read("<B", field, what)
        try:
            return str(take(k, field, what), "utf-8")
        except UnicodeDecodeError:
            raise WireError(field, f"{what} is not valid utf-8") from None

    H = "<header>"
    if take(2, H, "magic") != MAGIC:
        raise WireError(H, f"bad magic {bytes(mv[:2])!r}, expected {MAGIC!r}")
    (version,) = read("<B", H, "version")
    if version != VERSION:
        raise WireError(H, f"version {version} != supported {VERSION}")
    tag = bytes(take(4, H, "kind tag"))
    if tag != kind_tag(kind):
        raise WireError(H, f"kind tag {tag.hex()} != expected {kind!r} ({kind_tag(kind).hex()})")
    count = varint(H, "field count", 2**16)

    names, out = list(schema), {}
    for i in range(count):
        name = text(f"<field {i}>", "name")
        expected = names[i] if i < len(names) else None
        if name != expected:
            if name in out:
                raise WireError(name, "duplicate field")
            if name in schema:  # present but out of place: the expected one is missing here
                raise WireError(expected, f"missing (found {name!r} at position {i})")
            raise WireError(name, "not in schema")
        spec = schema[name]
        (t,) = read("<B", name, "type byte")
        if t != KINDS.index(spec.kind) + 1:
            got = KINDS[t - 1] if 1 <= t <= len(KINDS) else "unknown"
            raise WireError(name, f"type byte {t} ({got}) != expected {spec.kind}")

        if spec.kind == "tensor":
            c, ndim = read("<BB", name, "codec/ndim")
            codec = TENSOR_CODECS[c] if c < len(TENSOR_CODECS) else f"unknown {c}"
            if codec != spec.codec:
                raise WireError(name, f"codec {codec} != expected {spec.codec}")
            shape = tuple(varint(name, "dim", 2**32) for _ in range(ndim))
            if math.prod(d for d in shape if d) >= 2**62:     # torch cannot even describe it (a 0 dim hides it)
                raise WireError(name, f"shape {shape} is too large")
            if spec.shape is not None and shape != spec.shape:
                raise WireError(name, f"shape {shape} != expected {spec.shape}")
            numel = math.prod(shape)
            if codec in _INT:
                fmt, dtype = _INT[codec]
                raw = take(_nbytes(codec, numel), name, f"payload of shape {shape}")
                v = torch.from_numpy(np.frombuffer(raw, fmt).astype(fmt[1:])).reshape(shape)
                if numel:
                    _check_ints(name, spec, v.min().item(), v.max().item())
                out[name] = v
                continue
            scale = 1.0
            if codec in _SCALED:
                (scale,) = read("<f", name, "scale")
                if not (math.isfinite(scale) and scale > 0):
                    raise WireError(name, f"scale {scale} is not finite and positive")
            payload = take(payload_nbytes(codec, numel), name, f"payload of shape {shape}")
            try:
                v = dequantize(payload, codec, scale, numel).reshape(shape)
            except ValueError as e:
                raise WireError(name, str(e)) from None
            if spec.finite and not finite_range(v):
                raise WireError(name, "non-finite values")
            out[name] = v
        elif spec.kind == "int":
            (v,) = read(_int_format(spec), name, "int")
            _check_ints(name, spec, v, v)
            out[name] = v
        elif spec.kind == "float":
            (v,) = read("<d", name, "float64")
            if spec.finite and not math.isfinite(v):
                raise WireError(name, f"non-finite value {v}")
            out[name] = v
        else:  # bytes
            (k,) = read("<I", name, "length")
            if spec.max_len is not None and k > spec.max_len:
                raise WireError(name, f"{k} bytes > max_len {spec.max_len}")
            out[name] = bytes(take(k, name, "data"))

    if count < len(names):
        raise WireError(names[count], "missing")
    if pos != end:
        raise WireError("<trailer>", f"{end - pos} unexpected bytes after the last field")
    return out
