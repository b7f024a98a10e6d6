"""Realtime sessions on models that are no conversational assistant (tiny checkpoints, real servers):
a speech-only model refuses responses up front, and a recognizer's refusal of a session's
transcription options comes at session.update, as /v1/audio/transcriptions answers the same fields."""

from __future__ import annotations

import contextlib
import io
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import openai
import pytest
import soundfile as sf

from omni_actors.api.realtime.audio import WIRE_RATE
from omni_actors.cli import served_folder
from omni_actors.models.tiny import make_tiny
from tests.api.conftest import API_KEY, eventually, idle
from tests.api.realtime.conftest import Client, RtServer, b64, serve_rt

EVENT_TIMEOUT_S = 120.0
"""Longest wait for one event (a tiny model's transcription on a busy 2-core machine)."""
TEXT_ITEM = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello"}]}
GA_OPTIONS = "session.audio.input.transcription"
BETA_OPTIONS = "session.input_audio_transcription"


@contextlib.asynccontextmanager
async def _serve(kind: str, folder: Path) -> AsyncIterator[RtServer]:
    model = make_tiny(kind, folder)
    deploy = served_folder(str(model), {"model": str(model), "server": {"api_keys": [API_KEY]}})
    async with serve_rt(deploy=deploy) as server:
        yield server


@pytest.fixture
async def tts(tmp_path: Path) -> AsyncIterator[RtServer]:
    async with _serve("qwen3_tts", tmp_path / "tiny-tts") as server:
        yield server


@pytest.fixture
async def vox(tmp_path: Path) -> AsyncIterator[RtServer]:
    async with _serve("voxtral_realtime", tmp_path / "tiny-vox") as server:
        yield server


async def _connect(srv: RtServer, http: aiohttp.ClientSession, model: str) -> Client:
    ws = await http.ws_connect(f"{srv.url}/v1/realtime?model={model}", headers=srv.headers, max_msg_size=0,
                               autoclose=False)
    client = Client(ws)
    assert (await client.recv())["type"] == "session.created"
    assert (await client.recv())["type"] == "conversation.created"
    return client


async def _error(client: Client, eid: str) -> dict[str, Any]:
    """The next event, which must be the `error` answering event `eid`."""
    event = await client.recv(EVENT_TIMEOUT_S)
    assert event["type"] == "error", event
    assert event["error"]["event_id"] == eid and event["error"]["type"] == "invalid_request_error", event
    return event["error"]


async def _updated(client: Client, session: dict[str, Any]) -> dict[str, Any]:
    await client.send("session.update", session=session)
    event = await client.recv(EVENT_TIMEOUT_S)
    assert event["type"] == "session.updated", event
    return event["session"]


async def test_a_speech_only_model_refuses_a_conversation_up_front(tts: RtServer) -> None:
    """qwen3_tts speaks a text it is given and answers nothing: each response.create is an `error` saying
    so (as for a model that only transcribes), before any request reaches its stages; the session itself
    (its settings, its voice) goes on, since no other session type would serve it better."""
    async with aiohttp.ClientSession() as http:
        c = await _connect(tts, http, "tiny-tts")
        await _updated(c, {"type": "realtime", "audio": {"input": {"turn_detection": None}}})
        await c.send("conversation.item.create", item=TEXT_ITEM)
        await c.until("conversation.item.done")
        total = tts.orch.statistics().requests_total
        for response in (None, {"output_modalities": ["audio"]}, {"output_modalities": ["text"]}):
            eid = await c.send("response.create", **({"response": response} if response else {}))
            err = await _error(c, eid)
            assert err["code"] == "unsupported_session_type", err
            assert "'tiny-tts' cannot hold a conversation" in err["message"], err
            assert "/v1/audio/speech" in err["message"], err
        err = await _error(c, await c.send("session.update", session={"type": "transcription"}))
        assert (err["code"], err["param"]) == ("unsupported_session_type", "session.type")  # no recognizer
        assert tts.orch.statistics().requests_total == total and not [e for e in c.seen if "response." in e["type"]]
        await c.ws.close()
    # what it does serve, it still serves
    speech = await openai.AsyncOpenAI(base_url=f"{tts.url}/v1", api_key=API_KEY, max_retries=0).audio.speech.create(
        model="tiny-tts", voice="alloy", input="Hello", response_format="wav")
    audio, _ = sf.read(io.BytesIO(speech.content), dtype="float32")
    assert audio.size > 0
    await eventually(lambda: idle(tts.orch), EVENT_TIMEOUT_S)


async def test_transcription_options_the_recognizer_refuses_are_refused_at_session_update(vox: RtServer) -> None:
    """voxtral_realtime takes no prompt and a few languages: a session.update asking for others is an
    `error` naming the option (GA or beta field), with REST's code and the stage's reason, and the
    session keeps its options; options it takes transcribe each turn."""
    rest = openai.AsyncOpenAI(base_url=f"{vox.url}/v1", api_key=API_KEY, max_retries=0)
    wav = io.BytesIO()
    sf.write(wav, np.zeros(16000, np.float32), 16000, format="WAV")
    with pytest.raises(openai.BadRequestError) as by_rest:
        await rest.audio.transcriptions.create(model="tiny-vox", file=("a.wav", wav.getvalue()), prompt="names")
    async with aiohttp.ClientSession() as http:
        c = await _connect(vox, http, "tiny-vox")
        taken = {"model": "tiny-vox"}
        before = await _updated(c, {"type": "transcription", "audio": {"input": {
            "transcription": taken, "turn_detection": None}}})
        assert before["audio"]["input"]["transcription"] == taken
        refused: list[tuple[dict[str, Any], str, str]] = [  # session fields, param, in the message
            ({"audio": {"input": {"transcription": {"model": "tiny-vox", "prompt": "hello"}}}},
             f"{GA_OPTIONS}.prompt", "takes no prompt"),
            ({"type": "transcription", "audio": {"input": {"transcription": {"language": "sw"}}}},
             f"{GA_OPTIONS}.language", "'sw' is not one of them"),
            ({"input_audio_transcription": {"model": "whisper-1", "prompt": "names"}}, f"{BETA_OPTIONS}.prompt",
             "takes no prompt"),
        ]
        for i, (fields, param, reason) in enumerate(refused):
            err = await _error(c, await c.send("session.update", session=fields, event_id=f"opt{i}"))
            assert (err["code"], err["param"]) == (by_rest.value.body["code"], param), (fields, err)
            assert reason in err["message"] and "stage 0" not in err["message"], err
        assert by_rest.value.body["code"] == "rejected_by_stage" and "takes no prompt" in by_rest.value.message
        assert "stage 0" not in by_rest.value.body["message"] and "Error" not in by_rest.value.body["message"]
        assert await _updated(c, {"type": "transcription"}) == before  # nothing refused was taken
        english = {"model": "tiny-vox", "language": "en"}
        after = await _updated(c, {"type": "transcription", "audio": {"input": {"transcription": english}}})
        assert after["audio"]["input"]["transcription"] == english
        tone = (0.2 * np.sin(2 * np.pi * 180 * np.arange(WIRE_RATE) / WIRE_RATE)).astype(np.float32)
        await c.send("input_audio_buffer.append", audio=b64(tone))
        await c.send("input_audio_buffer.commit")
        events = await c.until("conversation.item.input_audio_transcription.completed", EVENT_TIMEOUT_S)
        assert not [e for e in events if e["type"] in ("error", "conversation.item.input_audio_transcription.failed")]
        await c.ws.close()
    await eventually(lambda: idle(vox.orch), EVENT_TIMEOUT_S)  # the checks left no request behind
