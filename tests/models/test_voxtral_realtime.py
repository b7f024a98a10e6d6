"""The voxtral_realtime family end to end: a tiny Voxtral Realtime folder served as `omni-run --model DIR`
serves it, transcribing through /v1/audio/transcriptions with the openai SDK (the reference is
transformers' own processor + generate), and live in /v1/realtime transcription sessions, where the
transcript streams while the audio is still arriving."""

from __future__ import annotations

import asyncio
import base64
import io
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
import soundfile as sf
from openai import AsyncOpenAI

from omni_actors.api.realtime.audio import WIRE_RATE, Resampler, decode_bytes, pcm16_bytes
from omni_actors.api.realtime.vad import VAD_RATE
from omni_actors.cli import served_folder
from omni_actors.models.tiny import make_tiny
from tests.api.conftest import Server, eventually, idle, serve_deploy
from tests.api.realtime.conftest import speak

KEY = "vox-key"
RATE = 16000
EVENT_TIMEOUT_S = 120.0
"""Longest wait for one realtime event (a delta on a busy 2-core machine)."""
DELTA = "conversation.item.input_audio_transcription.delta"
COMPLETED = "conversation.item.input_audio_transcription.completed"


@pytest.fixture(scope="module")
def vox_dir(tmp_path_factory) -> Path:
    return make_tiny("voxtral_realtime", tmp_path_factory.mktemp("models") / "tiny-vox")


@pytest.fixture(scope="module")
async def srv(vox_dir) -> AsyncIterator[Server]:
    deploy = served_folder(str(vox_dir), {"model": str(vox_dir), "server": {"api_keys": [KEY]}})
    async with serve_deploy(deploy, KEY) as server:
        yield server


def _speechlike(seconds: float = 2.0, seed: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * RATE)) / RATE
    return (0.2 * np.sin(2 * np.pi * 180 * t) * (1 + np.sin(2 * np.pi * 3 * t)) / 2
            + 0.01 * rng.standard_normal(t.size)).astype(np.float32)


def _wav(audio: np.ndarray, rate: int = RATE) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, audio, rate, format="WAV", subtype="FLOAT")
    return buf.getvalue()


def _reference(folder: Path, audio: np.ndarray) -> str:
    """What transformers' own processor + generate write for the same audio (greedy, offline padding)."""
    import torch
    from transformers import AutoProcessor, VoxtralRealtimeForConditionalGeneration

    proc = AutoProcessor.from_pretrained(folder)
    model = VoxtralRealtimeForConditionalGeneration.from_pretrained(folder).eval()
    batch = proc(audio, return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**batch)
    return proc.decode(out[0][batch["input_ids"].shape[1]:], skip_special_tokens=True).strip()


async def test_transcribes_like_transformers_and_streams(srv: Server, vox_dir: Path) -> None:
    assert srv.orch.pipeline.name == "voxtral_realtime"
    audio = _speechlike()
    client = srv.client()
    got = await client.audio.transcriptions.create(model="tiny-vox", file=("a.wav", _wav(audio)), language="en")
    want = _reference(vox_dir, audio)
    assert got.text and got.text == want
    events = [e async for e in await client.audio.transcriptions.create(
        model="tiny-vox", file=("a.wav", _wav(audio)), stream=True)]
    assert events[-1].type == "transcript.text.done" and events[-1].text == want
    assert len(events) >= 3 and "".join(e.delta for e in events[:-1]).strip() == want
    # at 44.1 kHz the audio is resampled to the model's 16 kHz first: still a transcript
    other = await client.audio.transcriptions.create(
        model="tiny-vox", file=("b.wav", _wav(_speechlike(1.0, seed=5), 44100)), response_format="text")
    assert isinstance(other, str) and other.strip()
    with pytest.raises(openai.BadRequestError) as err:  # the model takes no context prompt
        await client.audio.transcriptions.create(model="tiny-vox", file=("a.wav", _wav(audio)), prompt="names")
    assert err.value.body["param"] == "prompt", err.value.body
    with pytest.raises(openai.BadRequestError) as err:  # a language the model was not trained on
        await client.audio.transcriptions.create(model="tiny-vox", file=("a.wav", _wav(audio)), language="sw")
    assert err.value.body["param"] == "language" and "en, es" in err.value.body["message"], err.value.body
    await eventually(lambda: idle(srv.orch))


