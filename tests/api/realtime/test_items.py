"""Realtime conversation items with audio: refused by size before decoding, decoded and encoded off the loop."""

from __future__ import annotations

import asyncio

import aiohttp
import numpy as np

from omni_actors.api.realtime.audio import WIRE_RATE
from tests.api.realtime.conftest import STAGES, b64, connect, of_type, serve_rt

LIMIT_S = 4.0
BIG_ITEM_S = 30.0


def _tone(seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * WIRE_RATE)) / WIRE_RATE
    return (0.2 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


def _audio_item(audio_b64: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_audio", "audio": audio_b64}]}


async def test_over_limit_item_is_refused_before_decoding_and_the_session_lives() -> None:
    async with serve_rt("synthetic", stages=STAGES, server={"realtime_max_audio_s": LIMIT_S}) as srv, \
            aiohttp.ClientSession() as http:
        c = await connect(srv, http, turn_detection=None)
        # Over the limit AND not valid base64 at its end: decoded first, it would be refused for
        # its base64; refused by its size, nothing of it is decoded.
        eid = await c.send("conversation.item.create", item=_audio_item(b64(_tone(LIMIT_S * 2)) + "!!!!"))
        error = (await c.until("error"))[-1]["error"]
        assert error["code"] == "audio_limit_exceeded" and error["event_id"] == eid
        # The session goes on: an item within the limit is created, and retrieved with its audio.
        await c.send("conversation.item.create", item=_audio_item(b64(_tone(LIMIT_S / 2))))
        created = (await c.until("conversation.item.created"))[-1]["item"]
        await c.send("conversation.item.retrieve", item_id=created["id"])
        got = (await c.until("conversation.item.retrieved"))[-1]["item"]
        assert got["content"][0]["audio"]
        assert not of_type(c.seen, "error")[1:]
        await c.ws.close()


async def test_health_answers_while_a_big_item_decodes() -> None:
    async with serve_rt("synthetic", stages=STAGES) as srv, aiohttp.ClientSession() as http:
        c = await connect(srv, http, turn_detection=None)
        item = _audio_item(b64(_tone(BIG_ITEM_S)))
        await c.send("conversation.item.create", item=item)
        await c.send("conversation.item.create", item=item)
        await c.until("conversation.item.created", timeout_s=120)
        # The server is on the second item now (its frame is already there).
        items_when_healthy: list[int] = []

        async def health() -> None:
            async with http.get(srv.url + "/health") as resp:
                assert resp.status == 200
            (session,) = srv.sessions
            items_when_healthy.append(len(session.conversation.items))

        probe = asyncio.ensure_future(health())
        await c.until("conversation.item.created", timeout_s=120)
        await probe
        # /health was answered while the second item was decoding: items decode off the loop.
        assert items_when_healthy == [1]
        assert not of_type(c.seen, "error")
        await c.ws.close()


async def test_line_wrapped_base64_audio_is_taken() -> None:
    # base64.encodebytes (and MIME encoders) wrap lines every 76 characters: every append was refused
    import base64

    pcm = (np.clip(_tone(0.5), -1, 1) * 32767).astype("<i2").tobytes()
    async with serve_rt("synthetic", stages=STAGES) as srv, aiohttp.ClientSession() as http:
        c = await connect(srv, http, turn_detection=None)
        await c.send("input_audio_buffer.append", audio=base64.encodebytes(pcm).decode())
        await c.send("input_audio_buffer.commit")
        committed = (await c.until("input_audio_buffer.committed"))[-1]
        assert committed["item_id"] and not of_type(c.seen, "error"), of_type(c.seen, "error")
        await c.send("conversation.item.retrieve", item_id=committed["item_id"])
        got = (await c.until("conversation.item.retrieved"))[-1]["item"]
        assert len(base64.b64decode(got["content"][0]["audio"])) == len(pcm)
        await c.ws.close()
