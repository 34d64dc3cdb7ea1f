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
from rgb.core.jsonrecord import RecordError, check_fields


class CacheError(UserError, RuntimeError):
    """An answer cache with a damaged record that is not the torn last line of an interrupted write."""


# An answer record's fields and their types (`key` and `answer` required): a line holding another type is refused
# when the cache is read, never counted or summed into a wrong number.
RECORD_TYPES = {"key": str, "answer": str, "usage": dict[str, int] | None, "billed": dict[str, int | bool] | None,
                "finish_reason": str | None, "served_model": str | None}
REQUIRED = ("key", "answer")
# What to do about a cache that does not read.
FRESH_CACHE = "move the file away to start a fresh cache"


def answer_record(value, where: str) -> dict:
    """A cache line's decoded JSON checked as an answer record (CacheError naming `where` otherwise)."""
    if not isinstance(value, dict):
        raise CacheError(f"{where} holds {'a list' if isinstance(value, list) else type(value).__name__} where an "
                         f"answer record (a JSON object) belongs; {FRESH_CACHE}")
    lacking = [k for k in REQUIRED if k not in value]
    if lacking:
        raise CacheError(f"{where} is not an answer record (no {', '.join(lacking)}); {FRESH_CACHE}")
    try:
        check_fields(value, RECORD_TYPES)
    except RecordError as err:
        raise CacheError(f"{where}: {err}; {FRESH_CACHE}") from None
    return value


class AnswerCache:
    """Append-only JSONL of {"key", "answer", "usage", "billed", ...} (`billed`: what the provider charged for it,
    rgb.endpoints.cost.billed_usage); each record fsynced as it is written. A torn last line (kill -9 in the middle
    of a write) is cut off when the cache is opened; anything else unreadable is refused."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.answers: dict[str, dict] = {}
        self._lock = threading.Lock()
        self._file = None
        if self.path.exists():
            self._load()

    def _load(self) -> None:
        try:
            data = self.path.read_bytes()
        except OSError as err:  # a directory where the cache file belongs, unreadable
            raise CacheError(f"cannot read the answer cache {self.path} ({err.strerror}); {FRESH_CACHE}") from None
        whole = data[: data.rfind(b"\n") + 1]
        for number, line in enumerate(whole.splitlines(), start=1):
            try:
                value = json.loads(line)
            except ValueError as err:
                raise CacheError(f"{self.path} line {number} is not valid JSON ({err}); {FRESH_CACHE}") from None
            record = answer_record(value, f"{self.path} line {number}")
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
