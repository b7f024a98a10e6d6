"""The qwen3_asr family end to end: a tiny Qwen3-ASR folder served as `omni-run --model DIR` serves it,
transcribing through /v1/audio/transcriptions with the openai SDK (the reference is transformers' own
generate) and through a /v1/realtime transcription session with the SDK's realtime client; and, in
process, the adapter reading the language the model names ("language <Name><asr_text>") from
constructed outputs."""

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
from omni_actors.models.qwen3_asr.asr import Qwen3AsrAdapter
from omni_actors.models.tiny import make_tiny
from omni_actors.workers.engine import EngineContext
from omni_actors.workers.engines.hf_ar_adapter import ARSeq
from tests.api.conftest import Server, eventually, idle, serve_deploy
from tests.api.realtime.conftest import speak

KEY = "asr-key"
RATE = 16000
EVENT_TIMEOUT_S = 120.0
"""Longest wait for one realtime event (a turn's transcription on a busy 2-core machine)."""


@pytest.fixture(scope="module")
def asr_dir(tmp_path_factory) -> Path:
    return make_tiny("qwen3_asr", tmp_path_factory.mktemp("models") / "tiny-asr")


@pytest.fixture(scope="module")
async def srv(asr_dir) -> AsyncIterator[Server]:
    deploy = served_folder(str(asr_dir), {"model": str(asr_dir), "server": {"api_keys": [KEY]}})
    async with serve_deploy(deploy, KEY) as server:
        yield server


def _speechlike() -> np.ndarray:
    rng = np.random.default_rng(3)
    t = np.arange(2 * RATE) / RATE
    return (0.2 * np.sin(2 * np.pi * 180 * t) * (1 + np.sin(2 * np.pi * 3 * t)) / 2
            + 0.01 * rng.standard_normal(t.size)).astype(np.float32)


def _reference(folder: Path, audio: np.ndarray) -> str:
    """What transformers' own processor + generate write for the same audio (greedy, language forced)."""
    import torch
    from transformers import AutoProcessor, Qwen3ASRForConditionalGeneration

    proc = AutoProcessor.from_pretrained(folder)
    model = Qwen3ASRForConditionalGeneration.from_pretrained(folder).eval()
    batch = proc.apply_transcription_request(audio=audio, language="en")
    with torch.inference_mode():
        out = model.generate(**batch, do_sample=False)
    return proc.decode(out[0][batch["input_ids"].shape[1]:], skip_special_tokens=True).strip()


async def test_transcribes_like_transformers_and_streams(srv: Server, asr_dir: Path) -> None:
    assert srv.orch.pipeline.name == "qwen3_asr"
    audio = _speechlike()
    buf = io.BytesIO()
    sf.write(buf, audio, RATE, format="WAV", subtype="FLOAT")
    wav = buf.getvalue()
    client = srv.client()
    got = await client.audio.transcriptions.create(model="tiny-asr", file=("a.wav", wav), language="en")
    want = _reference(asr_dir, audio)
    assert got.text and got.text == want
    events = [e async for e in await client.audio.transcriptions.create(
        model="tiny-asr", file=("a.wav", wav), language="en", stream=True)]
    assert events[-1].type == "transcript.text.done" and events[-1].text == want
    assert events[-1].usage is None and (got.usage.type, got.usage.seconds) == ("duration", 2)
    assert len(events) >= 3 and "".join(e.delta for e in events[:-1]).strip() == want
    # without a language the model names it itself; only text after <asr_text> is sent
    auto = await client.audio.transcriptions.create(model="tiny-asr", file=("a.wav", wav), response_format="text")
    assert isinstance(auto, str) and "<asr_text>" not in auto and "language" not in auto.split(" ")[:1]
    with pytest.raises(openai.BadRequestError) as err:  # the processor's refusal, naming the field
        await client.audio.transcriptions.create(model="tiny-asr", file=("a.wav", wav), language="klingon")
    assert err.value.body["param"] == "language" and "klingon" in err.value.message, err.value.body
    await eventually(lambda: idle(srv.orch))


