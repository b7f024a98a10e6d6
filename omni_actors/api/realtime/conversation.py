"""Realtime conversation state: items and their parts, the conversation, the input audio buffer.

Plain data and plain `def`s; the connection's session is their only writer. Audio
is float32 at VAD_RATE (16 kHz); positions are sample counts on the session's
input timeline. Session configuration: session.py.
"""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omni_actors.api.realtime import client_events as ce
from omni_actors.api.realtime import events as ev
from omni_actors.api.realtime.audio import WIRE_RATE, decode_wire, pcm16_bytes, resample
from omni_actors.api.realtime.vad import VAD_RATE

ITEM_OVERHEAD_CHARS = 256
"""What an item counts toward a conversation's size beside its text (Item.size): an empty item is not free."""


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


def ms(samples: int, rate: int = VAD_RATE) -> int:
    return samples * 1000 // rate


@dataclass
class Part:
    type: str
    """input_text | input_audio (user, system) | text | audio (assistant)."""
    text: str | None = None
    transcript: str | None = None
    audio: np.ndarray | None = None
    """User audio, float32 at VAD_RATE."""
    audio_ms: int = 0
    """Assistant audio: milliseconds produced (or heard, after a truncate)."""
    segments: list[tuple[int, str]] = field(default_factory=list)
    """Assistant audio: (start_ms, transcript piece) per audio chunk that carried one."""


@dataclass
class Item:
    id: str
    role: str | None
    content: list[Part] = field(default_factory=list)
    type: str = "message"
    status: str = "completed"
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | None = None

    def text(self) -> str:
        """What this item says, as text (for the next response's context)."""
        return " ".join(p.text or p.transcript or "" for p in self.content).strip()

    def size(self) -> int:
        """Characters of text this item holds (its parts' text and transcripts, a call's name, arguments
        and output), plus ITEM_OVERHEAD_CHARS; its audio is counted apart (Conversation.audio_samples)."""
        fields = (self.name, self.arguments, self.output, *(t for p in self.content for t in (p.text, p.transcript)))
        return ITEM_OVERHEAD_CHARS + sum(len(t) for t in fields if t)

    def pending_audio(self) -> np.ndarray | None:
        """Untranscribed user audio, if this item has any."""
        for p in self.content:
            if p.type == "input_audio" and p.audio is not None and not p.transcript:
                return p.audio
        return None


_PART_NAMES = {"beta": {"text": "text", "audio": "audio"}, "ga": {"text": "output_text", "audio": "output_audio"}}


def render_part(p: Part, dialect: ev.Dialect, with_audio: bool = False) -> dict[str, Any]:
    if p.type == "input_text":
        return {"type": "input_text", "text": p.text or ""}
    if p.type == "input_audio":
        out: dict[str, Any] = {"type": "input_audio", "transcript": p.transcript}
        if with_audio and p.audio is not None:
            out["audio"] = base64.b64encode(pcm16_bytes(resample(p.audio, VAD_RATE, WIRE_RATE))).decode()
        return out
    name = _PART_NAMES[dialect][p.type]
    return {"type": name, "text": p.text or ""} if p.type == "text" else {"type": name, "transcript": p.transcript or ""}


def render_item(item: Item, dialect: ev.Dialect, with_audio: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"id": item.id, "object": "realtime.item", "type": item.type, "status": item.status}
    if item.type == "message":
        out["role"] = item.role
        out["content"] = [render_part(p, dialect, with_audio) for p in item.content]
    elif item.type == "function_call":
        out.update(call_id=item.call_id, name=item.name, arguments=item.arguments or "")
    else:
        out.update(call_id=item.call_id, output=item.output or "")
    return out


PARTS_BY_ROLE: dict[ev.Dialect, dict[str, frozenset[str]]] = {
    # GA: the SDK's RealtimeConversationItem{System,User,Assistant}Message (input_image: not served here).
    "ga": {"system": frozenset({"input_text"}), "user": frozenset({"input_text", "input_audio"}),
           "assistant": frozenset({"output_text", "output_audio"})},
    # Beta names `text` (and renders `audio`) for the assistant. A session is beta until a GA session.update,
    # and a GA client need not send one first: a beta session takes the GA assistant names too.
    "beta": {"system": frozenset({"input_text"}), "user": frozenset({"input_text", "input_audio"}),
             "assistant": frozenset({"text", "audio", "output_text", "output_audio"})},
}
"""The content part types a client's message item may carry, by dialect and role."""


