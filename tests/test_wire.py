"""Wire format: codecs, exact sizes, and strict validation on decode."""

import importlib
import math
import pathlib
import random
import struct
import zlib

import pytest
import torch

from lightfed.wire.fuzz import mutants
from lightfed.wire import (
    CODECS, Spec, WireError, decode, dequantize, encode, encoded_size, payload_nbytes,
    quantize, tensor_schema,
)

# lightfed.wire.quantize is the re-exported function; fetch the modules themselves
wire_message = importlib.import_module("lightfed.wire.message")
wire_quantize = importlib.import_module("lightfed.wire.quantize")

BIG = 10**9  # max_bytes when the size limit is not what a test is about


def recrc(body: bytes) -> bytes:
    """Replace the CRC trailer so a hand-edited message passes the checksum."""
    body = bytes(body[:-4])
    return body + struct.pack("<I", zlib.crc32(body))


def patch(buf: bytes, offset: int, new: bytes) -> bytes:
    """Overwrite bytes at offset and fix the CRC."""
    b = bytearray(buf)
    b[offset : offset + len(new)] = new
    return recrc(bytes(b))


def one_tensor(x, codec, kind="up", name="w", **spec):
    """A 1-field message; its tensor meta starts at 8 (header) + 2 + len(name)."""
    schema = {name: Spec("tensor", tuple(x.shape), codec, **spec)}
    return schema, encode({name: x}, schema, kind=kind)


def expect(field, fn, *args, match=None, **kw):
    with pytest.raises(WireError) as e:
        fn(*args, **kw)
    assert e.value.field == field, str(e.value)
    if match:
        assert match in str(e.value), str(e.value)
    return e.value


# ---------------------------------------------------------------- round trips


@pytest.mark.parametrize("shape", [(), (1,), (7,), (3, 4), (2, 3, 5)])
def test_fp32_roundtrip_exact(shape):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0)) * 1e3
    schema, msg = one_tensor(x, "fp32")
    y = decode(msg, schema, kind="up", max_bytes=BIG)["w"]
    assert y.dtype == torch.float32 and y.shape == x.shape and torch.equal(x, y)


def test_bf16_roundtrip_exact_for_representable():
    x = torch.randn(100, 3).to(torch.bfloat16).float()
    schema, msg = one_tensor(x, "bf16")
    assert torch.equal(decode(msg, schema, kind="up", max_bytes=BIG)["w"], x)
    payload, scale = quantize(x, "bf16")
    assert scale == 1.0 and len(payload) == 600 and torch.equal(dequantize(payload, "bf16", 1.0, 300), x.flatten())


@pytest.mark.parametrize("codec,qmax", [("int8", 127), ("int4", 7)])
@pytest.mark.parametrize("n", [1, 2, 7, 1000, 1001])
def test_int_codecs_error_within_half_step(codec, qmax, n):
    x = torch.randn(n, generator=torch.Generator().manual_seed(n))
    payload, scale = quantize(x, codec)
    assert len(payload) == payload_nbytes(codec, n)
    assert scale == pytest.approx(x.abs().max().item() / qmax, rel=1e-6)
    y = dequantize(payload, codec, scale, n)
    assert y.dtype == torch.float32 and y.shape == (n,)
    assert ((y - x).abs() <= scale / 2 * (1 + 1e-5)).all()
    schema, msg = one_tensor(x, codec)  # and through a message
    assert torch.equal(decode(msg, schema, kind="up", max_bytes=BIG)["w"], y)


def test_int4_packing_layout_and_odd_length():
    x = torch.tensor([-7.0, 7.0, 0.0])  # scale 1 -> q = -7, 7, 0 -> nibbles 1, 15, 8, pad 8
    payload, scale = quantize(x, "int4")
    assert scale == 1.0 and payload == bytes([1 | 15 << 4, 8 | 8 << 4])
    assert torch.equal(dequantize(payload, "int4", scale, 3), x)
    payload, _ = quantize(torch.tensor([3.5]), "int4")  # single element: q = 7, pad 8
    assert payload == bytes([15 | 8 << 4])


