"""Full-duplex realtime sessions on the tiny Moshi checkpoint: real workers, real server, real WebSocket clients."""

from __future__ import annotations

import asyncio
import base64
import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from openai import AsyncOpenAI
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from omni_actors.api.realtime.audio import WIRE_RATE
from omni_actors.api.realtime.duplex_stats import DuplexCollector, DuplexStatistics, DuplexStats
from omni_actors.api.realtime.events import GA_NAMES
from omni_actors.workers.engines.duplex import JITTER_FRAMES
from tests.api.conftest import idle
from tests.api.realtime.conftest import Client, RtServer, b64, pcm, serve_rt
from tests.conftest import eventually

SLOTS = 4
SEED = 1234
FRAME = 1920
"""Samples per 80 ms frame at 24 kHz (the wire rate is the model's)."""
FRAMES = 6
"""Frames compared per session."""
INPUT_FRAMES = 2
"""Frames of input each compared session sends, in one append; then it is fed silence. At most the
engine's JITTER_FRAMES, so a skipped tick on a slow box never drops any of it: every frame's input is
fixed whatever the timing."""
CLOSE_TIMEOUT_S = 60.0
AUDIO_EVENTS = ("response.audio.delta", "response.output_audio.delta")
TEXT_EVENTS = ("response.audio_transcript.delta", "response.output_audio_transcript.delta")


@pytest.fixture(scope="module")
async def srv(tiny_moshi: Path) -> AsyncIterator[RtServer]:
    stages = [{"stage_id": 0, "max_num_seqs": SLOTS, "default_sampling_params": {"seed": SEED},
               "engine_extras": {"frame_budget": 0}}]  # (SLOTS whatever a frame takes on a loaded box)
    async with serve_rt("moshi", model=str(tiny_moshi), stages=stages) as server:
        yield server


async def connect(srv: RtServer, http: aiohttp.ClientSession, dialect: str = "beta") -> Client:
    path = "/v1/realtime?model=moshi"
    ws = await http.ws_connect(srv.url + path, headers=srv.headers, max_msg_size=0, autoclose=False)
    client = Client(ws)
    assert (await client.recv())["type"] == "session.created"
    assert (await client.recv())["type"] == "conversation.created"
    if dialect == "ga":
        await client.send("session.update", session={"type": "realtime", "audio": {"input": {
            "turn_detection": {"type": "server_vad"}}}})
        updated = (await client.until("session.updated"))[-1]
        assert updated["session"]["audio"]["input"]["turn_detection"] is None  # duplex: no VAD, ever
    return client


def voice(seed: int, seconds: float) -> np.ndarray:
    """A loud random signal (deterministic per seed), float32 at 24 kHz."""
    return (np.random.default_rng(seed).standard_normal(int(seconds * WIRE_RATE)) * 0.2).astype(np.float32)


async def frames(client: Client, n: int) -> tuple[list[np.ndarray], str, list[dict[str, Any]]]:
    """The next `n` audio deltas, the transcript that came with them, and every event seen."""
    audio: list[np.ndarray] = []
    text, seen = "", []
    while len(audio) < n:
        event = await client.recv()
        seen.append(event)
        if event["type"] in AUDIO_EVENTS:
            audio.append(pcm(event["delta"]))
        elif event["type"] in TEXT_EVENTS:
            text += event["delta"]
    return audio, text, seen


async def session_output(srv: RtServer, http: aiohttp.ClientSession, seed: int) -> tuple[np.ndarray, str]:
    """One session fed all its input at once (so every frame's input is fixed): its first FRAMES frames."""
    assert INPUT_FRAMES <= JITTER_FRAMES
    client = await connect(srv, http)
    await client.send("input_audio_buffer.append", audio=b64(voice(seed, INPUT_FRAMES * FRAME / WIRE_RATE)))
    audio, text, _ = await frames(client, FRAMES)
    await client.ws.close()
    return np.concatenate(audio), text


