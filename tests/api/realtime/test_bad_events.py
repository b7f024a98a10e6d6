"""A demanding user's bad realtime events: each gets an `error` event, and the same session then works.

test_robustness.py covers the first mistakes (unknown type, broken base64, a wrong-typed field, an
oversized event); this covers frames that are not events at all, out-of-range session and response
settings, buffer and cancel misuse, each followed by an action that must succeed.
"""

from __future__ import annotations

import base64
from typing import Any

import aiohttp
import numpy as np
import pytest

from omni_actors.api.realtime.audio import pcm16_bytes
from tests.api.conftest import eventually, idle, post
from tests.api.realtime.conftest import Client, RtServer, b64, connect, of_type, pcm, silence

ABOVE_D, BELOW_D = "decimal_above_max_value", "decimal_below_min_value"
ABOVE_I, BELOW_I = "integer_above_max_value", "integer_below_min_value"
"""A number out of its range is coded as the REST routes code it (OpenAI's codes), not invalid_value."""
TYPE = "invalid_type"
"""A value of the wrong type, as REST codes it (api/errors.py validation_detail)."""
TEXT_ITEM = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "one two"}]}


async def _error(c: Client) -> dict[str, Any]:
    """The next event, which must be an `error` with the OpenAI fields."""
    event = await c.recv()
    assert event["type"] == "error", event
    err = event["error"]
    assert {"type", "code", "message", "param", "event_id"} <= set(err), err
    assert err["type"] == "invalid_request_error" and err["message"], err
    return err


async def _still_usable(c: Client) -> None:
    """A cheap round trip that must succeed right after an error."""
    await c.send("input_audio_buffer.clear")
    assert (await c.recv())["type"] == "input_audio_buffer.cleared"


async def _respond(c: Client, **response: Any) -> dict[str, Any]:
    await c.send("response.create", **({"response": response} if response else {}))
    events = await c.until("response.done")
    assert not of_type(events, "error"), of_type(events, "error")
    return events[-1]["response"]


async def test_frames_that_are_not_events(srv: RtServer) -> None:
    async with aiohttp.ClientSession() as http:
        c = await connect(srv, http, turn_detection=None)
        frames: list[tuple[str | bytes, str, str | None, str | None]] = [  # frame, code, param, event_id
            ("hello", "invalid_json", None, None),
            ("", "invalid_json", None, None),
            ("[1, 2]", "invalid_json", None, None),
            ('"input_audio_buffer.clear"', "invalid_json", None, None),
            ("null", "invalid_json", None, None),
            ("42", "invalid_json", None, None),
            (b"\x00\x01\x02binary", "invalid_json", None, None),
            (b'{"type": "\xff\xfe"}', "invalid_json", None, None),
            ('{"type": 5, "event_id": "n"}', "invalid_event", "type", "n"),
            ('{"event_id": "no-type"}', "invalid_event", "type", "no-type"),
            ('{"type": "session.delete", "event_id": "u"}', "invalid_event", "type", "u"),
            ('{"type": "input_audio_buffer.clear", "event_id": 7}', "invalid_type", "event_id", None),
            ('{"type": "session.update", "event_id": "s"}', "missing_required_parameter", "session", "s"),
            ('{"type": "session.update", "session": "fast", "event_id": "s2"}', "invalid_type", "session", "s2"),
            ('{"type": "input_audio_buffer.append", "event_id": "a"}', "missing_required_parameter", "audio", "a"),
            ('{"type": "input_audio_buffer.append", "audio": null, "event_id": "a2"}', "invalid_type", "audio", "a2"),
        ]
        for frame, code, param, event_id in frames:
            await (c.ws.send_bytes(frame) if isinstance(frame, bytes) else c.ws.send_str(frame))
            err = await _error(c)
            assert (err["code"], err["param"], err["event_id"]) == (code, param, event_id), (frame, err)
            await _still_usable(c)
        # a binary frame holding a valid event is acted on like a text frame
        await c.ws.send_bytes(b'{"type": "input_audio_buffer.clear"}')
        assert (await c.recv())["type"] == "input_audio_buffer.cleared"
        await c.send("conversation.item.create", item=TEXT_ITEM)
        await c.until("conversation.item.created")
        assert (await _respond(c))["status"] == "completed"
        await c.ws.close()


