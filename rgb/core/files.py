"""Files that are either old or whole: atomic writes, content hashes, and locks that die with their process."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import IO


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


@contextlib.contextmanager
def replaced_whole(directory: Path):
    """A staging copy of `directory` to write into: when the block ends normally it replaces `directory`, after an
    error (a full disk while copying or writing) `directory` is left exactly as it was, never half-updated."""
    directory = Path(directory)
    staging = directory.with_name(f".{directory.name}.new.{os.getpid()}")
    retired = directory.with_name(f".{directory.name}.old.{os.getpid()}")
    try:
        shutil.rmtree(staging, ignore_errors=True)
        if directory.is_dir():
            shutil.copytree(directory, staging, symlinks=True)
        else:
            staging.mkdir(parents=True)
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if directory.exists():
        os.replace(directory, retired)
    os.replace(staging, directory)
    shutil.rmtree(retired, ignore_errors=True)


def flock(path: Path, wait: bool = False) -> IO | None:
    """An exclusive `flock` on `path` (created if absent, never truncated), held until the returned handle is
    closed or its process dies (the kernel releases it: a killed holder never blocks the next run). None when
    another process holds it and `wait` is false; an OSError when the filesystem has no flock."""
    handle = open(path, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except OSError as err:
        handle.close()
        if err.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            return None
        raise
    return handle


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
