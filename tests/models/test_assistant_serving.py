"""The assistant served for real: its workers behind the aiohttp app, driven by the openai SDK.

One server for the whole module (it loads vLLM). Speech the tests send is made
by the server's own TTS path; speech it returns is checked by the server's own
ASR stage (a transcript-only request straight to the orchestrator). The last
test talks to it in the playground, for real: Chromium's fake microphone plays
the question (`--use-file-for-fake-audio-capture`), the page streams it to
/v1/realtime through its AudioWorklet, the server's VAD ends the turn, and the
answer's words appear in `talk-transcript` while its audio plays.
"""

from __future__ import annotations

import base64
import io
import json
import time
from collections.abc import AsyncIterator
from typing import Literal

import numpy as np
import openai
import pytest
import soundfile as sf
from assistant_support import assistant_dir, normalize
from openai import AsyncOpenAI
from pydantic import BaseModel

from omni_actors.api.realtime.audio import WIRE_RATE, pcm16_bytes, resample
from omni_actors.cli import bundled_deploy
from omni_actors.config.deploy import load_deploy
from omni_actors.models.assistant import ASR, LLM, TTS, VOCODER
from omni_actors.orchestrator.core import Orchestrator
from omni_actors.orchestrator.requests import RequestSpec
from tests.api.conftest import Server, eventually, idle, serve_deploy
from tests.browser_support import browser_page

__all__ = ["assistant_dir"]  # the fixture, imported for pytest

KEY = "assistant-test-key"
QUESTION = "What is the capital of France?"
THREE_SENTENCES = (
    "The weather is lovely today. We should walk to the park after lunch. Bring a hat and some water."
)
MAX_TOKENS = 40
"""Enough for SmolLM2's answer to QUESTION to name the city; short keeps the module quick."""
REQUEST_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
async def srv(assistant_dir, vllm_cache) -> AsyncIterator[Server]:
    """The bundled deploy (as `omni-run` serves it) on a free port, with an API key (and the run's vLLM cache)."""
    cache = {"stage_id": LLM, "engine_extras": {"cache_dir": str(vllm_cache)}}
    deploy = load_deploy(bundled_deploy(), {"model": str(assistant_dir), "server": {"api_keys": [KEY]},
                                            "stages": [cache]})
    async with serve_deploy(deploy, KEY) as server:
        yield server


def client(srv: Server) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{srv.url}/v1", api_key=KEY, max_retries=0, timeout=REQUEST_TIMEOUT_S,
                       websocket_base_url=srv.url.replace("http://", "ws://") + "/v1")


async def transcribe(orch: Orchestrator, wave: np.ndarray, rate: int) -> str:
    """The server's ASR stage alone (the planner's transcript-only route)."""
    stream = orch.submit(RequestSpec(inputs={"audio": wave.astype(np.float32), "sample_rate": rate},
                                     params={"modalities": ["transcript"]}))
    chunks = await stream.collect()
    assert {c.stage_id for c in chunks} == {ASR}
    return "".join(c.data.get("text", "") for c in chunks).strip()


def read_wav(data: bytes) -> tuple[np.ndarray, int]:
    wave, rate = sf.read(io.BytesIO(data), dtype="float32")
    return wave.reshape(-1), int(rate)


@pytest.fixture(scope="module")
async def question_wav(srv: Server) -> bytes:
    """QUESTION spoken by the server's TTS path (/v1/audio/speech), as a WAV file."""
    resp = await client(srv).audio.speech.create(model="assistant", voice="alloy", input=QUESTION,
                                                 response_format="wav")
    return resp.content


async def test_speech_is_intelligible(srv: Server, question_wav: bytes) -> None:
    wave, rate = read_wav(question_wav)
    assert rate == 22050 and 1.0 < wave.size / rate < 6.0
    assert normalize(await transcribe(srv.orch, wave, rate)) == normalize(QUESTION)


