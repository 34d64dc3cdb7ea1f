"""`run.json`: the identity a run directory is bound to. Train run dirs (rgb.training.rundir) and attack run
directories (rgb.runs.store) keep different records in it but follow one rule, kept here: a directory that holds
results is refused to a run of another identity, naming the differing keys in one line; one that holds none yet is
claimed by the next run whatever identity its record names, so a start that died before making anything never
blocks its corrected successor. A record that does not read, or is another kind's, is never overwritten (records
are written atomically, so it is a foreign or damaged file, not a half-written one): one line names it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rgb.core.files import atomic_write_json
from rgb.core.jsonrecord import read_json

MANIFEST = "run.json"
# Keep the list of changes in a refusal readable.
SHOWN_CHANGES = 6


def identity_changes(stored: dict, current: dict) -> list[str]:
    """`key stored -> current` for every key whose value differs, keys on both sides first, then keys that
    exist on one side only (shown as absent on the other)."""

    def shown(side: dict, key: str) -> str:
        return repr(side[key]) if key in side else "(absent)"

    differing = [key for key in set(stored) | set(current)
                 if key not in stored or key not in current or stored[key] != current[key]]
    differing.sort(key=lambda key: (key not in stored or key not in current, key))
    return [f"{key} {shown(stored, key)} -> {shown(current, key)}" for key in differing]


def changes_line(changes: list[str]) -> str:
    """The first SHOWN_CHANGES changes and how many more: a refusal stays one readable line."""
    more = f" and {len(changes) - SHOWN_CHANGES} more" if len(changes) > SHOWN_CHANGES else ""
    return ", ".join(changes[:SHOWN_CHANGES]) + more


class IdentityManifest:
    """The run.json of one directory as one kind of run keeps it. `identity_of` finds the identity in a record
    (None: not a record of this kind), `kind` names the kind with its article ("a training run"), `error` is the
    kind's one-line error, `refusal` what a refusal says the directory was made for, `elsewhere` where a refused
    run goes instead ("another run_name")."""

    def __init__(self, directory: Path, kind: str, identity_of: Callable[[object], dict | None],
                 error: type[Exception], refusal: str, elsewhere: str):
        self.directory = Path(directory)
        self.path = self.directory / MANIFEST
        self.kind, self.identity_of, self.error, self.refusal = kind, identity_of, error, refusal
        self.elsewhere = elsewhere
        self.start_over = f"start fresh with {elsewhere}, or delete {self.directory}"

    def read(self) -> dict | None:
        """The stored record, None when there is none; one that does not decode, or is not of this kind (another
        kind's directory), raises: such a directory is never adopted."""
        if not self.path.exists():
            return None
        record = read_json(self.path, self.error, self.start_over)
        if self.identity_of(record) is None:
            raise self.error(f"{self.path} is not {self.kind} record; use {self.elsewhere}")
        return record

    def claim(self, record: dict, holds_results: bool, write: bool = True) -> dict:
        """The stored record when its identity is `record`'s; otherwise `record`, written in its place (when
        `write`), unless the directory `holds_results` (what this kind's record protects): then another identity
        is refused, naming the differing keys."""
        stored = self.read()
        changes = identity_changes(self.identity_of(stored), self.identity_of(record)) if stored is not None else []
        if stored is not None and not changes:
            return stored
        if changes and holds_results:
            raise self.error(f"{self.directory} {self.refusal}: {changes_line(changes)}; {self.start_over}")
        if write:
            self.directory.mkdir(parents=True, exist_ok=True)
            atomic_write_json(self.path, record)
        return record
