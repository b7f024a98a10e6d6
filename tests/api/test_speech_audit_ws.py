"""Streamed speech as the issue-11 audit checked it on real servers: the text-in socket /v1/audio/speech/stream
says why a clause it could not submit is missing, lets go of each text it has spoken, holds synthesis back for
a client that does not read, and refuses in session.update a model that makes sound from a prompt; SSE and
chunked audio reach the client while the request still runs."""

from __future__ import annotations

import gc
from pathlib import Path

import aiohttp
import pytest

from omni_actors.api.app import build_app
from omni_actors.api.server import start_server
from omni_actors.api.speech_stream import MAX_AHEAD, Utterance
from omni_actors.cli import served_folder
from omni_actors.models.tiny import make_tiny
from tests.api.conftest import Server, eventually, idle, make_deploy, running
from tests.api.test_speech_rates import CHUNKS, MODEL_RATE, serve_voiced
from tests.api.test_speech_stream import (
    IDLE_TIMEOUT_S,
    opened,
    pcm_bytes,
    receive,
    say,
    texts,
    until,
)


async def test_a_clause_refused_for_a_full_queue_is_an_error_not_silence() -> None:
    """A stage admitting one request at a time (`max_queue: 1`) refuses the second of the two clauses the
    socket synthesizes at once (429's `queue_full` on REST). Before 2026-12-05 that refusal (AdmissionError,
    not a RequestError) ended the clause's task unseen: its audio was missing from the text and the client
    was told nothing; now it is an `error` event with code `queue_full`, and the next text speaks."""
    async with serve_voiced(max_queue=1) as srv, aiohttp.ClientSession() as http:
        ws = await opened(http, srv)
        await say(ws, "One, two.")
        events = await until(ws, "speech.audio.done")
        errors = [e["error"] for e in events if e["type"] == "error"]
        (spoken,) = texts(events)
        assert [e["code"] for e in errors] == ["queue_full"], events
        assert len(spoken) == pcm_bytes(1)  # the admitted clause spoke; the refused one said why
        await say(ws, "Three.")  # the session lives on
        (again,) = texts(await until(ws, "speech.audio.done"))
        assert len(again) == pcm_bytes(1)
        await ws.close()
        await eventually(lambda: idle(srv.orch), timeout_s=IDLE_TIMEOUT_S)


async def test_a_session_holds_no_text_it_has_finished_speaking() -> None:
    """Each text's state (its clause requests' usage, its resolved voice: a custom voice's whole clip) is
    let go at its `speech.audio.done`. Before 2026-12-05 the session kept every text it ever spoke until it
    closed, so a long-lived socket grew without bound (a minute-long custom-voice clip, ~5.8 MB at 24 kHz,
    per text). The server runs in this process: its live Utterance objects are counted directly."""
    async with serve_voiced() as srv, aiohttp.ClientSession() as http:
        ws = await opened(http, srv)
        for text in ("One.", "Two.", "Three."):
            await say(ws, text)
            (spoken,) = texts(await until(ws, "speech.audio.done"))
            assert len(spoken) == pcm_bytes(1)
        gc.collect()
        assert [o for o in gc.get_objects() if isinstance(o, Utterance)] == []
        await say(ws, "Four.")  # the session still speaks
        assert len(texts(await until(ws, "speech.audio.done"))[0]) == pcm_bytes(1)
        await ws.close()
        await eventually(lambda: idle(srv.orch), timeout_s=IDLE_TIMEOUT_S)


@pytest.mark.slow  # (a Stable Audio worker imports diffusers: ~30 s on a busy 2-core runner)
async def test_an_update_to_a_model_that_makes_sound_from_a_prompt_is_refused(tmp_path: Path) -> None:
    """One server with a speaking pipeline and a tiny Stable Audio folder: the socket refuses to open on the
    latter (400, as POST /v1/audio/speech does), and a session.update naming it is an `error` naming
    `session.model` (code `unsupported_task`); the session keeps its model and speaks. Before 2026-12-05 the
    update was taken, and every text then came back as the diffusion stage's "prompt: a string is required"."""
    folder = make_tiny("stable_audio", tmp_path / "tiny-sa", seed=0)
    async with running(make_deploy("synthetic")) as speaks, running(
            served_folder(str(folder), {"model": str(folder)})) as sounds:
        http = await start_server(build_app([speaks, sounds]), "127.0.0.1", 0, speaks.deploy.server)
        srv = Server(speaks, http.url, None, http)
        try:
            async with aiohttp.ClientSession() as client:
                ws = await opened(client, srv)
                await ws.send_json({"type": "session.update", "session": {"model": "tiny-sa"}, "event_id": "e1"})
                refused = await receive(ws)  # (was session.updated)
                assert refused["type"] == "error" and refused["error"]["param"] == "session.model", refused
                assert (refused["error"]["code"], refused["error"]["event_id"]) == ("unsupported_task", "e1")
                await say(ws, "Hello there.")
                events = await until(ws, "speech.audio.done")
                assert [e["type"] for e in events if e["type"] != "speech.audio.delta"] == ["speech.audio.done"]
                assert texts(events)[0]
                await ws.close()
            await eventually(lambda: idle(speaks) and idle(sounds), timeout_s=IDLE_TIMEOUT_S)
        finally:
            await http.close()


