"""The real speech assistant over /v1/realtime: a spoken question is transcribed and answered in speech."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.api.conftest import eventually, idle
from tests.api.realtime.conftest import (
    assistant_deploy,
    b64,
    connect,
    of_type,
    padded,
    response_audio,
    serve_rt,
    speak,
)

pytestmark = pytest.mark.slow


def asr_answered(srv: Any) -> int:
    """Requests the recognizer (stage 0) has answered so far."""
    return max((n for _, n in srv.orch.statistics().stage(0).first_output), default=0)


async def until_n(c: Any, type: str, n: int) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for _ in range(n):
        events += await c.until(type, timeout_s=120)
    return events


async def test_spoken_question_gets_a_spoken_answer(tmp_path: Path) -> None:
    deploy = assistant_deploy()
    question = padded(speak("What is the capital of France?", tmp_path), 0.3, 1.0)
    async with serve_rt(deploy=deploy) as srv, \
            aiohttp.ClientSession() as http:
        c = await connect(srv, http, input_audio_transcription={"model": "whisper-1"})
        await c.append(question)
        events = await c.until("response.done", timeout_s=120)
        assert events[-1]["response"]["status"] == "completed"
        heard = of_type(events, "conversation.item.input_audio_transcription.completed")[0]
        words = heard["transcript"].lower()  # (Whisper tiny.en once heard "capital on France" on a loaded box)
        assert "capital" in words and "france" in words, words
        assert of_type(events, "response.audio_transcript.done")[0]["transcript"]
        assert len(response_audio(events)) > 24_000  # more than a second of speech
        # the transcript is now the user item's text: the next turn's context
        await c.send("conversation.item.retrieve", item_id=heard["item_id"])
        item = (await c.until("conversation.item.retrieved"))[-1]["item"]
        assert item["content"][0]["transcript"] == heard["transcript"]
        assert item["content"][0]["audio"]  # the committed audio comes back, as pcm16 base64
        # An out-of-band response beside the conversation's, both hearing the same new audio: it waits for
        # the conversation's transcript instead of running the recognizer on that audio a second time.
        heard_before = asr_answered(srv)
        await c.send("conversation.item.create", item={"type": "message", "role": "user", "content": [
            {"type": "input_audio", "audio": b64(question)}]})
        await c.until("conversation.item.created")
        await c.send("response.create", response={"modalities": ["text"], "max_output_tokens": 8})
        await c.send("response.create", response={"conversation": "none", "modalities": ["text"],
                                                  "max_output_tokens": 8})
        done = [e for e in await until_n(c, "response.done", 2) if e["type"] == "response.done"]
        assert {d["response"]["status"] for d in done} <= {"completed", "incomplete"}, done
        assert asr_answered(srv) - heard_before == 1
        await c.ws.close()
        await eventually(lambda: idle(srv.orch), timeout_s=30)


async def test_a_language_whisper_refuses_is_refused_at_session_update() -> None:
    """Whisper (tiny.en) refuses any language but English: the session.update asking for one is the
    `error` (REST's code, the option as `param`: beta or GA field), not each turn's `.failed`."""
    deploy = assistant_deploy()
    async with serve_rt(deploy=deploy) as srv, aiohttp.ClientSession() as http:
        c = await connect(srv, http, turn_detection=None)
        refused = [  # session fields, param (whisper names the language it refuses)
            ({"input_audio_transcription": {"model": "whisper-1", "language": "fr"}},
             "session.input_audio_transcription.language"),
            ({"type": "transcription", "audio": {"input": {"transcription": {"language": "de"}}}},
             "session.audio.input.transcription.language"),
            ({"input_audio_transcription": {"language": "fr", "prompt": "Paris"}},
             "session.input_audio_transcription.language"),
        ]
        for fields, param in refused:
            await c.send("session.update", session=fields)
            event = await c.recv(120)
            assert event["type"] == "error", event
            assert (event["error"]["code"], event["error"]["param"]) == ("rejected_by_stage", param), event
            assert "transcribes 'en' only" in event["error"]["message"]
        await c.send("session.update", session={"input_audio_transcription": {"model": "whisper-1", "language": "EN"}})
        updated = (await c.until("session.updated", timeout_s=120))[-1]["session"]
        assert updated["input_audio_transcription"] == {"model": "whisper-1", "language": "EN"}  # (any case)
        await c.ws.close()
        await eventually(lambda: idle(srv.orch), timeout_s=30)
