"""Durable files without torch (the Flower client app imports this and nothing heavy)."""
from __future__ import annotations

import os
from pathlib import Path


def fsync(path: Path) -> None:
    """Flush a file's (or a folder's entries') data to the disk: durable across a power loss."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def source_hash() -> str:
    """12 hex digits of sha256 over lightfed's own source files (relative path + bytes, sorted): which code made a
    run (summary.json "code"); a benchmark reuses a finished run only if it was made by the code it runs now."""
    import hashlib
    global _SOURCE_HASH
    if _SOURCE_HASH is None:
        root = Path(__file__).resolve().parents[1]          # the lightfed package
        h = hashlib.sha256()
        for p in sorted(root.rglob("*.py")):
            h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
        _SOURCE_HASH = h.hexdigest()[:12]
    return _SOURCE_HASH


_SOURCE_HASH: str | None = None
