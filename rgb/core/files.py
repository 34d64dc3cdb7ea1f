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
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except BaseException:  # disk full, interrupted: leave no partial temp file behind
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, record) -> None:
    atomic_write_bytes(path, (json.dumps(record, indent=2) + "\n").encode())


def stable_id(path: Path) -> str:
    """A run id from a directory (W&B runs): a requeued, resumed or repeated job continues the same run."""
    return hashlib.sha1(str(Path(path).resolve()).encode()).hexdigest()[:16]


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_jsonl(path: Path, error: type[Exception], what: str):
    """(line number, decoded value) of every non-blank line of a JSON-lines file; an unreadable file or a line
    that is not JSON raises `error` naming `path:line`."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise error(f"cannot read {what} {path}: {getattr(err, 'strerror', None) or err}") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as err:
            raise error(f"{path}:{number}: not valid JSON ({err.msg})") from None
