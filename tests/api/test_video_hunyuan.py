"""HunyuanVideo-1.5 served end to end: `omni-run --model` on its tiny folder, the openai SDK's video jobs.

Its pipeline has no step callback (the engine pauses it inside `scheduler.step`) and cannot
batch prompts (`max_batch` 1): two jobs sent at once both complete, with per-step progress.
"""

from __future__ import annotations

import openai
import pytest

from omni_actors.media.mp4 import probe
from tests.api.model_server import serve_tiny
from tests.api.test_videos import JOB_WAIT_S, wait_done

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the SDK marks its video API deprecated
FAST = {"num_inference_steps": 3}


@pytest.fixture(scope="module")
def hy(tmp_path_factory):
    yield from serve_tiny(tmp_path_factory.mktemp("hy"), "hunyuan_video_1_5")


def test_two_jobs_at_once_complete_with_progress_and_decode_to_the_asked_frames(hy, tmp_path):
    client, name = hy.client(), hy.model
    caps = client.models.retrieve(name).model_extra["capabilities"]
    assert (caps["size_multiple"], caps["video"]["fps"], caps["video"]["frame_multiple"]) == (16, 24.0, 4)
    jobs = [client.videos.create(model=name, prompt=p, size="32x16", extra_body={**FAST, "num_frames": 5, "seed": 1})
            for p in ("a cat walks", "the sea at night")]
    mid = client.videos.retrieve(jobs[0].id, extra_query={"wait_s": JOB_WAIT_S, "progress_past": 0})
    assert mid.progress > 0 and mid.status in ("in_progress", "completed"), mid.error
    done = [wait_done(client, j.id) for j in jobs]
    assert [d.status for d in done] == ["completed"] * 2, [d.error for d in done]
    made = []
    for j in jobs:
        path = tmp_path / f"{j.id}.mp4"
        path.write_bytes(client.videos.download_content(j.id).read())
        made.append(probe(path))
    assert {(m.width, m.height, m.frames, m.fps, m.audio_channels) for m in made} == {(32, 16, 5, 24.0, 0)}
    with pytest.raises(openai.BadRequestError) as err:  # a size the VAE cannot make: refused, no job
        client.videos.create(model=name, prompt="x", size="30x16")
    assert err.value.body["param"] == "size"
    assert len(client.videos.list().data) == 2


def test_a_guidance_scale_its_call_does_not_take_is_a_400_not_a_no_op(hy):
    """HunyuanVideo-1.5's `__call__` has no guidance_scale (its guider holds it): /v1/models leaves it out of
    `inputs`, and a job that sent one ran without it, completed, and said nothing (before 2026-12-05)."""
    client, name = hy.client(), hy.model
    assert "guidance_scale" not in client.models.retrieve(name).model_extra["capabilities"]["inputs"]
    before = len(client.videos.list().data)
    with pytest.raises(openai.BadRequestError) as err:
        client.videos.create(model=name, prompt="x", size="32x16", extra_body={**FAST, "guidance_scale": 9.0})
    assert (err.value.body["param"], err.value.body["code"]) == ("guidance_scale", "unsupported_parameter")
    assert len(client.videos.list().data) == before  # refused before a job was stored