@pytest.mark.parametrize("codec", CODECS)
def test_zero_and_empty_tensors(codec):
    x = torch.zeros(5, 2)
    payload, scale = quantize(x, codec)
    assert scale == 1.0 and torch.equal(dequantize(payload, codec, scale, 10), x.flatten())
    schema, msg = one_tensor(x, codec)
    assert torch.equal(decode(msg, schema, kind="up", max_bytes=BIG)["w"], x)
    schema, msg = one_tensor(torch.zeros(0, 3), codec)
    assert decode(msg, schema, kind="up", max_bytes=BIG)["w"].shape == (0, 3)


def test_multi_field_message_with_scalars_bytes_and_int_tensors():
    schema = {
        "round": Spec("int", lo=0),
        "loss": Spec("float"),
        "note": Spec("bytes", max_len=64),
        "empty": Spec("bytes"),
        "ids": Spec("tensor", (2, 3), "i64"),
        "mask": Spec("tensor", (4,), "i32", lo=0, hi=1),
        "layer.0.weight": Spec("tensor", (4, 4), "int8"),
        "layer.0.bias": Spec("tensor", (4,), "fp32"),
        "z": Spec("tensor", (9,), "int4"),
    }
    fields = {
        "round": 2**62, "loss": 1 / 3, "note": "héllo".encode(), "empty": b"",
        "ids": torch.tensor([[-(2**63), 0, 2**63 - 1], [1, 2, 3]]),
        "mask": torch.tensor([0, 1, 1, 0], dtype=torch.int32),
        "layer.0.weight": torch.randn(4, 4), "layer.0.bias": torch.randn(4), "z": torch.randn(9),
    }
    msg = encode(fields, schema, kind="fedavg/up")
    out = decode(bytearray(msg), schema, kind="fedavg/up", max_bytes=len(msg))  # any bytes-like
    assert list(out) == list(schema)
    assert out["round"] == 2**62 and out["loss"] == 1 / 3 and out["note"] == fields["note"] and out["empty"] == b""
    assert out["ids"].dtype == torch.int64 and torch.equal(out["ids"], fields["ids"])
    assert out["mask"].dtype == torch.int32 and torch.equal(out["mask"], fields["mask"])
    assert torch.equal(out["layer.0.bias"], fields["layer.0.bias"])
    assert out["layer.0.weight"].shape == (4, 4)


@pytest.mark.parametrize("codec", CODECS + ("i64", "i32"))
def test_strided_and_other_dtype_inputs(codec):
    """Non-contiguous views and float64/bf16 inputs encode like their contiguous float32 copy."""
    base = torch.randn(4, 10, dtype=torch.float64)
    for x in (base[:, ::3], base.t(), base.flatten()[::2], base.to(torch.bfloat16)[1]):
        ref = x.contiguous().float()
        if codec in ("i64", "i32"):
            x = (x * 100).long()
            ref = x.contiguous()
        schema = {"w": Spec("tensor", tuple(x.shape), codec)}
        msg = encode({"w": x}, schema, kind="k")
        assert msg == encode({"w": ref}, schema, kind="k")
        if codec in ("fp32", "i64", "i32"):
            y = decode(msg, schema, kind="k", max_bytes=BIG)["w"]
            assert y.dtype == {"fp32": torch.float32, "i64": torch.int64, "i32": torch.int32}[codec]
            assert torch.equal(y, ref.to(y.dtype))


def test_tensor_schema():
    ts = {"a": torch.zeros(2, 3), "b": torch.zeros(4, dtype=torch.int32), "c": torch.zeros(1, dtype=torch.long)}
    s = tensor_schema(ts, codec="int8")
    assert s == {"a": Spec("tensor", (2, 3), "int8"), "b": Spec("tensor", (4,), "i32"), "c": Spec("tensor", (1,), "i64")}
    msg = encode(ts, s, kind="k")
    assert len(msg) == encoded_size(s, "k")


# ---------------------------------------------------------------- stochastic rounding


