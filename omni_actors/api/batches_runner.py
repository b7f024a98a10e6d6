"""Batches run in the main process: each line through the app's own route, its result stored as it ends.

A batch moves `validating` -> `in_progress` -> `finalizing` -> `completed`; `cancelling` -> `cancelled`
(POST .../cancel); `expired` once its completion window (24 h) has passed with lines left. The
lines run in input order, at most `lines_in_flight` at a time for the whole server, each as a
request to the app itself (batches_dispatch.Loopback), so its answer is what a direct call answers.
Each line's result is stored the moment it ends (batches_store.record), so a server that stops
mid-batch loses only the lines in flight: the next server on the same data directory takes the
batch up (at its start, or when a client reads the batch) and runs the lines without a result.

Lines answered 429 or 503 (a full queue, a stage not ready) are tried again after the answer's
`Retry-After`, up to TRANSIENT_TRIES times (without limit while the server is loading its models);
while the server drains or stops, such a line is not recorded and no further line starts: the batch
waits, `in_progress`, for the next server. A line with `stream: true` (or, on /v1/responses,
`background: true`) is not sent: its error says why. A cancel stops starting lines and aborts those
in flight (their requests end in every stage); the results so far are written out.

At the end the output file (2xx answers) and the error file (the others, and on expiry the lines
never run, `batch_expired`) are written as uploads of purpose `batch_output`, in input order.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Mapping
from typing import Any

import aiohttp
import msgspec
from aiohttp import web

from omni_actors import logs
from omni_actors.api.audio_codec import off_loop
from omni_actors.api.batches_dispatch import Loopback
from omni_actors.api.batches_schemas import Batch, BatchError, BatchErrors, BatchUsage
from omni_actors.api.batches_store import UNFINISHED, BatchStore
from omni_actors.api.file_store import FileStore
from omni_actors.api.files import file_store
from omni_actors.api.pipelines import PIPELINES_KEY
from omni_actors.store import owned_elsewhere

log = logs.get(__name__)

LINES_IN_FLIGHT = 4
"""Batch lines this server runs at once, over all its batches."""
TRANSIENT_TRIES = 5
"""Times a line answered 429 or 503 is sent before that answer is its result."""
TRANSIENT_WAIT_S = 1.0
"""Wait before trying such a line again when its answer has no `Retry-After`."""
EXIT_TIMEOUT_S = 10.0
"""Longest shutdown waits for the batches' tasks to put down their lines."""
RUNNING_HERE: set[str] = set()
"""The batches this process runs, in any of its apps (an app of the same process sees them running)."""
EXPIRED = {"code": "batch_expired", "message": "This request could not be executed before the completion window "
           "expired."}


class OutputLine(msgspec.Struct):
    id: str
    custom_id: str
    response: dict[str, Any] | None
    error: dict[str, str] | None


class _Flags(msgspec.Struct):
    """What a line's body says that makes it unfit for a batch (its other fields are read by its route)."""

    stream: Any = None
    background: Any = None


_flags = msgspec.json.Decoder(_Flags)


def _now() -> int:
    return int(time.time())


def _line_id() -> str:
    return f"batch_req_{secrets.token_hex(12)}"


