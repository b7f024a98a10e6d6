"""/v1/videos/edits end to end: `client.videos.edit` (the unmodified openai SDK) against
`omni-run --model <tiny Wan2.2 text-to-video folder>` (two experts, as Wan2.2-T2V-A14B).

An edit re-makes the source under a new prompt from its encoded frames noised to
`strength` (workers/engines/video_edit.py). With random weights nothing can be said of
the picture, so the tests show what can fail: the result has the source's size and frame
count; the same seed makes the same video; the source is really used (two sources give two
results at strength 0.5, one at 1.0, where the source is all noise); an upload of the same
MP4 edits as its job does; bad inputs are 400s naming the field.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import openai
import pytest

pytest.importorskip("diffusers")
pytest.importorskip("av")

from omni_actors.media.mp4 import probe, write_mp4
from tests.api.model_server import serve_tiny
from tests.api.test_video_derive import (
    FAST,
    FPS,
    by_id,
    decoded,
    download,
    frame_median_error,
    mean_error,
)
from tests.api.test_videos import wait_done

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the SDK marks its video API deprecated

EDIT = {"num_inference_steps": 4, "seed": 7}
SAME_MAX = 1.0
"""Largest median per-frame difference (of 255, `frame_median_error`) between two MP4s of the same video:
the engine's frames repeat exactly; libx264 now and then codes a few of them a few levels apart."""
DIFFERENT_MIN = 3.0
"""Smallest mean difference that counts as another video (different edits differ by tens of levels)."""


@pytest.fixture(scope="module")
def t2v(tmp_path_factory):
    yield from serve_tiny(tmp_path_factory.mktemp("t2v"), "wan2_2")


@pytest.fixture(scope="module")
def sources(t2v) -> list[str]:
    """Two completed 5-frame 32x32 videos of different seeds."""
    client = t2v.client()
    jobs = [client.videos.create(prompt="the sea", size="32x32", seconds="0.25", extra_body={**FAST, "seed": s})
            for s in (1, 2)]
    assert [wait_done(client, j.id).status for j in jobs] == ["completed"] * 2
    return [j.id for j in jobs]


def _edit(client: openai.OpenAI, tmp: Path, name: str, **video) -> np.ndarray:
    job = client.videos.edit(prompt="the sea on fire", **video) if video else None
    assert job is not None
    assert (job.status, job.size, job.seconds) == ("queued", "32x32", f"{5 / FPS:g}")
    done = wait_done(client, job.id)
    assert (done.status, done.progress) == ("completed", 100), done.error
    path = download(client, job.id, tmp / f"{name}.mp4")
    made = probe(path)
    assert (made.width, made.height, made.frames) == (32, 32, 5)
    return decoded(path)


def test_an_edit_remakes_the_source_at_its_size_and_repeats_with_its_seed(t2v, sources, tmp_path):
    client = t2v.client()
    first = _edit(client, tmp_path, "a", **by_id(sources[0], **EDIT, strength=0.5))
    again = _edit(client, tmp_path, "b", **by_id(sources[0], **EDIT, strength=0.5))
    assert frame_median_error(first, again) < SAME_MAX
    source = decoded(download(client, sources[0], tmp_path / "src.mp4"))
    assert mean_error(first, source) > DIFFERENT_MIN  # re-made, not copied


def test_the_source_shapes_the_edit_until_strength_one(t2v, tmp_path):
    client = t2v.client()
    uploads = []
    for name, level in (("black", 0), ("white", 255)):
        write_mp4(tmp_path / f"{name}.mp4", np.full((5, 32, 32, 3), level, np.uint8), FPS)
        uploads.append((f"{name}.mp4", (tmp_path / f"{name}.mp4").read_bytes(), "video/mp4"))
    low = [_edit(client, tmp_path, f"l{i}", video=u, extra_body={**EDIT, "strength": 0.1}) for i, u in enumerate(uploads)]
    assert mean_error(low[0], low[1]) > DIFFERENT_MIN  # two sources, two results
    full = [_edit(client, tmp_path, f"f{i}", video=u, extra_body={**EDIT, "strength": 1.0}) for i, u in enumerate(uploads)]
    assert frame_median_error(full[0], full[1]) < SAME_MAX  # at 1.0 the source is all noise: the seed alone decides


def test_an_uploaded_mp4_edits_as_its_job_does(t2v, sources, tmp_path):
    client = t2v.client()
    src = download(client, sources[1], tmp_path / "up.mp4")
    by_upload = _edit(client, tmp_path, "u", video=("up.mp4", src.read_bytes(), "video/mp4"),
                      extra_body={**EDIT, "strength": 0.5})
    by_job = _edit(client, tmp_path, "j", **by_id(sources[1], **EDIT, strength=0.5))
    assert frame_median_error(by_upload, by_job) < SAME_MAX


@pytest.mark.parametrize(("extra", "param"), [
    pytest.param({"strength": 0}, "strength", id="strength-0"),
    pytest.param({"strength": 1.5}, "strength", id="strength-over-1"),
    pytest.param({"num_inference_steps": 0}, "num_inference_steps", id="no-steps"),
])
def test_bad_edit_fields_are_400_naming_them(t2v, sources, extra, param):
    with pytest.raises(openai.BadRequestError) as err:
        t2v.client().videos.edit(prompt="x", **by_id(sources[0], **extra))
    assert err.value.body["param"] == param


def test_a_first_frame_for_a_text_only_model_is_400_naming_input_reference(t2v, sources):
    reference = {"input_reference": {"image_url": "data:image/png;base64,"}}
    with pytest.raises(openai.BadRequestError) as err:
        t2v.client().videos.edit(prompt="x", **by_id(sources[0], **reference))
    assert err.value.body["param"] == "input_reference" and "text only" in err.value.body["message"]


def test_a_source_of_a_frame_count_the_model_cannot_make_is_400_naming_video(t2v, tmp_path):
    write_mp4(tmp_path / "six.mp4", np.zeros((6, 32, 32, 3), np.uint8), FPS)  # Wan makes 4k + 1 frames
    with pytest.raises(openai.BadRequestError) as err:
        t2v.client().videos.edit(prompt="x", video=("six.mp4", (tmp_path / "six.mp4").read_bytes(), "video/mp4"))
    assert err.value.body["param"] == "video" and "6 frames" in err.value.body["message"]


def test_an_edit_is_not_remixed_and_a_text_only_model_cannot_extend(t2v, sources, tmp_path):
    client = t2v.client()
    job = client.videos.edit(prompt="snow", **by_id(sources[0], **EDIT))
    assert wait_done(client, job.id).status == "completed"
    with pytest.raises(openai.BadRequestError) as err:
        client.videos.remix(job.id, prompt="again")
    assert err.value.body["param"] == "video_id" and "is an edit" in err.value.body["message"]
    write_mp4(tmp_path / "s.mp4", np.zeros((5, 32, 32, 3), np.uint8), FPS)
    with pytest.raises(openai.BadRequestError) as err:
        client.videos.extend(prompt="x", seconds="0.25", video=("s.mp4", (tmp_path / "s.mp4").read_bytes(), "video/mp4"))
    assert err.value.body["param"] == "video"
    assert "cannot continue from a frame" in err.value.body["message"]
