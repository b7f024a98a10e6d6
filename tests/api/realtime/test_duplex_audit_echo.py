"""Duplex sessions on a stand-in echo model: the frame clock as a client meets it, its metrics, the beta SDK.

A real server and a real duplex worker, whose adapter is a stand-in model (DuplexAdapter's real
interface, each slot's frame an echo of its input), with long frames (FRAME_S): which output echoes
an append says which frame heard it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from omni_actors.api.realtime.duplex import MODEL_RATE
from omni_actors.api.realtime.duplex_stats import DuplexCollector, DuplexStats
from omni_actors.workers.engine import EngineContext
from omni_actors.workers.engines.duplex import JITTER_FRAMES, MAX_INPUT_S, DuplexAdapter, SlotOutput
from tests.api.conftest import idle
from tests.api.realtime.conftest import RtServer, b64, pcm, serve_rt
from tests.api.realtime.test_duplex import AUDIO_EVENTS, CLOSE_TIMEOUT_S, connect
from tests.api.realtime.test_sdk import sdk
from tests.conftest import eventually

FRAME_S = 0.5
"""A long frame: a client's answer to one output reaches the worker well before the next tick."""
FRAME = int(FRAME_S * MODEL_RATE)
REPLIES = 3
"""Outputs answered with a marked frame, each expected in the very next output."""
LATE = 90
"""The marker whose frame the stand-in model steps late: it sleeps LATE_SLEEP_FRAMES frames first."""
LATE_SLEEP_FRAMES = 1.25


class EchoAdapter(DuplexAdapter):
    """Each slot's frame is its input frame (FRAME_S long, at the realtime path's 24 kHz), and its first
    frame's text says the voice and instructions its session started with; a frame of the LATE marker
    takes LATE_SLEEP_FRAMES frames to step."""

    sample_rate, frame_samples = MODEL_RATE, FRAME

    def __init__(self, ctx: EngineContext) -> None:
        self.slots = ctx.max_num_seqs
        self.said: dict[int, str] = {}

    def start(self, slot: int, params: dict[str, Any]) -> None:
        self.said[slot] = f"{params.get('voice')}/{params.get('instructions')}"

    def stop(self, slot: int) -> None:
        self.said.pop(slot, None)

    def step(self, frames: np.ndarray) -> list[SlotOutput]:
        if any(heard(f) == LATE for f in frames):
            time.sleep(LATE_SLEEP_FRAMES * FRAME_S)
        return [SlotOutput(frames[s].copy(), self.said.pop(s, "")) for s in range(self.slots)]


@pytest.fixture(scope="module")
async def srv(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RtServer]:
    stages = [{"stage_id": 0, "max_num_seqs": 1,
               "engine_extras": {"adapter": "tests.api.realtime.test_duplex_audit_echo:EchoAdapter",
                                 "frame_budget": 0}}]
    async with serve_rt("moshi", model=str(tmp_path_factory.mktemp("echo")), stages=stages) as server:
        yield server


def marker(k: int) -> np.ndarray:
    """A frame whose samples all say `k`."""
    return np.full(FRAME, k / 100, np.float32)


def heard(x: np.ndarray) -> int | None:
    """The marker a frame echoes (None: silence)."""
    return round(float(np.median(x)) * 100) or None


async def next_audio(client: Any) -> np.ndarray:
    while (event := await client.recv(CLOSE_TIMEOUT_S))["type"] not in AUDIO_EVENTS:
        pass
    return pcm(event["delta"])


async def metrics(srv: RtServer, http: aiohttp.ClientSession) -> dict[str, float]:
    async with http.get(srv.url + "/metrics", headers=srv.headers) as resp:
        text = await resp.text()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name.startswith("omni_duplex") and not s.labels}


