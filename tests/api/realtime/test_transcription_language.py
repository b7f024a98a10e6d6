"""A realtime transcription session's `language` is read as /v1/audio/transcriptions reads it: an ISO-639-1
code (any case, a region subtag dropped) or Whisper's name for it is taken, anything else is an `error` at
session.update naming the field (before 2026-12-05 it went to the recognizer as sent: synthetic_asr took
"xx", Whisper tiny.en refused "English")."""

from __future__ import annotations

import aiohttp

from tests.api.conftest import eventually, idle
from tests.api.realtime.conftest import EVENT_TIMEOUT_S, serve_rt

PARAM = "session.audio.input.transcription.language"


async def test_a_bad_language_is_an_error_naming_it_and_codes_are_taken() -> None:
    async with serve_rt("synthetic_asr") as srv, aiohttp.ClientSession() as http:
        ws = await http.ws_connect(f"{srv.url}/v1/realtime?model=synthetic_asr", headers=srv.headers)
        assert [(await ws.receive_json(timeout=EVENT_TIMEOUT_S))["type"] for _ in range(2)] == [
            "session.created", "conversation.created"]
        for language, refused in (("xx", True), ("EN", False), ("en-US", False), ("English", False),
                                  ("Klingon", True)):
            await ws.send_json({"type": "session.update", "session": {"type": "transcription", "audio": {
                "input": {"transcription": {"language": language}}}}})
            event = await ws.receive_json(timeout=EVENT_TIMEOUT_S)
            while event["type"] not in ("error", "session.updated"):
                event = await ws.receive_json(timeout=EVENT_TIMEOUT_S)
            if refused:
                assert event["type"] == "error", event
                assert (event["error"]["param"], event["error"]["code"]) == (PARAM, "invalid_value"), event
                assert repr(language) in event["error"]["message"], event
            else:
                assert event["type"] == "session.updated", event
        await ws.close()
        await eventually(lambda: idle(srv.orch), timeout_s=30)
