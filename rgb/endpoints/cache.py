"""The answer cache of the `api` family: content-addressed (one request key per image, prompt and model identity)
and append-only, so the same image in two splits is asked once, a re-run asks nothing, and kill -9 loses only the
answers in flight.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from rgb.core.errors import UserError


class CacheError(UserError, RuntimeError):
    """An answer cache with a damaged record that is not the torn last line of an interrupted write."""


class AnswerCache:
    """Append-only JSONL of {"key", "answer", "usage", "billed", ...} (`billed`: what the provider charged for it,
    rgb.endpoints.cost.billed_usage); each record fsynced as it is written. A torn last line (kill -9 in the middle
    of a write) is cut off when the cache is opened; anything else unreadable is refused."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.answers: dict[str, dict] = {}
        self._lock = threading.Lock()
        self._file = None
        if self.path.is_file():
            self._load()

    def _load(self) -> None:
        data = self.path.read_bytes()
        whole = data[: data.rfind(b"\n") + 1]
        for number, line in enumerate(whole.splitlines(), start=1):
            try:
                record = json.loads(line)
                lacking = [k for k in ("key", "answer") if not isinstance(record.get(k), str)]
            except (ValueError, AttributeError) as err:
                lacking = [f"JSON: {err}"]
            if lacking:
                raise CacheError(f"{self.path} line {number} is not an answer record (no {', '.join(lacking)}); "
                                 f"move the file away to start a fresh cache")
            self.answers[record["key"]] = record
        if len(whole) < len(data):  # the torn tail of an interrupted append: never a whole answer
            with open(self.path, "r+b") as handle:
                handle.truncate(len(whole))

    def __contains__(self, key: str) -> bool:
        return key in self.answers

    def get(self, key: str) -> dict | None:
        return self.answers.get(key)

    def add(self, record: dict) -> None:
        line = (json.dumps(record, sort_keys=True) + "\n").encode()
        with self._lock:
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = open(self.path, "ab")
            self._file.write(line)
            self._file.flush()
            os.fsync(self._file.fileno())
            self.answers[record["key"]] = record

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