def item_from_client(it: ce.ItemIn, input_format: str, dialect: ev.Dialect = "beta", where: str = "item") -> Item:
    """A client-created item; its audio parts are decoded to VAD_RATE float32. A bad field is a BadEvent
    whose `param` starts with `where` ("item", or "response.input[2]" for response.create's `input`)."""
    if it.type == "message" and it.role is None:
        raise ce.BadEvent("a message item needs a role", param=f"{where}.role")
    if it.type != "message":
        needed = ("call_id", "name", "arguments") if it.type == "function_call" else ("call_id", "output")
        for key in needed:
            if getattr(it, key) is None:
                raise ce.BadEvent(f"a {it.type} item needs `{key}`", param=f"{where}.{key}")
    allowed = PARTS_BY_ROLE[dialect][it.role or "user"]
    parts = []
    for i, c in enumerate(it.content):
        if it.type == "message" and c.type not in allowed:
            why = "is not served here (no images over realtime)" if c.type == "input_image" else "is not allowed"
            raise ce.BadEvent(f"content type {c.type!r} {why} in a {it.role} message; expected one of "
                              f"{', '.join(repr(t) for t in sorted(allowed))}", param=f"{where}.content[{i}].type")
        if c.type in ("input_text", "text", "output_text"):
            parts.append(Part(c.type if c.type == "input_text" else "text", text=c.text or ""))
        elif c.type == "input_audio":
            audio = None
            if c.audio:
                try:
                    x, rate = decode_wire(c.audio, input_format)
                except ValueError as err:
                    raise ce.BadEvent(str(err), param=f"{where}.content[{i}].audio") from None
                audio = resample(x, rate, VAD_RATE)
            parts.append(Part("input_audio", audio=audio, transcript=c.transcript))
        elif c.type in ("audio", "output_audio"):
            parts.append(Part("audio", transcript=c.transcript or ""))
        else:
            raise ce.BadEvent(f"unsupported content type {c.type!r}", param=f"{where}.content[{i}].type")
    return Item(id=it.id or new_id("item"), role=it.role, content=parts, type=it.type,
                call_id=it.call_id, name=it.name, arguments=it.arguments, output=it.output)


class Conversation:
    """Ordered items, by id."""

    def __init__(self) -> None:
        self.id = new_id("conv")
        self.items: list[Item] = []

    def get(self, item_id: str) -> Item | None:
        return next((i for i in self.items if i.id == item_id), None)

    def last_id(self) -> str | None:
        return self.items[-1].id if self.items else None

    def audio_samples(self) -> int:
        """User audio held in the items (samples at VAD_RATE)."""
        return sum(len(p.audio) for i in self.items for p in i.content if p.audio is not None)

    def size(self) -> int:
        """The items' text, as Item.size counts it."""
        return sum(i.size() for i in self.items)

    def add(self, item: Item, previous_item_id: str | None = None) -> str | None:
        """Insert after `previous_item_id` (default: at the end); returns the id it follows."""
        if self.get(item.id) is not None:
            raise ce.BadEvent(f"item {item.id!r} already exists", param="item.id", code="duplicate_item_id")
        if previous_item_id is None:
            prev = self.last_id()
            self.items.append(item)
            return prev
        if previous_item_id == "root":
            self.items.insert(0, item)
            return None
        for i, other in enumerate(self.items):
            if other.id == previous_item_id:
                self.items.insert(i + 1, item)
                return previous_item_id
        raise ce.BadEvent(f"previous item {previous_item_id!r} not found", param="previous_item_id",
                          code="item_not_found")

    def delete(self, item_id: str) -> bool:
        item = self.get(item_id)
        if item is not None:
            self.items.remove(item)
        return item is not None


class InputBuffer:
    """Uncommitted input audio at VAD_RATE; `start` is the timeline position of its first sample."""

    def __init__(self) -> None:
        self.chunks: list[np.ndarray] = []
        self.start = 0
        self.size = 0

    @property
    def end(self) -> int:
        return self.start + self.size

    def append(self, x: np.ndarray) -> None:
        if len(x):
            self.chunks.append(x)
            self.size += len(x)

    def _joined(self) -> np.ndarray:
        if len(self.chunks) != 1:
            self.chunks = [np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.float32)]
        return self.chunks[0]

    def drop_before(self, pos: int) -> None:
        """Forget audio before timeline position `pos` (VAD keeps only the prefix padding)."""
        cut = min(max(0, pos - self.start), self.size)
        if cut:
            self.chunks = [self._joined()[cut:]]
            self.start += cut
            self.size -= cut

    def take(self, until: int | None = None) -> np.ndarray:
        """Remove and return the audio up to timeline position `until` (default: all)."""
        data = self._joined()
        cut = self.size if until is None else min(max(0, until - self.start), self.size)
        out, rest = data[:cut], data[cut:]
        self.chunks, self.start, self.size = [rest], self.start + cut, len(rest)
        return out

    def since(self, pos: int) -> np.ndarray:
        """The audio from timeline position `pos` to the end, read from the newest chunks back (no join)."""
        need = self.end - max(pos, self.start)
        parts: list[np.ndarray] = []
        for chunk in reversed(self.chunks):
            if need <= 0:
                break
            part = chunk[len(chunk) - need :] if len(chunk) > need else chunk
            parts.append(part)
            need -= len(part)
        return np.concatenate(parts[::-1]) if parts else np.zeros(0, np.float32)

    def clear(self) -> None:
        self.take()


def truncate(part: Part, audio_end_ms: int) -> None:
    """Cut an assistant audio part to what the user heard; its transcript follows.

    With per-chunk transcript pieces, keep the pieces whose audio started
    before the cut; otherwise keep the share of words the heard share of audio
    would carry.
    """
    if audio_end_ms >= part.audio_ms:
        return
    if part.segments:
        part.transcript = "".join(piece for start, piece in part.segments if start < audio_end_ms).strip()
        part.segments = [(s, p) for s, p in part.segments if s < audio_end_ms]
    else:
        words = (part.transcript or "").split()
        keep = len(words) * audio_end_ms // max(1, part.audio_ms)
        part.transcript = " ".join(words[:keep])
    part.audio_ms = audio_end_ms
