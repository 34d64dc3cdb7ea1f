"""The Batch path of a chat-completions requester (`model.batch=true`): the distinct uncached images of a split asked through
OpenAI's Batch API (half the price, answered within 24 h) instead of one request each, by the official `openai`
SDK: a JSONL of the same chat-completions bodies (custom_id: the request key), uploaded, run, polled, its output
parsed into the same cache records as the online path's (rgb.endpoints.client.completion_record), so a cached
answer is the same whichever path asked.

A kill at any point loses nothing asked: `<cache>.batches.json` beside the answer cache records each input file as
soon as it is uploaded and each batch as soon as it is created (written atomically); the next run creates the
batch of an uploaded file, or waits for a created one, and never puts an image of a pending batch in another. A
batch whose answers are cached leaves the state. Lines the batch failed, and answers cut by the token limit, are
not cached: unanswered (the split PARTIAL), asked again by the next run.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from tqdm import tqdm

from rgb.core.files import atomic_write_json
from rgb.core.jsonrecord import RecordError, check_fields, decode, read_json
from rgb.endpoints.cache import AnswerCache, CacheError
from rgb.endpoints.client import EndpointError, RequestBudget, RequestStats, completion_record
from rgb.endpoints.requester import Requester

log = logging.getLogger(__name__)
BATCH_URL = "/v1/chat/completions"
COMPLETION_WINDOW = "24h"  # the one window OpenAI's Batch API offers
MAX_REQUESTS = 50_000        # OpenAI's limit of requests per batch
MAX_FILE_BYTES = 190 * 2**20  # under OpenAI's 200 MB per input file
FINISHED = frozenset({"completed", "failed", "cancelled", "expired"})


# A pending batch's fields in `<cache>.batches.json` and their types (batch_id None: uploaded, not yet created).
PENDING_TYPES = {"input_file_id": str, "batch_id": str | None, "keys": list[str]}
# What to do about a state file that does not read.
MOVE_STATE = "move it away (its batches will not be resumed)"


def pending_batches(path: Path) -> list[dict]:
    """The pending batches of a state file, its one reader: anything malformed is one CacheError naming it."""
    state = read_json(path, CacheError, MOVE_STATE)
    try:
        pending = decode(list[dict], state.get("pending"), "pending")
        for number, entry in enumerate(pending):
            check_fields(entry, PENDING_TYPES, f"pending[{number}]", tuple(PENDING_TYPES))
    except RecordError as err:
        raise CacheError(f"{path} is not a state of pending batches ({err}); {MOVE_STATE}") from None
    return pending


class BatchState:
    """`<cache>.batches.json`: the batches not yet in the cache, each {"input_file_id", "batch_id", "keys"}
    (batch_id None: uploaded, not yet created). Every change is written at once, atomically."""

    def __init__(self, cache_path: Path):
        self.path = cache_path.with_name(cache_path.name + ".batches.json")
        self.pending: list[dict] = []
        if self.path.exists():
            self.pending = pending_batches(self.path)

    def save(self) -> None:
        if not self.pending:
            self.path.unlink(missing_ok=True)
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.path, {"pending": self.pending})

    def keys(self) -> set[str]:
        return {k for entry in self.pending for k in entry["keys"]}


def _chunks(lines: list[tuple[str, bytes]]) -> list[list[tuple[str, bytes]]]:
    """(key, JSONL line) pairs in input files of at most MAX_REQUESTS lines and MAX_FILE_BYTES bytes."""
    chunks, size = [[]], 0
    for key, line in lines:
        if chunks[-1] and (len(chunks[-1]) == MAX_REQUESTS or size + len(line) > MAX_FILE_BYTES):
            chunks.append([])
            size = 0
        chunks[-1].append((key, line))
        size += len(line)
    return [c for c in chunks if c]


class BatchRun:
    """One split's Batch round trip against the model's endpoint (SDK errors become one-line EndpointErrors)."""

    def __init__(self, model: Requester, cache: AnswerCache, sleep=time.sleep):
        self.model, self.cache, self.sleep = model, cache, sleep
        self.state = BatchState(cache.path)
        self.sdk = model.endpoint.sdk(model.endpoint.api_key() or "no-key", model.client_settings.max_retries)

    def call(self, what: str, function, *args, **kwargs):
        import openai

        try:
            return function(*args, **kwargs)
        except openai.OpenAIError as err:
            raise self.model.endpoint.refused(f"Batch API, {what}: {type(err).__name__}: {err}",
                                              self.model.endpoint.api_key()) from None

    def submit(self, keys: list[str], image_of: dict[str, bytes]) -> None:
        """Upload the requests of `keys` and create their batches, each step recorded in the state at once."""
        lines = [(k, (json.dumps({"custom_id": k, "method": "POST", "url": BATCH_URL,
                                  "body": self.model.body(image_of[k])}) + "\n").encode()) for k in keys]
        for chunk in _chunks(lines):
            content = b"".join(line for _, line in chunk)
            uploaded = self.call("upload", self.sdk.files.create, file=("requests.jsonl", content), purpose="batch")
            self.state.pending.append({"input_file_id": uploaded.id, "batch_id": None, "keys": [k for k, _ in chunk]})
            self.state.save()
            self.create(self.state.pending[-1])

    def create(self, entry: dict) -> None:
        batch = self.call("create", self.sdk.batches.create, input_file_id=entry["input_file_id"],
                          endpoint=BATCH_URL, completion_window=COMPLETION_WINDOW)
        entry["batch_id"] = batch.id
        self.state.save()

    def wait(self, desc: str) -> list:
        """Every pending batch once it has finished (polled every batch_poll_s, at most batch_wait_s)."""
        settings = self.model.client_settings
        deadline = time.monotonic() + settings.batch_wait_s
        total = sum(len(entry["keys"]) for entry in self.state.pending)
        with tqdm(total=total, desc=f"{desc} (batch)", unit="req", leave=False) as bar:
            while True:
                batches = [self.call("retrieve", self.sdk.batches.retrieve, entry["batch_id"])
                           for entry in self.state.pending]
                counts = [b.request_counts for b in batches if b.request_counts]
                bar.n = sum(c.completed + c.failed for c in counts)
                bar.set_postfix(failed=sum(c.failed for c in counts), status=",".join(sorted({b.status for b in
                                                                                               batches})))
                if all(b.status in FINISHED for b in batches):
                    return batches
                if time.monotonic() >= deadline:
                    raise EndpointError(f"{len(batches)} batch(es) still running after {settings.batch_wait_s:g} s "
                                   f"(model.batch_wait_s): run again to resume them ({self.state.path})")
                self.sleep(settings.batch_poll_s)

    def lines(self, file_id: str | None) -> list[dict]:
        if file_id is None:
            return []
        return [json.loads(x) for x in self.call("download", self.sdk.files.content, file_id).text.splitlines()
                if x.strip()]

    def collect(self, batch, entry: dict, uses: Counter, stats: RequestStats) -> list[str]:
        """Cache the answers of a finished batch; its failures, one line each (an empty list: none)."""
        if batch.status == "failed":
            errors = batch.errors.data if batch.errors and batch.errors.data else []
            return [f"batch {batch.id} failed: " + "; ".join(f"{e.message} (line {e.line})" for e in errors[:3])]
        problems, keys = [], set(entry["keys"])
        for line in self.lines(batch.output_file_id) + self.lines(batch.error_file_id):
            key, response = line.get("custom_id"), line.get("response") or {}
            if key not in keys or key in self.cache:  # (cached by a run killed while it collected)
                continue
            try:
                record = completion_record(response["body"], batch=True) if response.get("status_code") == 200 else None
            except (KeyError, IndexError, TypeError):
                record = None
            if record is None:
                problems.append(_line_problem(line))
                continue
            if key in uses:  # a resumed batch may hold other splits' keys: their tokens are theirs (cached there)
                stats.requests += 1
                stats.prompt_tokens += record["usage"]["prompt_tokens"]
                stats.completion_tokens += record["usage"]["completion_tokens"]
            if self.model.cut(record):  # not an answer: left unanswered, asked again by the next run
                stats.truncated += uses[key]
                continue
            self.cache.add({"key": key, **record})
        return problems


def _line_problem(line: dict) -> str:
    response = line.get("response") or {}
    error = line.get("error") or (response.get("body") or {}).get("error") or {}
    message = error.get("message") if isinstance(error, dict) else error
    return f"HTTP {response.get('status_code')}: {message}"


def ask_by_batch(model: Requester, images: Sequence[bytes], keys: list[str], cache: AnswerCache,
                 budget: RequestBudget, desc: str) -> RequestStats:
    """The answers of `images` (their request `keys`) into `cache` by the Batch API: pending batches resumed, the
    rest submitted, all waited for. What it cost is returned; the requester reads its answers from the cache."""
    if budget.max_tokens_total is not None or budget.max_cost is not None:
        raise EndpointError("max_tokens_total and max_cost stop online requests as their answers arrive; a Batch is "
                       "billed when it is done: with model.batch=true cap it by max_requests")
    uses, image_of = Counter(keys), {}
    for k, image in zip(keys, images):
        image_of.setdefault(k, image)
    stats = RequestStats(images=len(images))
    run = BatchRun(model, cache)
    for entry in run.state.pending:  # uploaded by a run that ended before creating the batch
        if entry["batch_id"] is None:
            run.create(entry)
    pending = run.state.keys()
    todo = [k for k in uses if k not in cache and k not in pending]
    run.submit(todo[: budget.take(len(todo))], image_of)
    problems = []
    if run.state.pending:
        for batch, entry in zip(run.wait(desc), list(run.state.pending)):
            problems += run.collect(batch, entry, uses, stats)
            run.state.pending.remove(entry)
            run.state.save()
    if problems:
        log.warning("%s: %d batch request(s) not answered (asked again by the next run), e.g. %s", desc,
                    len(problems), problems[0])
    return stats
