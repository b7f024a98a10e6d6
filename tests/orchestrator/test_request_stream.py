"""A request's stream bound counts what its reader left unread, not one output's size: a large output
behind a small unread one is taken (before 2026-12-05 it was refused and the request aborted — an image
or a video right behind its last progress report, when the loop handed both on at once), and a reader
that stops reading is still cut off once the bound is reached."""

from __future__ import annotations

import numpy as np

from omni_actors.orchestrator.requests import RequestStream, StageChunk, chunk_nbytes

BOUND = 1 << 20


def _chunk(nbytes: int) -> StageChunk:
    return StageChunk(0, "image", {"pixels": np.zeros(nbytes, dtype=np.uint8)}, False)


async def test_a_large_output_behind_a_small_unread_one_is_taken() -> None:
    stream = RequestStream("r", lambda _rid: None, BOUND)
    small, large = _chunk(100), _chunk(4 * BOUND)
    assert stream.put_nowait(small) and stream.put_nowait(large)
    assert stream.queued_bytes == chunk_nbytes(small) + chunk_nbytes(large)
    stream.finish_nowait()
    got = [chunk async for chunk in stream]
    assert [c.data["pixels"].nbytes for c in got] == [100, 4 * BOUND]
    assert stream.queued_bytes == 0


async def test_a_reader_that_stops_is_refused_once_the_bound_is_reached() -> None:
    stream = RequestStream("r", lambda _rid: None, BOUND)
    taken = 0
    while stream.put_nowait(_chunk(BOUND // 8)):
        taken += 1
    assert 8 <= taken <= 9  # under the bound each chunk is taken; the one at it is refused
    assert BOUND <= stream.queued_bytes < BOUND + chunk_nbytes(_chunk(BOUND // 8))
