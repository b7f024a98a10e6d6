"""A Realtime response's message item: opened, streamed into as text, transcript and audio deltas, closed.

Text outputs become text deltas (or, in an audio response, transcript deltas); audio outputs are
resampled to the wire rate (and stretched in time at the session's `speed`) and sent as they arrive,
their transcript as transcript deltas. `MessageItem` is mixed into ResponseRun (responses.py), whose
state it reads and writes.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from omni_actors.api.realtime import events as ev
from omni_actors.api.realtime.audio import Resampler, encode_wire, wire_rate
from omni_actors.api.realtime.conversation import Item, Part, new_id, render_item, render_part
from omni_actors.api.realtime.response_request import Options
from omni_actors.api.realtime.response_status import AUDIO_TOKENS_PER_S, Usage
from omni_actors.api.time_stretch import TimeStretch
from omni_actors.orchestrator.outputs import AudioOutput


class MessageItem:
    """The message item of one response (mixed into ResponseRun; see the module docstring)."""

    host: Any
    opts: Options
    id: str
    usage: Usage
    item: Item | None
    output: list[Item]
    audio: bool
    first_audio_ms: float | None
    _resampler: Resampler | None
    _stretch: TimeStretch | None
    _submitted_at: float

    def _part_event(self, cls: type, **kw: Any) -> ev.ServerEvent:
        assert self.item is not None
        return cls(response_id=self.id, item_id=self.item.id, output_index=self.output.index(self.item), **kw)

    async def _open_item(self) -> None:
        h = self.host
        self.item = Item(id=new_id("item"), role="assistant", status="in_progress",
                         content=[Part("audio", transcript="") if self.audio else Part("text", text="")])
        self.output.append(self.item)
        rendered = render_item(self.item, h.dialect)
        await h.send(ev.OutputItemAdded(response_id=self.id, output_index=self.output.index(self.item),
                                        item={**rendered, "content": []}))
        if self.opts.in_conversation:
            prev = h.conversation.add(self.item)
            await h.send(ev.ItemCreated(previous_item_id=prev, item={**rendered, "content": []}))
        await h.send(self._part_event(ev.ContentPartAdded, part=render_part(self.item.content[0], h.dialect)))

    async def _send_text(self, delta: str, text_is_transcript: bool) -> None:
        part = self.item.content[0]  # type: ignore[union-attr]
        if part.type == "text":
            part.text = (part.text or "") + delta
            await self.host.send(self._part_event(ev.TextDelta, delta=delta))
        elif text_is_transcript:
            part.transcript = (part.transcript or "") + delta
            await self.host.send(self._part_event(ev.TranscriptDelta, delta=delta))

    async def _on_audio(self, part: Part, out: AudioOutput, text_is_transcript: bool) -> None:
        start_ms = part.audio_ms
        if len(out.audio):
            fmt = self.opts.output_audio_format
            if self._resampler is None:
                self.first_audio_ms = (time.perf_counter() - self._submitted_at) * 1000
                self._resampler = Resampler(out.sample_rate, wire_rate(fmt))
                if self.opts.speed != 1.0:
                    self._stretch = TimeStretch(wire_rate(fmt), self.opts.speed)
            x = self._resampler.push(out.audio)
            await self._send_audio(part, x if self._stretch is None else self._stretch.feed(x))
        piece = out.transcript
        if piece:
            part.segments.append((start_ms, piece))
            if not text_is_transcript:
                part.transcript = (part.transcript or "") + piece
                await self.host.send(self._part_event(ev.TranscriptDelta, delta=piece))

    async def _send_audio(self, part: Part, out: np.ndarray) -> None:
        if not len(out):
            return
        fmt = self.opts.output_audio_format
        part.audio_ms += len(out) * 1000 // wire_rate(fmt)
        await self.host.send(self._part_event(ev.AudioDelta, delta=encode_wire(out, fmt)))

    async def _close_item(self, status: str) -> None:
        h = self.host
        assert self.item is not None
        part = self.item.content[0]
        if part.type == "audio":
            if status != "cancelled" and self._resampler is not None:
                tail = self._resampler.flush()
                await self._send_audio(part, tail if self._stretch is None else self._stretch.feed(tail, last=True))
            self.usage.output_audio = part.audio_ms * AUDIO_TOKENS_PER_S // 1000
            await h.send(self._part_event(ev.AudioDone))
            await h.send(self._part_event(ev.TranscriptDone, transcript=part.transcript or ""))
        else:
            await h.send(self._part_event(ev.TextDone, text=part.text or ""))
        await h.send(self._part_event(ev.ContentPartDone, part=render_part(part, h.dialect)))
        self.item.status = "completed" if status == "completed" else "incomplete"
        rendered = render_item(self.item, h.dialect)
        await h.send(ev.OutputItemDone(response_id=self.id, output_index=self.output.index(self.item), item=rendered))
        if h.dialect == "ga" and self.opts.in_conversation:
            await h.send(ev.ItemDone(previous_item_id=None, item=rendered))
