"""A demanding user's probes of the turn-based path: GA per-response audio overrides and a cleared buffer.

A GA `response.create` sets its own voice and output format as `audio.output.{voice, format}` (the SDK's
RealtimeResponseCreateParams); `input_audio_buffer.clear` forgets every appended sample, including those
still inside the input resampler.
"""

from __future__ import annotations

import base64

import aiohttp
import numpy as np
from openai import AsyncOpenAI

from tests.api.conftest import API_KEY, eventually, idle
from tests.api.realtime.conftest import WIRE_RATE, RtServer, b64, connect, of_type

TEXT_ITEM = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "one two"}]}


async def test_ga_response_audio_output_sets_its_format_and_voice(srv: RtServer) -> None:
    client = AsyncOpenAI(base_url=f"{srv.url}/v1", api_key=API_KEY)
    async with client.realtime.connect(model="synthetic") as conn:
        await conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
        await conn.conversation.item.create(item=TEXT_ITEM)  # type: ignore[arg-type]
        await conn.response.create(response={"output_modalities": ["audio"], "audio": {"output": {
            "format": {"type": "audio/pcmu"}, "voice": "echo"}}}, event_id="ga")
        audio = b""
        async for event in conn:
            assert event.type != "error", event
            if event.type == "response.output_audio.delta":
                audio += base64.b64decode(event.delta)
            elif event.type == "response.done":
                break
        assert event.response.audio is not None and event.response.audio.output is not None
        assert event.response.audio.output.format.type == "audio/pcmu"  # type: ignore[union-attr]
        assert event.response.audio.output.voice == "echo"
        # g711_ulaw is one byte a sample at 8 kHz; the session's 24 kHz pcm16 is 6 times the bytes.
        session_fmt_bytes = len(audio)
        await conn.response.create(response={"output_modalities": ["audio"]})
        pcm16 = b""
        async for event in conn:
            if event.type == "response.output_audio.delta":
                pcm16 += base64.b64decode(event.delta)
            elif event.type == "response.done":
                break
        assert event.response.audio.output.format.type == "audio/pcm"  # type: ignore[union-attr]
        assert session_fmt_bytes and abs(len(pcm16) / session_fmt_bytes - 6) < 0.1, (len(pcm16), session_fmt_bytes)
        await conn.response.create(response={"audio": {"output": {"format": {"type": "audio/mp3"}}}},
                                   event_id="bad")  # type: ignore[typeddict-item]
        async for event in conn:
            if event.type == "error":  # (after the last response's rate_limits.updated)
                break
        assert (event.error.param, event.error.event_id) == ("response.audio.output.format.type", "bad")
    await eventually(lambda: idle(srv.orch))