async def test_spoken_round_trip(srv: Server, question_wav: bytes) -> None:
    """A spoken question in, a spoken answer out whose transcript names the answer."""
    answer = await client(srv).chat.completions.create(
        model="assistant",
        modalities=["text", "audio"],
        audio={"voice": "alloy", "format": "wav"},
        max_tokens=MAX_TOKENS,
        messages=[{"role": "user", "content": [{"type": "input_audio", "input_audio": {
            "data": base64.b64encode(question_wav).decode(), "format": "wav"}}]}],
    )
    message = answer.choices[0].message
    assert "paris" in normalize(message.content or ""), message.content
    assert message.audio is not None and message.audio.transcript == message.content
    wave, rate = read_wav(base64.b64decode(message.audio.data))
    assert wave.size / rate > 0.5
    heard = await transcribe(srv.orch, wave, rate)
    assert "paris" in normalize(heard), (message.content, heard)
    await eventually(lambda: idle(srv.orch))


async def test_speech_streams_progressively(srv: Server) -> None:
    """Chunked /v1/audio/speech: the first bytes arrive well before the last."""
    started = time.monotonic()
    arrivals: list[tuple[float, int]] = []
    async with client(srv).audio.speech.with_streaming_response.create(
        model="assistant", voice="alloy", input=THREE_SENTENCES, response_format="pcm",
        extra_body={"stream": True},
    ) as resp:
        assert resp.headers.get("transfer-encoding") == "chunked"
        async for piece in resp.iter_bytes():
            arrivals.append((time.monotonic() - started, len(piece)))
    total = sum(n for _, n in arrivals)
    seconds = total / 2 / 24000  # pcm: 16-bit mono at 24 kHz, as OpenAI sends it
    assert 4.0 < seconds < 15.0, seconds
    first, last = arrivals[0][0], arrivals[-1][0]
    assert len(arrivals) >= 3
    assert first < 0.6 * last, arrivals  # sentence by sentence, chunk by chunk: not all at the end
    await eventually(lambda: idle(srv.orch))


async def test_text_chat_skips_speech_stages(srv: Server) -> None:
    """modalities ["text"]: only the llm runs (no stage but the llm ever holds the request)."""
    stream = await client(srv).chat.completions.create(
        model="assistant", modalities=["text"], max_tokens=MAX_TOKENS, stream=True,
        messages=[{"role": "user", "content": QUESTION}],
    )
    text, audio_deltas, busy = [], 0, []
    async for chunk in stream:
        stats = srv.orch.statistics()
        busy.append({s: stats.stage(s).in_flight for s in (ASR, LLM, TTS, VOCODER)})
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
            audio_deltas += getattr(choice.delta, "audio", None) is not None
    assert "paris" in normalize("".join(text))
    assert audio_deltas == 0
    assert all(b[ASR] == b[TTS] == b[VOCODER] == 0 for b in busy), busy
    assert any(b[LLM] == 1 for b in busy), busy


async def test_realtime_spoken_turn(srv: Server, question_wav: bytes) -> None:
    """Manual commit: the question's audio in, audio deltas and a transcript naming Paris out."""
    wave, rate = read_wav(question_wav)
    wire = resample(wave, rate, WIRE_RATE)
    audio, transcript, user_transcript, types = b"", "", "", []
    heard_deltas: list[str] = []
    async with client(srv).beta.realtime.connect(model="assistant") as conn:
        await conn.session.update(session={
            "modalities": ["text", "audio"], "turn_detection": None, "temperature": 0.0,  # greedy
            "input_audio_transcription": {"model": "whisper-1"}, "max_response_output_tokens": MAX_TOKENS,
        })
        async for event in conn:
            types.append(event.type)
            if event.type == "session.updated":
                step = WIRE_RATE // 5
                for i in range(0, wire.size, step):
                    await conn.input_audio_buffer.append(audio=base64.b64encode(pcm16_bytes(wire[i:i + step])).decode())
                await conn.input_audio_buffer.commit()
                await conn.response.create()
            elif event.type == "response.audio.delta":
                audio += base64.b64decode(event.delta)
            elif event.type == "response.audio_transcript.done":
                transcript = event.transcript
            elif event.type == "conversation.item.input_audio_transcription.delta":
                heard_deltas.append(event.delta)
            elif event.type == "conversation.item.input_audio_transcription.completed":
                user_transcript = event.transcript
                assert "".join(heard_deltas) == user_transcript  # the deltas came first and add up
            elif event.type == "error":
                pytest.fail(f"realtime error: {event.error}")
            elif event.type == "response.done":
                # Answers run to the token cap: "incomplete" with that reason is the expected end.
                status = event.response.status
                reason = event.response.status_details.reason if event.response.status_details else None
                assert status == "completed" or (status, reason) == ("incomplete", "max_output_tokens"), status
                break
    assert normalize(user_transcript) == normalize(QUESTION) and heard_deltas
    assert "paris" in normalize(transcript), transcript
    assert types.count("response.audio.delta") >= 2
    assert len(audio) / 2 / WIRE_RATE > 0.5
    await eventually(lambda: idle(srv.orch))


