"""rgb-serve's Files and Batches endpoints, shaped as OpenAI's (the `openai` SDK's FileObject and Batch), so a
client's Batch path is rehearsed against a local model: `POST /v1/files` (purpose `batch`), `GET /v1/files` (listed),
`GET /v1/files/{id}` and `/content`, `DELETE /v1/files/{id}`, `POST /v1/batches`, `GET /v1/batches` (listed),
`GET /v1/batches/{id}`, `POST /v1/batches/{id}/cancel`. Lists are OpenAI's cursor pages (`after`, `limit`,
`has_more`, `first_id`, `last_id`), so the SDK's pagers walk them.

A batch runs in the background (validating, in_progress, then completed, failed or cancelled), each line through
the same handler as `/v1/chat/completions` (so faults and the concurrency limit apply to it too). Answered lines go
to the output file and refused ones to the error file, each as OpenAI writes them: {"id", "custom_id",
"response": {"status_code", "request_id", "body"}, "error"}. An input that is not a JSONL of chat-completions
requests with distinct custom_ids fails the batch as a whole (`errors`), as OpenAI's validation does. Unlike
OpenAI, nothing expires: the files and batches stay in the store's directory (`batch_dir`) until deleted, and a
server restarted on it serves them again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import tempfile
import threading
import time
import uuid
from pathlib import Path

from fastapi import FastAPI, Request
from starlette.datastructures import UploadFile
from fastapi.responses import Response

from rgb.core.errors import UserError
from rgb.core.files import atomic_write_bytes, atomic_write_json
from rgb.core.jsonrecord import RecordError, decode, read_json
from rgb.endpoints.batch import BATCH_URL, COMPLETION_WINDOW, FINISHED, MAX_REQUESTS  # OpenAI's Batch API, as the client speaks it

log = logging.getLogger("rgb.serve")


class BatchStoreError(UserError, ValueError):
    """A batch_dir whose records rgb-serve cannot read (one line naming the file)."""


class BatchStore:
    """The uploaded and written files and the batches, kept in `directory` so that a restarted server on the same
    directory lists and retrieves them: a file's content as `<file id>`, its object as `<file id>.json`, a batch's
    object as `<batch id>.json` (each written whole). A batch that was running when the server stopped is failed
    (`server_restarted`) on loading: its answers so far were in memory only."""

    def __init__(self, directory: str | Path | None = None):
        self.directory = Path(directory) if directory else Path(tempfile.mkdtemp(prefix="rgb-serve-batches-"))
        self.directory.mkdir(parents=True, exist_ok=True)
        self.files: dict[str, dict] = {}
        self.batches: dict[str, dict] = {}
        self.lock = threading.Lock()
        self._load()

    def _load(self) -> None:
        for path in sorted(self.directory.glob("*.json")):
            fix = f"move it out of {self.directory}"
            entry = read_json(path, BatchStoreError, fix)
            try:
                kind = decode(str, entry.get("object"), "object")
                decode(str, entry.get("id"), "id")
                if kind == "batch":
                    decode(str, entry.get("status"), "status")
                elif kind != "file":
                    raise RecordError(f"object is {kind!r}, neither a file nor a batch")
            except RecordError as err:
                raise BatchStoreError(f"batch_dir: {path} is not a file or batch object rgb-serve wrote ({err}); "
                                      f"{fix}") from None
            if kind == "file" and (self.directory / entry["id"]).is_file():
                self.files[entry["id"]] = entry
            elif kind == "batch":
                self.batches[entry["id"]] = entry
                if entry["status"] not in FINISHED:
                    error = {"code": "server_restarted", "line": None, "param": None,
                             "message": "rgb-serve stopped while the batch ran: create it again"}
                    self.update(entry, status="failed", failed_at=int(time.time()),
                                errors={"object": "list", "data": [error]})

    def update(self, batch: dict, **changes) -> None:
        """Change a batch and keep it on disk."""
        batch.update(changes)
        atomic_write_json(self.directory / f"{batch['id']}.json", batch)

    def add_file(self, content: bytes, filename: str, purpose: str) -> dict:
        file_id = f"file-{uuid.uuid4().hex}"
        atomic_write_bytes(self.directory / file_id, content)
        entry = {"id": file_id, "object": "file", "bytes": len(content), "created_at": int(time.time()),
                 "filename": filename, "purpose": purpose, "status": "processed", "expires_at": None,
                 "status_details": None}
        atomic_write_json(self.directory / f"{file_id}.json", entry)
        with self.lock:
            self.files[file_id] = entry
        return entry

    def add_batch(self, batch: dict) -> None:
        with self.lock:
            self.batches[batch["id"]] = batch
        self.update(batch)

    def delete_file(self, file_id: str) -> None:
        with self.lock:
            self.files.pop(file_id, None)
        (self.directory / f"{file_id}.json").unlink(missing_ok=True)
        (self.directory / file_id).unlink(missing_ok=True)

    def content(self, file_id: str) -> bytes:
        return (self.directory / file_id).read_bytes()


def _page(entries: list[dict], after: str | None, limit: int, newest_first: bool = True) -> dict:
    """One page of a list ordered by created_at, then id (a total order that a restart keeps), in OpenAI's list
    shape: the SDK's cursor pager asks for the next with `after` = the page's last id while `has_more`."""
    ordered = sorted(entries, key=lambda entry: (entry["created_at"], entry["id"]), reverse=newest_first)
    ids = [entry["id"] for entry in ordered]
    start = ids.index(after) + 1 if after in ids else 0
    data = ordered[start:start + limit]
    return {"object": "list", "data": [dict(entry) for entry in data], "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": start + limit < len(ordered)}


def _lines(content: bytes) -> tuple[list[dict], list[dict]]:
    """The requests of an input file, or the validation errors that fail the batch (OpenAI's BatchError shape)."""
    requests, errors, seen = [], [], set()
    for number, line in enumerate(content.decode("utf-8", "replace").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            problem = (None if isinstance(request, dict) and isinstance(request.get("custom_id"), str)
                       and request.get("method") == "POST" and request.get("url") == BATCH_URL
                       and isinstance(request.get("body"), dict) else
                       f"each line must be an object with a string custom_id, method POST, url {BATCH_URL} "
                       f"and a body object")
        except ValueError:
            problem = "the line is not valid JSON"
        if problem is None and request["custom_id"] in seen:
            problem = f"the custom_id {request['custom_id']!r} is not unique"
        if problem:
            errors.append({"code": "invalid_request", "line": number, "message": problem, "param": None})
        else:
            seen.add(request["custom_id"])
            requests.append(request)
    if not requests and not errors:
        errors.append({"code": "empty_file", "line": None, "message": "the input file has no requests",
                       "param": None})
    if len(requests) > MAX_REQUESTS:
        errors.append({"code": "too_many_requests", "line": None, "param": None,
                       "message": f"a batch holds at most {MAX_REQUESTS} requests, not {len(requests)}"})
    return requests, errors


def _answered(request: dict, status: int, body: dict) -> dict:
    """An output or error file's line for `request`, as OpenAI writes it."""
    return {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": request["custom_id"], "error": None,
            "response": {"status_code": status, "request_id": uuid.uuid4().hex, "body": body}}


def _new_batch(input_file_id: str, metadata) -> dict:
    """A batch object as OpenAI's Batch has it, validating."""
    now = int(time.time())
    return {"id": f"batch_{uuid.uuid4().hex}", "object": "batch", "endpoint": BATCH_URL, "errors": None,
            "input_file_id": input_file_id, "completion_window": COMPLETION_WINDOW,
            "status": "validating", "output_file_id": None, "error_file_id": None, "created_at": now,
            "in_progress_at": None, "expires_at": now + 24 * 3600, "finalizing_at": None, "completed_at": None,
            "failed_at": None, "expired_at": None, "cancelling_at": None, "cancelled_at": None,
            "request_counts": {"total": 0, "completed": 0, "failed": 0}, "metadata": metadata}


class BatchRoutes:
    """The Files and Batches routes of one app, a method each (`add_to` puts them on the app).
    `complete(raw body) -> (request, completion)` answers one chat request or raises `error_reply` (the app's
    OpenAI-shaped error, whose `response()` is the error body); `authorize(request)` refuses a wrong key."""

    def __init__(self, store: BatchStore, authorize, complete, error_reply):
        self.store, self.authorize, self.complete, self.error_reply = store, authorize, complete, error_reply
        self.running: set[asyncio.Task] = set()  # the background batches (a reference each, so none is collected)

    def add_to(self, app: FastAPI) -> None:
        app.post("/v1/files")(self.create_file)
        app.get("/v1/files")(self.list_files)
        app.get("/v1/files/{file_id}")(self.retrieve_file)
        app.delete("/v1/files/{file_id}")(self.delete_file)
        app.get("/v1/files/{file_id}/content")(self.file_content)
        app.post("/v1/batches")(self.create_batch)
        app.get("/v1/batches")(self.list_batches)
        app.get("/v1/batches/{batch_id}")(self.retrieve_batch)
        app.post("/v1/batches/{batch_id}/cancel")(self.cancel_batch)

    # ------------------------------------------------------------------------------------------------ the routes
    async def create_file(self, request: Request) -> dict:
        """A multipart upload (`file`, `purpose`), read here so that every refusal is in OpenAI's error shape."""
        self.authorize(request)
        form = await request.form()  # a broken multipart body: starlette's 400, in OpenAI's shape (build_app)
        file, purpose = form.get("file"), form.get("purpose")
        if not isinstance(file, UploadFile):
            raise self.error_reply(400, "Missing required parameter: 'file'", "missing_required_parameter", "file")
        if purpose != "batch":
            raise self.error_reply(400, f"rgb-serve stores files for the Batch API only (purpose 'batch', not "
                                        f"{purpose!r})", "invalid_value", "purpose")
        return self.store.add_file(await file.read(), file.filename or "upload.jsonl", purpose)

    async def list_files(self, request: Request, after: str | None = None, limit: str = "10000",
                         order: str = "desc", purpose: str | None = None) -> dict:
        """OpenAI's files.list: newest first (`order=asc`: oldest), `limit` 1 to 10,000, `purpose` filters."""
        self.authorize(request)
        if order not in ("asc", "desc"):
            raise self.error_reply(400, "Invalid 'order': expected 'asc' or 'desc'", "invalid_value", "order")
        with self.store.lock:
            files = [f for f in self.store.files.values() if purpose is None or f["purpose"] == purpose]
        return _page(files, after, self._limit(limit, 10_000), newest_first=order == "desc")

    async def list_batches(self, request: Request, after: str | None = None, limit: str = "20") -> dict:
        """OpenAI's batches.list: newest first, `limit` 1 to 100 (20 unless asked)."""
        self.authorize(request)
        with self.store.lock:
            batches = list(self.store.batches.values())
        return _page(batches, after, self._limit(limit, 100))

    async def retrieve_file(self, file_id: str, request: Request) -> dict:
        self.authorize(request)
        return self._file(file_id)

    async def delete_file(self, file_id: str, request: Request) -> dict:
        """Its content and its object go; the batches that named it keep their records."""
        self.authorize(request)
        self._file(file_id)
        self.store.delete_file(file_id)
        return {"id": file_id, "object": "file", "deleted": True}

    async def file_content(self, file_id: str, request: Request) -> Response:
        self.authorize(request)
        self._file(file_id)
        return Response(self.store.content(file_id), media_type="application/octet-stream")

    async def create_batch(self, request: Request) -> dict:
        """A batch of an uploaded file, run in the background (validating, in_progress, then finished)."""
        self.authorize(request)
        try:
            asked = json.loads(await request.body())
        except ValueError:
            raise self.error_reply(400, "the body is not valid JSON", "invalid_json") from None
        if not isinstance(asked, dict) or not isinstance(asked.get("input_file_id"), str):
            raise self.error_reply(400, "Missing required parameter: 'input_file_id'", "missing_required_parameter",
                                   "input_file_id")
        for name, value in (("endpoint", BATCH_URL), ("completion_window", COMPLETION_WINDOW)):
            if asked.get(name) != value:
                raise self.error_reply(400, f"Invalid '{name}': rgb-serve runs {name} {value!r} only",
                                       "invalid_value", name)
        self._file(asked["input_file_id"])
        batch = _new_batch(asked["input_file_id"], asked.get("metadata"))
        self.store.add_batch(batch)
        task = asyncio.create_task(self._run_guarded(batch))
        self.running.add(task)
        task.add_done_callback(self.running.discard)
        return dict(batch)

    async def retrieve_batch(self, batch_id: str, request: Request) -> dict:
        self.authorize(request)
        return dict(self._batch(batch_id))

    async def cancel_batch(self, batch_id: str, request: Request) -> dict:
        self.authorize(request)
        batch = self._batch(batch_id)
        if batch["status"] in ("validating", "in_progress"):
            self.store.update(batch, status="cancelling", cancelling_at=int(time.time()))
        return dict(batch)

    # ------------------------------------------------------------------------------------- the stored objects
    def _limit(self, asked: str, most: int) -> int:
        if not asked.isdigit() or not 1 <= int(asked) <= most:
            raise self.error_reply(400, f"Invalid 'limit': expected an integer from 1 to {most}", "invalid_value",
                                   "limit")
        return int(asked)

    def _stored(self, table: dict, object_id: str, kind: str, param: str) -> dict:
        with self.store.lock:
            entry = table.get(object_id)
        if entry is None:
            raise self.error_reply(404, f"No such {kind} object: {object_id}", "not_found", param)
        return entry

    def _file(self, file_id: str) -> dict:
        return self._stored(self.store.files, file_id, "File", "file_id")

    def _batch(self, batch_id: str) -> dict:
        return self._stored(self.store.batches, batch_id, "Batch", "batch_id")

    def _write(self, lines: list[dict], batch_id: str, kind: str) -> str | None:
        if not lines:
            return None
        content = "".join(json.dumps(line) + "\n" for line in lines).encode()
        return self.store.add_file(content, f"{batch_id}_{kind}.jsonl", "batch_output")["id"]

    # ------------------------------------------------------------------------------------------ a batch's run
    async def _one(self, request: dict) -> tuple[bool, dict]:
        try:
            _chat, completion = await self.complete(json.dumps(request["body"]).encode())
        except self.error_reply as err:
            return False, _answered(request, err.status, json.loads(err.response().body))
        return True, _answered(request, 200, completion)

    async def _run(self, batch: dict) -> None:
        requests, errors = _lines(self.store.content(batch["input_file_id"]))
        if errors:
            self.store.update(batch, status="failed", failed_at=int(time.time()),
                              errors={"object": "list", "data": errors})
            return
        counts = batch["request_counts"]
        counts["total"] = len(requests)
        if batch["status"] == "validating":  # (else cancelled while it was validated)
            self.store.update(batch, status="in_progress", in_progress_at=int(time.time()))
        output, failed = [], []
        step = 16  # lines in flight at once: the server's own concurrency limit queues them further
        for start in range(0, len(requests), step):
            if batch["status"] == "cancelling":
                break
            for ok, line in await asyncio.gather(*(self._one(r) for r in requests[start:start + step])):
                (output if ok else failed).append(line)
                counts["completed" if ok else "failed"] += 1
            self.store.update(batch)  # the counts so far
        cancelled = batch["status"] == "cancelling"  # even if its last lines were already in flight
        if not cancelled:
            self.store.update(batch, status="finalizing", finalizing_at=int(time.time()))
        self.store.update(batch, output_file_id=self._write(output, batch["id"], "output"),
                          error_file_id=self._write(failed, batch["id"], "error"))
        ended = "cancelled" if cancelled else "completed"
        self.store.update(batch, **{"status": ended, f"{ended}_at": int(time.time())})

    async def _run_guarded(self, batch: dict) -> None:
        try:
            await self._run(batch)
        except Exception as err:  # a server fault: the batch fails with one line, the server keeps serving
            log.exception("rgb-serve failed on batch %s", batch["id"])
            error = {"code": "server_error", "line": None, "message": f"the server failed: {type(err).__name__}",
                     "param": None}
            self.store.update(batch, status="failed", failed_at=int(time.time()),
                              errors={"object": "list", "data": [error]})
