"""The wire: every message between server and client, as validated bytes (no pickle)."""

from .message import Schema, Spec, WireError, decode, encode, encoded_size, kind_of, kind_tag, tensor_schema
from .quantize import CODECS, dequantize, payload_nbytes, quantize

__all__ = [
    "CODECS", "quantize", "dequantize", "payload_nbytes",
    "Spec", "Schema", "WireError", "encode", "decode", "encoded_size", "kind_of", "kind_tag", "tensor_schema",
]