async def test_realtime_transcription_session(srv: Server, question_wav: bytes) -> None:
    """GA `session.type: "transcription"`: a server-VAD turn of the question is transcribed by the ASR
    stage alone (deltas adding up to the transcript, no response); a language Whisper refuses is an
    `error` at session.update (as /v1/audio/transcriptions refuses it), and the options it takes then
    transcribe a committed turn."""
    wave, rate = read_wav(question_wav)
    wire = np.concatenate([resample(wave, rate, WIRE_RATE), np.zeros(WIRE_RATE, np.float32)])
    chunks = [base64.b64encode(pcm16_bytes(c)).decode() for c in np.array_split(wire, 10)]
    types: list[str] = []
    deltas: list[str] = []
    heard: list[str] = []
    refused = None
    async with client(srv).realtime.connect(model="assistant") as conn:
        await conn.session.update(session={"type": "transcription", "audio": {"input": {
            "transcription": {"model": "whisper-1"},
            "turn_detection": {"type": "server_vad", "silence_duration_ms": 800}}}})
        async for event in conn:
            types.append(event.type)
            if event.type == "session.updated":
                assert event.session.type == "transcription"
                for chunk in chunks:
                    await conn.input_audio_buffer.append(audio=chunk)
                if refused is not None:  # the second turn: committed by hand
                    assert event.session.audio.input.transcription.language == "en"
                    await conn.input_audio_buffer.commit()
            elif event.type == "conversation.item.input_audio_transcription.delta":
                deltas.append(event.delta)
            elif event.type == "conversation.item.input_audio_transcription.completed":
                assert "".join(deltas) == event.transcript and normalize(event.transcript) == normalize(QUESTION)
                heard.append(event.transcript)
                deltas.clear()
                if refused is not None:
                    break
                await conn.session.update(session={"type": "transcription", "audio": {"input": {
                    "transcription": {"model": "whisper-1", "language": "fr"}, "turn_detection": None}}})
            elif event.type == "error" and refused is None:  # tiny.en hears English only
                refused = event.error
                assert (refused.code, refused.param) == (
                    "rejected_by_stage", "session.audio.input.transcription.language"), refused
                await conn.session.update(session={"type": "transcription", "audio": {"input": {
                    "transcription": {"model": "whisper-1", "language": "en"}, "turn_detection": None}}})
            elif event.type in ("error", "conversation.item.input_audio_transcription.failed"):
                pytest.fail(f"realtime {event.type}: {event}")
    assert len(heard) == 2 and refused is not None
    assert types.index("input_audio_buffer.committed") < types.index(
        "conversation.item.input_audio_transcription.completed")
    assert not [t for t in types if t.startswith("response.")], types
    await eventually(lambda: idle(srv.orch), timeout_s=10)