def test_the_language_the_model_names_is_reported(asr_dir: Path) -> None:
    """In process, the real adapter and tokenizer on constructed outputs: the model's own "language
    <Name><asr_text>" gives the step's "language" (what transformers' parser reads from the same output),
    "language None" gives none, and only the text after <asr_text> is sent, a split character whole."""
    ctx = EngineContext(stage_id=0, replica=0, model_stage="asr", model_path=asr_dir, device="cpu",
                        max_num_seqs=2, dtype="float32", gpu_memory_utilization=0.5, tensor_parallel_size=1)
    adapter = Qwen3AsrAdapter(ctx)
    adapter.load()
    tok, eos = adapter.tokenizer, min(adapter.eos)
    for raw, language in (("language English<asr_text>Hello there", "English"),
                          ("language Chinese<asr_text>你好世界", "Chinese"), ("language None<asr_text>", None)):
        seq = ARSeq("r", {}, streaming=False)
        adapter.start(seq, {"audio": _speechlike()[:RATE // 10], "sample_rate": RATE})
        ids = [*tok.encode(raw, add_special_tokens=False), eos]
        payloads = [adapter.on_tokens([seq], [t], None, False)[0][0] for t in ids]
        want = adapter.processor.parse_output(tok.decode(ids[:-1], skip_special_tokens=False))
        assert want["language"] == language, want
        assert [p["language"] for p in payloads if "language" in p] == ([language] if language else []), payloads
        assert "".join(p["text"] for p in payloads) == want["transcription"] == raw.partition("<asr_text>")[2]
        assert all("\ufffd" not in p["text"] for p in payloads)
    forced = ARSeq("f", {"language": "en"}, streaming=False)  # prefilled tag: all the model writes is text
    adapter.start(forced, {"audio": _speechlike()[:RATE // 10], "sample_rate": RATE})
    payloads = [adapter.on_tokens([forced], [t], None, False)[0][0] for t in tok.encode("Hi", add_special_tokens=False)]
    assert "".join(p["text"] for p in payloads) == "Hi" and not any("language" in p for p in payloads)


async def test_verbose_json_names_the_language_as_openai(srv: Server) -> None:
    """verbose_json's `language` is OpenAI's lower-case English name, whether the request gave a name in any
    case or a code (before 2026-12-05: "English" was echoed, "yue" stayed a code)."""
    wav = _wav(_speechlike(), RATE)
    client = srv.client()
    for asked, named in (("English", "english"), ("en", "english"), ("FR", "french"), ("yue", "cantonese")):
        got = await client.audio.transcriptions.create(model="tiny-asr", file=("a.wav", wav), language=asked,
                                                       response_format="verbose_json")
        assert got.language == named, (asked, got.language)
    await eventually(lambda: idle(srv.orch))


def _wav(audio: np.ndarray, rate: int) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, audio, rate, format="WAV", subtype="FLOAT")
    return buf.getvalue()


async def _until(conn: Any, last: str) -> list[Any]:
    """Events up to and including the first of type `last`."""
    events = []
    while not events or events[-1].type != last:
        events.append(await asyncio.wait_for(conn.recv(), EVENT_TIMEOUT_S))
    return events


def _turn(events: list[Any]) -> str:
    """A turn's transcript: committed, announced, then deltas adding up to the completed transcript."""
    types = [e.type for e in events]
    assert not [t for t in types if t.startswith("response.")], types  # no model response, ever
    committed = next(e for e in events if e.type == "input_audio_buffer.committed")
    assert types.index("input_audio_buffer.committed") < types.index("conversation.item.added")
    deltas = [e for e in events if e.type == "conversation.item.input_audio_transcription.delta"]
    done = events[-1]
    assert done.type == "conversation.item.input_audio_transcription.completed"
    assert done.item_id == committed.item_id and {d.item_id for d in deltas} == {committed.item_id}
    assert done.transcript and "".join(d.delta for d in deltas) == done.transcript
    return done.transcript


async def test_realtime_transcription_session(srv: Server, tmp_path: Path) -> None:
    """GA `session.type: "transcription"`: each turn (server VAD, then a manual commit) is transcribed
    as /v1/audio/transcriptions transcribes the same audio, and no response is made; a conversation
    session is refused with an error saying the model only transcribes."""
    spoken = speak("Hello there. How are you today?", tmp_path)
    silence = np.zeros(WIRE_RATE, np.float32)
    sdk = AsyncOpenAI(api_key=KEY, base_url=f"{srv.url}/v1", max_retries=0,
                      websocket_base_url=srv.url.replace("http://", "ws://") + "/v1")
    transcription = {"model": "tiny-asr", "language": "en"}
    async with sdk.realtime.connect(model="tiny-asr") as conn:
        await _until(conn, "conversation.created")
        await conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
        (refused,) = await _until(conn, "error")
        assert refused.error.param == "session.type" and "only transcribes" in refused.error.message
        await conn.response.create()
        (refused,) = await _until(conn, "error")
        assert "only transcribes" in refused.error.message

        await conn.session.update(session={"type": "transcription", "audio": {"input": {
            "transcription": transcription, "turn_detection": {"type": "server_vad"}}}})
        updated = (await _until(conn, "session.updated"))[-1]
        assert updated.session.type == "transcription"
        assert updated.session.audio.input.turn_detection.type == "server_vad"
        audio = np.concatenate([silence[: WIRE_RATE // 2], spoken, silence])
        for chunk in np.array_split(audio, 20):
            await conn.input_audio_buffer.append(audio=base64.b64encode(pcm16_bytes(chunk)).decode())
        events = await _until(conn, "conversation.item.input_audio_transcription.completed")
        types = [e.type for e in events]
        assert types.index("input_audio_buffer.speech_started") < types.index("input_audio_buffer.speech_stopped")
        assert types.index("input_audio_buffer.speech_stopped") < types.index("input_audio_buffer.committed")
        _turn(events)
        await conn.response.create()
        (refused,) = await _until(conn, "error")
        assert refused.error.code == "unsupported_in_transcription_session"

    async with sdk.realtime.connect(model="tiny-asr") as conn:  # a fresh session: its resampler starts clean
        # a manual commit of known audio: the same text the REST route writes for the same 16 kHz samples
        await conn.session.update(session={"type": "transcription", "audio": {"input": {
            "transcription": transcription, "turn_detection": None}}})
        await _until(conn, "session.updated")
        wire = pcm16_bytes(spoken)
        await conn.input_audio_buffer.append(audio=base64.b64encode(wire).decode())
        await conn.input_audio_buffer.commit()
        heard = _turn(await _until(conn, "conversation.item.input_audio_transcription.completed"))
    resampler = Resampler(WIRE_RATE, VAD_RATE)
    x = decode_bytes(wire, "pcm16")
    at16k = np.concatenate([resampler.push(x), resampler.flush()])
    rest = await srv.client().audio.transcriptions.create(model="tiny-asr", file=("a.wav", _wav(at16k, VAD_RATE)),
                                                          language="en")
    assert heard == rest.text
    await eventually(lambda: idle(srv.orch))
