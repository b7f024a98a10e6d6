"""What callers of the orchestrator see: request specs, stream events, handles.

A request's RequestStream is bounded: once `max_bytes` of outputs its reader has
not taken are queued, `put_nowait` refuses the next (and the orchestrator then
aborts the request in every stage). A reader that keeps up never sees the bound,
even when the loop hands it a large output behind a small unread one (an image
or a video behind a progress report); one that stops reading costs at most
`max_bytes` plus one output, and that memory is dropped the moment the stream is
aborted (RequestAborted: its reader left, stopped reading, or the request was
cancelled) or its reader closes it (`close`: a route's PipelineCall, on leaving).

A failure (a stage's error, a dead worker, the deadline) is read after the outputs
made before it, in order. (Until 2026-12-05 it dropped them: a stage that made two
outputs and failed at once had a streamed route, which waits for the first output
before it sends its headers, answer the failure's HTTP status with none of them.)
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omni_actors.errors import RequestAborted, RequestError
from omni_actors.orchestrator.outputs import FinalOutput

CHUNK_OVERHEAD_BYTES = 256
"""What a queued chunk costs besides its arrays and strings (the Python objects around them)."""


def new_request_id(prefix: str = "req") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


@dataclass(frozen=True)
class RequestSpec:
    """One request into the pipeline.

    `inputs` go to the entry stages (those with no upstream in `stages`).
    `params` go to every stage; `stage_params` add per-stage values on top.
    `stages` selects a subset of the pipeline (None: the pipeline's planner
    decides, or every stage). Arrays in `inputs` may be numpy or torch.
    """

    inputs: dict[str, Any]
    params: dict[str, Any] = field(default_factory=dict)
    stage_params: dict[int, dict[str, Any]] = field(default_factory=dict)
    stages: tuple[int, ...] | None = None
    deadline_s: float | None = None
    request_id: str = field(default_factory=new_request_id)
    streaming: bool = False
    """Entry stages take more input after `inputs`, through `Orchestrator.feed` (a duplex session)."""


@dataclass(frozen=True)
class StageChunk:
    """A delta of a final-output stage. Arrays are numpy copies owned by the reader.

    Routes read `output`, the typed final output (outputs.py); `data` is the stage's raw payload."""

    stage_id: int
    output_type: str | None
    data: dict[str, Any]
    finished: bool
    output: FinalOutput | None = None


def chunk_nbytes(chunk: StageChunk) -> int:
    """About how much memory a queued chunk holds: its arrays, strings and a fixed overhead."""
    n = CHUNK_OVERHEAD_BYTES
    for value in chunk.data.values():
        if isinstance(value, np.ndarray):
            n += value.nbytes
        elif isinstance(value, str | bytes):
            n += len(value)
    return n


_END = object()


class RequestStream:
    """The async iterator of one request's final outputs.

    Yields StageChunk until every final stage finished, then stops; on failure
    raises the RequestError once. Exactly one terminal event either way.
    """

    def __init__(self, request_id: str, on_abort: Callable[[str], None], max_bytes: int | None = None) -> None:
        self.request_id = request_id
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._on_abort = on_abort
        self.max_bytes = max_bytes
        self.queued_bytes = 0
        """Bytes of chunks put and not yet taken by the reader."""
        self._ended = False
        self.terminal: BaseException | None = None
        self.plan: tuple[int, ...] = ()
        """The stage ids this request runs through (set at submit)."""
        self.stage_tokens: dict[int, tuple[int, int]] = {}
        """(prompt, completion) tokens a stage whose outputs are not final reported when it ended
        (an AR stage before a decoder: what a speech route's usage counts)."""

    # -- producer side (orchestrator) --
    def put_nowait(self, chunk: StageChunk) -> bool:
        """Queue a chunk for the reader; False (and not queued) when the unread outputs already
        reach `max_bytes`. A chunk is taken whatever its size while they are under it (the bound
        is on what a reader left unread, not on one output's size)."""
        if self._ended:
            return True
        size = chunk_nbytes(chunk)
        if self.max_bytes is not None and self.queued_bytes >= max(self.max_bytes, 1):
            return False
        self.queued_bytes += size
        self._queue.put_nowait((chunk, size))
        return True

    def finish_nowait(self, error: RequestError | None = None) -> bool:
        """End the stream; returns False if it had already ended. The end (the error, or the
        normal end) is read after every chunk queued before it, but an abort drops the unread
        chunks at once (nobody wants them: the reader left or stopped reading, or the request
        was cancelled; the reader gets the RequestAborted next)."""
        if self._ended:
            return False
        self._ended = True
        self.terminal = error
        if isinstance(error, RequestAborted):
            self._drop_unread()
        self._queue.put_nowait(error if error is not None else _END)
        return True

    def _drop_unread(self) -> None:
        while not self._queue.empty():
            self._queue.get_nowait()
        self.queued_bytes = 0

    @property
    def ended(self) -> bool:
        return self._ended

    def backlog(self) -> int:
        """Chunks waiting to be read (a reader that falls behind can skip what it cannot use)."""
        return self._queue.qsize()

    # -- consumer side (API) --
    def abort(self) -> None:
        """Abort the request in every stage; the stream ends with RequestAborted (a no-op once it
        ended: what is queued is still read, then the end)."""
        if not self._ended:
            self._on_abort(self.request_id)

    def close(self) -> None:
        """The reader has gone: abort the request if it still runs, and drop what it left unread
        now (an ended stream's too); a later read gets the stream's end at once."""
        self.abort()
        if self._ended and self.queued_bytes:
            self._drop_unread()
            self._queue.put_nowait(self.terminal if self.terminal is not None else _END)

    def __aiter__(self) -> AsyncIterator[StageChunk]:
        return self

    async def __anext__(self) -> StageChunk:
        item = await self._queue.get()
        if item is _END:
            self._queue.put_nowait(_END)
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            self._queue.put_nowait(_END)
            raise item
        chunk, size = item
        self.queued_bytes -= size
        return chunk

    async def collect(self) -> list[StageChunk]:
        return [chunk async for chunk in self]