STEP_DELAY_MS = 300
"""The synthetic first stage's compute per step: its four steps leave ~0.9 s of the request after the first."""


@pytest.mark.parametrize("stream_format", ["sse", "audio"])
async def test_streamed_speech_arrives_while_the_request_is_still_running(stream_format: str) -> None:
    """`stream_format` sse / audio send the audio as it is made (the issue's "SSE deltas arrive before the
    end"): the first delta (or chunk of bytes) reaches the client while the request is still in flight in
    the stages, not after it ended; the rest follows, and the request ends. The server runs in this
    process: its orchestrator's in-flight count is read directly."""
    extras = {"chunks": 4, "step_delay_ms": STEP_DELAY_MS}
    async with serve_voiced(engine_extras=extras) as srv, aiohttp.ClientSession() as http:
        body = {"model": "synthetic", "input": "hello big world", "voice": "tone", "response_format": "pcm",
                "stream_format": stream_format}
        async with http.post(srv.url + "/v1/audio/speech", json=body) as resp:
            assert resp.status == 200
            first = await (resp.content.readline() if stream_format == "sse" else resp.content.readany())
            assert first and srv.orch.statistics().requests_in_flight == 1, first[:80]
            rest = await resp.read()
        assert len(first) + len(rest) > 0 and (stream_format == "audio" or b"speech.audio.done" in rest)
        await eventually(lambda: idle(srv.orch), timeout_s=IDLE_TIMEOUT_S)


BIG_SAMPLES = 200_000
"""Samples per synthetic audio chunk here: ~2.3 MB of base64 pcm a clause, so that the socket's buffers
(the kernel's both ways, aiohttp's) take only a few clauses of a text whose reader does not read."""
CLAUSES = 20


async def test_a_client_that_does_not_read_holds_the_synthesis_back() -> None:
    """Backpressure: a client that sends a long text and reads nothing gets at most MAX_AHEAD clauses
    synthesized past what the socket took; the rest wait, and all of it is spoken in order once it reads.
    Before 2026-12-05 a clause's place was freed as soon as its audio was made: the whole text was
    synthesized and held in the server's memory, however slowly the client read."""
    async with serve_voiced(samples=BIG_SAMPLES) as srv, aiohttp.ClientSession() as http:
        ws = await opened(http, srv)
        await say(ws, " ".join(f"word {i}," for i in range(CLAUSES - 1)) + " the end.")

        def submitted() -> int:
            return srv.orch.counters["total"]

        seen: list[int] = []

        def settled() -> bool:
            """The first clauses ran and nothing has run since the last look (the sender waits on the socket;
            a request that just ended and the next one's submit would differ between two looks)."""
            seen.append(submitted() if idle(srv.orch) else -1)
            return seen[-1] >= MAX_AHEAD and seen[-2:] == [seen[-1]] * 2

        await eventually(settled, timeout_s=IDLE_TIMEOUT_S)
        held_back = submitted()
        assert held_back < CLAUSES, held_back
        events = await until(ws, "speech.audio.done")  # reading: the rest is spoken
        assert [e["type"] for e in events if e["type"] != "speech.audio.delta"] == ["speech.audio.done"]
        assert submitted() == CLAUSES
        assert len(texts(events)[0]) == 2 * round(CLAUSES * CHUNKS * BIG_SAMPLES * 24000 / MODEL_RATE)
        await ws.close()
        await eventually(lambda: idle(srv.orch), timeout_s=IDLE_TIMEOUT_S)