async def test_clear_leaves_no_cleared_audio_in_the_next_turn(srv: RtServer) -> None:
    async with aiohttp.ClientSession() as http:
        c = await connect(srv, http, turn_detection=None)
        tone = (0.5 * np.sin(2 * np.pi * 440 * np.arange(WIRE_RATE // 10) / WIRE_RATE)).astype(np.float32)
        await c.send("input_audio_buffer.append", audio=b64(tone))
        await c.send("input_audio_buffer.clear")
        await c.until("input_audio_buffer.cleared")
        await c.send("input_audio_buffer.commit", event_id="empty")
        err = (await c.until("error"))[-1]["error"]
        assert (err["code"], err["event_id"]) == ("input_audio_buffer_commit_empty", "empty")
        assert "0 ms of audio" in err["message"], err  # not the cleared tone's last few ms
        await c.send("input_audio_buffer.append", audio=b64(tone))
        await c.send("input_audio_buffer.commit")
        item_id = (await c.until("input_audio_buffer.committed"))[-1]["item_id"]
        await c.send("conversation.item.retrieve", item_id=item_id)
        item = (await c.until("conversation.item.retrieved"))[-1]["item"]
        samples = len(base64.b64decode(item["content"][0]["audio"])) // 2
        assert abs(samples - len(tone)) <= 3, (samples, len(tone))  # one tone's worth, not one and a bit
        assert not of_type(c.seen, "error")[1:]
        await c.ws.close()
    await eventually(lambda: idle(srv.orch))


async def test_semantic_vad_takes_and_echoes_its_eagerness(srv: RtServer) -> None:
    """As OpenAI echoes semantic_vad: type, eagerness and the response flags, no VAD numbers; the
    eagerness sets how long a pause ends the turn (the same VAD serves it)."""
    async with aiohttp.ClientSession() as http:
        c = await connect(srv, http)
        await c.send("session.update", session={"turn_detection": {"type": "semantic_vad", "eagerness": "high"}})
        td = (await c.until("session.updated"))[-1]["session"]["turn_detection"]
        assert td == {"type": "semantic_vad", "eagerness": "high", "create_response": True,
                      "interrupt_response": True}, td
        assert srv.sessions and all(s.cfg.turn_detection.silence_duration_ms == 300 for s in srv.sessions)
        await c.send("session.update", session={"turn_detection": {"type": "semantic_vad", "eagerness": "eager"}},
                     event_id="bad")
        err = (await c.until("error"))[-1]["error"]
        assert (err["param"], err["event_id"]) == ("session.turn_detection.eagerness", "bad"), err
        assert "expected one of 'auto', 'high', 'low', 'medium'" in err["message"], err
        await c.send("session.update", session={"turn_detection": {"type": "server_vad"}})
        td = (await c.until("session.updated"))[-1]["session"]["turn_detection"]
        assert "eagerness" not in td and td["silence_duration_ms"] == 500, td
        await c.ws.close()


async def test_a_second_response_create_is_answered_after_the_firsts_response_created(srv: RtServer) -> None:
    """Events are answered in the order they were sent: the first response.create's response.created comes
    before the error for a second one sent right behind it."""
    async with aiohttp.ClientSession() as http:
        c = await connect(srv, http, turn_detection=None)
        await c.send("conversation.item.create", item={"type": "message", "role": "user",
                                                       "content": [{"type": "input_text", "text": "one two"}]})
        await c.until("conversation.item.created")
        await c.ws.send_json({"type": "response.create", "event_id": "first"})
        await c.ws.send_json({"type": "response.create", "event_id": "second"})
        events = await c.until("error")
        assert [e["type"] for e in events][:1] == ["response.created"], [e["type"] for e in events]
        assert (events[-1]["error"]["code"], events[-1]["error"]["event_id"]) == (
            "conversation_already_has_active_response", "second")
        await c.until("response.done")
        await c.ws.close()
    await eventually(lambda: idle(srv.orch))


async def test_an_out_of_band_response_takes_item_references(srv: RtServer) -> None:
    """response.create's `input` may name conversation items (`item_reference`), as OpenAI's does; an unknown
    one is item_not_found naming its place, and a reference is no item to add to the conversation."""
    async with aiohttp.ClientSession() as http:
        c = await connect(srv, http, turn_detection=None)
        await c.send("conversation.item.create", item={"id": "said", "type": "message", "role": "user",
                                                       "content": [{"type": "input_text", "text": "red green"}]})
        await c.until("conversation.item.created")
        await c.send("conversation.item.create", item={"type": "message", "role": "user",
                                                       "content": [{"type": "input_text", "text": "blue"}]})
        await c.until("conversation.item.created")
        await c.send("response.create", response={"conversation": "none", "modalities": ["text"],
                                                  "max_output_tokens": 2,
                                                  "input": [{"type": "item_reference", "id": "said"}]})
        events = await c.until("response.done")
        text = "".join(e["delta"] for e in events if e["type"] in ("response.text.delta", "response.output_text.delta"))
        assert text == "red green", [e["type"] for e in events]  # the synthetic stage repeats the last message
        await c.send("response.create", response={"conversation": "none", "input": [
            {"type": "item_reference", "id": "said"}, {"type": "item_reference", "id": "nope"}]}, event_id="ref")
        err = (await c.until("error"))[-1]["error"]
        assert (err["code"], err["param"], err["event_id"]) == ("item_not_found", "response.input[1].id", "ref"), err
        await c.send("conversation.item.create", item={"type": "item_reference", "id": "said"}, event_id="add")
        err = (await c.until("error"))[-1]["error"]
        assert (err["param"], err["event_id"]) == ("item.type", "add"), err
        await c.ws.close()
    await eventually(lambda: idle(srv.orch))
