"""Background responses (`background: true`): answered `queued` at once, run as a task, polled.

The request is checked and admitted (a full stage queue is still a 429) before the answer; the
row is stored `queued`, moves to `in_progress` with the first output and ends `completed` /
`incomplete` (the answer stored as a foreground one is), `failed` (with `error`) or `cancelled`
(`POST /v1/responses/{id}/cancel`, or the client's delete). A cancel that reaches another server on
the same data directory marks the row `cancelled` there and answers it; the server running it reads
its row between outputs, at most every ELSEWHERE_CHECK_S, and stops the work (as it does for a row
another server deleted). A response this server was running
when it stopped, or that a gone server left unfinished, reads as `failed` (`server_stopped`):
the work is not resumed. The client polls `GET /v1/responses/{id}`, or, for one created with
`stream: true`, reads its events as they are made (api/responses_events.py): the task then runs
the response's event stream into an EventLog instead of only tallying its text.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from typing import Any

import msgspec

from omni_actors import logs
from omni_actors.api.calls import PipelineCall
from omni_actors.api.responses_answer import failure, response_error
from omni_actors.api.responses_events import EventLog
from omni_actors.api.responses_schemas import (
    Response,
    ResponseFailed,
    ResponseInProgress,
)
from omni_actors.api.responses_store import UNFINISHED, ResponseStore
from omni_actors.errors import AdmissionError, RequestAborted, RequestError, StageUnavailable
from omni_actors.orchestrator.outputs import TextOutput
from omni_actors.store import owned_elsewhere

log = logs.get(__name__)

EXIT_TIMEOUT_S = 10.0
"""Longest shutdown (or a cancel) waits for a background task to record its end."""
ELSEWHERE_CHECK_S = 0.5
"""Least time between a running response's looks at its row (cancelled by another server?), taken as
its outputs come (one SQLite read; nothing wakes it for them)."""
RUNNING_HERE: set[str] = set()
"""The background responses this process runs, in any of its apps: a row this process owns is not
taken for one a stopped server left (an app of the same process, as in the tests, sees it running)."""
STOPPED = response_error("server_stopped", "the server stopped while this response was being made; create it again")


class Background:
    """This server's running background responses."""

    def __init__(self) -> None:
        self.running: dict[str, tuple[asyncio.Task[None], PipelineCall]] = {}
        self.logs: dict[str, EventLog] = {}
        """The event logs of streamed responses running here (dropped once stored)."""
        self.cancelling: set[str] = set()
        """Responses a client cancelled (their abort reads `cancelled`, not `failed`)."""
        self.closing = False

    def start(self, call: PipelineCall, answer, store: ResponseStore,
              events: AsyncGenerator[Any, None] | None = None) -> EventLog | None:
        """Run an admitted call (its `__aenter__` done) for `answer` (responses_answer.Answer); with
        `events` (the response's stream over `call`, which finishes `answer`), into a new EventLog."""
        rid = answer.base.id
        stream_log = None
        if events is not None:
            stream_log = self.logs[rid] = EventLog()
        task = asyncio.create_task(self._run(call, answer, store, events, stream_log), name=f"response-{rid}")
        self.running[rid] = (task, call)
        RUNNING_HERE.add(rid)
        return stream_log

    async def _run(self, call: PipelineCall, answer, store: ResponseStore,
                   events: AsyncGenerator[Any, None] | None, stream_log: EventLog | None) -> None:
        rid, base = answer.base.id, answer.base
        end: Response | None = None
        look_at = time.monotonic() + ELSEWHERE_CHECK_S
        try:
            if events is not None and stream_log is not None:
                async for event in events:
                    if isinstance(event, ResponseInProgress):
                        base = event.response
                        store.update(base)
                    stream_log.append(event)
                    if time.monotonic() >= look_at:
                        look_at = time.monotonic() + ELSEWHERE_CHECK_S
                        self._stop_if_cancelled(store, rid, call)
            else:
                async for chunk in call:
                    if time.monotonic() >= look_at:
                        look_at = time.monotonic() + ELSEWHERE_CHECK_S
                        self._stop_if_cancelled(store, rid, call)
                    if base.status == "queued":
                        base = msgspec.structs.replace(base, status="in_progress")
                        store.update(base)
                    if isinstance(chunk.output, TextOutput):
                        answer.tally.add_text(chunk.output)
                answer.finish()  # stored as a foreground answer is
        except RequestAborted as err:
            if rid in self.cancelling:
                end = msgspec.structs.replace(base, status="cancelled")
            elif self.closing or call.orch.draining:
                end = msgspec.structs.replace(base, status="failed", error=STOPPED)
            else:  # ended by the runtime (its output buffer overflowed, its deadline passed, ...)
                end = msgspec.structs.replace(base, status="failed", error=response_error("aborted", str(err)),
                                              output=answer.so_far())
        except (RequestError, AdmissionError, StageUnavailable) as err:  # as a foreground answer's error body
            # says it (code, this API's fields); (a truncated input submitted again may find the queue full)
            end = msgspec.structs.replace(base, status="failed", error=failure(err, base.truncation),
                                          output=answer.so_far())
        except Exception as err:  # the response's boundary: it fails with a reason, the server lives on
            log.exception("responses.background_failed", response=rid, error_type=type(err).__name__)
            end = msgspec.structs.replace(base, status="failed", output=answer.so_far(),
                                          error=response_error("internal_error", f"{type(err).__name__}: {err}"))
        finally:
            if events is not None:
                await events.aclose()
            await call.__aexit__(None, None, None)
            if end is not None:
                store.update(end)
            if stream_log is not None:
                if end is not None:
                    stream_log.append(ResponseFailed(sequence_number=len(stream_log.events), response=end))
                stream_log.close()
                store.set_events(rid, stream_log.blob())  # before the log goes: a reader finds one or the other
                self.logs.pop(rid, None)
            self.running.pop(rid, None)
            RUNNING_HERE.discard(rid)
            self.cancelling.discard(rid)

    def _stop_if_cancelled(self, store: ResponseStore, rid: str, call: PipelineCall) -> None:
        """Abort the work when another server has marked the row cancelled (`cancel_elsewhere`) or
        deleted it (as a delete here cancels first)."""
        found = store.status(rid)
        if (found is None or found[0] == "cancelled") and call.stream is not None:
            self.cancelling.add(rid)
            call.stream.abort()

    async def cancel(self, rid: str) -> bool:
        """Abort a running background response and wait for its end; False if it is not running here."""
        entry = self.running.get(rid)
        if entry is None:
            return False
        assert entry[1].stream is not None
        self.cancelling.add(rid)
        entry[1].stream.abort()
        await asyncio.wait([entry[0]], timeout=EXIT_TIMEOUT_S)
        return True

    async def close(self) -> None:
        """Shutdown: abort every running background response; each ends `failed` (server_stopped)."""
        self.closing = True
        tasks = []
        for task, call in list(self.running.values()):
            if call.stream is not None:
                call.stream.abort()
            tasks.append(task)
        if tasks:
            await asyncio.wait(tasks, timeout=EXIT_TIMEOUT_S)


def settled(store: ResponseStore, rid: str, running: Background) -> None:
    """Mark `failed` a stored response left unfinished by a server that no longer runs it."""
    found = store.status(rid)
    if found is None or found[0] not in UNFINISHED or rid in running.running or rid in RUNNING_HERE:
        return
    if not owned_elsewhere(found[1]):
        body = store.body(rid)
        if body is not None:
            lost = msgspec.json.decode(body, type=Response)
            store.update(msgspec.structs.replace(lost, status="failed", error=STOPPED))


def cancel_elsewhere(store: ResponseStore, rid: str) -> None:
    """Mark `cancelled` an unfinished response another server runs (that server stops it when it next
    looks at its row); a no-op once it has ended."""
    body = store.body(rid)
    if body is not None:
        found = msgspec.json.decode(body, type=Response)
        if found.status in UNFINISHED:
            store.update(msgspec.structs.replace(found, status="cancelled"))
