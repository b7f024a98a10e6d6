"""A turn transcribed while it is spoken, for streaming recognizers (`PipelineConfig.live_transcription`).

    turn = LiveTurn.open(host, item_id, start)   # speech started (server VAD) or the first append (manual)
    turn.catch_up(buffer)                         # after each append: the turn's new audio, fed at once
    turn.finish(audio, item)                      # the turn was committed with `audio` as `item`
    turn.task.cancel()                            # cleared, or the session ended: aborts the request

One streaming request per turn (PipelineCall(streaming=True), the transcript-only
route, the session's transcription options as params): its first input is the
turn's audio so far, every later append's share is fed as it arrives, and the
commit feeds the rest with `last`. Transcript deltas
(`conversation.item.input_audio_transcription.delta`, with the item id the turn
will be committed under) go out as the model writes them, before the commit;
`.completed` (or `.failed`) only once the item exists. The request hears exactly
the committed audio, except that under server VAD it has also heard the trailing
silence the VAD waited for before it ended the turn.
"""

from __future__ import annotations

import asyncio

import numpy as np

from omni_actors.api.calls import PipelineCall
from omni_actors.api.realtime.conversation import InputBuffer, Item
from omni_actors.api.realtime.transcription import (
    ROUTE,
    TRANSCRIPTION_ERRORS,
    Host,
    send_completed,
    send_failed,
    stream_transcript,
    transcription_params,
)
from omni_actors.api.realtime.vad import VAD_RATE

CONTENT_INDEX = 0
"""A committed audio turn's item holds one part: its audio."""


class LiveTurn:
    def __init__(self, host: Host, item_id: str, start: int, call: PipelineCall) -> None:
        self.host = host
        self.item_id = item_id
        self.start = start  # timeline position of the turn's first sample
        self.fed = 0  # samples of the turn fed so far
        self.call = call
        self.item: Item | None = None
        self._committed = asyncio.Event()
        self.task = asyncio.ensure_future(self._run())
        self.task.add_done_callback(self._ended)

    def _ended(self, _task: asyncio.Future) -> None:
        """However the task ended, the request ends: a task cancelled before its first step never
        runs `_run`'s `finally` (a turn cleared or a socket closed right after the first append)."""
        if self.call.stream is not None:
            self.call.stream.abort()  # a no-op once the stream has ended

    @classmethod
    async def open(cls, host: Host, item_id: str, start: int) -> LiveTurn:
        """Submit the turn's streaming request (AdmissionError / StageUnavailable / ApiError if refused)."""
        call = PipelineCall(host.app, ROUTE, {"audio": np.zeros(0, np.float32), "sample_rate": VAD_RATE},
                            transcription_params(host.cfg), {"transcript"}, streaming=True, orch=host.orch)
        await call.__aenter__()
        return cls(host, item_id, start, call)

    def catch_up(self, buffer: InputBuffer) -> None:
        """Feed the turn's audio that arrived since the last feed."""
        new = buffer.since(self.start + self.fed)
        if len(new):
            self._feed(new, last=False)

    def finish(self, audio: np.ndarray, item: Item) -> None:
        """The turn was committed as `item` with `audio`: feed what it has not heard, and end its input."""
        self.item = item
        self._feed(audio[self.fed :], last=True)
        self._committed.set()

    def _feed(self, x: np.ndarray, last: bool) -> None:
        self.fed += len(x)
        self.call.feed({"audio": np.ascontiguousarray(x, np.float32), "sample_rate": VAD_RATE}, last)

    async def _run(self) -> None:
        error: Exception | None = None
        transcript = ""
        try:
            transcript = await stream_transcript(self.host, self.call, self.item_id, CONTENT_INDEX)
        except TRANSCRIPTION_ERRORS as err:
            error = err
        finally:
            await self.call.__aexit__(None, None, None)  # aborts the request unless it ended
        await self._committed.wait()  # .completed / .failed name an item that exists
        if error is not None:
            await send_failed(self.host, self.item_id, CONTENT_INDEX, error)
            return
        assert self.item is not None
        await send_completed(self.host, self.item, CONTENT_INDEX, transcript)
