"""Files that are either old or whole: atomic writes, content hashes, files that do not read named as such, and
locks that die with their process."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import unicodedata
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from rgb.core.errors import UserError

log = logging.getLogger(__name__)


class CorruptFileError(UserError, ValueError):
    """A file that is there but does not read whole (truncated, damaged, or not the format its name says)."""


def unwritable(path: Path) -> str | None:
    """Why the directory `path` cannot be created or written into (None when it can): said before anything is
    written (Hydra creating a run dir, rgb.benchmark exporting weights), where it would be a traceback."""
    path = Path(path)
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"cannot create {path}: {existing} is a file, not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        return (f"cannot create or write {path}: {existing} is not writable (read-only or no permission); point "
                f"paths.output_dir (or output_dir) to a writable place")
    return None


def new_file_mode() -> int:
    """The mode `open()` gives a new file: 0o666 less the process umask (read from /proc where it can be, since
    setting the umask to read it is not thread-safe)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


@contextlib.contextmanager
def atomic_output(path: Path) -> Iterator[Path]:
    """A per-process temp path beside `path` for any writer; when the block ends the file takes the umask's mode
    (safetensors creates 0600 files, unreadable to a lab-mate) and replaces `path` whole. A block that raises
    (disk full, interrupted, refused) leaves `path` as it was and no temp file behind."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}")
    try:
        yield tmp
        os.chmod(tmp, new_file_mode())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write via a per-process temp file + rename: readers see the old file or the whole new one, never a part."""
    with atomic_output(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_json(path: Path, record, indent: int = 2) -> None:
    """`record` as indented JSON plus a newline, written whole (the one way rgb writes a JSON file)."""
    atomic_write_bytes(path, (json.dumps(record, indent=indent) + "\n").encode())


def _first_sentence(err: BaseException) -> str:
    return re.split(r"(?<=\.)\s", " ".join(str(err).split()), maxsplit=1)[0]


def tensor_file_problem(path: Path) -> str | None:
    """Why a tensor file does not read, in a few words (None when it reads, or is not there): a `.safetensors`
    file by its header and size (what a truncation breaks), any other file as a weights-only torch checkpoint."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), "pt"):
                pass
        else:
            import torch

            torch.load(path, map_location="cpu", weights_only=True)
    except OSError as err:
        return err.strerror or _first_sentence(err)
    except Exception as err:  # each library raises its own kinds; torch's advice to unpickle anyway is dropped
        text = str(err)
        if "Unsupported global" in text:
            return "it pickles Python objects, which a weights-only load refuses to run"
        if "Weights only load failed" in text:
            return "not a torch checkpoint"
        return _first_sentence(err)
    return None


@contextlib.contextmanager
def corrupt_file_named(path: Path, what: str) -> Iterator[None]:
    """Around a library's read of the tensor file `path`: its failure becomes one CorruptFileError line naming
    the file when the file itself does not read; any other failure passes through as raised."""
    try:
        yield
    except Exception:
        problem = tensor_file_problem(path)
        if problem is None:
            raise
        raise CorruptFileError(f"{what} {path} is corrupt ({problem}): replace it with a good copy") from None


def read_cached_tensors(path: Path, what: str) -> dict | None:
    """The tensors of a safetensors cache entry, or None when there is none or it does not read (logged, naming
    it): a cache entry is recomputed by its owner, never fatal and never trusted half-read."""
    path = Path(path)
    if not path.is_file():
        return None
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as err:
        log.warning("%s %s does not read (%s): computing it again", what, path, _first_sentence(err))
        return None


class NameClashError(UserError, ValueError):
    """Two owners of one file (two records of one model, or names the same but for their Unicode spelling): refused
    while the files are planned, before anything is written, never one overwriting the other."""


def distinct_name(*parts: str) -> str:
    """The one maker of a file, folder or W&B artifact name from run, model or dataset names (site pages, rgb's and
    RobustBench's model_info, CLIP_benchmark files, W&B artifacts): a readable part (letters, digits and `.`, any
    other run of characters one `-`; so no `_`, which RobustBench's readers take as the end of a model id) and a
    hash of the parts in Unicode NFC, so that names the readable part would merge (`x 1`, `x+1`, `x_1`; `X` and `x`
    on a case-insensitive file system) stay apart, the same on every rebuild. The readable part is cut to keep the
    name within any file system's limit; one spelling of a name in NFC and NFD is one name (DistinctFiles refuses
    the pair)."""
    text = [unicodedata.normalize("NFC", str(part)) for part in parts]
    digest = hashlib.sha256(json.dumps(text).encode()).hexdigest()[:10]
    readable = re.sub(r"[^A-Za-z0-9.]+", "-", "-".join(text))[:80].strip(".-")
    return f"{readable}-{digest}" if readable else digest


class DistinctFiles:
    """The files of one output tree, each claimed by one owner: a path claimed twice (two records of one model,
    names one in NFC, or the same but for case on a case-insensitive file system) is a NameClashError naming both
    owners. Writers claim every path before writing any, so a clash leaves nothing half-written."""

    def __init__(self) -> None:
        self._owners: dict[str, str] = {}

    def claim(self, path: str, owner: str) -> str:
        """`path` (relative, `/`-separated), now `owner`'s alone."""
        key = unicodedata.normalize("NFC", path).casefold()
        if key in self._owners:
            raise NameClashError(f"{self._owners[key]} and {owner} would both be written to {path}: rename one of "
                                 f"them (a file is one model's alone)")
        self._owners[key] = owner
        return path


def stable_id(path: Path) -> str:
    """A run id from a directory (W&B runs): a requeued, resumed or repeated job continues the same run."""
    return hashlib.sha1(str(Path(path).resolve()).encode()).hexdigest()[:16]


def sha256_alias(sha256: str) -> str:
    """The W&B alias of an artifact version by the hash of what it holds (a train run's weights, an evaluation's
    scores.json), so that a reader declares the very file it read (`<artifact>:<alias>`), not the latest one."""
    return f"sha256-{sha256[:12]}"


@contextlib.contextmanager
def replaced_whole(directory: Path, *, start_empty: bool = False, keep_theirs: Callable[[Path], bool] | None = None):
    """A staging copy of `directory` to write into: when the block ends normally it replaces `directory`, after an
    error (a full disk while copying or writing) `directory` is left exactly as it was, never half-updated.
    Staging copies a killed process left beside it are removed first (readers skip them: `is_staging`).

    `start_empty`: the staging folder starts empty, not as a copy (a build that writes all of it). `keep_theirs`:
    when another process put a `directory` in place while this one wrote, keep it where this says it may stand for
    ours (the same build) instead of raising."""
    directory = Path(directory)
    staging = directory.with_name(f".{directory.name}.new.{os.getpid()}")
    retired = directory.with_name(f".{directory.name}.old.{os.getpid()}")
    remove_dead_staging(directory)
    try:
        shutil.rmtree(staging, ignore_errors=True)
        if directory.is_dir() and not start_empty:
            _copy_tree(directory, staging)
        else:
            staging.mkdir(parents=True)
        yield staging
        if directory.exists():
            os.replace(directory, retired)
        try:
            os.replace(staging, directory)
        except OSError:
            if keep_theirs is None or not keep_theirs(directory):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    shutil.rmtree(retired, ignore_errors=True)


def _copy_tree(source: Path, target: Path) -> None:
    """shutil.copytree that raises a file's copy error as it is: copytree gathers them into a shutil.Error of
    strings, which loses the errno (a full disk was a traceback, not the commands' one line)."""
    failures: list[OSError] = []

    def copy(src, dst):
        try:
            return shutil.copy2(src, dst)
        except OSError as err:
            failures.append(err)
            raise

    try:
        shutil.copytree(source, target, symlinks=True, copy_function=copy)
    except shutil.Error:
        if failures:
            raise failures[0] from None
        raise


STAGING_NAME = re.compile(r"^\.(?P<name>.+)\.(?:new|old)\.(?P<pid>\d+)$")


def is_staging(path: Path) -> bool:
    """Whether `path` is a staging copy of `replaced_whole` (never a result to read: it may be half-written)."""
    return STAGING_NAME.match(Path(path).name) is not None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_dead_staging(directory: Path) -> list[Path]:
    """Remove the staging copies of `directory` whose writing process is gone (a killed run); returns them."""
    directory = Path(directory)
    removed = []
    if not directory.parent.is_dir():
        return removed
    for candidate in directory.parent.iterdir():
        found = STAGING_NAME.match(candidate.name)
        if found and found["name"] == directory.name and not _alive(int(found["pid"])):
            shutil.rmtree(candidate, ignore_errors=True)
            removed.append(candidate)
    return removed


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
