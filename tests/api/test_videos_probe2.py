"""/v1/videos deletes that race: several DELETEs of one running job at once answer `deleted: true` once and
404 otherwise, as OpenAI does, against a real server (tests/api/test_videos.py's helpers).

The job runs 1000 denoising steps, so it is still running when the deletes arrive; each waits for its
abort (between steps, in the worker process) before removing the row, so they overlap in that wait.
"""

from __future__ import annotations

import asyncio
import json
from urllib.parse import urlsplit

import openai
import pytest

pytest.importorskip("diffusers")
pytest.importorskip("av")

from tests.api.test_videos import LONG, serve_wan, wait_done

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the SDK marks its video API deprecated

QUEUE = 2
DELETES = 4
HTTP_TIMEOUT_S = 120
SLOW = {"size": "128x128", "seconds": "0.5"}
"""Large enough that a denoising step (the most an abort waits) outlasts the deletes' arrival."""


@pytest.fixture(scope="module")
def wan(tmp_path_factory):
    yield from serve_wan(tmp_path_factory.mktemp("wan-probe2"), QUEUE)


async def test_deletes_of_one_running_job_at_once_answer_deleted_once_and_404_else(wan):
    client = wan.client
    job = client.videos.create(model=wan.model.name, prompt="slow", **SLOW, extra_body=LONG)
    assert wait_done(client, job.id, past="queued").status == "in_progress"
    answers = sorted(await _at_once(wan.run.url, f"/v1/videos/{job.id}", DELETES), key=lambda a: a[0])
    assert [status for status, _ in answers] == [200] + [404] * (DELETES - 1), answers
    assert answers[0][1] == {"id": job.id, "object": "video.deleted", "deleted": True}
    assert all(body["error"]["code"] == "not_found" for _, body in answers[1:]), answers
    with pytest.raises(openai.NotFoundError):
        client.videos.delete(job.id)
    with pytest.raises(openai.NotFoundError):
        client.videos.retrieve(job.id)
    assert not list((wan.data / "state" / "files" / "videos").glob(f"{job.id}*"))


async def _at_once(base: str, path: str, count: int) -> list[tuple[int, dict]]:
    """`count` DELETEs of `path`, each on its own connection, their headers' last line sent to all at once
    (none can start before then), so they reach the server together; [(status, JSON body)]."""
    url = urlsplit(base)
    conns = [await asyncio.open_connection(url.hostname, url.port) for _ in range(count)]
    for _, writer in conns:
        writer.write(f"DELETE {path} HTTP/1.1\r\nHost: {url.netloc}\r\nConnection: close\r\n".encode())
        await writer.drain()
    for _, writer in conns:
        writer.write(b"\r\n")
    answers = []
    async with asyncio.timeout(HTTP_TIMEOUT_S):
        for reader, writer in conns:
            head, _, body = (await reader.read()).partition(b"\r\n\r\n")
            writer.close()
            answers.append((int(head.split()[1]), json.loads(body)))
    return answers
