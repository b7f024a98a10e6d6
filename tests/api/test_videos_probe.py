"""/v1/videos as a demanding client uses it: SDK auto-pagination while deleting, HEAD and Range on
content, a full queue's 429, and what a failed job answers after a restart
(of a renamed model folder), against a real server.

Tests run in file order against one server (tests/api/test_videos.py's helpers); the last restarts it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import openai
import pytest
import requests

pytest.importorskip("diffusers")
pytest.importorskip("av")

from omni_actors.bus.shm import unlink_segment
from tests.api.model_server import ModelRun
from tests.api.test_videos import FAST, LONG, serve_wan, wait_done
from tests.shutdown_support import runtime_dirs, segments_of

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the SDK marks its video API deprecated

QUEUE = 3
HTTP_TIMEOUT_S = 60
STREAM_CHUNK = 256
SMALL = {"size": "32x32", "seconds": "0.25"}


@pytest.fixture(scope="module")
def wan(tmp_path_factory):
    yield from serve_wan(tmp_path_factory.mktemp("wan-probe"), QUEUE)


def test_the_sdks_pages_keep_creation_order_and_survive_deleting_what_they_list(wan):
    client = wan.client
    made = [client.videos.create(model=wan.model.name, prompt=f"p{i}", **SMALL, extra_body=FAST).id
            for i in range(3)]  # likely within one second of `created_at`: ids must still order them
    newest = [v.id for v in client.videos.list(order="desc", limit=100) if v.id in made]
    assert newest == made[::-1]
    for job_id in made:
        assert wait_done(client, job_id).status == "completed"
    # The SDK's own loop: each next page is asked with `after` = the last id it saw, deleted by now.
    seen = []
    for video in client.videos.list(limit=1, order="asc"):
        seen.append(video.id)
        assert client.videos.delete(video.id).deleted
    assert [v for v in seen if v in made] == made
    assert client.videos.list(limit=100).data == []
    resp = requests.get(f"{wan.run.url}/v1/videos", params={"after": made[0]}, timeout=HTTP_TIMEOUT_S)
    assert resp.status_code == 200 and resp.json()["data"] == []
    resp = requests.get(f"{wan.run.url}/v1/videos", params={"after": "video_never"}, timeout=HTTP_TIMEOUT_S)
    assert (resp.status_code, resp.json()["error"]["param"]) == (400, "after")


def test_content_answers_head_range_and_two_readers_at_once(wan):
    client = wan.client
    job = client.videos.create(model=wan.model.name, prompt="a cat", **SMALL, extra_body=FAST)
    assert wait_done(client, job.id).status == "completed"
    url = f"{wan.run.url}/v1/videos/{job.id}/content"
    whole = requests.get(url, timeout=HTTP_TIMEOUT_S).content
    head = requests.head(url, timeout=HTTP_TIMEOUT_S)
    assert (head.status_code, head.headers["Content-Type"], int(head.headers["Content-Length"])) == (
        200, "video/mp4", len(whole))
    part = requests.get(url, headers={"Range": "bytes=10-109"}, timeout=HTTP_TIMEOUT_S)
    assert (part.status_code, part.content) == (206, whole[10:110])
    with requests.get(url, stream=True, timeout=HTTP_TIMEOUT_S) as first:
        chunks = first.iter_content(STREAM_CHUNK)
        start = next(chunks)
        assert client.videos.download_content(job.id).read() == whole  # while the first is open
        assert start + b"".join(chunks) == whole
    client.videos.delete(job.id)
    with pytest.raises(openai.NotFoundError):
        client.videos.download_content(job.id)


def test_a_full_queue_is_a_429_with_retry_after_and_unfinished_content_a_409(wan):
    client = wan.client
    jobs = [client.videos.create(model=wan.model.name, prompt=f"slow {i}", **SMALL, extra_body=LONG).id
            for i in range(QUEUE)]
    try:
        resp = requests.post(f"{wan.run.url}/v1/videos", timeout=HTTP_TIMEOUT_S,
                             json={"model": wan.model.name, "prompt": "one too many", **SMALL, **LONG})
        assert resp.status_code == 429 and int(resp.headers["Retry-After"]) > 0
        assert resp.json()["error"]["code"] == "queue_full"
        listed = {v.id: v.prompt for v in client.videos.list(limit=100)}
        assert set(jobs) <= set(listed) and "one too many" not in listed.values()  # nothing stored for it
        with pytest.raises(openai.APIStatusError) as err:
            client.videos.download_content(jobs[-1])
        assert (err.value.status_code, err.value.body["code"]) == (409, "video_not_ready")
    finally:
        for job_id in jobs:
            client.videos.delete(job_id)


def test_a_failed_job_says_why_to_download_and_remix_and_cursors_survive_a_restart(wan):
    client = wan.client
    gone = client.videos.create(model=wan.model.name, prompt="gone", **SMALL, extra_body=FAST)
    assert wait_done(client, gone.id).status == "completed"
    client.videos.delete(gone.id)
    kept = client.videos.create(model=wan.model.name, prompt="kept", **SMALL, extra_body=FAST)
    assert wait_done(client, kept.id).status == "completed"
    mp4 = client.videos.download_content(kept.id).read()
    lost = client.videos.create(model=wan.model.name, prompt="lost", **SMALL, extra_body=LONG)
    assert wait_done(client, lost.id, past="queued").status == "in_progress"
    wan.run.kill()  # a crash mid-job; clean up what the server and its worker cannot
    for name in segments_of(wan.run.pid):
        unlink_segment(name)
    for left in runtime_dirs(wan.run.runtime_parent) - wan.run.runtime_before:
        shutil.rmtree(wan.run.runtime_parent / left)
    wan.model = Path(shutil.move(wan.model, wan.tmp / "tiny-wan-renamed"))  # the folder, so the model, renamed
    wan.run = ModelRun(wan.tmp, wan.model, wan.data, {"0": {"max_queue": QUEUE}})
    wan.run.wait_ready()
    client = wan.client
    failed = client.videos.retrieve(lost.id)
    assert (failed.status, failed.error.code) == ("failed", "server_restarted")
    assert failed.completed_at is not None and failed.error.message
    with pytest.raises(openai.APIStatusError) as err:
        client.videos.download_content(lost.id)
    assert (err.value.status_code, err.value.body["code"]) == (409, "video_failed")
    assert "server_restarted" in err.value.body["message"]
    with pytest.raises(openai.APIStatusError) as err:
        client.videos.remix(lost.id, prompt="again")
    assert (err.value.status_code, err.value.body["code"]) == (409, "video_failed")
    listed = client.videos.list(after=gone.id, order="asc", limit=100)  # a cursor deleted before the restart
    assert [(v.id, v.model) for v in listed.data] == [(kept.id, "tiny-wan"), (lost.id, "tiny-wan")]
    assert client.videos.download_content(kept.id).read() == mp4  # the file outlives the model's name
    with pytest.raises(openai.BadRequestError) as err:  # but a remix needs the model that made it
        client.videos.remix(kept.id, prompt="kept")
    assert err.value.body["param"] == "video_id" and "tiny-wan-renamed" in err.value.body["message"]
