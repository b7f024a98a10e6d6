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
from tests.api.realtime.test_sdk import sdk

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


@pytest.fixture(scope="module")
async def asr() -> AsyncIterator[RtServer]:
    """The synthetic recognizer ("N samples at R Hz" of the audio it hears): cheap, for every test here."""
    async with serve_rt("synthetic_asr") as server:
        yield server


ASR_DONE = "conversation.item.input_audio_transcription.completed"


async def test_the_openai_sdks_beta_transcription_client_is_served(asr: RtServer) -> None:
    """OpenAI's beta transcription API (`?intent=transcription`, transcription_session.update): the
    unmodified SDK's beta client gets transcription_session.* and each committed turn's transcript,
    the same text a GA transcription session gets for the same audio; what a transcription session
    cannot do is an `error`."""
    clip = b64((0.2 * np.sin(2 * np.pi * 220 * np.arange(WIRE_RATE) / WIRE_RATE)).astype(np.float32))
    async with sdk(asr).beta.realtime.connect(model="whisper-1", extra_query={"intent": "transcription"}) as conn:
        created = await conn.recv()
        assert created.type == "transcription_session.created", created
        assert created.to_dict()["session"]["object"] == "realtime.transcription_session"  # (no SDK model of it)
        await conn.transcription_session.update(session={
            "input_audio_transcription": {"model": "whisper-1", "language": "en"}, "turn_detection": None})
        updated = await conn.recv()
        assert updated.type == "transcription_session.updated", updated
        assert updated.session.input_audio_transcription.language == "en"  # type: ignore[union-attr]
        assert updated.session.turn_detection is None  # type: ignore[union-attr]
        await conn.response.create()  # no responses in a transcription session
        refused = await conn.recv()
        assert refused.type == "error" and refused.error.code == "unsupported_in_transcription_session"  # type: ignore[union-attr]
        await conn.input_audio_buffer.append(audio=clip)
        await conn.input_audio_buffer.commit()
        seen = []
        async for event in conn:
            seen.append(event)
            if event.type in (ASR_DONE, "error", "conversation.item.input_audio_transcription.failed"):
                break
        types = [e.type for e in seen]
        assert types[:2] == ["input_audio_buffer.committed", "conversation.item.created"], types
        assert types[-1] == ASR_DONE, seen[-1]
        item_id = seen[0].item_id  # type: ignore[union-attr]
        deltas = [e for e in seen if e.type == "conversation.item.input_audio_transcription.delta"]
        assert deltas and {e.item_id for e in deltas} == {item_id}  # type: ignore[union-attr]
        heard = seen[-1].transcript  # type: ignore[union-attr]
        assert "".join(e.delta for e in deltas) == heard and "samples at 16000 Hz" in heard  # type: ignore[union-attr]
    async with aiohttp.ClientSession() as http:  # the GA session hears the same audio alike
        c = await _connect(asr, http, "whisper-1")
        await _updated(c, {"type": "transcription", "audio": {"input": {"turn_detection": None}}})
        await c.send("input_audio_buffer.append", audio=clip)
        await c.send("input_audio_buffer.commit")
        assert (await c.until(ASR_DONE))[-1]["transcript"] == heard
        await c.ws.close()
    await eventually(lambda: idle(asr.orch))


async def test_beta_transcription_session_update_is_checked_as_the_ga_one(asr: RtServer) -> None:
    """transcription_session.update on a session opened without the intent makes it a beta transcription
    session; what it cannot serve (noise reduction, logprobs) or a wrong field is an `error` naming the
    field, coded as REST codes it, and changes nothing; session.update is then refused."""
    async with aiohttp.ClientSession() as http:
        c = await _connect(asr, http, "whisper-1")
        bad: list[tuple[dict[str, Any], str, str]] = [  # session fields, code, param
            ({"input_audio_noise_reduction": {"type": "near_field"}}, "unsupported_parameter",
             "session.input_audio_noise_reduction"),
            ({"include": ["item.input_audio_transcription.logprobs"]}, "unsupported_parameter", "session.include"),
            ({"input_audio_transcription": {"language": 5}}, "invalid_type", "session.input_audio_transcription.language"),
            ({"turn_detection": {"type": "push_to_talk"}}, "invalid_value", "session.turn_detection.type"),
            ({"input_audio_format": "mp3"}, "invalid_value", "session.input_audio_format"),
            ({"input_audio_noise_reduction": {"type": "anywhere"}}, "invalid_value",
             "session.input_audio_noise_reduction.type"),
        ]
        for i, (fields, code, param) in enumerate(bad):
            eid = await c.send("transcription_session.update", session=fields, event_id=f"t{i}")
            err = await _error(c, eid)
            assert (err["code"], err["param"]) == (code, param), (fields, err)
        await c.send("transcription_session.update", session={
            "input_audio_format": "g711_ulaw", "input_audio_noise_reduction": None, "include": [],
            "turn_detection": {"type": "server_vad", "silence_duration_ms": 300}})
        event = await c.recv()
        assert event["type"] == "transcription_session.updated", event
        session = event["session"]
        assert (session["object"], session["input_audio_format"]) == ("realtime.transcription_session", "g711_ulaw")
        assert session["turn_detection"]["silence_duration_ms"] == 300 and session["input_audio_noise_reduction"] is None
        err = await _error(c, await c.send("session.update", session={"instructions": "hi"}))
        assert err["code"] == "unsupported_in_transcription_session", err
        await c.ws.close()
    async with aiohttp.ClientSession(headers=asr.headers) as http:  # an intent it does not know: a 400
        async with http.get(f"{asr.url}/v1/realtime?model=x&intent=translation", headers={"Upgrade": "websocket"}) as resp:
            body = await resp.json()
        assert resp.status == 400 and (body["error"]["code"], body["error"]["param"]) == ("invalid_value", "intent")
