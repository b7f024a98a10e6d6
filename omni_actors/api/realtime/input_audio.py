"""The input-audio half of a realtime session: appends, VAD turns, commits, live transcription.

Audio is decoded, resampled to 16 kHz and run through the VAD off the event loop
(one shared thread, VAD_EXECUTOR), in arrival order, in slices of at most VAD_SLICE_S:
each session waits for its slice before queueing the next, so the executor's FIFO serves
sessions round robin, and a session appending minutes of audio delays another's turn
detection by one slice, not by its whole append. A turn the VAD ends (or a
manual commit) becomes a user item; in a transcription session it is then
transcribed (transcription.py), or, on a streaming recognizer, heard while it is
spoken (live_transcription.py). `InputAudio` is mixed into the session class
(handler.py), whose state it reads and writes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any

import numpy as np

from omni_actors import logs
from omni_actors.api.realtime import client_events as ce
from omni_actors.api.realtime import events as ev
from omni_actors.api.realtime.audio import AudioFormatError, Resampler, WireStream, wire_rate
from omni_actors.api.realtime.conversation import Conversation, InputBuffer, Item, Part, ms, new_id
from omni_actors.api.realtime.live_transcription import LiveTurn
from omni_actors.api.realtime.session import SessionConfig
from omni_actors.api.realtime.transcription import (
    TRANSCRIPTION_ERRORS,
    refuse_unheard,
    transcribe_turn,
)
from omni_actors.api.realtime.vad import VAD_RATE, VadDetector, VadEvent

log = logs.get(__name__)

MIN_COMMIT_MS = 100
"""Shortest input buffer `input_audio_buffer.commit` accepts (as OpenAI's)."""
INLINE_INGEST_SAMPLES = 4800
"""Appends up to this many wire samples (200 ms at 24 kHz) without VAD are handled on the loop."""
VAD_EXECUTOR = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="realtime-vad")
"""One thread for decoding, resampling and VAD of every session (onnxruntime releases the GIL)."""
VAD_SLICE_S = 1.0
"""Most wire audio one VAD_EXECUTOR job resamples and runs through the VAD (~6 ms of one core). A session
queues its next slice only once its last is done, so the executor's FIFO interleaves sessions round robin."""


