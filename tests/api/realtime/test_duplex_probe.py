"""Duplex sessions used as clients break them: G.711 items, updates while audio flows, drops, bursts.

Tiny Moshi behind a real server; real WebSocket clients (aiohttp and the openai SDK).
"""

from __future__ import annotations

import asyncio
import base64
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from openai import AsyncOpenAI

from omni_actors.api.realtime import STATS_KEY
from omni_actors.api.realtime.audio import (
    G711_RATE,
    AudioFormatError,
    Resampler,
    WireStream,
    pcm16_bytes,
)
from omni_actors.api.realtime.duplex import MAX_FEED_S, MODEL_RATE
from tests.api.conftest import idle
from tests.api.realtime.conftest import Client, RtServer, b64, serve_rt
from tests.api.realtime.test_duplex import (
    AUDIO_EVENTS,
    CLOSE_TIMEOUT_S,
    FRAME,
    connect,
    frames,
    voice,
)
from tests.conftest import eventually

SLOTS = 2
SEED = 99
G711_FRAMES = 24
"""G.711 frames a session hears before it cancels: each floored to whole ms would lose ~0.2 ms."""
BURST = 6
"""Connections opened at once against SLOTS slots."""
TEMPERATURE_FRAMES = 12
GREEDY_AFTER = 3
"""Frames heard before a session sets temperature 0 (the rest are compared)."""
LONG_APPEND_S = 600
"""One G.711 append of 10 minutes (6.4 MB of base64)."""
LONG_APPEND_PEAK_BYTES = 64 * 1024 * 1024
"""Most memory the server (and this client) may allocate for it: a few copies of the event, not its audio
at 24 kHz (7.2 M floats per copy)."""


@pytest.fixture(scope="module")
async def srv(tiny_moshi: Path) -> AsyncIterator[RtServer]:
    stages = [{"stage_id": 0, "max_num_seqs": SLOTS, "default_sampling_params": {"seed": SEED},
               "engine_extras": {"frame_budget": 0}}]
    async with serve_rt("moshi", model=str(tiny_moshi), stages=stages) as server:
        yield server


async def g711_deltas(client: Client, n: int) -> list[bytes]:
    """The next `n` audio deltas' bytes (other events are kept in client.seen)."""
    got: list[bytes] = []
    while len(got) < n:
        event = await client.recv()
        if event["type"] in AUDIO_EVENTS:
            got.append(base64.b64decode(event["delta"]))
    return got