async def test_audio_appended_between_two_ticks_is_heard_at_the_next(srv: RtServer) -> None:
    """The engine waited for its tick inside `step`, where the worker reads no message: audio that came
    while it waited (nearly all of a frame) reached the engine only after that tick's frame, a frame late
    (and its input_to_output time was taken from then, so the metric never showed the frame it waited)."""
    async with aiohttp.ClientSession() as http:
        client = await connect(srv, http)
        await client.send("input_audio_buffer.append", audio=b64(marker(1)))
        assert heard(await next_audio(client)) == 1  # the first frame: the audio that opened the stream
        for k in range(2, 2 + REPLIES):
            await client.send("input_audio_buffer.append", audio=b64(marker(k)))  # right after an output
            assert heard(await next_audio(client)) == k, f"marker {k} was not heard at the next tick"
        await client.ws.close()
    await eventually(lambda: srv.stats().duplex.sessions_live == 0 and idle(srv.orch), CLOSE_TIMEOUT_S)


async def test_a_late_frame_skips_ahead_and_says_so_in_metrics(srv: RtServer) -> None:
    """A step that overruns its tick skips the ticks it overran, and the audio of them past the jitter
    frames: the client hears the frames after the skipped one (none queued), and /metrics counts both."""
    frames = [LATE, 2, 3, 4]  # 2 s: all the engine buffers; the late step skips one of the 3 buffered after it
    assert len(frames) * FRAME_S <= MAX_INPUT_S and len(frames) - 1 - JITTER_FRAMES == 1
    async with aiohttp.ClientSession() as http:
        before = await metrics(srv, http)
        client = await connect(srv, http)
        await client.send("input_audio_buffer.append", audio=b64(np.concatenate([marker(k) for k in frames])))
        got = [heard(await next_audio(client)) for _ in range(4)]
        await client.ws.close()
        await eventually(lambda: srv.stats().duplex.sessions_live == 0 and idle(srv.orch), CLOSE_TIMEOUT_S)
        after = await metrics(srv, http)
    assert got == [LATE, 3, 4, None]  # frame 2 skipped with the late tick, then silence: the client sent no more
    assert after["omni_duplex_late_frames_total"] - before["omni_duplex_late_frames_total"] >= 1
    assert after["omni_duplex_dropped_input_seconds_total"] - before["omni_duplex_dropped_input_seconds_total"] \
        == pytest.approx(FRAME_S)


async def test_the_beta_sdk_hears_its_own_audio_and_a_commit_is_refused(srv: RtServer) -> None:
    """The unmodified openai SDK's beta realtime client: the voice and instructions of its session.update
    reach the model (a model that takes them reads them at the stream's start), the model's audio and text
    come under beta names (here its own audio, echoed), `input_audio_buffer.commit` is refused with
    duplex_no_commit, a cancel ends the response."""
    async with sdk(srv).beta.realtime.connect(model="moshi") as conn:
        await conn.session.update(session={"voice": "ash", "instructions": "be brief"})
        await conn.input_audio_buffer.append(audio=b64(marker(5)))
        seen: list[Any] = []
        async for event in conn:
            seen.append(event)
            if event.type == "response.audio_transcript.delta":
                break
        (audio,) = [e for e in seen if e.type == "response.audio.delta"]
        assert heard(pcm(audio.delta)) == 5 and event.delta == "ash/be brief"
        assert "session.updated" in [e.type for e in seen] and "response.created" in [e.type for e in seen]
        await conn.input_audio_buffer.commit(event_id="commit")
        refused = await anext(e async for e in conn if e.type == "error")
        assert (refused.error.code, refused.error.event_id) == ("duplex_no_commit", "commit")
        await conn.response.cancel()
        done = await anext(e async for e in conn if e.type == "response.done")
        assert done.response.status == "cancelled"
    await eventually(lambda: srv.stats().duplex.sessions_live == 0 and idle(srv.orch), CLOSE_TIMEOUT_S)


def test_the_session_limit_gauge_is_read_at_scrape_time() -> None:
    """omni_duplex_session_limit read 0 on a fresh server: the route sets it when a client connects."""
    registry = CollectorRegistry()
    limit = [3]
    registry.register(DuplexCollector(DuplexStats(), lambda: limit[0]))
    for want in (3, 1):
        limit[0] = want
        text = generate_latest(registry).decode()
        assert f"omni_duplex_session_limit {want}.0" in text.splitlines()

