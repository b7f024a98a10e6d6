"""Batches run in the main process: each line through the app's own route, its result stored as it ends.

A batch moves `validating` -> `in_progress` -> `finalizing` -> `completed`; `cancelling` -> `cancelled`
(POST .../cancel); `expired` once its completion window (24 h) has passed with lines left. The
lines run in input order, at most `lines_in_flight` at a time for the whole server (the deploy's
`server.batch_lines_in_flight`, default LINES_IN_FLIGHT), each as a request to the app itself (batches_dispatch.Loopback), so its answer is what a direct call answers.
Each line's result is stored the moment it ends (batches_store.record), so a server that stops
mid-batch loses only the lines in flight: the next server on the same data directory takes the
batch up (at its start, or when a client reads the batch) and runs the lines without a result,
once its models are loaded (it waits for api/loading.py's `ready`, instead of sending lines into its
503s). A line whose result the store refuses (a SQLite error) is failed with an `internal_error` that
names the cause: stored in its place if the store takes that, else kept here until the batch ends.
Every call to the store runs off the loop: a write waits for another process's write lock (another
server on the same data directory, a backup) up to the store's busy timeout, and the store's one
connection is held meanwhile, so a call made on the loop would stall every client of this server.

Lines answered 429 or 503 (a full queue, a stage not ready) are tried again after the answer's
`Retry-After`, up to TRANSIENT_TRIES times (without limit while the server is loading its models);
while the server drains or stops, such a line is not recorded and no further line starts: the batch
waits, `in_progress`, for the next server. A line with `stream: true` (or, on /v1/responses,
`background: true`) is not sent: its error says why. A cancel stops starting lines and aborts those
in flight (their requests end in every stage); the results so far are written out.

At the end the output file (2xx answers) and the error file (the others, and on expiry the lines
never run, `batch_expired`) are written as uploads of purpose `batch_output`, in input order, line by
line, and made live in the transaction that ends the batch (batches_output.py): a batch cut short
while it ends is ended again with the same two files.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import sqlite3
import time
from collections.abc import Mapping
from typing import Any

import aiohttp
import msgspec
from aiohttp import web

from omni_actors import logs
from omni_actors.api.audio_codec import off_loop
from omni_actors.api.batches_dispatch import Loopback
from omni_actors.api.batches_output import discard, write_outputs
from omni_actors.api.batches_schemas import Batch, BatchError, BatchErrors
from omni_actors.api.batches_store import UNFINISHED, BatchStore
from omni_actors.api.files import file_store
from omni_actors.api.loading import LOADING_KEY
from omni_actors.api.pipelines import PIPELINES_KEY
from omni_actors.store import owned_elsewhere

log = logs.get(__name__)

LINES_IN_FLIGHT = 4
"""Batch lines this server runs at once, over all its batches, unless its deploy's
`server.batch_lines_in_flight` says otherwise."""
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


class RunnerStatistics(msgspec.Struct, frozen=True):
    batches: int
    """Batches running in this app."""
    lines_in_flight: int
    waiting_for_models: int
    """Batches waiting for the server's models to load before they send a line."""
    unstored_lines: int
    """Lines whose result the store refused, kept here until their batch ends."""


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
        server = app[PIPELINES_KEY].default.deploy.server
        self.lines_in_flight: int = getattr(server, "batch_lines_in_flight", LINES_IN_FLIGHT)
        self.loopback: Loopback | None = None
        self.store: BatchStore | None = None
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.lines: dict[str, set[asyncio.Task[None]]] = {}
        """Each running batch's lines in flight."""
        self.closing = False
        self.paused = False
        """Set when a line met a draining server: no line starts again in this server."""
        self._slots: asyncio.Semaphore | None = None
        self.unstored: dict[str, dict[int, bytes]] = {}
        """Each batch's lines whose result the store refused: line -> its output line (an internal_error)."""
        self._waiting: set[str] = set()
        self._cancelled: set[str] = set()
        """Running batches cancelled here: no line of theirs starts again."""
        self._closed = asyncio.Event()

    def statistics(self) -> RunnerStatistics:
        return RunnerStatistics(len(self.tasks), sum(len(x) for x in self.lines.values()), len(self._waiting),
                                sum(len(x) for x in self.unstored.values()))

    async def batch_store(self) -> BatchStore:
        """The batches' store: in the app's file store's database (opened on first use, off the loop)."""
        if self.store is None:
            self.store = await off_loop(lambda: BatchStore(file_store(self.app).store))
        return self.store

    async def resume(self) -> None:
        """At start-up: take up every unfinished batch no running server owns."""
        store = await self.batch_store()
        for bid, owner in await off_loop(store.unfinished):
            await self.adopt(bid, owner)

    async def adopt(self, bid: str, owner: int | None) -> None:
        """Run batch `bid` here unless it runs (here or in another live server) or the server stops."""
        if self.closing or bid in RUNNING_HERE or owned_elsewhere(owner):
            return
        assert self.store is not None
        if await off_loop(self.store.claim, bid, owner) and not self.closing:
            self.start(bid)

    def start(self, bid: str) -> None:
        """Run a batch this server owns (unless it runs already: a read adopted it first)."""
        if bid in RUNNING_HERE:
            return
        RUNNING_HERE.add(bid)
        self.tasks[bid] = asyncio.create_task(self._run(bid), name=f"batch-{bid}")

    def cancel(self, bid: str) -> None:
        """Abort a running batch's lines in flight (its row says `cancelling` already)."""
        if bid in self.tasks:
            self._cancelled.add(bid)
        for task in list(self.lines.get(bid, ())):
            task.cancel()

    async def close(self) -> None:
        """Shutdown: abort every line in flight (each is run again by the next server) and stop."""
        self.closing = True
        self._closed.set()
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
            batch = await off_loop(store.get, bid)
            if batch is None:
                return
            if batch.status == "validating":
                batch = msgspec.structs.replace(batch, status="in_progress", in_progress_at=_now())
                await off_loop(store.move, batch, ("validating",))
            if await off_loop(store.status, bid) == "in_progress" and not await self._run_lines(batch):
                return  # stopped with lines left: the next server goes on
            await self._finish(bid)
        except Exception as err:  # the batch's boundary: it fails with a reason, the server lives on
            log.exception("batch.failed", batch=bid, error_type=type(err).__name__)
            try:
                found = await off_loop(store.get, bid)
                if found is not None and found.status in UNFINISHED:
                    errors = BatchErrors([BatchError("internal_error", f"{type(err).__name__}: {err}")])
                    failed = msgspec.structs.replace(found, status="failed", failed_at=_now(), errors=errors)
                    await off_loop(lambda: store.move(failed, UNFINISHED, drop_lines=True))
            except sqlite3.Error as again:  # the store refuses writes: the batch stays for the next server
                log.error("batch.unrecorded", batch=bid, error=repr(again))
        finally:
            self.tasks.pop(bid, None)
            self.lines.pop(bid, None)
            self.unstored.pop(bid, None)
            self._cancelled.discard(bid)
            RUNNING_HERE.discard(bid)

    async def _models_loaded(self, bid: str) -> bool:
        """Wait while the server loads its models (a batch resumed at its start); False if it stops first."""
        loading = self.app.get(LOADING_KEY)
        ready = getattr(loading, "ready", None)  # (api/loading.py's event, set when every stage is ready)
        if loading is None or not loading.active or not isinstance(ready, asyncio.Event):
            return not self.closing
        log.info("batch.waiting_for_models", batch=bid)
        self._waiting.add(bid)
        waits = [asyncio.ensure_future(ready.wait()), asyncio.ensure_future(self._closed.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._waiting.discard(bid)
            for w in waits:
                w.cancel()
        return not self.closing

    async def _run_lines(self, batch: Batch) -> bool:
        """Run the lines without a result; False when the server stopped them with lines left."""
        assert self.store is not None
        if not await self._models_loaded(batch.id):
            return False
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
            status = await off_loop(self.store.status, batch.id)
            # (checked after that wait: a cancel or a shutdown that came meanwhile starts no line)
            if self._stopping() or status != "in_progress" or batch.id in self._cancelled \
                    or time.time() >= batch.expires_at:
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
        kept = await off_loop(self._store_result, batch.id, line, custom_id, result, ok)
        if kept is not None:
            self.unstored.setdefault(batch.id, {})[line] = kept

    def _store_result(self, bid: str, line: int, custom_id: str, result: bytes, ok: bool) -> bytes | None:
        """Store a line's result; if the store refuses it, the line fails with an internal_error naming why,
        stored in its place, or returned (to keep in `unstored`) when the store refuses that too. Blocking:
        call it off the loop."""
        assert self.store is not None
        try:
            self.store.record(bid, line, result, ok)
            return None
        except sqlite3.Error as err:
            log.error("batch.result_unstored", batch=bid, line=line, error=repr(err))
            failed = msgspec.json.encode(OutputLine(_line_id(), custom_id, None, {
                "code": "internal_error",
                "message": f"the line's result could not be stored: {type(err).__name__}: {err}"}))
        try:
            self.store.record(bid, line, failed, False)
            return None
        except sqlite3.Error as err:
            log.error("batch.result_unstored", batch=bid, line=line, error=repr(err), kept=True)
            return failed

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
        batch = await off_loop(store.get, bid)
        assert batch is not None
        ended = "expired" if time.time() >= batch.expires_at and await off_loop(store.has_pending, bid) \
            else "completed"
        if batch.status == "in_progress":
            finalizing = msgspec.structs.replace(batch, status="finalizing", finalizing_at=_now())
            if await off_loop(store.move, finalizing, ("in_progress",)):
                batch = finalizing
            else:  # cancelled meanwhile
                batch = await off_loop(store.get, bid) or batch
        if batch.status == "cancelling":
            ended = "cancelled"
        elif batch.status != "finalizing":
            return
        files = file_store(self.app)
        expired = _expired_line if ended == "expired" else None
        written = await off_loop(write_outputs, files, store, batch, expired, self.unstored.get(bid, {}))
        now = _now()
        times = {"completed": {"completed_at": now}, "cancelled": {"cancelled_at": now},
                 "expired": {"expired_at": now}}[ended]
        final = msgspec.structs.replace(batch, status=ended, output_file_id=written.output_file_id,
                                        error_file_id=written.error_file_id, usage=written.usage, **times)
        try:
            moved = await off_loop(lambda: store.move(final, (batch.status,), drop_lines=True, also=written.rows,
                                                      failed=written.unstored))
        except BaseException:
            discard(files, written)
            raise
        if not moved:
            discard(files, written)
            return
        log.info("batch.ended", batch=bid, status=ended)


def _expired_line(custom_id: str) -> bytes:
    return msgspec.json.encode(OutputLine(_line_id(), custom_id, None, EXPIRED))


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