async def test_sessions_at_once_equal_each_alone_and_the_next_is_refused(srv: RtServer) -> None:
    async with aiohttp.ClientSession() as http:
        alone = [await session_output(srv, http, seed) for seed in range(SLOTS)]
        await eventually(lambda: idle(srv.orch), CLOSE_TIMEOUT_S)
        blockers = [await connect(srv, http) for _ in range(SLOTS)]
        extra = await connect_refused(srv, http)
        for b in blockers:
            await b.ws.close()
        assert extra["error"]["code"] == "session_limit_reached"
        await eventually(lambda: srv.stats().duplex.sessions_live == 0, CLOSE_TIMEOUT_S)
        together = await asyncio.gather(*(session_output(srv, http, seed) for seed in range(SLOTS)))
    for (a_audio, a_text), (t_audio, t_text) in zip(alone, together, strict=True):
        assert len(a_audio) == FRAMES * FRAME
        assert np.array_equal(a_audio, t_audio)  # batch rows are independent and shapes are fixed
        assert a_text == t_text
    assert not np.array_equal(alone[0][0], alone[1][0]), "different input, same output"
    stats = srv.stats().duplex
    assert stats.sessions_rejected >= 1 and stats.frames >= 2 * SLOTS * FRAMES
    assert stats.input_to_output_ms_p50 > 0  # frames of user audio were timed from arrival to output
    await eventually(lambda: srv.stats().duplex.sessions_live == 0, CLOSE_TIMEOUT_S)  # (no frame counted mid-scrape)
    async with aiohttp.ClientSession() as http, http.get(srv.url + "/metrics") as resp:
        text = await resp.text()
    for name in ("omni_duplex_sessions_live", "omni_duplex_late_frames_total"):
        assert name in text
    assert_timings_in_seconds(text, srv.stats().duplex)


def assert_timings_in_seconds(text: str, stats: DuplexStatistics) -> None:
    """The duplex timings are Prometheus summaries in base units: seconds, never the milliseconds kept inside."""
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert not {n for n in families if n.startswith("omni_duplex") and n.endswith("_ms")}
    for name, p50_ms, p99_ms, count in (
            ("omni_duplex_frame_seconds", stats.frame_ms_p50, stats.frame_ms_p99, stats.frames),
            ("omni_duplex_start_lag_seconds", stats.start_lag_ms_p50, stats.start_lag_ms_p99, stats.frames),
            ("omni_duplex_input_to_output_seconds", stats.input_to_output_ms_p50, stats.input_to_output_ms_p99,
             stats.input_to_output_count)):
        family = families[name]
        assert family.type == "summary"
        samples = {(s.name, s.labels.get("quantile")): s.value for s in family.samples}
        assert samples[(name, "0.5")] == pytest.approx(p50_ms / 1000)
        assert samples[(name, "0.99")] == pytest.approx(p99_ms / 1000)
        assert samples[(name + "_count", None)] == count > 0
        assert 0 <= samples[(name + "_sum", None)] < count * 10.0  # seconds: under 10 s a frame
    io_mean_s = stats.input_to_output_s_sum / stats.input_to_output_count
    assert 0 < io_mean_s < 10.0  # audio in to audio out takes frames (80 ms each), not thousands of seconds


def test_timings_before_any_frame_are_nan_not_zero_seconds() -> None:
    """An empty summary's quantiles are NaN (as Prometheus clients write them): a 0 s p99 would chart as a
    real, perfect frame time on a server that has stepped none."""
    registry = CollectorRegistry()
    stats = DuplexStats()
    registry.register(DuplexCollector(stats))
    text = generate_latest(registry).decode()
    stats.frame(20.0, 0.5, 0, None)  # a frame of silence: no input-to-output time
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("omni_duplex_frame_seconds", "omni_duplex_input_to_output_seconds"):
        quantiles = [s.value for s in families[name].samples if "quantile" in s.labels]
        assert len(quantiles) == 2 and all(math.isnan(v) for v in quantiles), (name, quantiles)
    after = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    frame = {s.labels.get("quantile"): s.value for s in after["omni_duplex_frame_seconds"].samples}
    assert frame["0.5"] == pytest.approx(0.020)
    io = [s.value for s in after["omni_duplex_input_to_output_seconds"].samples if "quantile" in s.labels]
    assert all(math.isnan(v) for v in io)  # still no user frame timed


async def connect_refused(srv: RtServer, http: aiohttp.ClientSession) -> dict[str, Any]:
    ws = await http.ws_connect(srv.url + "/v1/realtime?model=moshi", headers=srv.headers, autoclose=False)
    client = Client(ws)
    event = await client.recv()
    closing = await ws.receive(timeout=CLOSE_TIMEOUT_S)
    assert closing.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
    await ws.close()
    return event


async def test_audio_streams_out_while_the_client_is_still_talking(srv: RtServer) -> None:
    async with aiohttp.ClientSession() as http:
        client = await connect(srv, http, dialect="ga")
        talk = voice(7, 30.0)
        got: list[dict[str, Any]] = []
        sent = 0
        for i in range(0, len(talk), FRAME):  # one frame per append until 3 audio deltas came back
            await client.send("input_audio_buffer.append", audio=b64(talk[i:i + FRAME]))
            sent += 1
            while True:
                try:
                    msg = await client.ws.receive(timeout=0.08)
                except TimeoutError:
                    break
                got.append(msg.json())
            if sum(e["type"] == "response.output_audio.delta" for e in got) >= 3:
                break
        assert sent * FRAME < len(talk), "no audio came back while the client was talking"
        types = [e["type"] for e in got]
        assert types[0] == "response.created" and "response.audio.delta" not in types  # GA names only
        await client.ws.close()