class InputAudio:
    """Input audio of one session (mixed into RealtimeSession; see the module docstring)."""

    id: str
    cfg: SessionConfig
    orch: Any
    conversation: Conversation
    buffer: InputBuffer
    timeline: int
    max_audio: int
    response: Any
    _in: Resampler
    _wire: WireStream
    _vad: VadDetector | None
    _speech_item: str | None
    _live: LiveTurn | None
    _transcriptions: set[asyncio.Task]

    def _reset_vad(self) -> None:
        td = self.cfg.turn_detection
        self._vad = VadDetector(td.vad_params(), origin=self.timeline) if td is not None else None
        self._speech_item = None
        self._drop_live()

    def _vad_samples(self, b64_chars: int) -> int:
        """How many 16 kHz samples `b64_chars` of base64 audio in the session's format come to."""
        fmt = self.cfg.input_audio_format
        wire_samples = b64_chars * 3 // 4 // (2 if fmt == "pcm16" else 1)
        return wire_samples * VAD_RATE // wire_rate(fmt)

    def _hear(self, x: np.ndarray) -> tuple[np.ndarray, list[VadEvent]]:
        """Resample wire samples to 16 kHz and run the VAD. Plain def: runs in VAD_EXECUTOR for big inputs."""
        x16 = self._in.push(x)
        return x16, (self._vad.feed(x16) if self._vad is not None else [])

    async def _append(self, b64: str, eid: str | None) -> None:
        vad = self._vad
        try:  # checked before the VAD hears it: refused audio leaves no trace
            self._check_audio_room(self._vad_samples(len(b64)))
        except ce.BadEvent as err:
            err.event_id = eid
            raise
        try:
            if vad is None and len(b64) * 3 // 8 <= INLINE_INGEST_SAMPLES:
                await self._take(*self._hear(self._wire.decode(b64)), vad)
                return
            loop = asyncio.get_running_loop()
            x = await loop.run_in_executor(VAD_EXECUTOR, self._wire.decode, b64)  # (a bad one is refused whole)
        except AudioFormatError as err:
            raise ce.BadEvent(str(err), param="audio", event_id=eid) from None
        step = int(VAD_SLICE_S * wire_rate(self.cfg.input_audio_format))
        for i in range(0, len(x), step):  # each slice's turns are taken before the next slice is queued
            await self._take(*await loop.run_in_executor(VAD_EXECUTOR, self._hear, x[i:i + step]), vad)

    async def _take(self, x16: np.ndarray, turns: list[VadEvent], vad: VadDetector | None) -> None:
        """Add heard 16 kHz audio to the buffer and act on the turn boundaries the VAD found in it."""
        self.buffer.append(x16)
        self.timeline += len(x16)
        for turn in turns:
            if turn.kind == "start":
                await self._speech_started(turn.sample)
            else:
                await self._speech_stopped(turn.sample)
        if self._hears_live() and self._live is None and vad is None and self.buffer.size:
            self._speech_item = new_id("item")  # manual commits: the turn starts with its first audio
            await self._open_live(self._speech_item)
        if self._live is not None:
            self._live.catch_up(self.buffer)
        td = self.cfg.turn_detection
        if vad is not None and td is not None and not vad.speaking:
            self.buffer.drop_before(vad.position - td.prefix_padding_ms * VAD_RATE // 1000)

    def _check_audio_room(self, samples: int) -> None:
        """Refuse audio that would take the session past server.realtime_max_audio_s."""
        held = self.buffer.size + self.conversation.audio_samples()
        if samples and held + samples > self.max_audio:
            raise ce.BadEvent(f"the session would hold {ms(held + samples) // 1000} s of audio; the limit is "
                              f"{ms(self.max_audio) // 1000} s (server.realtime_max_audio_s): commit or clear "
                              "the input buffer, or delete conversation items",
                              code="audio_limit_exceeded", param="audio")

    async def _speech_started(self, pos: int) -> None:
        self._speech_item = new_id("item")
        self.buffer.drop_before(pos)
        await self.send(ev.SpeechStarted(audio_start_ms=ms(pos), item_id=self._speech_item))
        if self._hears_live():
            await self._open_live(self._speech_item)
        td = self.cfg.turn_detection
        if self.response is not None and td is not None and td.interrupt_response:
            await self._cancel_response("turn_detected")

    async def _speech_stopped(self, pos: int) -> None:
        item_id = self._speech_item or new_id("item")
        self._speech_item = None
        await self.send(ev.SpeechStopped(audio_end_ms=ms(pos), item_id=item_id))
        await self._commit(self.buffer.take(until=pos), item_id)
        td = self.cfg.turn_detection
        if td is not None and td.create_response and self.response is None and self.cfg.type == "realtime":
            try:
                await self._create_response(None, None)
            except ce.BadEvent as err:  # (no response now: the turn stays committed, the append is heard on)
                await self.send_error(err)

    async def _commit_manual(self, eid: str | None) -> None:
        tail = self._in.flush()  # the resampler's delay: the last few ms appended belong to this item
        self.buffer.append(tail)
        self.timeline += len(tail)
        if ms(self.buffer.size) < MIN_COMMIT_MS:
            raise ce.BadEvent(f"buffer too small: {ms(self.buffer.size)} ms of audio, need {MIN_COMMIT_MS} ms",
                              code="input_audio_buffer_commit_empty", event_id=eid)
        item_id = self._speech_item or new_id("item")
        self._speech_item = None
        await self._commit(self.buffer.take(), item_id)

    async def _commit(self, audio: np.ndarray, item_id: str) -> None:
        item = Item(id=item_id, role="user", content=[Part("input_audio", audio=audio)])
        prev = self.conversation.add(item)
        await self.send(ev.BufferCommitted(previous_item_id=prev, item_id=item_id))
        await self._announce_item(item, prev)
        live, self._live = self._live, None
        if live is not None and live.item_id == item_id:
            live.finish(audio, item)
        elif self.cfg.type == "transcription":
            if live is not None:
                live.task.cancel()
            task = asyncio.ensure_future(transcribe_turn(self, item))
            self._transcriptions.add(task)
            task.add_done_callback(self._transcription_ended)
        elif self.cfg.input_audio_transcription is not None and "transcript" not in self.orch.pipeline.output_types():
            await refuse_unheard(self, item)

    def _hears_live(self) -> bool:
        """True when turns are transcribed while spoken (a streaming recognizer in a transcription session)."""
        return self.cfg.type == "transcription" and self.orch.pipeline.live_transcription

    async def _open_live(self, item_id: str) -> None:
        self._drop_live()
        try:
            self._live = await LiveTurn.open(self, item_id, self.buffer.start)
        except TRANSCRIPTION_ERRORS as err:  # refused now: the turn is transcribed once committed instead
            log.warning("realtime.live_transcription_refused", session_id=self.id, error=type(err).__name__)
            return
        self._transcriptions.add(self._live.task)
        self._live.task.add_done_callback(self._transcription_ended)

    def _drop_live(self) -> None:
        """Forget the turn being heard (its audio was cleared): abort its request."""
        live, self._live = self._live, None
        if live is not None:
            live.task.cancel()
