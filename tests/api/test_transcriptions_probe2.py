"""/v1/audio/transcriptions verbose_json with word timestamps alone, against the real Whisper tiny.en
(tests/api/test_transcriptions_probe.py's server and recording): OpenAI then answers `words`, no `segments`."""

from __future__ import annotations

import json

from tests.api.conftest import Server
from tests.api.test_transcriptions_probe import RECORDING, whisper

__all__ = ["whisper"]  # the module-scoped Whisper server fixture, shared with the probe tests


async def test_word_timestamps_alone_leave_segments_out(whisper: Server) -> None:
    client = whisper.client()
    data = RECORDING.read_bytes()
    raw = await client.audio.transcriptions.with_raw_response.create(
        model="assistant", file=("a.wav", data), response_format="verbose_json", timestamp_granularities=["word"])
    body = json.loads(raw.http_response.content)
    assert "segments" not in body, body
    assert body["words"] and "young man" in body["text"].lower(), body
    said = raw.parse()
    assert said.segments is None and said.words and all(w.start <= w.end for w in said.words)
    both = await client.audio.transcriptions.create(model="assistant", file=("a.wav", data),
                                                    response_format="verbose_json",
                                                    timestamp_granularities=["segment", "word"])
    assert both.segments and both.words
    assert [w.word for w in both.words] == [w.word for w in said.words]