async def test_cancel_silences_until_the_user_speaks_and_close_leaves_nothing(srv: RtServer) -> None:
    async with aiohttp.ClientSession() as http:
        client = await connect(srv, http)
        await client.send("session.update", session={"input_audio_transcription": {"model": "whisper-1"}})
        refused = (await client.until("error"))[-1]["error"]  # no turns to transcribe: refused, the session lives on
        assert (refused["param"], refused["code"]) == ("session.input_audio_transcription", "unsupported_parameter")
        await client.send("input_audio_buffer.append", audio=b64(voice(3, 0.2)))
        _, _, seen = await frames(client, 4)
        types = [e["type"] for e in seen]
        assert "response.audio.delta" in types and not set(types) & set(GA_NAMES.values())  # beta names only
        deltas = [e for e in seen if e["type"] in AUDIO_EVENTS]
        assert types.count("response.created") == 1 and len({e["response_id"] for e in deltas}) == 1  # one response
        await client.send("response.cancel")
        before_done = 0
        while (event := await client.recv())["type"] != "response.done":
            before_done += event["type"] in AUDIO_EVENTS
        assert event["response"]["status"] == "cancelled"
        assert before_done <= 2
        # muted: quiet input does not unmute; frames keep being stepped but none is sent
        await client.send("input_audio_buffer.append", audio=b64(np.zeros(2 * FRAME, np.float32)))
        frames_seen = srv.stats().duplex.frames
        await eventually(lambda: srv.stats().duplex.frames >= frames_seen + 3, CLOSE_TIMEOUT_S)
        await client.send("input_audio_buffer.append", audio=b64(voice(4, 0.2)))  # the user speaks: unmuted
        resumed = await client.until("response.created")
        assert not [e for e in resumed if e["type"] in AUDIO_EVENTS]
        assert resumed[-1]["response"]["id"] != deltas[0]["response_id"]  # a new response, after the cancelled one
        await frames(client, 1)
        cancelled = srv.stats().responses.get("cancelled", 0)
        await client.ws.close()  # while frames are being stepped
    await eventually(lambda: idle(srv.orch) and srv.stats().duplex.sessions_live == 0, CLOSE_TIMEOUT_S)
    # the live response, cut short, is counted
    await eventually(lambda: srv.stats().responses.get("cancelled", 0) == cancelled + 1, CLOSE_TIMEOUT_S)


async def test_openai_sdk_ga_client_hears_the_model_and_cancels(srv: RtServer) -> None:
    ws_url = srv.url.replace("http://", "ws://") + "/v1"
    client = AsyncOpenAI(api_key=srv.key, base_url=f"{srv.url}/v1", websocket_base_url=ws_url, max_retries=0)
    async with client.realtime.connect(model="moshi") as conn:
        await conn.session.update(session={"type": "realtime", "audio": {"output": {"speed": 1.25}}})
        refused = await anext(e async for e in conn if e.type == "error")  # it speaks in real time
        assert refused.error.param == "session.audio.output.speed"
        await conn.session.update(session={"type": "realtime", "audio": {"input": {"transcription": {"model": "whisper-1"}}}})
        refused = await anext(e async for e in conn if e.type == "error")  # no turns to transcribe
        assert refused.error.param == "session.audio.input.transcription"
        assert refused.error.code == "unsupported_parameter"
        await conn.session.update(session={"type": "realtime"})
        await conn.input_audio_buffer.append(audio=b64(voice(9, 0.16)))
        audio, status, formats = b"", None, []
        async for event in conn:
            if event.type in ("response.created", "response.done"):  # GA names the format under audio.output
                out = event.response.audio.output  # (was None: the beta fields, in a GA session)
                formats.append((out.format.type, out.format.rate, out.voice))
            if event.type == "response.output_audio.delta":
                audio += base64.b64decode(event.delta)
                if len(audio) == 2 * 2 * FRAME:
                    await conn.response.cancel()
            elif event.type == "response.done":
                status = event.response.status
                break
    assert status == "cancelled" and len(audio) >= 2 * 2 * FRAME
    assert formats == [("audio/pcm", WIRE_RATE, "alloy")] * 2


def test_make_tiny_moshi_is_detected(tiny_moshi: Path) -> None:
    from omni_actors.models.detect import detect_pipeline

    assert detect_pipeline(tiny_moshi) == "moshi"
