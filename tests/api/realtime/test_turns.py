"""Realtime turns end to end: server VAD, manual commit, barge-in, truncate."""

from __future__ import annotations

import base64

import aiohttp
import numpy as np

from omni_actors.api.realtime.audio import encode_wire, resample
from omni_actors.api.realtime.handler import MAX_RESPONSES
from tests.api.conftest import Server, eventually, idle
from tests.api.realtime.conftest import Client, b64, connect, of_type, response_audio, silence

WIRE = 24_000


async def test_vad_turn_streams_an_audio_response(srv: Server, speech: dict[str, np.ndarray]) -> None:
    lead = 0.5
    audio = np.concatenate([silence(lead), speech["hello"], silence(1.0)])
    async with aiohttp.ClientSession() as http:
        c = await connect(srv, http)
        await c.append(audio)
        started = (await c.until("input_audio_buffer.speech_started"))[-1]
        stopped = (await c.until("input_audio_buffer.speech_stopped"))[-1]
        speech_ms = len(speech["hello"]) * 1000 // WIRE
        # speech starts near `lead` (minus the 300 ms prefix padding) and stops after it ends
        assert 0 <= started["audio_start_ms"] <= lead * 1000
        assert lead * 1000 + speech_ms - 300 <= stopped["audio_end_ms"] <= lead * 1000 + speech_ms + 900
        assert stopped["item_id"] == started["item_id"]
        events = await c.until("response.done")
        committed = of_type(events, "input_audio_buffer.committed")[0]
        assert committed["item_id"] == started["item_id"]
        user_item = of_type(events, "conversation.item.created")[0]["item"]
        assert user_item["role"] == "user" and user_item["content"][0]["type"] == "input_audio"
        done = events[-1]["response"]
        assert done["status"] == "completed", done
        # 8 chunks of 100 ms at 22.05 kHz, resampled to 24 kHz on the wire
        out = response_audio(events)
        assert abs(len(out) - 8 * WIRE // 10) <= 2, len(out)
        assert np.abs(out).max() > 0.05
        order = [e["type"] for e in events]
        first_delta = order.index("response.audio.delta")
        assert order.index("response.created") < order.index("response.content_part.added") < first_delta
        assert order.index("response.audio.done") < order.index("response.output_item.done")
        transcript = "".join(e["delta"] for e in of_type(events, "response.audio_transcript.delta"))
        assert transcript == of_type(events, "response.audio_transcript.done")[0]["transcript"]
        assert done["output"][0]["content"][0]["transcript"] == transcript
        assert done["usage"]["output_tokens"] > 0
        limits = (await c.until("rate_limits.updated"))[-1]["rate_limits"]
        assert limits[0]["name"] == "requests" and limits[0]["remaining"] <= limits[0]["limit"]
        await c.ws.close()
    await eventually(lambda: idle(srv.orch))


async def test_manual_commit_and_text_response(srv: Server, speech: dict[str, np.ndarray]) -> None:
    async with aiohttp.ClientSession() as http:
        c = await connect(srv, http, turn_detection=None, modalities=["text"])
        await c.append(np.concatenate([speech["hello"], silence(0.5)]))
        eid = await c.send("input_audio_buffer.commit")
        events = await c.until("conversation.item.created")
        assert not of_type(events, "input_audio_buffer.speech_started")
        assert of_type(events, "input_audio_buffer.committed")
        # an empty buffer cannot be committed: error, session lives
        eid = await c.send("input_audio_buffer.commit")
        err = (await c.until("error"))[-1]["error"]
        assert err["code"] == "input_audio_buffer_commit_empty" and err["event_id"] == eid
        await c.send("conversation.item.create",
                     item={"type": "message", "role": "user",
                           "content": [{"type": "input_text", "text": "alpha beta gamma"}]})
        await c.send("response.create", response={"max_output_tokens": 5})
        events = await c.until("response.done")
        text = "".join(e["delta"] for e in of_type(events, "response.text.delta"))
        assert text == "alpha beta gamma alpha beta"
        assert not of_type(events, "response.audio.delta")
        assert events[-1]["response"]["status"] == "incomplete"
        assert events[-1]["response"]["status_details"]["reason"] == "max_output_tokens"
        await c.ws.close()


async def test_transcription_asked_of_a_pipeline_without_a_recognizer_fails_per_turn(
    srv: Server, speech: dict[str, np.ndarray]
) -> None:
    """The synthetic pipeline hears audio but makes no transcripts: each committed turn says so with
    `.failed` (not silence), and the turn is still answered."""
    async with aiohttp.ClientSession() as http:
        c = await connect(srv, http, turn_detection=None, modalities=["text"],
                          input_audio_transcription={"model": "whisper-1"})  # fmt: skip
        await c.append(np.concatenate([speech["hello"], silence(0.5)]))
        await c.send("input_audio_buffer.commit")
        events = await c.until("conversation.item.input_audio_transcription.failed")
        item_id = of_type(events, "input_audio_buffer.committed")[0]["item_id"]
        failed = events[-1]
        assert failed["item_id"] == item_id and failed["content_index"] == 0
        assert failed["error"]["code"] == "unsupported_parameter" and "recognizer" in failed["error"]["message"]
        await c.send("response.create", response={"max_output_tokens": 2})
        events = await c.until("response.done")
        assert events[-1]["response"]["status"] == "incomplete"
        assert not of_type(events, "conversation.item.input_audio_transcription.completed")
        await c.ws.close()


async def test_barge_in_cancels_then_next_turn_and_truncate(srv: Server, speech: dict[str, np.ndarray]) -> None:
    async with aiohttp.ClientSession() as http:
        c = await connect(srv, http)
        await c.send("conversation.item.create",
                     item={"type": "message", "role": "user",
                           "content": [{"type": "input_text", "text": "one two three four"}]})
        await c.send("response.create", response={"max_response_output_tokens": 60})
        events = [e for _ in range(3) for e in await c.until("response.audio.delta")]
        first = of_type(events, "response.created")[0]["response"]["id"]
        assistant_id = of_type(events, "response.output_item.added")[0]["item"]["id"]
        # the user talks over the answer
        await c.append(np.concatenate([speech["stop"], silence(1.0)]))
        events = await c.until("input_audio_buffer.speech_started")
        events += await c.until("response.done")
        done = events[-1]["response"]
        assert done["id"] == first and done["status"] == "cancelled"
        assert done["status_details"]["reason"] == "turn_detected"
        heard = response_audio(c.seen)
        assert len(heard) < 60 * WIRE // 10  # cut long before its 6 s of audio
        # the next turn (from the speech that interrupted) answers in full
        events = await c.until("response.done")
        assert of_type(events, "input_audio_buffer.speech_stopped")
        assert events[-1]["response"]["status"] == "completed"
        assert events[-1]["response"]["id"] != first
        # the client heard only 150 ms of the cancelled answer: trim it to that
        await c.send("conversation.item.truncate", item_id=assistant_id, content_index=0, audio_end_ms=150)
        truncated = (await c.until("conversation.item.truncated"))[-1]
        assert truncated["audio_end_ms"] == 150
        await c.send("conversation.item.retrieve", item_id=assistant_id)
        item = (await c.until("conversation.item.retrieved"))[-1]["item"]
        assert item["content"][0]["transcript"] == "one two"  # two 100 ms chunks started before 150 ms
        eid = await c.send("conversation.item.truncate", item_id=assistant_id, content_index=0,
                           audio_end_ms=99_999)
        err = (await c.until("error"))[-1]["error"]
        assert err["param"] == "audio_end_ms" and err["event_id"] == eid
        await c.ws.close()
    await eventually(lambda: idle(srv.orch))


async def test_truncating_the_answer_being_made_cancels_it_first(srv: Server) -> None:
    """A client without server VAD cuts the answer its user talked over: the response ends cancelled
    (before the truncated event), and the item keeps what was heard, not what came after the cut."""
    async with aiohttp.ClientSession() as http:
        c = await connect(srv, http, turn_detection=None)
        await c.send("conversation.item.create",
                     item={"type": "message", "role": "user",
                           "content": [{"type": "input_text", "text": "one two three four"}]})
        await c.send("response.create", response={"max_response_output_tokens": 400})
        events = [e for _ in range(3) for e in await c.until("response.audio.delta")]
        item_id = of_type(events, "response.output_item.added")[0]["item"]["id"]
        await c.send("conversation.item.truncate", item_id=item_id, content_index=0, audio_end_ms=150)
        events = await c.until("conversation.item.truncated")
        done = of_type(events, "response.done")
        assert len(done) == 1 and done[0]["response"]["status"] == "cancelled", [e["type"] for e in events]
        assert events[-1]["audio_end_ms"] == 150
        await c.send("conversation.item.retrieve", item_id=item_id)
        item = (await c.until("conversation.item.retrieved"))[-1]["item"]
        assert item["content"][0]["transcript"] == "one two"  # two 100 ms chunks started before 150 ms
        await c.ws.close()
    await eventually(lambda: idle(srv.orch))


async def test_client_helper_sanity(srv: Server) -> None:
    async with aiohttp.ClientSession() as http:
        c: Client = await connect(srv, http)
        assert c.seen[0]["session"]["turn_detection"]["type"] == "server_vad"
        assert c.seen[0]["session"]["modalities"] == ["text", "audio"]
        await c.ws.close()


async def test_g711_in_and_out(srv: Server, speech: dict[str, np.ndarray]) -> None:
    ulaw = base64.b64decode(encode_wire(resample(np.concatenate([speech["hello"], silence(1.0)]), WIRE, 8_000),
                                        "g711_ulaw"))
    async with aiohttp.ClientSession() as http:
        c = await connect(srv, http, input_audio_format="g711_ulaw", output_audio_format="g711_ulaw")
        for i in range(0, len(ulaw), 800):  # 100 ms of 8 kHz u-law per append
            await c.send("input_audio_buffer.append", audio=base64.b64encode(ulaw[i:i + 800]).decode())
        events = await c.until("response.done")
        assert of_type(events, "input_audio_buffer.speech_stopped")
        assert events[-1]["response"]["status"] == "completed"
        out = b"".join(base64.b64decode(e["delta"]) for e in of_type(events, "response.audio.delta"))
        assert abs(len(out) - 8 * 800) <= 2  # 800 ms of one-byte 8 kHz samples
        await c.ws.close()


async def test_a_turn_whose_response_is_refused_leaves_the_rest_of_its_append_heard(
        srv: Server, speech: dict[str, np.ndarray]) -> None:
    """Server VAD ends a turn while the session already runs its most responses (out-of-band ones): the turn is
    committed and its response refused with an `error`, and the rest of the same append is still heard: its
    next turn is announced and committed too."""
    busy = {"conversation": "none", "modalities": ["text"], "max_output_tokens": 2000,  # (40 s: cancelled below)
            "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "busy"}]}]}
    async with aiohttp.ClientSession() as http:
        c = await connect(srv, http)
        for _ in range(MAX_RESPONSES):
            await c.send("response.create", response=busy)
            await c.until("response.created")
        turns = np.concatenate([silence(0.5), speech["hello"], silence(1.0), speech["stop"], silence(1.0)])
        await c.send("input_audio_buffer.append", audio=b64(turns))  # two turns in one append
        events = await c.until("input_audio_buffer.committed")
        events += await c.until("input_audio_buffer.committed")
        events += await c.until("error")
        kinds = [e["type"] for e in events if e["type"].startswith("input_audio_buffer.") or e["type"] == "error"]
        assert kinds == ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                         "input_audio_buffer.committed", "error"] * 2, kinds
        assert {e["error"]["code"] for e in of_type(events, "error")} == {"response_limit_reached"}
        for created in of_type(c.seen, "response.created"):
            await c.send("response.cancel", response_id=created["response"]["id"])
            await c.until("response.done")
        await c.ws.close()
    await eventually(lambda: idle(srv.orch))