async def test_transcriptions_route_as_the_openai_sdk_calls_it(srv: Server, question_wav: bytes) -> None:
    """/v1/audio/transcriptions: a WAV upload as json, an MP3 as text, a stream, and clear refusals."""
    sdk = client(srv)
    got = await sdk.audio.transcriptions.create(model="assistant", file=("q.wav", question_wav))
    assert normalize(got.text) == normalize(QUESTION) and got.usage.seconds >= 1
    mp3 = (await sdk.audio.speech.create(model="assistant", voice="alloy", input=QUESTION,
                                         response_format="mp3")).content
    text = await sdk.audio.transcriptions.create(model="assistant", file=("q.mp3", mp3), response_format="text")
    assert normalize(text) == normalize(QUESTION)
    events = [e async for e in await sdk.audio.transcriptions.create(
        model="assistant", file=("q.wav", question_wav), stream=True)]
    assert [e.type for e in events][-1] == "transcript.text.done" and len(events) >= 2
    assert "".join(e.delta for e in events[:-1]) == events[-1].text and normalize(events[-1].text) == normalize(QUESTION)
    with pytest.raises(openai.BadRequestError) as refused:  # tiny.en hears English only
        await sdk.audio.transcriptions.create(model="assistant", file=("q.wav", question_wav), language="fr")
    assert refused.value.body["code"] == "rejected_by_stage"
    with pytest.raises(openai.BadRequestError) as bad:
        await sdk.audio.transcriptions.create(model="assistant", file=("q.wav", b"not audio at all"))
    assert (bad.value.body["code"], bad.value.body["param"]) == ("invalid_audio", "file")
    await eventually(lambda: idle(srv.orch), timeout_s=10)


async def test_whisper_times_segments_and_words(srv: Server, question_wav: bytes) -> None:
    """verbose_json with word timestamps, srt and vtt from Whisper's own timing: ordered, inside the audio,
    and the words spell the transcript."""
    sdk = client(srv)
    wave, rate = read_wav(question_wav)
    seconds = wave.size / rate
    assert (await sdk.models.retrieve("assistant")).features == ["json_output", "word_timestamps"]
    got = await sdk.audio.transcriptions.create(model="assistant", file=("q.wav", question_wav),
                                                response_format="verbose_json",
                                                timestamp_granularities=["word", "segment"])
    assert normalize(got.text) == normalize(QUESTION) and abs(got.duration - seconds) < 0.01
    assert got.language == "english"  # a name, as OpenAI writes it
    assert got.segments and normalize(" ".join(s.text for s in got.segments)) == normalize(QUESTION)
    spans = [(s.start, s.end) for s in got.segments]
    assert all(0 <= a < b <= seconds + 0.5 for a, b in spans) and spans == sorted(spans), spans
    assert got.segments[0].tokens and got.segments[0].avg_logprob < 0  # Whisper's own statistics
    words = got.words or []
    assert normalize(" ".join(w.word for w in words)) == normalize(QUESTION), words
    starts = [w.start for w in words]
    assert starts == sorted(starts) and all(w.start <= w.end <= seconds + 0.5 for w in words), words
    srt = await sdk.audio.transcriptions.create(model="assistant", file=("q.wav", question_wav),
                                                response_format="srt")
    cues = srt.strip().split("\n\n")
    assert len(cues) == len(got.segments) and cues[0].startswith("1\n00:00:0"), srt
    assert normalize(" ".join(c.split("\n", 2)[2] for c in cues)) == normalize(QUESTION)
    vtt = await sdk.audio.transcriptions.create(model="assistant", file=("q.wav", question_wav),
                                                response_format="vtt")
    assert vtt.startswith("WEBVTT\n\n00:00:0") and vtt.count(" --> ") == len(cues), vtt


class Capital(BaseModel):
    city: Literal["Paris", "London", "Rome"]


async def test_json_answers_by_guided_decoding(srv: Server) -> None:
    """response_format on the vLLM text stage: the SDK's parse() gets an answer in its schema (also
    streamed), json_object an object, and a schema the decoder cannot compile is a 400 naming the field."""
    sdk = client(srv)
    ask = {"model": "assistant", "modalities": ["text"], "max_tokens": MAX_TOKENS, "temperature": 0.0,
           "messages": [{"role": "user", "content": QUESTION + " Answer in JSON."}]}
    parsed = await sdk.chat.completions.parse(**ask, response_format=Capital)
    assert isinstance(parsed.choices[0].message.parsed, Capital), parsed
    schema = {"type": "json_schema", "json_schema": {"name": "capital", "schema": Capital.model_json_schema()}}
    stream = await sdk.chat.completions.create(**ask, response_format=schema, stream=True)
    streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert Capital.model_validate_json(streamed) == parsed.choices[0].message.parsed
    loose = await sdk.chat.completions.create(**{**ask, "max_tokens": 60}, response_format={"type": "json_object"})
    assert loose.choices[0].finish_reason == "stop" and isinstance(json.loads(loose.choices[0].message.content), dict)
    with pytest.raises(openai.BadRequestError) as bad:
        await sdk.chat.completions.create(**ask, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}})
    assert bad.value.body["param"] == "response_format", bad.value.body
    # the Responses API's parse(), the same guided decoding through text.format
    answer = await sdk.responses.parse(model="assistant", input=QUESTION + " Answer in JSON.", text_format=Capital,
                                       max_output_tokens=MAX_TOKENS, temperature=0.0)
    assert answer.output_parsed == parsed.choices[0].message.parsed, answer
    await eventually(lambda: idle(srv.orch), timeout_s=10)