async def test_a_g711_item_holds_what_the_client_heard_across_a_mid_stream_update(srv: RtServer) -> None:
    async with aiohttp.ClientSession() as http:
        client = await connect(srv, http)
        await client.send("session.update", session={"input_audio_format": "g711_ulaw",
                                                     "output_audio_format": "g711_ulaw"})
        await client.until("session.updated")
        ulaw = bytes(np.random.default_rng(1).integers(0, 256, 4 * G711_RATE // 10, dtype=np.uint8))
        await client.send("input_audio_buffer.append", audio=base64.b64encode(ulaw).decode())
        heard = await g711_deltas(client, 4)
        # An update that keeps the formats while audio flows: nothing of the model's audio is lost to it.
        await client.send("session.update", session={"instructions": "be brief", "voice": "echo",
                                                     "turn_detection": {"type": "server_vad"}})
        heard += await g711_deltas(client, G711_FRAMES - 4)
        updated = [e for e in client.seen if e["type"] == "session.updated"][-1]["session"]
        assert (updated["instructions"], updated["turn_detection"]) == ("be brief", None)
        out = Resampler(MODEL_RATE, G711_RATE)  # the same frames through one resampler, as one stream
        expected = sum(len(out.push(np.zeros(FRAME, np.float32))) for _ in range(G711_FRAMES))
        assert sum(map(len, heard)) == expected
        await client.send("response.cancel")
        seen = await client.until("response.done")
        heard += [base64.b64decode(e["delta"]) for e in seen if e["type"] in AUDIO_EVENTS]
        item_id = seen[-1]["response"]["output"][0]["id"]
        heard_ms = sum(map(len, heard)) * 1000 // G711_RATE  # the client's own count (8 kHz, a byte each)
        await client.send("conversation.item.truncate", item_id=item_id, content_index=0, audio_end_ms=heard_ms)
        answer = await client.recv()
        assert answer["type"] == "conversation.item.truncated", answer
        assert answer["audio_end_ms"] == heard_ms
        await client.ws.close()


async def test_response_create_while_the_model_speaks_is_refused_as_on_every_session(srv: RtServer) -> None:
    ws_url = srv.url.replace("http://", "ws://") + "/v1"
    sdk = AsyncOpenAI(api_key=srv.key, base_url=f"{srv.url}/v1", websocket_base_url=ws_url, max_retries=0)
    async with sdk.realtime.connect(model="moshi") as conn:
        await conn.session.update(session={"type": "realtime"})
        await conn.response.create()
        seen: list[Any] = []
        async for event in conn:
            seen.append(event)
            if event.type == "response.output_audio.delta":
                break
        live_id = next(e.response.id for e in seen if e.type == "response.created")
        await conn.response.create(event_id="again")
        await conn.response.cancel()
        until_done = []
        async for event in conn:
            until_done.append(event)
            if event.type == "response.done":
                break
        (refused,) = [e for e in until_done if e.type == "error"]  # answered in order: before the cancel's
        assert (refused.error.code, refused.error.event_id) == ("conversation_already_has_active_response", "again")
        assert live_id in refused.error.message
        assert (event.response.id, event.response.status) == (live_id, "cancelled")
        await conn.response.create()  # muted, no response open: this one opens the next
        created = await anext(e async for e in conn if e.type in ("response.created", "error"))
        assert created.type == "response.created" and created.response.id != live_id
    await eventually(lambda: srv.stats().duplex.sessions_live == 0, CLOSE_TIMEOUT_S)


async def test_a_client_dropped_mid_frame_frees_its_slot_and_memory_for_the_next_at_once(srv: RtServer) -> None:
    async with aiohttp.ClientSession() as http:
        keep = await connect(srv, http)
        await keep.send("input_audio_buffer.append", audio=b64(voice(1, 0.2)))
        gone = await connect(srv, http)
        for i in range(4):  # faster than real time, each append over the bus's inline size (shared memory)
            await gone.send("input_audio_buffer.append", audio=b64(voice(10 + i, 2.0)))
        await frames(gone, 2)
        assert srv.stats().duplex.sessions_live == SLOTS
        transport = gone.ws._response.connection.transport  # no close frame: the TCP connection just ends
        assert transport is not None
        transport.abort()
        await eventually(lambda: srv.stats().duplex.sessions_live < SLOTS, CLOSE_TIMEOUT_S)
        again = await connect(srv, http)  # the slot is the next session's at once: not refused
        await again.send("input_audio_buffer.append", audio=b64(voice(2, 0.2)))
        audio, _, seen = await frames(again, 3)
        assert len(audio) == 3 and not [e for e in seen if e["type"] == "error"], seen
        await frames(keep, 1)  # the other session was never disturbed
        for c in (keep, again):
            await c.ws.close()
    await eventually(lambda: srv.stats().duplex.sessions_live == 0 and not srv.sessions, CLOSE_TIMEOUT_S)
    await eventually(lambda: idle(srv.orch), CLOSE_TIMEOUT_S)  # no run, lease (shm) or engine session left


async def test_a_burst_past_the_slots_is_refused_with_a_code_and_the_rest_are_served(srv: RtServer) -> None:
    async def one(http: aiohttp.ClientSession, seed: int) -> tuple[str, Any]:
        ws = await http.ws_connect(srv.url + "/v1/realtime?model=moshi", headers=srv.headers, autoclose=False)
        client = Client(ws)
        first = await client.recv()
        if first["type"] == "error":
            closing = await ws.receive(timeout=CLOSE_TIMEOUT_S)
            await ws.close()
            return first["error"]["code"], closing.data
        await client.recv()
        await client.send("input_audio_buffer.append", audio=b64(voice(seed, 0.2)))
        await frames(client, 2)
        return "served", client

    async with aiohttp.ClientSession() as http:
        results = await asyncio.gather(*(one(http, i) for i in range(BURST)))
        served = [c for kind, c in results if kind == "served"]
        close_codes = [code for kind, code in results if kind != "served"]
        assert len(served) == SLOTS and len(close_codes) == BURST - SLOTS
        assert {kind for kind, _ in results} == {"served", "session_limit_reached"}
        assert set(close_codes) == {1013}  # "try again later", after the error event
        for c in served:
            await c.ws.close()
    await eventually(lambda: srv.stats().duplex.sessions_live == 0, CLOSE_TIMEOUT_S)


async def heard_with(srv: RtServer, http: aiohttp.ClientSession, greedy_after: int | None) -> list[np.ndarray]:
    """TEMPERATURE_FRAMES frames of a session (the deploy's seed, fixed input); after `greedy_after`
    frames it sets temperature 0 while the stream runs."""
    client = await connect(srv, http)
    await client.send("input_audio_buffer.append", audio=b64(voice(5, 2 * FRAME / MODEL_RATE)))  # (<= jitter)
    audio: list[np.ndarray] = []
    if greedy_after is not None:
        audio, _, _ = await frames(client, greedy_after)
        await client.send("session.update", session={"temperature": 0.0})
    more, _, _ = await frames(client, TEMPERATURE_FRAMES - len(audio))
    await client.ws.close()
    return audio + more


async def test_a_temperature_set_while_audio_flows_reaches_the_live_stream(srv: RtServer) -> None:
    async with aiohttp.ClientSession() as http:
        sampled = await heard_with(srv, http, None)
        again = await heard_with(srv, http, None)
        greedy = await heard_with(srv, http, GREEDY_AFTER)
    assert all(map(np.array_equal, sampled, again))  # the same seed and input: the same frames
    assert all(map(np.array_equal, sampled[:GREEDY_AFTER], greedy[:GREEDY_AFTER]))
    assert not all(map(np.array_equal, sampled, greedy)), "the new temperature never reached the model"


CLEARED_FRAMES = 25
"""Frames of audio appended and then cleared: the engine buffers up to 2 s (25 frames) ahead of its clock."""


async def test_clear_drops_the_appended_audio_the_model_has_not_heard(srv: RtServer) -> None:
    """input_audio_buffer.clear on a duplex session: the audio buffered ahead of the frame clock is never
    stepped (nor counted as dropped). The append is cut at an odd byte, as a client splitting its byte
    stream anywhere does: the odd byte leads the next append."""
    await eventually(lambda: srv.stats().duplex.sessions_live == 0, CLOSE_TIMEOUT_S)
    d = srv.app[STATS_KEY].duplex
    heard_before, dropped_before = len(d.input_to_output_ms), d.dropped_input_s
    raw = pcm16_bytes(voice(7, CLEARED_FRAMES * FRAME / MODEL_RATE))
    async with aiohttp.ClientSession() as http:
        client = await connect(srv, http)
        for piece in (raw[:1001], raw[1001:]):
            await client.send("input_audio_buffer.append", audio=base64.b64encode(piece).decode())
        await client.send("input_audio_buffer.clear")
        _, _, seen = await frames(client, CLEARED_FRAMES + 5)
        await client.ws.close()
    assert [e["type"] for e in seen if e["type"] in ("error", "input_audio_buffer.cleared")] == [
        "input_audio_buffer.cleared"]
    # Frames of the user's audio the model stepped, or dropped with late ticks: before the clear reached the
    # engine only (a frame or two), not the whole 2 s.
    reached = len(d.input_to_output_ms) - heard_before + round((d.dropped_input_s - dropped_before) * MODEL_RATE / FRAME)
    assert reached < CLEARED_FRAMES // 2, reached
    await eventually(lambda: srv.stats().duplex.sessions_live == 0, CLOSE_TIMEOUT_S)


async def test_a_minutes_long_append_costs_only_the_audio_the_engine_keeps(srv: RtServer) -> None:
    # The whole append was decoded, resampled to 24 kHz (3x G.711's samples) and fed on the event loop, for
    # the engine to keep its last 2 s: 10 minutes of G.711 took ~130 MB (now ~30) and seconds of the loop.
    ulaw = np.random.default_rng(5).integers(0, 256, LONG_APPEND_S * G711_RATE, dtype=np.uint8)
    audio = base64.b64encode(ulaw.tobytes()).decode()
    async with aiohttp.ClientSession() as http:
        client = await connect(srv, http)
        await client.send("session.update", session={"input_audio_format": "g711_ulaw"})
        await client.until("session.updated")
        dropped = srv.stats().duplex.dropped_input_s
        tracemalloc.start()  # (the server runs in this process: its allocations are traced too)
        try:
            await client.send("input_audio_buffer.append", audio=audio)
            _, _, seen = await frames(client, 2)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert not [e for e in seen if e["type"] == "error"], seen
        assert peak < LONG_APPEND_PEAK_BYTES, peak
        assert srv.stats().duplex.dropped_input_s - dropped >= LONG_APPEND_S - 3  # still counted as dropped
        await client.ws.close()
    await eventually(lambda: srv.stats().duplex.sessions_live == 0, CLOSE_TIMEOUT_S)


HUGE_APPEND_S = 60
"""A pcm16 append of a minute (3.9 MB of line-wrapped base64): far more than MAX_FEED_S, its kept tail."""
HUGE_APPEND_PEAK_BYTES = 48 * 1024 * 1024
"""Most memory the server (and this client) may allocate for it: the event's copies on the way in, not its
decoded minute (2.9 MB) on top of a copy of the event without its whitespace."""


def huge_append(fmt: str, seed: int, seconds: float) -> str:
    """Random audio of `fmt` (pcm16: an odd count of bytes, so a byte is held after it) as base64,
    line-wrapped as MIME encoders write it (whitespace inside, padding at the end)."""
    n = int(seconds * (MODEL_RATE * 2 if fmt == "pcm16" else G711_RATE)) | 1
    raw = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()
    return base64.encodebytes(raw).decode()


def whole_tail(fmt: str, held: bytes, b64: str, keep: int) -> tuple[np.ndarray, bytes, int]:
    """What keeping `keep` samples of an append must give: its stream decoded whole, then cut (samples kept,
    byte held, samples skipped)."""
    stream = WireStream(fmt)
    stream.held = held
    x = stream.decode(b64)
    return x[max(0, len(x) - keep):], stream.held, max(0, len(x) - keep)


def test_a_wire_stream_keeps_of_an_append_exactly_the_tail_of_its_whole_decode() -> None:
    for fmt, held in (("pcm16", b""), ("pcm16", b"\x7f"), ("g711_ulaw", b"")):
        for cut in range(1, 12):  # every alignment of the 3-byte groups against the kept samples' start
            text = huge_append(fmt, cut, 0.05)
            text = text[: len(text) - cut % 4] if cut > 7 else text  # (cut short, its padding too: refused)
            try:
                want: Any = whole_tail(fmt, held, text, 100 + cut)
            except AudioFormatError:
                want = "refused"
            stream = WireStream(fmt)
            stream.held = held
            try:
                x = stream.decode(text, keep=100 + cut)
                got: Any = (x, stream.held, stream.skipped)
            except AudioFormatError:
                got = "refused"
            if want == "refused" or got == "refused":
                assert got == want and stream.held == held, (fmt, held, cut)
            else:
                assert np.array_equal(got[0], want[0]) and got[1:] == want[1:], (fmt, held, cut)


async def test_a_huge_appends_kept_audio_is_the_tail_of_it_decoded_whole(srv: RtServer) -> None:
    # Only the base64 groups holding the kept tail are decoded: what the stream starts with is, sample for
    # sample, the whole append decoded and cut (whitespace, padding, an odd byte held after it, G.711).
    async with aiohttp.ClientSession() as http:
        for fmt in ("pcm16", "g711_ulaw"):
            client = await connect(srv, http)
            if fmt != "pcm16":
                await client.send("session.update", session={"input_audio_format": fmt})
                await client.until("session.updated")
            rate = MODEL_RATE if fmt == "pcm16" else G711_RATE
            keep = int(MAX_FEED_S * rate)
            text = huge_append(fmt, 11, HUGE_APPEND_S)
            kept, held, skipped = whole_tail(fmt, b"", text, keep)
            dropped = srv.stats().duplex.dropped_input_s
            await client.send("input_audio_buffer.append", audio=text)
            _, _, seen = await frames(client, 1)
            assert not [e for e in seen if e["type"] == "error"], seen
            (session,) = [s for s in srv.sessions if s.stream is not None]
            started = srv.orch.runs[session.stream.request_id].spec.inputs["audio"]  # what the model hears first
            assert np.array_equal(started, Resampler(rate, MODEL_RATE).push(kept))
            assert (session._wire.held, session._wire.skipped) == (held, skipped)
            assert srv.stats().duplex.dropped_input_s - dropped >= skipped / rate - 1e-6  # (+ the engine's drops)
            await client.ws.close()
            await eventually(lambda: srv.stats().duplex.sessions_live == 0, CLOSE_TIMEOUT_S)


async def test_a_bad_character_deep_in_a_huge_append_refuses_it_whole(srv: RtServer) -> None:
    # A character no base64 holds, or padding, far inside the part not decoded: refused as the whole decode
    # refused it (same error), nothing counted as dropped, the held byte kept. Then a good one, the byte
    # carried: its accounting is exact and its memory bounded.
    text = huge_append("pcm16", 12, HUGE_APPEND_S)
    async with aiohttp.ClientSession() as http:
        client = await connect(srv, http)
        await client.send("input_audio_buffer.append", audio=base64.b64encode(b"\x01\x02\x03").decode())
        await frames(client, 1)
        (session,) = [s for s in srv.sessions if s.stream is not None]
        assert session._wire.held == b"\x03"
        dropped = srv.stats().duplex.dropped_input_s
        for bad in ("!", "=", "====", "-", "é"):  # ("====": the groups after it still line up)
            sent = await client.send("input_audio_buffer.append", audio=text[:1000] + bad + text[1000:])
            await client.send("session.update", session={"instructions": "after the append"})  # (answered after it)
            errors = [e["error"] for e in await client.until("session.updated") if e["type"] == "error"]
            assert [(e["code"], e["param"], e["event_id"], e["message"]) for e in errors] == [
                ("invalid_value", "audio", sent, "audio is not valid base64")], bad
            assert session._wire.held == b"\x03" and srv.stats().duplex.dropped_input_s == dropped
        _, held, skipped = whole_tail("pcm16", b"\x03", text, int(MAX_FEED_S * MODEL_RATE))
        tracemalloc.start()
        try:
            await client.send("input_audio_buffer.append", audio=text)
            await client.send("session.update", session={"instructions": "after the append"})  # (answered after it)
            seen = await client.until("session.updated")
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert not [e for e in seen if e["type"] == "error"], seen
        assert peak < HUGE_APPEND_PEAK_BYTES, peak
        assert (session._wire.held, session._wire.skipped) == (held, skipped)
        assert srv.stats().duplex.dropped_input_s - dropped >= skipped / MODEL_RATE - 1e-6
        await client.ws.close()
    await eventually(lambda: srv.stats().duplex.sessions_live == 0, CLOSE_TIMEOUT_S)