async def test_session_update_with_bad_values_changes_nothing(srv: RtServer) -> None:
    async with aiohttp.ClientSession() as http:
        c = await connect(srv, http, turn_detection=None)
        await c.send("session.update", session={"instructions": "be brief"})
        before = (await c.until("session.updated"))[-1]["session"]
        bad: list[tuple[Any, ...]] = [  # session fields, param[, code when not invalid_value]
            ({"temperature": 1e9}, "session.temperature", ABOVE_D),
            ({"temperature": -1}, "session.temperature", BELOW_D),
            ({"max_response_output_tokens": -5}, "session.max_response_output_tokens", BELOW_I),
            ({"max_response_output_tokens": 0}, "session.max_response_output_tokens", BELOW_I),
            ({"max_response_output_tokens": 10**30}, "session.max_response_output_tokens", ABOVE_I),
            ({"max_output_tokens": 2**63}, "session.max_output_tokens", ABOVE_I),
            ({"max_response_output_tokens": "lots"}, "session.max_response_output_tokens"),
            ({"modalities": ["video"]}, "session.modalities[0]"),
            ({"voice": 5}, "session.voice", TYPE),
            ({"tools": "all"}, "session.tools", TYPE),
            ({"output_audio_format": "mp3"}, "session.output_audio_format"),
            ({"turn_detection": {"type": "push_to_talk"}}, "session.turn_detection.type"),
            ({"turn_detection": {"threshold": 1.5}}, "session.turn_detection.threshold", ABOVE_D),
            ({"turn_detection": {"silence_duration_ms": -1}}, "session.turn_detection.silence_duration_ms", BELOW_I),
            ({"turn_detection": {"prefix_padding_ms": 10**9}}, "session.turn_detection.prefix_padding_ms", ABOVE_I),
            ({"turn_detection": {"silence_duration_ms": 10**9}}, "session.turn_detection.silence_duration_ms", ABOVE_I),
            ({"modalities": []}, "session.modalities"),
            ({"output_modalities": []}, "session.output_modalities"),
            ({"type": "translation"}, "session.type"),
            ({"audio": {"input": {"format": {"type": "audio/wav"}}}}, "session.audio.input.format.type"),
            ({"audio": {"output": {"format": "opus"}}}, "session.audio.output.format"),
            # transcription options of the wrong type: refused here, not by each turn's recognizer
            ({"input_audio_transcription": {"language": 123}}, "session.input_audio_transcription.language", TYPE),
            ({"input_audio_transcription": {"prompt": ["a"]}}, "session.input_audio_transcription.prompt", TYPE),
            ({"audio": {"input": {"transcription": {"language": ["en"]}}}},
             "session.audio.input.transcription.language", TYPE),
            ({"audio": {"input": {"transcription": {"model": 7}}}}, "session.audio.input.transcription.model", TYPE),
            ({"input_audio_transcription": "whisper-1"}, "session.input_audio_transcription", TYPE),
            # one good field does not slip through beside a bad one
            ({"instructions": "changed", "temperature": 9.0}, "session.temperature", ABOVE_D),
        ]
        for i, (fields, param, *code) in enumerate(bad):
            await c.send("session.update", session=fields, event_id=f"bad{i}")
            err = await _error(c)
            assert (err["code"], err["param"], err["event_id"]) == ((*code, "invalid_value")[0], param, f"bad{i}"), (
                fields, err)
            if fields == {"modalities": ["video"]}:  # a closed set: the message lists it
                assert err["message"].endswith("expected one of 'audio', 'text'"), err
        await c.send("session.update", session={"type": "transcription"}, event_id="asr")
        err = await _error(c)  # the synthetic pipeline makes no transcripts
        assert (err["code"], err["param"], err["event_id"]) == ("unsupported_session_type", "session.type", "asr")
        await c.send("session.update", session={"voice": "echo"})
        after = (await c.until("session.updated"))[-1]["session"]
        assert after == {**before, "voice": "echo"}
        assert after["temperature"] == 0.8 and after["max_response_output_tokens"] == "inf"
        await c.send("conversation.item.create", item=TEXT_ITEM)
        await c.until("conversation.item.created")
        done = await _respond(c)
        assert done["status"] == "completed" and done["voice"] == "echo"
        await c.ws.close()
    await eventually(lambda: idle(srv.orch))


