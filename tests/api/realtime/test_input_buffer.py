"""InputBuffer.since: a live turn reads the audio that arrived after a timeline position, across chunks,
after drops and takes, without joining the buffer."""

from __future__ import annotations

import numpy as np

from omni_actors.api.realtime.conversation import InputBuffer


def test_since_reads_across_chunks_after_drops_and_takes() -> None:
    buf = InputBuffer()
    audio = np.arange(100, dtype=np.float32)
    for part in np.split(audio, [10, 35, 36, 70]):
        buf.append(part)
    assert np.array_equal(buf.since(0), audio)
    assert np.array_equal(buf.since(33), audio[33:])
    assert np.array_equal(buf.since(70), audio[70:])
    assert buf.since(100).size == 0 and buf.since(150).size == 0
    assert len(buf.chunks) == 5  # read from the newest chunks back: nothing was joined
    buf.drop_before(20)
    assert np.array_equal(buf.since(5), audio[20:])  # before the buffer's start: all it holds
    assert np.array_equal(buf.take(until=40), audio[20:40])
    buf.append(np.full(5, -1, np.float32))
    assert np.array_equal(buf.since(95), np.concatenate([audio[95:], np.full(5, -1, np.float32)]))
    assert buf.since(buf.end).size == 0
