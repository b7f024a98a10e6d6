"""Many realtime sessions at once (no cross-talk), the session limit, the idle timeout."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from omni_actors.api.realtime.vad import VAD_RATE
from tests.api.conftest import eventually, idle
from tests.api.realtime.conftest import (
    Client,
    RtServer,
    b64,
    connect,
    of_type,
    padded,
    response_audio,
    serve_rt,
    silence,
    speak,
)

SESSIONS = 16
FLOOD_APPENDS = 4
FLOOD_APPEND_S = 120.0
"""Silence per append of the flooding session (480 s in all, under the audio cap: silence is dropped): each
append seconds of VAD, many times the one-second slices heard in turn with a 5 s turn's 100 ms appends."""
FLOOD_TIMEOUT_S = 120.0
"""Until the whole flood is heard (~3 s of VAD on an idle core)."""
PHRASES = ("Good morning.", "Please book a table for two at eight tonight.",
           "How far is the moon?", "Read me the news, then play some jazz music.")


@pytest.fixture(scope="module")
def phrases(tmp_path_factory: pytest.TempPathFactory) -> list[np.ndarray]:
    tmp: Path = tmp_path_factory.mktemp("phrases")
    return [padded(speak(p, tmp), 0.3, 0.8) for p in PHRASES]


async def conversation(srv: RtServer, http: aiohttp.ClientSession, k: int, speech: np.ndarray) -> dict[str, Any]:
    """A text turn unique to `k`, then a spoken turn (the synthetic pipeline, without ASR, answers "ok")."""
    c = await connect(srv, http)
    await c.send("conversation.item.create",
                 item={"type": "message", "role": "user",
                       "content": [{"type": "input_text", "text": f"session{k} says hello to number {k}"}]})
    await c.send("response.create")
    first = await c.until("response.done")
    await c.append(speech)
    second = await c.until("response.done")
    await c.ws.close()
    assert first[-1]["response"]["status"] == second[-1]["response"]["status"] == "completed"
    return {
        "transcripts": [of_type(ev, "response.audio_transcript.done")[0]["transcript"] for ev in (first, second)],
        "audio": [response_audio(ev) for ev in (first, second)],
        "vad": (of_type(second, "input_audio_buffer.speech_started")[0]["audio_start_ms"],
                of_type(second, "input_audio_buffer.speech_stopped")[0]["audio_end_ms"]),
    }


async def test_sessions_at_once_match_each_alone_and_limit_closes_1013(
        srv: RtServer, phrases: list[np.ndarray]) -> None:
    async with aiohttp.ClientSession() as http:
        alone = [await conversation(srv, http, k, phrases[k % len(phrases)]) for k in range(SESSIONS)]
        gate = asyncio.Event()

        async def hold_then_run(k: int) -> dict[str, Any]:
            result = asyncio.ensure_future(conversation(srv, http, k, phrases[k % len(phrases)]))
            await gate.wait()
            return await result

        runs = [asyncio.ensure_future(hold_then_run(k)) for k in range(SESSIONS)]
        await eventually(lambda: len(srv.sessions) == SESSIONS)
        # one past the limit: an error event, then closed at once with 1013 and a reason
        extra = await http.ws_connect(f"{srv.url}/v1/realtime", headers=srv.headers)
        assert (await extra.receive_json(timeout=5))["error"]["code"] == "session_limit_reached"
        msg = await extra.receive(timeout=5)
        assert msg.type == aiohttp.WSMsgType.CLOSE and msg.data == 1013 and "limit" in msg.extra
        gate.set()
        together = await asyncio.gather(*runs)
    for k, (a, t) in enumerate(zip(alone, together, strict=True)):
        assert a["transcripts"] == t["transcripts"], k
        assert f"session{k}" in t["transcripts"][0]
        assert a["vad"] == t["vad"], k
        for x, y in zip(a["audio"], t["audio"], strict=True):
            assert len(x) == len(y) and np.allclose(x, y, atol=1e-4), k
    assert len({t["transcripts"][0] for t in together}) == SESSIONS
    stats = srv.stats()
    assert stats.sessions_rejected >= 1 and stats.sessions_total >= 2 * SESSIONS
    assert stats.responses["completed"] >= 4 * SESSIONS
    assert len(stats.pipeline_first_audio_ms) >= 4 * SESSIONS
    await eventually(lambda: idle(srv.orch) and not srv.sessions)