async def test_response_create_with_bad_values_starts_nothing(srv: RtServer) -> None:
    async with aiohttp.ClientSession() as http:
        c = await connect(srv, http, turn_detection=None)
        await c.send("conversation.item.create", item=TEXT_ITEM)
        await c.until("conversation.item.created")
        total = srv.orch.statistics().requests_total
        bad: list[tuple[Any, ...]] = [  # response fields, param[, code when not invalid_value]
            ({"max_output_tokens": 10**30}, "response.max_output_tokens", ABOVE_I),
            ({"max_response_output_tokens": 2**64}, "response.max_response_output_tokens", ABOVE_I),
            ({"max_output_tokens": 0}, "response.max_output_tokens", BELOW_I),
            ({"max_output_tokens": -3}, "response.max_output_tokens", BELOW_I),
            ({"temperature": 1e9}, "response.temperature", ABOVE_D),
            ({"output_audio_format": "mp3"}, "response.output_audio_format"),
            ({"conversation": "elsewhere"}, "response.conversation"),
            ({"modalities": ["image"]}, "response.modalities[0]"),
            ({"modalities": []}, "response.modalities"),  # as session.update refuses it
            ({"output_modalities": []}, "response.output_modalities"),
            ({"input": [{"type": "message", "role": "user", "content": [{"type": "input_video"}]}]},
             "response.input[0].content[0].type"),
        ]
        for i, (fields, param, *code) in enumerate(bad):
            await c.send("response.create", response=fields, event_id=f"bad{i}")
            err = await _error(c)
            assert (err["code"], err["param"], err["event_id"]) == ((*code, "invalid_value")[0], param, f"bad{i}"), (
                fields, err)
            if fields == {"modalities": ["video"]}:  # a closed set: the message lists it
                assert err["message"].endswith("expected one of 'audio', 'text'"), err
        assert srv.orch.statistics().requests_total == total  # none reached the pipeline
        for field, value, code in (("temperature", 1e9, ABOVE_D), ("max_tokens", 0, BELOW_I)):  # REST agrees
            status, body = await post(srv, "/v1/chat/completions", {"model": "synthetic", "messages": [
                {"role": "user", "content": "hi"}], field: value})
            assert (status, body["error"]["code"], body["error"]["param"]) == (400, code, field), body
        done = await _respond(c, max_output_tokens=3, output_audio_format="g711_ulaw")
        assert done["status"] == "incomplete" and done["output_audio_format"] == "g711_ulaw"
        await c.ws.close()
    await eventually(lambda: idle(srv.orch))


async def test_input_audio_buffer_mistakes(srv: RtServer) -> None:
    async with aiohttp.ClientSession() as http:
        c = await connect(srv, http, turn_detection=None)
        eid = await c.send("input_audio_buffer.commit")  # nothing appended yet
        err = await _error(c)
        assert (err["code"], err["event_id"]) == ("input_audio_buffer_commit_empty", eid)
        for audio in ("AAA", "AA=A", "data:audio/wav;base64,AAAA"):
            eid = await c.send("input_audio_buffer.append", audio=audio)
            err = await _error(c)
            assert (err["code"], err["param"], err["event_id"]) == ("invalid_value", "audio", eid), (audio, err)
        await c.send("input_audio_buffer.append", audio=b64(silence(0.05)))
        eid = await c.send("input_audio_buffer.commit")  # 50 ms is too short ...
        err = await _error(c)
        assert (err["code"], err["event_id"]) == ("input_audio_buffer_commit_empty", eid)
        assert "need 100 ms" in err["message"]
        await c.send("input_audio_buffer.append", audio=b64(silence(0.1)))
        await c.send("input_audio_buffer.commit")  # ... and is kept: 150 ms commit
        item_id = (await c.until("input_audio_buffer.committed"))[-1]["item_id"]
        await c.send("conversation.item.retrieve", item_id=item_id)
        item = (await c.until("conversation.item.retrieved"))[-1]["item"]
        held_s = len(base64.b64decode(item["content"][0]["audio"])) / 2 / 24_000
        assert abs(held_s - 0.15) < 0.005, held_s
        await c.ws.close()


async def _committed_level(c: Client) -> float:
    """Commit the input buffer; the median level of the committed item's audio."""
    await c.send("input_audio_buffer.commit")
    item_id = (await c.until("input_audio_buffer.committed"))[-1]["item_id"]
    await c.send("conversation.item.retrieve", item_id=item_id)
    item = (await c.until("conversation.item.retrieved"))[-1]["item"]
    return float(np.median(np.abs(pcm(item["content"][0]["audio"]))))