@pytest.mark.parametrize("codec,qmax", [("int8", 127), ("int4", 7)])
def test_stochastic_rounding_unbiased_and_seeded(codec, qmax):
    x = torch.tensor([1.0, -1.0, 0.3, -0.55, 0.05, 0.71, 0.0, -0.999])  # scale = 1/qmax
    draws = 4000
    payload, scale = quantize(x.repeat(draws), codec, torch.Generator().manual_seed(0))
    y = dequantize(payload, codec, scale, x.numel() * draws).view(draws, -1)
    # each draw is one of the two neighbouring grid points ...
    assert ((y - x).abs() < scale * (1 + 1e-5)).all()
    # ... and the mean converges to x (std of the mean <= scale / (2 sqrt(draws)) ~ scale/126)
    assert ((y.mean(0) - x).abs() < 0.05 * scale).all(), (y.mean(0) - x) / scale
    payload, scale = quantize(x, codec)
    nearest = dequantize(payload, codec, scale, x.numel())
    assert (nearest - x).abs().max() > 0.2 * scale  # round-to-nearest is biased on this x
    # deterministic for a given seed, different for another
    same = [quantize(x.repeat(50), codec, torch.Generator().manual_seed(7))[0] for _ in range(2)]
    other = quantize(x.repeat(50), codec, torch.Generator().manual_seed(8))[0]
    assert same[0] == same[1] != other
    schema = {"w": Spec("tensor", (8,), codec)}
    m1, m2 = (encode({"w": x}, schema, kind="k", generator=torch.Generator().manual_seed(3)) for _ in range(2))
    assert m1 == m2


# ---------------------------------------------------------------- byte counts


def test_encoded_size_matches_len():
    schemas = [
        {"w": Spec("tensor", (3, 5), c)} for c in CODECS + ("i64", "i32")
    ] + [
        {"a": Spec("int"), "b": Spec("float"), "é": Spec("tensor", (), "int4")},
        {"x" * 255: Spec("tensor", (0,), "int8")},
        {},
    ]
    for schema in schemas:
        fields = {k: (torch.ones(s.shape, dtype=torch.long) if s.codec in ("i64", "i32") else torch.randn(s.shape))
                  if s.kind == "tensor" else 1 for k, s in schema.items()}
        for kind in ("", "fedavg/up", "ü" * 100):
            msg = encode(fields, schema, kind=kind)
            assert len(msg) == encoded_size(schema, kind)
    s = {"b": Spec("bytes", max_len=10), "n": Spec("int")}
    assert encoded_size(s, "k") is None and encoded_size({"b": Spec("bytes")}, "k", worst_case=True) is None
    assert encoded_size(s, "k", worst_case=True) == len(encode({"b": b"0123456789", "n": 0}, s, kind="k"))
    assert encoded_size({"w": Spec("tensor")}, "k") is None  # shape not fixed


def test_int4_latent_overhead_under_5_percent():
    schema = {"z": Spec("tensor", (1280,), "int4")}
    msg = encode({"z": torch.randn(1280)}, schema, kind="up")
    overhead = len(msg) - 640
    assert overhead == 8 + (1 + len("z")) + 3 + 2 + 4 + 4 == 23      # header, name, type/codec/ndim, dim, scale, CRC
    assert overhead < 0.05 * 640
    # FLITE's upload on MiniLM: 1,296 int4 latents + the engine's 4-byte sample count
    from lightfed.engine.protocol import EXAMPLES
    schema = {"z": Spec("tensor", (1296,), "int4"), EXAMPLES: Spec("int", lo=1, hi=2**32 - 1)}
    msg = encode({"z": torch.randn(1296), EXAMPLES: 80}, schema, kind="flite/up")
    assert len(msg) - 648 == 23 + (1 + len(EXAMPLES) + 1 + 4) == 31 < 0.05 * 648


def test_int_width_follows_the_bounds():
    for lo, hi, width in ((0, 255, 1), (-128, 127, 1), (0, 256, 2), (-1, 40000, 4), (1, 2**32 - 1, 4),
                          (0, 2**32, 8), (None, None, 8), (0, None, 8)):
        s = {"n": Spec("int", lo=lo, hi=hi)}
        for v in {lo if lo is not None else -(2**63), hi if hi is not None else 2**63 - 1}:
            msg = encode({"n": v}, s, kind="k")
            assert len(msg) == encoded_size(s, "k") == 8 + 2 + 1 + width + 4
            assert decode(msg, s, kind="k", max_bytes=BIG) == {"n": v}


# ---------------------------------------------------------------- rejection


def sample():
    schema = {"n": Spec("int"), "w": Spec("tensor", (2, 3), "int8"), "b": Spec("bytes", max_len=8)}
    msg = encode({"n": 5, "w": torch.randn(2, 3), "b": b"abc"}, schema, kind="up")
    return schema, msg


