"""The openai SDK's realtime clients (GA and beta) against our /v1/realtime."""

from __future__ import annotations

import base64

from openai import AsyncOpenAI

from tests.api.realtime.conftest import RtServer


def sdk(srv: RtServer) -> AsyncOpenAI:
    ws_url = srv.url.replace("http://", "ws://") + "/v1"
    return AsyncOpenAI(api_key=srv.key, base_url=f"{srv.url}/v1", websocket_base_url=ws_url, max_retries=0)


async def test_ga_client_speaks_the_ga_dialect(srv: RtServer) -> None:
    async with sdk(srv).realtime.connect(model="synthetic") as conn:
        await conn.session.update(session={"type": "realtime", "output_modalities": ["audio"],
                                           "audio": {"input": {"turn_detection": None},
                                                     "output": {"format": {"type": "audio/pcm", "rate": 24000}}}})
        types, audio, transcript = [], b"", ""
        async for event in conn:
            types.append(event.type)
            if event.type == "session.updated":
                assert event.session.audio.input.turn_detection is None
                await conn.conversation.item.create(item={
                    "type": "message", "role": "user", "content": [{"type": "input_text", "text": "ga words"}]})
                await conn.response.create()
            elif event.type == "response.output_audio.delta":
                audio += base64.b64decode(event.delta)
            elif event.type == "response.output_audio_transcript.done":
                transcript = event.transcript
            elif event.type == "response.done":
                assert event.response.status == "completed"
                break
    assert "conversation.item.added" in types and "conversation.item.done" in types
    assert "response.audio.delta" not in types
    assert transcript == "ga words ga words ga words ga words"
    assert len(audio) == 2 * 8 * 2400


async def test_ga_output_speed_shortens_the_answer_and_bad_speeds_are_errors(srv: RtServer) -> None:
    async with sdk(srv).realtime.connect(model="synthetic") as conn:
        await conn.session.update(session={"type": "realtime", "output_modalities": ["audio"],
                                           "audio": {"output": {"speed": 9.0}}})
        error = await anext(e async for e in conn if e.type == "error")
        assert error.error.param == "session.audio.output.speed"
        await conn.session.update(session={"type": "realtime", "output_modalities": ["audio"],
                                           "audio": {"input": {"turn_detection": None}, "output": {"speed": 1.5}}})
        audio = b""
        async for event in conn:
            if event.type == "session.updated":
                assert event.session.audio.output.speed == 1.5
                await conn.conversation.item.create(item={
                    "type": "message", "role": "user", "content": [{"type": "input_text", "text": "ga words"}]})
                await conn.response.create()
            elif event.type == "response.output_audio.delta":
                audio += base64.b64decode(event.delta)
            elif event.type == "response.done":
                assert event.response.status == "completed"
                break
    assert len(audio) == 2 * round(8 * 2400 / 1.5)  # the same answer as above, in two thirds of the time


async def test_beta_client(srv: RtServer) -> None:
    async with sdk(srv).beta.realtime.connect(model="synthetic") as conn:
        await conn.session.update(session={"modalities": ["text"], "turn_detection": None})
        await conn.conversation.item.create(item={
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "beta"}]})
        await conn.response.create()
        text = ""
        async for event in conn:
            if event.type == "response.text.delta":
                text += event.delta
            elif event.type == "response.done":
                assert event.response.status == "completed"
                break
    assert text == " ".join(["beta"] * 8)
