"""A stage failing right after it made output, as every streamed route answers it: the outputs made first, in
order, then the error (in-band once a stream began), never an HTTP error status in place of them.

The text stage makes two words and fails at the third with no time between them, so its three messages reach
the orchestrator together. Before 2026-12-05 the failure dropped the two unread words (a RequestStream emptied
itself on any error), and every route, which waits for the first output before it sends its headers, answered
an HTTP 500 with none of them (the text-in speech socket, which does not wait, sent the error alone). Each
case is asked REPEATS times: it failed every time before the fix.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import aiohttp
import openai
import pytest

from tests.api.conftest import Server, eventually, idle, serve

REPEATS = 5
WS_TIMEOUT_S = 30
"""Longest wait for one event of the text-in speech socket."""
FAIL_AT = 2
"""The failing stage's outputs before it fails (each engine's `fail_on_chunk`)."""
ASK = [{"role": "user", "content": "a b c d"}]
"""The synthetic text stage says these words, one a token: "a", " b", then fails."""


@pytest.fixture(scope="module")
async def text() -> AsyncIterator[Server]:
    async with serve("synthetic_text", stages=[{"stage_id": 0, "engine_extras": {"fail_on_chunk": FAIL_AT}}]) as srv:
        yield srv
        await eventually(lambda: idle(srv.orch))


@pytest.fixture(scope="module")
async def speech() -> AsyncIterator[Server]:
    """The vocoder makes two chunks of audio and fails, at once: it is given the talker's whole output (no async
    chunk), not fed it piece by piece."""
    async with serve("synthetic", async_chunk=False,
                     stages=[{"stage_id": 2, "engine_extras": {"fail_on_chunk": FAIL_AT}}]) as srv:
        yield srv
        await eventually(lambda: idle(srv.orch))


async def _event(ws: aiohttp.ClientWebSocketResponse) -> dict:
    msg = await ws.receive(timeout=WS_TIMEOUT_S)
    assert msg.type == aiohttp.WSMsgType.TEXT, msg
    return json.loads(msg.data)


async def test_a_chat_stream_sends_the_words_made_then_the_error_in_band(text: Server) -> None:
    client = text.client()
    for i in range(REPEATS):
        said: list[str | None] = []
        with pytest.raises(openai.APIError) as failed:  # (the SDK raises on the in-band error event)
            stream = await client.chat.completions.create(model="synthetic_text", messages=ASK, max_tokens=4,
                                                          stream=True)
            async for chunk in stream:
                said.append(chunk.choices[0].delta.content)
        assert said == ["", "a", " b"], (i, said, failed.value)
        assert not isinstance(failed.value, openai.APIStatusError), failed.value  # (200, then in-band)
        assert "synthetic failure at chunk 2" in failed.value.message


async def test_a_responses_stream_sends_the_words_made_then_response_failed(text: Server) -> None:
    client = text.client()
    for i in range(REPEATS):
        events = [e async for e in await client.responses.create(model="synthetic_text", input="a b c d",
                                                                   max_output_tokens=4, stream=True)]
        said = [e.delta for e in events if e.type == "response.output_text.delta"]
        assert said == ["a", " b"] and events[-1].type == "response.failed", (i, events)
        assert events[-1].response.output[0].content[0].text == "a b"


async def test_not_streamed_a_failure_after_output_keeps_each_route_s_answer(text: Server) -> None:
    """Chat: a 500 (unchanged by the fix). Responses: its documented answer, the response `failed` with the text
    made (HTTP 200), which it was answered only when the failure came after the route read the first word."""
    client = text.client()
    for i in range(REPEATS):
        with pytest.raises(openai.InternalServerError):
            await client.chat.completions.create(model="synthetic_text", messages=ASK, max_tokens=4)
        failed = await client.responses.create(model="synthetic_text", input="a b c d", max_output_tokens=4)
        assert (failed.status, failed.output_text) == ("failed", "a b"), (i, failed)


async def test_a_speech_sse_stream_sends_the_audio_made_then_the_error_in_band(speech: Server) -> None:
    body = {"model": "synthetic", "input": "a b c d e f", "stream_format": "sse"}
    async with aiohttp.ClientSession(headers=speech.headers) as http:
        for i in range(REPEATS):
            async with http.post(speech.url + "/v1/audio/speech", json=body) as resp:
                assert resp.status == 200, (i, await resp.text())
                events = [json.loads(line[6:]) for line in (await resp.text()).splitlines()
                          if line.startswith("data: ")]
            kinds = [e.get("type", "error" if "error" in e else None) for e in events]
            assert kinds == ["speech.audio.delta"] * FAIL_AT + ["error"], (i, kinds)
            assert events[-1]["error"]["code"] == "stage_failed"


async def test_a_chunked_speech_stream_sends_the_audio_made_then_cuts_the_connection(speech: Server) -> None:
    body = {"model": "synthetic", "input": "a b c d e f", "stream": True, "response_format": "pcm"}
    async with aiohttp.ClientSession(headers=speech.headers) as http:
        for i in range(REPEATS):
            got = 0
            async with http.post(speech.url + "/v1/audio/speech", json=body) as resp:
                assert resp.status == 200, (i, await resp.text())
                with pytest.raises(aiohttp.ClientPayloadError):  # (a truncated chunked body: "incomplete")
                    async for part in resp.content.iter_any():
                        got += len(part)
            assert got > 0, i
        # The cut is the route's answer, not an unhandled error: counted with the stage's code under the
        # stream's status (before 2026-12-05 the error left the handler, aiohttp logged a traceback, and
        # the metrics said 500 with no code of ours).
        async with http.get(speech.url + "/metrics") as resp:
            scrape = await resp.text()
    line = 'omni_http_errors_total{code="stage_failed",route="/v1/audio/speech",status="200"}'
    assert any(row.startswith(line) and float(row.split()[-1]) >= REPEATS for row in scrape.splitlines()), [
        row for row in scrape.splitlines() if row.startswith("omni_http_errors_total")]


async def test_the_text_in_speech_socket_sends_the_audio_made_then_the_error(speech: Server) -> None:
    async with aiohttp.ClientSession(headers=speech.headers) as http:
        for i in range(REPEATS):
            async with http.ws_connect(f"{speech.url}/v1/audio/speech/stream") as ws:
                assert (await _event(ws))["type"] == "session.created"
                await ws.send_json({"type": "input_text.append", "text": "a b c d e f"})
                await ws.send_json({"type": "input_text.done"})
                kinds = []
                while not kinds or kinds[-1] != "speech.audio.done":
                    event = await _event(ws)
                    kinds.append(event["type"] if event["type"] != "error" else event["error"]["code"])
            assert kinds == ["speech.audio.delta"] * FAIL_AT + ["stage_failed", "speech.audio.done"], (i, kinds)