def test_any_flipped_byte_fails_crc():
    schema, msg = sample()
    decode(msg, schema, kind="up", max_bytes=len(msg))
    for i in range(len(msg)):
        for flip in (0x01, 0x80, 0xFF):
            bad = bytearray(msg)
            bad[i] ^= flip
            expect("<crc>", decode, bytes(bad), schema, kind="up", max_bytes=BIG)


def test_truncated():
    schema, msg = sample()
    for cut in (0, 1, 5, 9):
        expect("<header>", decode, msg[:cut], schema, kind="up", max_bytes=BIG, match="minimum")
    for cut in (12, 17, len(msg) // 2, len(msg) - 4, len(msg) - 1):
        expect("<crc>", decode, msg[:cut], schema, kind="up", max_bytes=BIG)
    # truncated with a valid CRC (a buggy sender): the field that runs out is named
    schema, msg = one_tensor(torch.randn(100), "fp32")
    body = msg[:-4]
    for cut in (len(body) - 1, len(body) - 200, 15):   # the payload starts at 14
        expect("w", decode, recrc(body[:cut] + b"CRC!"), schema, kind="up", max_bytes=BIG, match="truncated")


def test_oversized():
    schema, msg = sample()
    expect("<header>", decode, msg, schema, kind="up", max_bytes=len(msg) - 1, match="max_bytes")


def test_wrong_type_and_codec_bytes():
    x = torch.randn(2, 3)
    schema, msg = one_tensor(x, "fp32")  # header 0-7, name "w" 8-9, type byte 10, codec byte 11
    expect("w", decode, patch(msg, 11, bytes([2])), schema, kind="up", max_bytes=BIG, match="codec int8 != expected fp32")
    expect("w", decode, patch(msg, 11, bytes([99])), schema, kind="up", max_bytes=BIG, match="unknown")
    expect("w", decode, patch(msg, 10, bytes([2])), schema, kind="up", max_bytes=BIG, match="type byte")
    expect("w", decode, patch(msg, 10, bytes([0])), schema, kind="up", max_bytes=BIG, match="type byte")
    # receiver expects another codec than the sender used
    expect("w", decode, msg, {"w": Spec("tensor", (2, 3), "bf16")}, kind="up", max_bytes=BIG, match="codec")
    # encode: dtype does not match the codec, value of the wrong kind
    expect("w", encode, {"w": x.long()}, schema, kind="up", match="not a float type")
    expect("w", encode, {"w": x}, {"w": Spec("tensor", (2, 3), "i64")}, kind="up", match="not an integer type")
    expect("w", encode, {"w": 3}, schema, kind="up", match="expected a tensor")
    expect("n", encode, {"n": True}, {"n": Spec("int")}, kind="up")
    expect("n", encode, {"n": 1.0}, {"n": Spec("int")}, kind="up")
    expect("b", encode, {"b": "str"}, {"b": Spec("bytes")}, kind="up")


def test_wrong_shape():
    e = expect("layer.0.weight", encode, {"layer.0.weight": torch.zeros(3, 4)},
               {"layer.0.weight": Spec("tensor", (4, 4))}, kind="up")
    assert str(e) == "wire: field 'layer.0.weight': shape (3, 4) != expected (4, 4)"
    schema, msg = one_tensor(torch.zeros(3, 4), "int8")
    expect("w", decode, msg, {"w": Spec("tensor", (4, 4), "int8")}, kind="up", max_bytes=BIG, match="shape (3, 4)")
    expect("w", decode, msg, {"w": Spec("tensor", (12,), "int8")}, kind="up", max_bytes=BIG, match="shape")
    # a forged dim with the original payload (dims are varints from byte 13): the payload length no longer matches
    forged = patch(msg, 13, b"\x04")
    expect("w", decode, forged, {"w": Spec("tensor", None, "int8")}, kind="up", max_bytes=BIG, match="truncated")
    forged = patch(msg, 13, b"\x02")
    expect("<trailer>", decode, forged, {"w": Spec("tensor", None, "int8")}, kind="up", max_bytes=BIG)
    # shape=None accepts any shape
    assert decode(msg, {"w": Spec("tensor", None, "int8")}, kind="up", max_bytes=BIG)["w"].shape == (3, 4)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("codec", CODECS)
def test_nonfinite_refused(bad, codec):
    x = torch.randn(6)
    x[3] = bad
    expect("w", encode, {"w": x}, {"w": Spec("tensor", (6,), codec)}, kind="up", match="non-finite")
    if codec in ("fp32", "bf16"):  # allowed when the spec says so
        msg = encode({"w": x}, {"w": Spec("tensor", (6,), codec, finite=False)}, kind="up")
        y = decode(msg, {"w": Spec("tensor", (6,), codec, finite=False)}, kind="up", max_bytes=BIG)["w"]
        assert torch.equal(y.isnan(), x.isnan())
    else:  # int codecs cannot carry it at all
        expect("w", encode, {"w": x}, {"w": Spec("tensor", (6,), codec, finite=False)}, kind="up")
    expect("f", encode, {"f": bad}, {"f": Spec("float")}, kind="up", match="non-finite")


def test_bf16_overflow_refused_on_encode():
    x = torch.tensor([torch.finfo(torch.float32).max])  # finite in fp32, inf in bf16
    expect("w", encode, {"w": x}, {"w": Spec("tensor", (1,), "bf16")}, kind="up", match="non-finite")


def test_nan_payload_with_valid_crc_refused():
    schema, msg = one_tensor(torch.randn(4), "fp32")  # payload starts at 11 + 2 (codec, ndim) + 1 (dim) = 14
    for bad in (math.nan, math.inf):
        forged = patch(msg, 14 + 4 * 2, struct.pack("<f", bad))
        expect("w", decode, forged, schema, kind="up", max_bytes=BIG, match="non-finite")
    schema, msg = one_tensor(torch.randn(4), "bf16")
    expect("w", decode, patch(msg, 14, b"\xc0\x7f"), schema, kind="up", max_bytes=BIG, match="non-finite")
    schema = {"f": Spec("float")}
    msg = encode({"f": 1.0}, schema, kind="up")
    expect("f", decode, patch(msg, 11, struct.pack("<d", math.nan)), schema, kind="up", max_bytes=BIG)


@pytest.mark.parametrize("codec", ["int8", "int4"])
def test_bad_scale_refused(codec):
    schema, msg = one_tensor(torch.randn(5), codec)  # scale at 11 + 2 + 1 = 14
    for bad in (math.nan, math.inf, -math.inf, 0.0, -1.0):
        forged = patch(msg, 14, struct.pack("<f", bad))
        expect("w", decode, forged, schema, kind="up", max_bytes=BIG, match="scale")
    # a huge finite scale that overflows on dequantisation
    forged = patch(msg, 14, struct.pack("<f", 3e38))
    expect("w", decode, forged, schema, kind="up", max_bytes=BIG, match="non-finite")


def test_invalid_quantised_codes_refused():
    schema, msg = one_tensor(torch.randn(5), "int8")  # payload at 18
    expect("w", decode, patch(msg, 18, b"\x80"), schema, kind="up", max_bytes=BIG, match="-128")
    schema, msg = one_tensor(torch.randn(5), "int4")  # 3 payload bytes at 18, last high nibble pads
    expect("w", decode, patch(msg, 18, b"\x08"), schema, kind="up", max_bytes=BIG, match="-8")
    expect("w", decode, patch(msg, 20, bytes([msg[20] & 15 | 0x90])), schema, kind="up", max_bytes=BIG, match="padding")


def test_missing_extra_and_reordered_fields():
    full = {"a": Spec("int"), "b": Spec("int"), "c": Spec("int")}
    ab = {"a": Spec("int"), "b": Spec("int")}
    ac = {"a": Spec("int"), "c": Spec("int")}
    # encode
    expect("c", encode, {"a": 1, "b": 2}, full, kind="up", match="missing")
    expect("x", encode, {"a": 1, "b": 2, "x": 3}, ab, kind="up", match="not in schema")
    # decode: a message with fewer / other / more fields than the receiver's schema
    expect("c", decode, encode({"a": 1, "b": 2}, ab, kind="up"), full, kind="up", max_bytes=BIG, match="missing")
    expect("b", decode, encode({"a": 1, "c": 2}, ac, kind="up"), full, kind="up", max_bytes=BIG, match="missing")
    expect("c", decode, encode({"a": 1, "b": 2, "c": 3}, full, kind="up"), ab, kind="up", max_bytes=BIG,
           match="not in schema")
    x = {"a": Spec("int"), "x": Spec("int"), "b": Spec("int")}
    expect("x", decode, encode({"a": 1, "x": 0, "b": 2}, x, kind="up"), ab, kind="up", max_bytes=BIG)
    ba = {"b": Spec("int"), "a": Spec("int")}  # order is part of the format
    expect("b", decode, encode({"a": 1, "b": 2}, ab, kind="up"), ba, kind="up", max_bytes=BIG, match="found 'a'")
    aa = recrc(encode({"a": 1, "b": 2}, ab, kind="up").replace(b"\x01b", b"\x01a"))  # duplicate name
    expect("a", decode, aa, {"a": Spec("int")}, kind="up", max_bytes=BIG)


def test_header_problems():
    schema, msg = sample()
    expect("<header>", decode, msg, schema, kind="down", max_bytes=BIG, match="!= expected 'down'")
    expect("<header>", decode, patch(msg, 0, b"XX"), schema, kind="up", max_bytes=BIG, match="magic")
    expect("<header>", decode, patch(msg, 2, b"\x01"), schema, kind="up", max_bytes=BIG, match="version")
    expect("<header>", decode, patch(msg, 4, b"\xff"), schema, kind="up", max_bytes=BIG, match="kind tag")
    # the field count (a varint at 7): too large, or not in its shortest form
    expect("<header>", decode, patch(msg, 7, b"\xff\xff\x7f"), schema, kind="up", max_bytes=BIG, match="exceeds")
    expect("<header>", decode, recrc(msg[:7] + b"\x83\x00" + msg[8:-4] + b"CRC!"), schema, kind="up", max_bytes=BIG,
           match="shortest")
    expect("<header>", decode, "not bytes", schema, kind="up", max_bytes=BIG)
    assert len(encode({}, {}, kind="k" * 1000)) == len(encode({}, {}, kind="k")) == 12     # the kind costs 4 bytes
    expect("y" * 256, encode, {"y" * 256: 1}, {"y" * 256: Spec("int")}, kind="up", match="at most 255")


def test_trailing_bytes():
    schema, msg = sample()
    expect("<trailer>", decode, recrc(msg[:-4] + b"\0\0" + b"CRC!"), schema, kind="up", max_bytes=BIG,
           match="2 unexpected bytes")


def test_int_bounds():
    s = {"n": Spec("int", lo=0, hi=9)}
    expect("n", encode, {"n": 10}, s, kind="up", match="upper bound 9")
    expect("n", encode, {"n": -1}, s, kind="up", match="lower bound 0")
    expect("n", encode, {"n": 2**63}, {"n": Spec("int")}, kind="up")
    msg = encode({"n": 10}, {"n": Spec("int")}, kind="up")
    expect("n", decode, msg, s, kind="up", max_bytes=BIG, match="upper bound")
    t = {"ids": Spec("tensor", (3,), "i32", lo=0, hi=5)}
    expect("ids", encode, {"ids": torch.tensor([0, 6, 1])}, t, kind="up", match="upper bound")
    expect("ids", encode, {"ids": torch.tensor([0, 2**40, 1])}, {"ids": Spec("tensor", (3,), "i32")}, kind="up")
    msg = encode({"ids": torch.tensor([0, 6, 1])}, {"ids": Spec("tensor", (3,), "i32")}, kind="up")
    expect("ids", decode, msg, t, kind="up", max_bytes=BIG, match="upper bound")


def test_bytes_max_len():
    expect("b", encode, {"b": b"x" * 9}, {"b": Spec("bytes", max_len=8)}, kind="up", match="max_len 8")
    msg = encode({"b": b"x" * 9}, {"b": Spec("bytes")}, kind="up")
    expect("b", decode, msg, {"b": Spec("bytes", max_len=8)}, kind="up", max_bytes=BIG, match="max_len")
    forged = patch(msg, 11, struct.pack("<I", 2**32 - 1))  # a length far past the end
    expect("b", decode, forged, {"b": Spec("bytes")}, kind="up", max_bytes=BIG, match="truncated")


def test_error_is_a_valueerror_and_picklable_args():
    e = WireError("w", "bad")
    assert isinstance(e, ValueError) and e.args == ("w", "bad") and str(e) == "wire: field 'w': bad"
    assert str(WireError("<crc>", "x")) == "wire: <crc>: x"


# ---------------------------------------------------------------- fuzz


def test_fuzz_only_wireerror_escapes():
    rng = random.Random(0)
    torch.manual_seed(0)
    schema = {"n": Spec("int", lo=-5, hi=5), "f": Spec("float"), "w": Spec("tensor", None, "int4"),
              "v": Spec("tensor", (3,), "bf16"), "ids": Spec("tensor", (2,), "i32"), "b": Spec("bytes", max_len=16)}
    msg = encode({"n": 1, "f": 0.5, "w": torch.randn(5), "v": torch.randn(3), "ids": torch.tensor([1, 2]),
                  "b": b"hey"}, schema, kind="fz")

    def attempt(buf):
        try:
            out = decode(buf, schema, kind="fz", max_bytes=4096)
        except WireError:
            return 0
        assert list(out) == list(schema)
        return 1

    for _ in range(200):  # pure garbage, some of it with a valid CRC and magic
        buf = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 120)))
        attempt(buf)
        if len(buf) >= 10:
            attempt(recrc(b"LF\x02" + buf[3:]))
    accepted = 0
    for bad in mutants(msg, 800, rng):  # flips, cuts, insertions, deletions; stale and valid CRCs; garbage
        accepted += attempt(bad)
    assert accepted < 100
    with pytest.raises(WireError):
        decode(b"", schema, kind="fz", max_bytes=4096)


