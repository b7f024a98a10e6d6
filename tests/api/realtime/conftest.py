"""Realtime test helpers: a synthetic pipeline behind a real server, WebSocket clients, espeak speech."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import soundfile as sf
from aiohttp import web

import omni_actors
from omni_actors.api.app import build_app
from omni_actors.api.realtime import SESSIONS_KEY, STATS_KEY
from omni_actors.api.realtime.audio import WIRE_RATE, pcm16_bytes, resample
from omni_actors.api.realtime.stats import RealtimeStatistics
from omni_actors.api.server import start_server
from omni_actors.config.deploy import DeployConfig, load_deploy
from omni_actors.models.assistant.prepare import default_data_dir, is_prepared
from tests.api.conftest import API_KEY, Server
from tests.conftest import make_deploy, running

STEP_MS = 20
"""Synthetic compute per step: a default response (8 chunks) takes ~200 ms."""
MODEL_RATE = 22_050
"""The synthetic vocoder's rate, unlike the wire's, so output resampling is exercised."""
STAGES = [
    {"stage_id": 0, "engine_extras": {"chunks": 8, "step_delay_ms": STEP_MS}},
    {"stage_id": 1, "engine_extras": {"step_delay_ms": 2}},
    {"stage_id": 2, "engine_extras": {"sample_rate": MODEL_RATE, "samples": 2205, "step_delay_ms": 2}},
]
EVENT_TIMEOUT_S = 10.0


def speak(text: str, tmp: Path) -> np.ndarray:
    """espeak-ng speech for `text`, float32 mono at the wire rate."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed")
    wav = tmp / f"{abs(hash(text))}.wav"
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp)}  # else espeak-ng leaves a /tmp/pulse-* behind
    subprocess.run(["espeak-ng", "-w", str(wav), text], check=True, capture_output=True, env=env)
    x, rate = sf.read(wav, dtype="float32")
    return resample(x, rate, WIRE_RATE)


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * WIRE_RATE), np.float32)


def padded(x: np.ndarray, lead_s: float, tail_s: float) -> np.ndarray:
    """`x` with `lead_s` of silence before it and `tail_s` after (a turn as a microphone sends it)."""
    return np.concatenate([silence(lead_s), x, silence(tail_s)])


def b64(x: np.ndarray) -> str:
    return base64.b64encode(pcm16_bytes(x)).decode()


def pcm(delta: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(delta), "<i2").astype(np.float32) / 32768


class Client:
    """One realtime WebSocket connection with helpers to send events and wait for others."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.seen: list[dict[str, Any]] = []
        self._n = 0

    async def send(self, type: str, **fields: Any) -> str:
        self._n += 1
        event_id = fields.pop("event_id", f"c{self._n}")
        await self.ws.send_json({"type": type, "event_id": event_id, **fields})
        return event_id

    async def append(self, audio: np.ndarray, chunk_s: float = 0.1, pace: float = 0.0) -> None:
        """Stream audio in chunks (pace 1.0 = real time; 0 = as fast as possible)."""
        step = int(chunk_s * WIRE_RATE)
        for i in range(0, len(audio), step):
            await self.send("input_audio_buffer.append", audio=b64(audio[i:i + step]))
            if pace:
                await asyncio.sleep(chunk_s / pace)

    async def recv(self, timeout_s: float = EVENT_TIMEOUT_S) -> dict[str, Any]:
        msg = await self.ws.receive(timeout=timeout_s)
        assert msg.type == aiohttp.WSMsgType.TEXT, f"unexpected frame {msg.type} {msg.data!r}"
        event = msg.json()
        self.seen.append(event)
        return event

    async def until(self, type: str, timeout_s: float = EVENT_TIMEOUT_S) -> list[dict[str, Any]]:
        """Events received up to and including the first of `type`."""
        out = []
        while True:
            event = await self.recv(timeout_s)
            out.append(event)
            if event["type"] == type:
                return out


async def connect(srv: Server, session: aiohttp.ClientSession, **session_fields: Any) -> Client:
    ws = await session.ws_connect(f"{srv.url}/v1/realtime?model=synthetic", headers=srv.headers,
                                  max_msg_size=0, autoclose=False)
    client = Client(ws)
    assert (await client.recv())["type"] == "session.created"
    assert (await client.recv())["type"] == "conversation.created"
    if session_fields:
        await client.send("session.update", session=session_fields)
        await client.until("session.updated")
    return client


def of_type(events: list[dict[str, Any]], type: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == type]


def response_audio(events: list[dict[str, Any]]) -> np.ndarray:
    deltas = [pcm(e["delta"]) for e in events if e["type"] in ("response.audio.delta", "response.output_audio.delta")]
    return np.concatenate(deltas) if deltas else np.zeros(0, np.float32)


@dataclass
class RtServer(Server):
    app: web.Application | None = None

    @property
    def sessions(self) -> set:
        assert self.app is not None
        return self.app[SESSIONS_KEY]

    def stats(self) -> RealtimeStatistics:
        assert self.app is not None
        return self.app[STATS_KEY].statistics()


@contextlib.asynccontextmanager
async def serve_rt(pipeline: str = "synthetic", deploy: DeployConfig | None = None,
                   **raw: Any) -> AsyncIterator[RtServer]:
    """Workers plus a real HTTP server on a free port (the REST tests' `serve`, keeping the app)."""
    if deploy is None:
        deploy = make_deploy(pipeline, server={"api_keys": [API_KEY], **raw.pop("server", {})}, **raw)
    async with running(deploy) as orch:
        app = build_app(orch)
        http = await start_server(app, "127.0.0.1", 0, deploy.server)
        try:
            yield RtServer(orch, http.url, API_KEY, http, app)
        finally:
            await http.close()


def assistant_deploy() -> DeployConfig:
    """The speech assistant's deploy over its prepared models (the test is skipped where they are not)."""
    if not is_prepared():
        pytest.skip("assistant models are not prepared (omni-run prepare assistant)")
    return load_deploy(Path(omni_actors.__file__).parent / "deploy" / "assistant.yaml",
                       {"model": str(default_data_dir()), "server": {"api_keys": [API_KEY]}})


@pytest.fixture(scope="module")
async def srv() -> AsyncIterator[RtServer]:
    async with serve_rt("synthetic", stages=STAGES, server={"max_realtime_sessions": 16}) as server:
        yield server


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    tmp = tmp_path_factory.mktemp("speech")
    return {
        "hello": speak("Hello there, what is the weather like in Paris today?", tmp),
        "stop": speak("Wait, stop, tell me about Rome instead.", tmp),
    }


@pytest.fixture(scope="session")
def tiny_moshi(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny Moshi checkpoint for every duplex test of a test process (~8 s to build; read only)."""
    from omni_actors.models.tiny import make_tiny

    return make_tiny("moshi", tmp_path_factory.mktemp("moshi"))
