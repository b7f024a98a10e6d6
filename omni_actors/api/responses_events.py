"""A streamed background response's events: kept while it runs, read by any number of streams, stored at its end.

    POST /v1/responses {"background": true, "stream": true}     streams the events as they are made
    GET  /v1/responses/{id}?stream=true&starting_after=N        the same events after number N, again or resumed

The response's task appends each event (its `sequence_number` is its index) to an EventLog;
every reader follows the log from where it asked, waiting for the next append, so a client that
drops the connection loses nothing: the response goes on, and `retrieve(id, stream=True,
starting_after=N)` picks up after the last event it saw. When the response ends its events go to
the store as one JSON array (responses_store.py), so a finished stream can be read again after a
restart; a response that ended without its events written (its server stopped) ends its replay with
one `response.failed` carrying the stored response.

A reader only reads: a slow one holds its own place in the log, never the response's work.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import msgspec

from omni_actors.api.responses_schemas import Response, ResponseFailed

_encoder = msgspec.json.Encoder()
TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})
"""The event types that end a stream."""


class _Kind(msgspec.Struct):
    type: str


class EventLog:
    """One running response's events, encoded once."""

    def __init__(self) -> None:
        self.events: list[bytes] = []
        self.closed = False
        self._appended = asyncio.Event()

    def append(self, event: Any) -> None:
        self.events.append(_encoder.encode(event))
        self._wake()

    def close(self) -> None:
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        self._appended.set()  # readers waiting now go on; later ones wait on a fresh event
        self._appended = asyncio.Event()

    def blob(self) -> bytes:
        """Every event as one JSON array (what the store keeps)."""
        return b"[" + b",".join(self.events) + b"]"

    async def follow(self, after: int) -> AsyncGenerator[msgspec.Raw, None]:
        """The events numbered above `after`, then each one as it is appended, until the log closes."""
        index = after + 1
        while True:
            while index < len(self.events):
                yield msgspec.Raw(self.events[index])
                index += 1
            if self.closed:
                return
            await self._appended.wait()


async def replay(stored: bytes, after: int, body: bytes) -> AsyncGenerator[msgspec.Raw, None]:
    """A stored stream's events numbered above `after`; if it has no end event (its server stopped
    before writing them), one `response.failed` with the stored response (`body`) ends it."""
    events = msgspec.json.decode(stored, type=list[msgspec.Raw])
    for index in range(after + 1, len(events)):
        yield events[index]
    if not events or msgspec.json.decode(events[-1], type=_Kind).type not in TERMINAL:
        response = msgspec.json.decode(body, type=Response)
        yield msgspec.Raw(_encoder.encode(ResponseFailed(sequence_number=max(len(events), after + 1),
                                                         response=response)))