async def test_speech_speed_voices_and_aac_on_the_piper_voice(srv: Server) -> None:
    """/v1/audio/speech on the assistant: `speed` reaches Piper (0.25 is far longer than 4.0), OpenAI
    voice names map onto its one voice, another name is a 400 listing the choices, aac decodes."""
    sdk = client(srv)
    slow, rate = read_wav((await sdk.audio.speech.create(model="assistant", voice="joe", input="Good morning.",
                                                         response_format="wav", speed=0.25)).content)
    fast, _ = read_wav((await sdk.audio.speech.create(model="assistant", voice="cedar", input="Good morning.",
                                                      response_format="wav", speed=4.0)).content)
    assert rate == 22050 and slow.size > 4 * fast.size
    with pytest.raises(openai.BadRequestError) as bad:
        await sdk.audio.speech.create(model="assistant", voice="nobody", input="hi")
    assert bad.value.body["param"] == "voice" and "joe" in bad.value.body["message"]
    with pytest.raises(openai.BadRequestError) as bad:  # Piper cannot clone a custom voice
        await sdk.audio.speech.create(model="assistant", voice={"id": "voice_abc"}, input="hi")
    assert bad.value.body["code"] == "unsupported_voice"
    aac = (await sdk.audio.speech.create(model="assistant", voice="alloy", input="hi", response_format="aac")).content
    import av

    with av.open(io.BytesIO(aac)) as box:
        assert sum(f.samples for f in box.decode(audio=0)) > 0


LEAD_S, TAIL_S = 0.5, 40.0
"""Silence around the playground's question: the tail ends the turn and keeps the looping fake mic quiet."""


@pytest.mark.timeout(600)  # a spoken turn through Chromium on 2 cores
async def test_playground_talk_hears_the_question_and_speaks_the_answer(
    srv: Server, question_wav: bytes, tmp_path
) -> None:
    wave, rate = read_wav(question_wav)
    wave = resample(wave, rate, WIRE_RATE)
    pad = lambda s: np.zeros(int(s * WIRE_RATE), np.float32)  # noqa: E731
    mic = tmp_path / "question.wav"
    sf.write(mic, np.concatenate([pad(LEAD_S), wave, pad(TAIL_S)]), WIRE_RATE, subtype="PCM_16")
    async with browser_page(srv.url + "/", fake_mic=mic, api_key=KEY) as bp:
        page = bp.page
        await page.locator("body[data-ready=true]").wait_for()
        await page.get_by_test_id("talk-button").click()
        await page.wait_for_function("document.getElementById('talk-transcript').textContent.length > 0 "
                                     "&& window.__playground.talk.playedSeconds > 0.5")
        await page.wait_for_function("/paris/i.test(document.getElementById('talk-transcript').textContent)")
        heard = await page.get_by_test_id("talk-user").inner_text()
        await page.screenshot(path=str(tmp_path / "talk.png"))
        await page.get_by_test_id("talk-button").click()  # stop: the socket closes
        await page.wait_for_function("window.__playground.talk === null")
        assert bp.errors == [] and bp.refused == []
    assert normalize(heard)[:len(normalize(QUESTION))] == normalize(QUESTION), heard
    assert (tmp_path / "talk.png").stat().st_size > 0
    await eventually(lambda: srv.orch.statistics().requests_in_flight == 0, timeout_s=30)
    await eventually(lambda: idle(srv.orch), timeout_s=10)