async def test_idle_timeout_and_text_only_pipeline() -> None:
    async with serve_rt("synthetic_text", server={"max_realtime_sessions": 1, "realtime_idle_timeout_s": 1.0}) as srv, \
            aiohttp.ClientSession() as http:
        c = await connect(srv, http)
        assert c.seen[0]["session"]["modalities"] == ["text"]
        await c.send("conversation.item.create",
                     item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a b"}]})
        await c.send("response.create")
        events = await c.until("response.done")
        assert "".join(e["delta"] for e in of_type(events, "response.text.delta")) == "a b a b"
        second = await http.ws_connect(f"{srv.url}/v1/realtime", headers=srv.headers)
        assert (await second.receive_json(timeout=5))["type"] == "error"
        msg = await second.receive(timeout=5)
        assert msg.type == aiohttp.WSMsgType.CLOSE and msg.data == 1013
        assert (await c.recv())["type"] == "rate_limits.updated"
        msg = await c.ws.receive(timeout=5)  # nothing more from the client: the session ends cleanly
        assert msg.type == aiohttp.WSMsgType.CLOSE and msg.data == 1000 and msg.extra == "idle timeout"
        await c.ws.close()
        await eventually(lambda: not srv.sessions)
        bad = await http.get(f"{srv.url}/v1/realtime")  # no key
        assert bad.status == 401


async def spoken_turn(client: Client, speech: np.ndarray) -> tuple[int, int]:
    """Stream a spoken turn in 100 ms appends; its speech_started / speech_stopped positions (ms), once committed."""
    await client.append(padded(speech, 0.5, 1.0))
    events = await client.until("input_audio_buffer.committed")
    started, stopped = of_type(events, "input_audio_buffer.speech_started"), of_type(events, "input_audio_buffer.speech_stopped")
    assert len(started) == len(stopped) == 1 and started[0]["item_id"] == stopped[0]["item_id"] == events[-1]["item_id"]
    return started[0]["audio_start_ms"], stopped[0]["audio_end_ms"]


async def test_a_session_flooding_the_vad_with_silence_does_not_hold_up_another_sessions_turn(
        srv: RtServer, speech: dict[str, np.ndarray]) -> None:
    """Every session's server VAD runs on one thread. A session appending minutes of silence at a time (under its
    audio cap) must not make another session's turn wait until all of it was heard: the other's turn is detected,
    at the positions it has alone, while most of the flood is still unheard; the flood is then heard in full."""
    async with aiohttp.ClientSession() as http:
        first = await connect(srv, http)
        alone = await spoken_turn(first, speech["hello"])
        await first.until("response.done")
        await first.ws.close()
        flood, talker = await connect(srv, http), await connect(srv, http)
        session = next(s for s in srv.sessions if s.id == flood.seen[0]["session"]["id"])
        quiet = b64(silence(FLOOD_APPEND_S))

        async def flood_on() -> None:
            for _ in range(FLOOD_APPENDS - 1):
                await flood.send("input_audio_buffer.append", audio=quiet)
            await flood.send("input_audio_buffer.clear")

        await flood.send("input_audio_buffer.append", audio=quiet)  # the VAD thread has it when the turn begins
        sending = asyncio.ensure_future(flood_on())
        before = session.timeline
        together = await spoken_turn(talker, speech["hello"])
        flooded = FLOOD_APPENDS * FLOOD_APPEND_S * VAD_RATE
        # while the turn was heard, most of the flood was not: the two sessions were heard in turn
        assert session.timeline - before < (flooded - before) / 2, "the turn waited for the other session's flood"
        assert together == alone
        await talker.until("response.done")
        await sending
        events = await flood.until("input_audio_buffer.cleared", timeout_s=FLOOD_TIMEOUT_S)
        assert [e["type"] for e in events] == ["input_audio_buffer.cleared"]  # silence: no turn, no error
        assert session.timeline > flooded - VAD_RATE // 10  # all of it heard, in order (less the resampler's delay)
        for c in (flood, talker):
            await c.ws.close()
    await eventually(lambda: idle(srv.orch) and not srv.sessions)
