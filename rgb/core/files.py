"""Files that are either old or whole: atomic writes, and content hashes."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write via a per-process temp file + rename: readers see the old file or the whole new one, never a part."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def atomic_write_json(path: Path, record) -> None:
    atomic_write_bytes(path, (json.dumps(record, indent=2) + "\n").encode())


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