# ---------------------------------------------------------------- nothing executable


def test_no_pickle_in_source():
    for mod in (wire_message, wire_quantize):
        src = pathlib.Path(mod.__file__).read_text()
        assert "import pickle" not in src and "from pickle" not in src
        assert "torch.load(" not in src and "torch.save(" not in src and "eval(" not in src


def test_absurd_shape_with_a_zero_dim_refused():
    schema = {"w": Spec("tensor", None, "fp32")}
    msg = encode({"w": torch.zeros(0, 3)}, schema, kind="up")     # dims at 13: 0, 3
    huge = b"\xff\xff\xff\xff\x0f"                                   # 2**32 - 1 as a varint
    forged = recrc(msg[:12] + b"\x03" + b"\x00" + huge + huge + msg[15:-4] + b"CRC!")
    expect("w", decode, forged, schema, kind="up", max_bytes=BIG, match="too large")


# ---------------------------------------------------------------- int4g: int4 with a scale per group of 32

def test_int4g_rounds_each_value_against_its_own_group_and_keeps_small_groups():
    """One large value zeroes a tensor's small ones under int4 (one scale for all); under int4g each group of 32
    has its own scale: the error of every element is at most half its group's step, and the small groups survive."""
    G = wire_quantize.GROUP
    x = torch.cat([torch.tensor([1000.0]), torch.randn(G - 1), 0.01 * torch.randn(3 * G + 5)])   # 4 groups and 5
    payload, scale = quantize(x, "int4g")
    assert scale == 1.0 and len(payload) == payload_nbytes("int4g", x.numel()) == 4 * 5 + (x.numel() + 1) // 2
    y = dequantize(payload, "int4g", 1.0, x.numel())
    step = torch.cat([torch.cat([x, x.new_zeros(-x.numel() % G)]).view(-1, G).abs().amax(1) / 7]).repeat_interleave(G)
    assert ((y - x).abs() <= step[: x.numel()] / 2 * (1 + 1e-6)).all()
    p4, s4 = quantize(x, "int4")
    y4 = dequantize(p4, "int4", s4, x.numel())
    assert (y4[G:] == 0).all() and (y[G:] != 0).float().mean() > 0.8          # int4 zeroes them, int4g keeps them
    schema, msg = one_tensor(x, "int4g")
    assert torch.equal(decode(msg, schema, kind="up", max_bytes=BIG)["w"], y)
    assert len(msg) == encoded_size(schema, "up")


def test_int4g_group_scales_are_validated_on_decode():
    schema, msg = one_tensor(torch.randn(40), "int4g")        # payload at 11 + 2 + 1 = 14: 2 scales, then nibbles
    for bad in (math.nan, math.inf, 0.0, -1.0):
        for k in (0, 1):
            forged = patch(msg, 14 + 4 * k, struct.pack("<f", bad))
            expect("w", decode, forged, schema, kind="up", max_bytes=BIG, match="scale")
    forged = patch(msg, 14, struct.pack("<f", 3e38))                                # finite, overflows on decode
    expect("w", decode, forged, schema, kind="up", max_bytes=BIG, match="non-finite")
