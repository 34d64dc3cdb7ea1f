"""Model names that point outside the libraries' registries: `hf-hub:ORG/NAME[@REV]` and `local-dir:PATH`.

The libraries' own loaders read them (timm.create_model, open_clip.create_model), so the Hugging Face cache,
`HF_HOME` / `HF_HUB_CACHE` and `HF_HUB_OFFLINE` behave as everywhere else. What this module adds: one line when
the files are not on this machine (which repo, how to fetch it), and the exact revision of what was loaded, for
model.json.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from rgb.core.errors import UserError
from rgb.core.files import CorruptFileError, tensor_file_problem
from rgb.core.values import ConfigValueError

HF_HUB = "hf-hub"
LOCAL_DIR = "local-dir"


class HubModelMissingError(UserError, FileNotFoundError):
    """A hub model whose files are not in the local Hugging Face cache (offline, or the hub unreachable)."""


class HubCacheCorruptError(CorruptFileError):
    """A file of a hub repo that is in the local Hugging Face cache but does not read (truncated download, a blob
    overwritten): the libraries' own errors name neither the file nor the repo."""


def split_source(name: str) -> tuple[str | None, str]:
    """(`hf-hub` / `local-dir` / None, the rest) of a model name, as both libraries spell the prefixes."""
    for source in (HF_HUB, LOCAL_DIR):
        if name.startswith(f"{source}:"):
            rest = name[len(source) + 1 :]
            if not rest:
                raise ConfigValueError(f"model name {name!r} names no repo or folder after '{source}:': write "
                                       f"{HF_HUB}:ORG/NAME[@REV] or {LOCAL_DIR}:PATH")
            return source, rest
    return None, name


def split_revision(repo: str) -> tuple[str, str | None]:
    """`ORG/NAME@REV` -> (ORG/NAME, REV); no `@` -> (repo, None)."""
    repo_id, _, revision = repo.partition("@")
    return repo_id, revision or None


def fetch_hint(repo_id: str, revision: str | None) -> str:
    from huggingface_hub import constants

    rev = f" --revision {revision}" if revision else ""
    cache = constants.HF_HUB_CACHE
    return (f"on a machine with internet run `hf download {repo_id}{rev}` (huggingface-cli download with older "
            f"huggingface_hub), bring its cache here ({cache}) and run with HF_HUB_OFFLINE=1")


def _file_problem(path: Path) -> str | None:
    """Why a cached config (JSON) or weights file does not read, in a few words; None when it reads."""
    if path.is_symlink() and not path.exists():
        return "the blob it links to is missing: a cache copied without its blobs/ folder, or a blob deleted"
    if path.suffix != ".json":
        return tensor_file_problem(path)
    try:
        json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        return f"not JSON: {err}"
    return None


def _broken_cached_file(repo_id: str, revision: str | None, files: tuple[str, ...]) -> tuple[Path, str] | None:
    """(path, problem) of the first of `files` that the cache's snapshot of this revision holds but that does not
    read; the snapshot is found as huggingface_hub lays the cache out (refs/<branch> names the commit)."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    repo = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo_id, repo_type="model")
    ref = repo / "refs" / (revision or "main")
    commit = ref.read_text().strip() if ref.is_file() else revision
    for filename in files if commit else ():
        path = repo / "snapshots" / commit / filename
        problem = _file_problem(path) if path.is_symlink() or path.is_file() else None
        if problem:
            return path, problem
    return None


@contextlib.contextmanager
def hub_files(name: str, repo: str, files: tuple[str, ...] = ()):
    """Failures of huggingface_hub (or a library wrapping it) inside the block as one line: one of `files` (the
    repo's config and weights, as the library names them) in the cache but unreadable names that file and the
    repo; files not in the cache / the hub unreachable name the repo and how to fetch it."""
    from huggingface_hub.errors import EntryNotFoundError, OfflineModeIsEnabled

    repo_id, revision = split_revision(repo)
    spelled = f"{repo_id}{'@' + revision if revision else ''}"
    try:
        yield
    except Exception as err:
        broken = _broken_cached_file(repo_id, revision, files)
        if broken is not None:
            path, problem = broken
            raise HubCacheCorruptError(
                f"model {name}: file {path.name} of hub repo {spelled} in the local Hugging Face cache ({path}) "
                f"does not read ({' '.join(problem.split())}): fetch it again (hf download {repo_id} {path.name} "
                f"--force-download{' --revision ' + revision if revision else ''}, where the hub is reachable)"
            ) from None
        if not isinstance(err, (EntryNotFoundError, OfflineModeIsEnabled, FileNotFoundError, ConnectionError)):
            raise
        offline = "HF_HUB_OFFLINE=1" if os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0") else "hub unreachable"
        raise HubModelMissingError(
            f"model {name}: files of hub repo {spelled} are not in the local "
            f"Hugging Face cache ({offline}; {type(err).__name__}): {fetch_hint(repo_id, revision)}"
        ) from None


def hub_file(name: str, repo: str, filename: str) -> Path:
    """Local path of one file of a hub repo (downloaded if allowed, else from the cache), or the one-line error."""
    from huggingface_hub import hf_hub_download

    repo_id, revision = split_revision(repo)
    with hub_files(name, repo, (filename,)):
        return Path(hf_hub_download(repo_id, filename, revision=revision))


def cached_revision(path: Path) -> str | None:
    """The commit a file of the hub cache belongs to (`.../snapshots/<commit>/<file>`)."""
    for parent in Path(path).parents:
        if parent.parent.name == "snapshots":
            return parent.name
    return None


def source_record(name: str, marker_file: str) -> dict | None:
    """What model.json records about where a prefixed model came from: the exact name, and the hub commit (or the
    absolute folder) that was loaded; None for registry names."""
    source, rest = split_source(name)
    if source is None:
        return None
    if source == LOCAL_DIR:
        return {"name": name, "source": LOCAL_DIR, "path": str(Path(rest).expanduser().resolve())}
    repo_id, revision = split_revision(rest)
    commit = cached_revision(hub_file(name, rest, marker_file))
    return {"name": name, "source": HF_HUB, "repo_id": repo_id, "requested_revision": revision, "revision": commit}