async def test_pcm16_appends_cut_mid_sample_are_one_byte_stream(srv: RtServer) -> None:
    """A client cutting its pcm16 byte stream anywhere: an append's odd last byte leads the next append
    (a commit keeps it: its sample starts the next turn), and input_audio_buffer.clear drops it."""
    level = 0.125  # int16 0x1000: bytes 00 10; one byte off, they read as 0x0010, near silence
    raw = pcm16_bytes(np.full(int(0.15 * 24_000), level, np.float32))
    stream = raw + raw
    async with aiohttp.ClientSession() as http:
        c = await connect(srv, http, turn_detection=None)
        for piece in (stream[:1001], stream[1001:len(raw) + 1]):  # the second ends one byte into turn two
            await c.send("input_audio_buffer.append", audio=base64.b64encode(piece).decode())
        assert await _committed_level(c) == pytest.approx(level, abs=1e-3)
        await c.send("input_audio_buffer.append", audio=base64.b64encode(stream[len(raw) + 1:]).decode())
        assert await _committed_level(c) == pytest.approx(level, abs=1e-3)
        await c.send("input_audio_buffer.append", audio=base64.b64encode(raw[:3]).decode())  # holds a byte
        await c.send("input_audio_buffer.clear")
        await c.send("input_audio_buffer.append", audio=base64.b64encode(raw).decode())
        assert await _committed_level(c) == pytest.approx(level, abs=1e-3)
        assert not of_type(c.seen, "error"), of_type(c.seen, "error")
        await c.ws.close()


async def test_cancel_mistakes_leave_the_response_running(srv: RtServer) -> None:
    async with aiohttp.ClientSession() as http:
        c = await connect(srv, http, turn_detection=None)
        eid = await c.send("response.cancel", response_id="resp_nope")
        err = await _error(c)
        assert (err["code"], err["param"], err["event_id"]) == ("response_cancel_not_active", "response_id", eid)
        await c.send("conversation.item.create", item=TEXT_ITEM)
        await c.until("conversation.item.created")
        await c.send("response.create")
        created = (await c.until("response.created"))[-1]["response"]
        await c.send("response.cancel", response_id="resp_other", event_id="wrong-id")
        await c.send("response.create", event_id="second")
        events = await c.until("response.done")
        errors = {e["error"]["event_id"]: e["error"]["code"] for e in of_type(events, "error")}
        assert errors == {"wrong-id": "response_cancel_not_active",
                          "second": "conversation_already_has_active_response"}
        done = events[-1]["response"]
        assert done["id"] == created["id"] and done["status"] == "completed"
        await c.send("response.cancel")  # finished: nothing left to cancel
        assert (await c.until("error"))[-1]["error"]["code"] == "response_cancel_not_active"
        assert (await _respond(c))["status"] == "completed"
        await c.ws.close()
    await eventually(lambda: idle(srv.orch))


async def test_a_field_realtime_and_rest_both_take_is_refused_with_the_same_code(srv: RtServer) -> None:
    """One reading of a decode failure for both (api/errors.py validation_detail): a wrong type, a number
    past a float's range, a `model` past a name's length get the code the REST route gives the same field."""
    chat = b'{"model": "synthetic", "messages": [{"role": "user", "content": "hi"}], '
    cases = [  # realtime session fields (raw JSON), the REST body's field (raw JSON), param
        (b'{"temperature": "hot"}', b'"temperature": "hot"}', "temperature"),
        (b'{"temperature": 1e999}', b'"temperature": 1e999}', "temperature"),
        (b'{"temperature": -1e999}', b'"temperature": -1e999}', "temperature"),
        (b'{"max_response_output_tokens": true}', b'"max_tokens": true}', None),
    ]
    async with aiohttp.ClientSession() as http:
        c = await connect(srv, http, turn_detection=None)
        for i, (session, rest_field, param) in enumerate(cases):
            status, body = await post(srv, "/v1/chat/completions", data=chat + rest_field,
                                      headers={"Content-Type": "application/json"})
            assert status == 400, body
            await c.ws.send_str(f'{{"type": "session.update", "event_id": "n{i}", "session": {session.decode()}}}')
            err = await _error(c)
            assert err["code"] == body["error"]["code"] and err["event_id"] == f"n{i}", (session, err, body)
            assert err["param"] == f"session.{param or 'max_response_output_tokens'}", err
        assert {of["error"]["code"] for of in of_type(c.seen, "error")} == {"invalid_type", "invalid_value"}
        await _still_usable(c)
        await c.ws.close()
        name = "m" * 300  # longer than any name REST takes
        status, body = await post(srv, "/v1/chat/completions", {"model": name, "messages": [
            {"role": "user", "content": "hi"}]})
        async with http.get(f"{srv.url}/v1/realtime?model={name}", headers={**srv.headers, "Upgrade": "websocket"}) \
                as resp:
            refused = await resp.json()
        assert (status, body["error"]["code"]) == (400, "string_above_max_length"), body
        assert (resp.status, refused["error"]["code"], refused["error"]["param"]) == (status, body["error"]["code"],
                                                                                      "model"), refused
        assert name not in refused["error"]["message"]
