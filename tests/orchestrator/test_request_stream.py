"""A request's stream bound counts what its reader left unread, not one output's size: a large output
behind a small unread one is taken (before 2026-12-05 it was refused and the request aborted — an image
or a video right behind its last progress report, when the loop handed both on at once), and a reader
that stops reading is still cut off once the bound is reached. A failure is read after the outputs made
before it; an abort, or a reader that closes the stream, drops them at once."""

from __future__ import annotations

import numpy as np
import pytest

from omni_actors.errors import RequestAborted, RequestError, StageFailed
from omni_actors.orchestrator.requests import RequestSpec, RequestStream, StageChunk, chunk_nbytes
from tests.conftest import make_deploy, running

BOUND = 1 << 20
REPEATS = 10
"""Requests of the real stage that fails at once: each lost its outputs before the fix."""


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


# A failure is read after the outputs made before it; an abort, or a reader that closes the stream, drops them at
# once (before 2026-12-05 every error dropped them: a stage that made two outputs and failed at once had a
# streamed route, which waits for the first output before its headers, answer an HTTP 500 with none of them).


def _text(text: str) -> StageChunk:
    return StageChunk(0, "text", {"text": text}, False)


async def _read(stream: RequestStream) -> tuple[list[str], BaseException | None]:
    got: list[str] = []
    try:
        async for chunk in stream:
            got.append(chunk.data["text"])
    except RequestError as err:
        return got, err
    return got, None


async def test_a_failure_is_read_after_the_outputs_made_before_it() -> None:
    stream = RequestStream("r", lambda _rid: None, BOUND)
    assert stream.put_nowait(_text("a")) and stream.put_nowait(_text(" b"))
    failed = StageFailed(0, "boom")
    assert stream.finish_nowait(failed)
    assert stream.queued_bytes > 0  # (held for the reader still there)
    assert await _read(stream) == (["a", " b"], failed)
    assert stream.queued_bytes == 0
    assert await _read(stream) == ([], None)  # the error is raised once


async def test_an_abort_drops_the_unread_outputs_at_once() -> None:
    stream = RequestStream("r", lambda _rid: None, BOUND)
    stream.put_nowait(_chunk(BOUND // 2))
    aborted = RequestAborted("r aborted")
    stream.finish_nowait(aborted)
    assert stream.queued_bytes == 0
    assert await _read(stream) == ([], aborted)


@pytest.mark.parametrize("error", [StageFailed(0, "boom"), None], ids=["failed", "ended"])
async def test_a_reader_that_closes_an_ended_stream_frees_what_it_left_unread(error: RequestError | None) -> None:
    aborts: list[str] = []
    stream = RequestStream("r", aborts.append, BOUND)
    stream.put_nowait(_text("a"))
    stream.put_nowait(_chunk(BOUND // 2))
    stream.finish_nowait(error)
    stream.close()
    assert stream.queued_bytes == 0 and stream.backlog() == 1 and aborts == []  # (ended: nothing to abort)
    assert await _read(stream) == ([], error)


async def test_a_reader_that_closes_a_running_stream_aborts_it() -> None:
    aborts: list[str] = []
    stream = RequestStream("r", aborts.append, BOUND)
    stream.close()
    assert aborts == ["r"]


async def test_outputs_a_stage_made_before_failing_at_once_reach_the_reader_in_order() -> None:
    """A real stage that makes two words and fails at the third, with no time between them: its three
    messages reach the orchestrator together, every time."""
    deploy = make_deploy("synthetic_text", stages=[{"stage_id": 0, "engine_extras": {"fail_on_chunk": 2}}])
    async with running(deploy) as orch:
        for i in range(REPEATS):
            got, err = await _read(orch.submit(RequestSpec(inputs={"prompt": "a b c d"}, params={"max_tokens": 4})))
            assert got == ["a", " b"] and isinstance(err, StageFailed), (i, got, err)
            assert "synthetic failure at chunk 2" in str(err)
