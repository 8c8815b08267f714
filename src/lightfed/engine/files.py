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
