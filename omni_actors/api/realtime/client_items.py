"""Client items made conversation items: conversation.item.create/.retrieve/.truncate and response.create's `input`.

A client's items are refused by size before their audio is decoded (the session's audio
limit, from the base64 length) and by the text the conversation would then hold
(`max_text`); big ones are decoded, and big items rendered with their audio, off the
loop. `ClientItems` is mixed into the session class (handler.py), whose state it reads
and writes; the items themselves are conversation.py's.
"""

from __future__ import annotations

from typing import Any

from omni_actors.api.audio_codec import off_loop
from omni_actors.api.realtime import client_events as ce
from omni_actors.api.realtime import events as ev
from omni_actors.api.realtime.conversation import (
    Conversation,
    Item,
    item_from_client,
    render_item,
    truncate,
)
from omni_actors.api.realtime.session import SessionConfig

INLINE_AUDIO_SAMPLES = 16000
"""Conversation items with at most this much audio (base64 characters to decode, or 16 kHz samples
to encode: about a second) are converted on the loop; bigger ones in the thread pool."""


class ClientItems:
    """The conversation items of one session's client (mixed into RealtimeSession; see the module docstring)."""

    cfg: SessionConfig
    dialect: ev.Dialect
    conversation: Conversation
    max_text: int
    response: Any

    async def _create_item(self, it: ce.ItemIn, prev: str | None, eid: str | None) -> None:
        """conversation.item.create: the item added after `prev` (None: last), then announced."""
        try:
            if it.type == "item_reference":
                raise ce.BadEvent("an item_reference names an item for response.create's `input`; it "
                                  "is not an item to add", param="item.type")
            (item,) = await self._items_from_client([("item", it)])
            self._check_text_room(item)
            prev = self.conversation.add(item, prev)
        except ce.BadEvent as err:
            err.event_id = eid
            raise
        await self._announce_item(item, prev)

    async def _retrieve_item(self, item_id: str, eid: str | None) -> None:
        item = self._item(item_id, eid)
        held = sum(len(p.audio) for p in item.content if p.audio is not None)
        rendered = (render_item(item, self.dialect, with_audio=True) if held <= INLINE_AUDIO_SAMPLES
                    else await off_loop(render_item, item, self.dialect, True))  # (encodes its audio)
        await self.send(ev.ItemRetrieved(item=rendered))

    async def _items_from_client(self, items: list[tuple[str, ce.ItemIn]]) -> list[Item]:
        """Client items (each with the `param` that names it) with their audio decoded: refused by size
        before any decoding (the session's audio limit, from the base64 length), decoded off the loop when big."""
        b64 = [len(c.audio) for _, it in items for c in it.content if c.type == "input_audio" and c.audio]
        self._check_audio_room(sum(self._vad_samples(n) for n in b64))
        fmt, dialect = self.cfg.input_audio_format, self.dialect
        if sum(b64) <= INLINE_AUDIO_SAMPLES:
            return [item_from_client(it, fmt, dialect, where) for where, it in items]
        return await off_loop(lambda: [item_from_client(it, fmt, dialect, where) for where, it in items])

    async def _response_input(self, items: list[ce.ItemIn]) -> list[Item]:
        """response.create's `input`: new items, and `item_reference`s to the conversation's, in order."""
        for i, it in enumerate(items):
            if it.type == "item_reference" and (it.id is None or self.conversation.get(it.id) is None):
                raise ce.BadEvent(f"item {it.id!r} does not exist", code="item_not_found",
                                  param=f"response.input[{i}].id")
        made = iter(await self._items_from_client([(f"response.input[{i}]", it) for i, it in enumerate(items)
                                                    if it.type != "item_reference"]))
        return [self.conversation.get(it.id) if it.type == "item_reference" and it.id else next(made)
                for it in items]

    def _check_text_room(self, item: Item) -> None:
        """Refuse an item that would take the conversation's text past `max_text` (server.max_body_mb):
        without a bound, one session's items could grow the server's memory without end."""
        held = self.conversation.size()
        if held + item.size() > self.max_text:
            raise ce.BadEvent(f"the conversation would hold {held + item.size()} characters of text; the limit is "
                              f"{self.max_text} (server.max_body_mb, as for one REST request): delete "
                              "conversation items", code="text_limit_exceeded", param="item")

    def _item(self, item_id: str, eid: str | None) -> Item:
        item = self.conversation.get(item_id)
        if item is None:
            raise ce.BadEvent(f"item {item_id!r} does not exist", code="item_not_found", param="item_id",
                              event_id=eid)
        return item

    async def _announce_item(self, item: Item, prev: str | None) -> None:
        rendered = render_item(item, self.dialect)
        await self.send(ev.ItemCreated(previous_item_id=prev, item=rendered))
        if self.dialect == "ga":
            await self.send(ev.ItemDone(previous_item_id=prev, item=rendered))

    async def _truncate(self, item: Item, ci: int, end_ms: int, eid: str | None) -> None:
        if item.role != "assistant" or not 0 <= ci < len(item.content) or item.content[ci].type != "audio":
            raise ce.BadEvent("only an assistant audio content part can be truncated", param="content_index",
                              event_id=eid)
        part = item.content[ci]
        if not 0 <= end_ms <= part.audio_ms:
            raise ce.BadEvent(f"audio_end_ms must be between 0 and the part's {part.audio_ms} ms",
                              param="audio_end_ms", event_id=eid)
        if self.response is not None and self.response.item is item:
            # The answer still being made: the client stopped playing it (its user talked over it, with
            # no server VAD to say so). Stop it first, else it would go on past the cut.
            await self._cancel_response("client_cancelled")
        truncate(part, end_ms)
        await self.send(ev.ItemTruncated(item_id=item.id, content_index=ci, audio_end_ms=end_ms))