class BatchRunner:
    """The app's running batches."""

    def __init__(self, app: web.Application) -> None:
        self.app = app
        self.lines_in_flight = LINES_IN_FLIGHT
        self.loopback: Loopback | None = None
        self.store: BatchStore | None = None
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.lines: dict[str, set[asyncio.Task[None]]] = {}
        """Each running batch's lines in flight."""
        self.closing = False
        self.paused = False
        """Set when a line met a draining server: no line starts again in this server."""
        self._slots: asyncio.Semaphore | None = None

    async def batch_store(self) -> BatchStore:
        """The batches' store: in the app's file store's database (opened on first use, off the loop)."""
        if self.store is None:
            self.store = await off_loop(lambda: BatchStore(file_store(self.app).store))
        return self.store

    async def resume(self) -> None:
        """At start-up: take up every unfinished batch no running server owns."""
        store = await self.batch_store()
        for bid, owner in await off_loop(store.unfinished):
            self.adopt(bid, owner)

    def adopt(self, bid: str, owner: int | None) -> None:
        """Run batch `bid` here unless it runs (here or in another live server) or the server stops."""
        if self.closing or bid in RUNNING_HERE or owned_elsewhere(owner):
            return
        assert self.store is not None
        if self.store.claim(bid, owner):
            self.start(bid)

    def start(self, bid: str) -> None:
        """Run a batch this server owns (unless it runs already: a read adopted it first)."""
        if bid in RUNNING_HERE:
            return
        RUNNING_HERE.add(bid)
        self.tasks[bid] = asyncio.create_task(self._run(bid), name=f"batch-{bid}")

    def cancel(self, bid: str) -> None:
        """Abort a running batch's lines in flight (its row says `cancelling` already)."""
        for task in list(self.lines.get(bid, ())):
            task.cancel()

    async def close(self) -> None:
        """Shutdown: abort every line in flight (each is run again by the next server) and stop."""
        self.closing = True
        for bid in list(self.lines):
            self.cancel(bid)
        if self.tasks:
            await asyncio.wait(list(self.tasks.values()), timeout=EXIT_TIMEOUT_S)
        if self.loopback is not None:
            await self.loopback.close()

    def _stopping(self) -> bool:
        return self.closing or self.paused or any(o.draining for o in self.app[PIPELINES_KEY].all)

    async def _run(self, bid: str) -> None:
        assert self.store is not None
        store = self.store
        try:
            batch = store.get(bid)
            if batch is None:
                return
            if batch.status == "validating":
                batch = msgspec.structs.replace(batch, status="in_progress", in_progress_at=_now())
                store.move(batch, ("validating",))
            if store.status(bid) == "in_progress" and not await self._run_lines(batch):
                return  # stopped with lines left: the next server goes on
            await self._finish(bid)
        except Exception as err:  # the batch's boundary: it fails with a reason, the server lives on
            log.exception("batch.failed", batch=bid, error_type=type(err).__name__)
            found = store.get(bid)
            if found is not None and found.status in UNFINISHED:
                errors = BatchErrors([BatchError("internal_error", f"{type(err).__name__}: {err}")])
                store.move(msgspec.structs.replace(found, status="failed", failed_at=_now(), errors=errors),
                           UNFINISHED, drop_lines=True)
        finally:
            self.tasks.pop(bid, None)
            self.lines.pop(bid, None)
            RUNNING_HERE.discard(bid)

    async def _run_lines(self, batch: Batch) -> bool:
        """Run the lines without a result; False when the server stopped them with lines left."""
        assert self.store is not None
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.lines_in_flight)
        if self.loopback is None:
            self.loopback = Loopback(self.app, self.lines_in_flight)
        await self.loopback.start()
        pending = await off_loop(self.store.pending, batch.id)
        log.info("batch.running", batch=batch.id, lines=len(pending))
        flying = self.lines.setdefault(batch.id, set())
        for line, custom_id, body in pending:
            await self._slots.acquire()
            if self._stopping() or self.store.status(batch.id) != "in_progress" or time.time() >= batch.expires_at:
                self._slots.release()
                break
            task = asyncio.create_task(self._line(batch, line, custom_id, body))
            flying.add(task)
            task.add_done_callback(self._landed(flying))
        if flying:
            await asyncio.wait(list(flying))
        return not self._stopping()

    def _landed(self, flying: set[asyncio.Task[None]]):
        def done(task: asyncio.Task[None]) -> None:
            flying.discard(task)
            assert self._slots is not None
            self._slots.release()
            if not task.cancelled() and task.exception() is not None:
                log.error("batch.line_failed", error=repr(task.exception()))

        return done

    async def _line(self, batch: Batch, line: int, custom_id: str, body: str) -> None:
        """Run one line and store its result (nothing when the server stopped it)."""
        try:
            answer = await self._answer(batch.endpoint, body)
        except Exception as err:  # the line's boundary: its error says why, the batch goes on
            log.exception("batch.line_failed", batch=batch.id, line=line, error_type=type(err).__name__)
            answer = None, {"code": "internal_error", "message": f"{type(err).__name__}: {err}"}, False
        if answer is None:
            return
        response, error, ok = answer
        result = msgspec.json.encode(OutputLine(_line_id(), custom_id, response, error))
        assert self.store is not None
        self.store.record(batch.id, line, result, ok)

    async def _answer(self, endpoint: str, body: str) -> tuple[dict[str, Any] | None, dict[str, str] | None, bool] | None:
        """(response, error, ok) of a line; None when the server stopped it before its answer."""
        try:
            fields = _flags.decode(body)
        except (msgspec.DecodeError, RecursionError):  # (too deep for this stack: its route answers it, a 400)
            fields = _Flags()
        if fields.stream is True:
            return None, {"code": "invalid_request", "message": "body.stream: a batch's answers are whole; send the "
                          "request without `stream: true`"}, False
        if fields.background is True:
            return None, {"code": "invalid_request", "message": "body.background: a batch line is answered in the "
                          "batch's output file; send it without `background: true`"}, False
        assert self.loopback is not None
        tries = 0
        while True:
            try:
                status, headers, payload = await self.loopback.post(endpoint, body.encode())
            except aiohttp.ClientError as err:
                if self._stopping():
                    return None
                return None, {"code": "internal_error", "message": f"the request was not answered: {err}"}, False
            if status not in (429, 503):
                break
            if self._stopping():
                self.paused = self.paused or not self.closing
                return None
            code = _error_code(payload)
            tries += code != "loading"
            if tries >= TRANSIENT_TRIES:
                break
            await asyncio.sleep(_retry_after(headers))
        try:
            answered: Any = msgspec.Raw(msgspec.json.encode(msgspec.json.decode(payload)))
        except msgspec.DecodeError:
            answered = payload.decode(errors="replace")
        response = {"status_code": status, "request_id": f"req_{secrets.token_hex(12)}", "body": answered}
        return response, None, 200 <= status < 300

    async def _finish(self, bid: str) -> None:
        """Write the output and error files and end the batch: completed, cancelled or expired."""
        assert self.store is not None
        store = self.store
        batch = store.get(bid)
        assert batch is not None
        ended = "expired" if time.time() >= batch.expires_at and store.has_pending(bid) else "completed"
        if batch.status == "in_progress":
            finalizing = msgspec.structs.replace(batch, status="finalizing", finalizing_at=_now())
            if store.move(finalizing, ("in_progress",)):
                batch = finalizing
            else:  # cancelled meanwhile
                batch = store.get(bid) or batch
        if batch.status == "cancelling":
            ended = "cancelled"
        elif batch.status != "finalizing":
            return
        out, err, usage = await off_loop(self._write, batch, ended == "expired")
        now = _now()
        times = {"completed": {"completed_at": now}, "cancelled": {"cancelled_at": now},
                 "expired": {"expired_at": now}}[ended]
        final = msgspec.structs.replace(batch, status=ended, output_file_id=out, error_file_id=err, usage=usage,
                                        **times)
        store.move(final, (batch.status,), drop_lines=True)
        log.info("batch.ended", batch=bid, status=ended)

    def _write(self, batch: Batch, expired: bool) -> tuple[str | None, str | None, BatchUsage]:
        """The output and error files (ids, None for one without a line) and the answers' token usage."""
        assert self.store is not None
        files: FileStore = file_store(self.app)
        out, err = bytearray(), bytearray()
        usage = BatchUsage()
        for _, custom_id, result, ok in self.store.results(batch.id):
            if result is None:
                if expired:
                    err += msgspec.json.encode(OutputLine(_line_id(), custom_id, None, EXPIRED)) + b"\n"
                continue
            (out if ok else err).extend(result.encode() + b"\n")
            if ok:
                _add_usage(usage, result)
        ids = []
        for data, kind in ((out, "output"), (err, "error")):
            made = files.add(f"{batch.id}_{kind}.jsonl", "batch_output", bytes(data),
                             self.store.output_expiry(batch.id)) if data else None
            ids.append(made.id if made else None)
        return ids[0], ids[1], usage


def _add_usage(usage: BatchUsage, result: str) -> None:
    """Add an answer's tokens (chat's and completions' prompt/completion, responses' input/output)."""
    found = ((json.loads(result).get("response") or {}).get("body") or {})
    got = found.get("usage") if isinstance(found, dict) else None
    if not isinstance(got, dict):
        return
    took = got.get("input_tokens", got.get("prompt_tokens", 0)) or 0
    made = got.get("output_tokens", got.get("completion_tokens", 0)) or 0
    usage.input_tokens += took
    usage.output_tokens += made
    usage.total_tokens += took + made


def _error_code(payload: bytes) -> str | None:
    try:
        return json.loads(payload)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None


def _retry_after(headers: Mapping[str, str]) -> float:
    try:
        return max(0.0, float(headers.get("Retry-After", TRANSIENT_WAIT_S)))
    except ValueError:
        return TRANSIENT_WAIT_S