async def _until(conn: Any, last: str) -> list[Any]:
    """Events up to and including the first of type `last`."""
    events = []
    while not events or events[-1].type != last:
        events.append(await asyncio.wait_for(conn.recv(), EVENT_TIMEOUT_S))
    return events


def _sdk(srv: Server) -> AsyncOpenAI:
    return AsyncOpenAI(api_key=KEY, base_url=f"{srv.url}/v1", max_retries=0,
                       websocket_base_url=srv.url.replace("http://", "ws://") + "/v1")


async def test_live_transcript_streams_before_the_commit(srv: Server) -> None:
    """Manual commits: the turn's transcript deltas arrive while its audio is still uncommitted; the
    completed transcript (after the commit) is what /v1/audio/transcriptions writes for the same
    16 kHz samples, and the deltas add up to it. A cleared buffer first drops the turn being heard
    (its request ends, no transcript) and the session goes on."""
    spoken = Resampler(RATE, WIRE_RATE).push(_speechlike(2.5, seed=7))
    async with _sdk(srv).realtime.connect(model="tiny-vox") as conn:
        await _until(conn, "conversation.created")
        await conn.session.update(session={"type": "transcription", "audio": {"input": {
            "transcription": {"model": "tiny-vox"}, "turn_detection": None}}})
        await _until(conn, "session.updated")
        await conn.input_audio_buffer.append(audio=base64.b64encode(pcm16_bytes(spoken[: WIRE_RATE // 2])).decode())
        await eventually(lambda: srv.orch.statistics().requests_in_flight == 1)  # the turn is being heard
        await conn.input_audio_buffer.clear()
        cleared = await _until(conn, "input_audio_buffer.cleared")
        assert not [e for e in cleared if e.type in (DELTA, COMPLETED)]
        await eventually(lambda: idle(srv.orch))
    async with _sdk(srv).realtime.connect(model="tiny-vox") as conn:  # a fresh session: its resampler starts clean
        await conn.session.update(session={"type": "transcription", "audio": {"input": {
            "transcription": {"model": "tiny-vox"}, "turn_detection": None}}})
        await _until(conn, "session.updated")
        wire = pcm16_bytes(spoken)
        step = len(wire) // 10 // 2 * 2
        for at in range(0, len(wire), step):
            await conn.input_audio_buffer.append(audio=base64.b64encode(wire[at : at + step]).decode())
        early = await _until(conn, DELTA)  # nothing committed yet: a live transcript
        assert not [e for e in early if e.type == "input_audio_buffer.committed"]
        await conn.input_audio_buffer.commit()
        events = early + await _until(conn, COMPLETED)
    types = [e.type for e in events]
    committed = next(e for e in events if e.type == "input_audio_buffer.committed")
    assert types.index("input_audio_buffer.committed") < types.index("conversation.item.added") < len(types) - 1
    deltas = [e for e in events if e.type == DELTA]
    done = events[-1]
    assert {d.item_id for d in deltas} == {committed.item_id} == {done.item_id}
    assert done.transcript and "".join(d.delta for d in deltas) == done.transcript
    resampler = Resampler(WIRE_RATE, VAD_RATE)
    x = decode_bytes(wire, "pcm16")
    at16k = np.concatenate([resampler.push(x), resampler.flush()])
    rest = await srv.client().audio.transcriptions.create(model="tiny-vox", file=("a.wav", _wav(at16k, VAD_RATE)))
    assert done.transcript == rest.text
    await eventually(lambda: idle(srv.orch))


async def test_turns_cleared_or_dropped_at_once_end_their_requests(srv: Server) -> None:
    """An append then a clear (or a closed socket) straight away, before the turn's task has run:
    the turn's request still ends (it used to stay in the stage, and 64 of them filled its queue)."""
    wire = base64.b64encode(pcm16_bytes(Resampler(RATE, WIRE_RATE).push(_speechlike(0.2, seed=5)))).decode()
    session = {"type": "transcription", "audio": {"input": {"transcription": {"model": "tiny-vox"}, "turn_detection": None}}}
    async with _sdk(srv).realtime.connect(model="tiny-vox") as conn:
        await conn.session.update(session=session)
        await _until(conn, "session.updated")
        for _ in range(5):
            await conn.input_audio_buffer.append(audio=wire)
            await conn.input_audio_buffer.clear()
        for _ in range(5):
            await _until(conn, "input_audio_buffer.cleared")
        await eventually(lambda: idle(srv.orch), timeout_s=EVENT_TIMEOUT_S)
    for _ in range(3):
        async with _sdk(srv).realtime.connect(model="tiny-vox") as conn:
            await conn.session.update(session=session)
            await _until(conn, "session.updated")
            await conn.input_audio_buffer.append(audio=wire)
    await eventually(lambda: idle(srv.orch), timeout_s=EVENT_TIMEOUT_S)
    assert srv.orch.statistics().requests_in_flight == 0


async def test_live_transcription_with_server_vad(srv: Server, tmp_path: Path) -> None:
    """Server VAD: the turn is heard from speech_started on, under the item id speech_started named."""
    spoken = speak("Hello there. How are you today?", tmp_path)
    silence = np.zeros(WIRE_RATE, np.float32)
    async with _sdk(srv).realtime.connect(model="tiny-vox") as conn:
        await conn.session.update(session={"type": "transcription", "audio": {"input": {
            "transcription": {"model": "tiny-vox"}, "turn_detection": {"type": "server_vad"}}}})
        await _until(conn, "session.updated")
        audio = np.concatenate([silence[: WIRE_RATE // 2], spoken, silence])
        for chunk in np.array_split(audio, 20):
            await conn.input_audio_buffer.append(audio=base64.b64encode(pcm16_bytes(chunk)).decode())
        events = await _until(conn, COMPLETED)
    types = [e.type for e in events]
    started = next(e for e in events if e.type == "input_audio_buffer.speech_started")
    assert types.index("input_audio_buffer.speech_stopped") < types.index("input_audio_buffer.committed")
    assert not [t for t in types if t.startswith("response.")]
    deltas = [e for e in events if e.type == DELTA]
    done = events[-1]
    assert done.item_id == started.item_id and {d.item_id for d in deltas} == {started.item_id}
    assert done.transcript and "".join(d.delta for d in deltas) == done.transcript
    await eventually(lambda: idle(srv.orch))


async def _live_turn(srv: Server, spoken: np.ndarray, pieces: int) -> tuple[str, str]:
    """One manual-commit session hearing `spoken` in `pieces` appends: (its transcript, REST's for it)."""
    wire = pcm16_bytes(spoken)
    async with _sdk(srv).realtime.connect(model="tiny-vox") as conn:
        await conn.session.update(session={"type": "transcription", "audio": {"input": {
            "transcription": {"model": "tiny-vox"}, "turn_detection": None}}})
        await _until(conn, "session.updated")
        step = len(wire) // pieces // 2 * 2
        for at in range(0, len(wire), step):
            await conn.input_audio_buffer.append(audio=base64.b64encode(wire[at : at + step]).decode())
            await asyncio.sleep(0)  # let the other session's appends interleave
        await conn.input_audio_buffer.commit()
        done = (await _until(conn, COMPLETED))[-1]
    resampler = Resampler(WIRE_RATE, VAD_RATE)
    x = decode_bytes(wire, "pcm16")
    at16k = np.concatenate([resampler.push(x), resampler.flush()])
    rest = await srv.client().audio.transcriptions.create(model="tiny-vox", file=("a.wav", _wav(at16k, VAD_RATE)))
    return done.transcript, rest.text


async def test_concurrent_live_turns_batch_and_stay_apart(srv: Server) -> None:
    """Two sessions heard at once (their streaming requests share decode steps at different positions)
    each get the transcript of their own audio."""
    a = Resampler(RATE, WIRE_RATE).push(_speechlike(1.5, seed=11))
    b = Resampler(RATE, WIRE_RATE).push(0.5 * _speechlike(3.0, seed=12)[::-1].copy())
    (got_a, want_a), (got_b, want_b) = await asyncio.gather(_live_turn(srv, a, 7), _live_turn(srv, b, 13))
    assert got_a == want_a and got_b == want_b and got_a != got_b
    await eventually(lambda: idle(srv.orch))
