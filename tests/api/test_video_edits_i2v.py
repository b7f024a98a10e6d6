"""/v1/videos/edits on image-to-video Wan2.2 (WanImageToVideoPipeline) end to end: `client.videos.edit`
(the unmodified openai SDK) against `omni-run --model <tiny folder>`, in each of the pipeline's layouts:
TI2V-5B's (`expand_timesteps`: the first frame's latents put over the video's) and I2V-A14B's (two
experts; the first frame a condition concatenated to the latents).

An edit is conditioned on the source's first frame, or on an `input_reference` that replaces it, and
SDEdits the rest (workers/engines/video_edit.py). With random weights nothing can be said of the
picture, so the tests show what can fail: size and frame count kept; the same seed repeats; the
result is not the source and depends on strength; two sources with the same first frame make two
results below strength 1 and one at 1 (where only their first frame is left); a reference (inline,
or by the file id of an upload) makes what a source with it as its first frame makes; bad inputs
are 400s naming the field.
"""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np
import openai
import pytest

pytest.importorskip("diffusers")
pytest.importorskip("av")
pytest.importorskip(
    "ftfy", reason="WanImageToVideoPipeline imports ftfy unguarded (requirements/cpu.txt)"
)

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
    png,
    smooth,
)
from tests.api.test_video_edits import EDIT
from tests.api.test_videos import wait_done

pytestmark = pytest.mark.filterwarnings(
    "ignore::DeprecationWarning"
)  # the SDK marks its video API deprecated

FRAMES = 9
"""Source frames: three latent frames, two of them after the first frame's."""
SAME_MAX = 1.0
"""Largest median per-frame difference (of 255, `frame_median_error`) between two MP4s that should hold
the same video (the first frame may have come through an MP4 in one and a PNG in the other)."""
DIFFERENT_MIN = 5.0
"""Smallest mean difference that counts as another video (the different edits here differ by 8 or more)."""
GREY, WHITE = 128, 255


@pytest.fixture(scope="module", params=[  # (default-suite budget: A14B, two experts, in the slow run)
    "wan2_2_i2v", pytest.param("wan2_2_i2v-a14b", marks=pytest.mark.slow)])
def i2v(request, tmp_path_factory):
    yield from serve_tiny(tmp_path_factory.mktemp(request.param), request.param)


def _upload(tmp: Path, name: str, frames: np.ndarray) -> tuple[str, bytes, str]:
    write_mp4(tmp / f"{name}.mp4", frames, FPS)
    return f"{name}.mp4", (tmp / f"{name}.mp4").read_bytes(), "video/mp4"


def _flat(first: int, rest: int, size: tuple[int, int] = (32, 32)) -> np.ndarray:
    """FRAMES flat frames: the first of level `first`, the rest `rest` (flat colours survive H.264)."""
    frames = np.full((FRAMES, *size, 3), rest, np.uint8)
    frames[0] = first
    return frames


def _reference(frame: np.ndarray) -> dict:
    return {
        "input_reference": {
            "image_url": "data:image/png;base64," + base64.b64encode(png(frame)).decode()
        }
    }


def _edit(client: openai.OpenAI, tmp: Path, name: str, size: str = "32x32", **video) -> np.ndarray:
    job = client.videos.edit(prompt="the sea on fire", **video)
    assert (job.status, job.size, job.seconds) == ("queued", size, f"{FRAMES / FPS:g}")
    done = wait_done(client, job.id)
    assert (done.status, done.progress) == ("completed", 100), done.error
    path = download(client, job.id, tmp / f"{name}.mp4")
    made = probe(path)
    assert (f"{made.width}x{made.height}", made.frames) == (size, FRAMES)
    return decoded(path)


def test_an_edit_keeps_size_and_frames_repeats_with_its_seed_and_follows_strength(i2v, tmp_path):
    client = i2v.client()
    source = smooth(FRAMES, 32, 48, seed=3)
    video = _upload(tmp_path, "src", source)
    half = _edit(client, tmp_path, "a", "48x32", video=video, extra_body={**EDIT, "strength": 0.5})
    again = _edit(client, tmp_path, "b", "48x32", video=video, extra_body={**EDIT, "strength": 0.5})
    assert frame_median_error(half, again) < SAME_MAX
    assert mean_error(half, decoded(tmp_path / "src.mp4")) > DIFFERENT_MIN  # re-made, not copied
    most = _edit(client, tmp_path, "c", "48x32", video=video, extra_body={**EDIT, "strength": 0.9})
    assert mean_error(half, most) > DIFFERENT_MIN


def test_a_completed_job_edits_as_its_uploaded_mp4_does(i2v, tmp_path):
    client = i2v.client()
    job = client.videos.create(
        prompt="the sea",
        size="32x32",
        seconds=f"{FRAMES / FPS:g}",
        extra_body=FAST,
        input_reference=("f.png", png(np.full((32, 32, 3), GREY, np.uint8)), "image/png"),
    )
    assert wait_done(client, job.id).status == "completed"
    src = download(client, job.id, tmp_path / "job.mp4")
    by_job = _edit(client, tmp_path, "j", **by_id(job.id, **EDIT, strength=0.5))
    by_upload = _edit(
        client,
        tmp_path,
        "u",
        video=("up.mp4", src.read_bytes(), "video/mp4"),
        extra_body={**EDIT, "strength": 0.5},
    )
    assert frame_median_error(by_job, by_upload) < SAME_MAX


def test_the_source_after_its_first_frame_shapes_the_edit_until_strength_one(i2v, tmp_path):
    client = i2v.client()
    dark, light = (
        _upload(tmp_path, "dark", _flat(GREY, 0)),
        _upload(tmp_path, "light", _flat(GREY, WHITE)),
    )
    low = [
        _edit(client, tmp_path, f"l{i}", video=v, extra_body={**EDIT, "strength": 0.1})
        for i, v in enumerate((dark, light))
    ]
    assert mean_error(low[0], low[1]) > DIFFERENT_MIN  # the noised source, not only its first frame
    full = [
        _edit(client, tmp_path, f"f{i}", video=v, extra_body={**EDIT, "strength": 1.0})
        for i, v in enumerate((dark, light))
    ]
    assert frame_median_error(full[0], full[1]) < SAME_MAX  # all noise but the shared first frame


def test_an_input_reference_takes_the_place_of_the_first_frame(i2v, tmp_path):
    client = i2v.client()
    grey_first = _upload(tmp_path, "grey", _flat(GREY, 0))
    white_first = _upload(tmp_path, "white", _flat(WHITE, 0))
    own = _edit(client, tmp_path, "own", video=grey_first, extra_body=EDIT)
    referenced = _edit(
        client,
        tmp_path,
        "ref",
        video=grey_first,
        extra_body={**EDIT, **_reference(np.full((32, 32, 3), WHITE, np.uint8))},
    )
    assert mean_error(own, referenced) > DIFFERENT_MIN
    white = png(np.full((32, 32, 3), WHITE, np.uint8))
    uploaded = client.files.create(file=("white.png", white, "image/png"), purpose="vision")
    from_file = _edit(client, tmp_path, "file", video=grey_first,
                      extra_body={**EDIT, "input_reference": {"file_id": uploaded.id}})
    assert frame_median_error(from_file, referenced) < SAME_MAX  # the same image, by file id
    as_source = _edit(client, tmp_path, "src", video=white_first, extra_body=EDIT)
    assert frame_median_error(referenced, as_source) < SAME_MAX
    # a reference of another size is resized to the source's (a flat one stays what it was)
    small = _edit(
        client,
        tmp_path,
        "small",
        video=grey_first,
        extra_body={**EDIT, **_reference(np.full((16, 24, 3), WHITE, np.uint8))},
    )
    assert frame_median_error(small, as_source) < SAME_MAX


@pytest.mark.parametrize(("extra", "param", "words"), [
    pytest.param({"input_reference": {"image_url": "data:image/png;base64,bm90IGFuIGltYWdl"}}, "input_reference",
                 "not an image", id="reference-not-an-image"),
    pytest.param({"input_reference": {"file_id": "file-1"}}, "input_reference", "does not exist", id="reference-file-id"),
    pytest.param({"strength": 0}, "strength", "strength", id="strength-0"),
])  # fmt: skip
def test_bad_edit_fields_are_400_naming_them(i2v, tmp_path, extra, param, words):
    with pytest.raises(openai.BadRequestError) as err:
        i2v.client().videos.edit(
            prompt="x", video=_upload(tmp_path, "s", _flat(GREY, 0)), extra_body=extra
        )
    assert err.value.body["param"] == param and words in err.value.body["message"], err.value.body
    assert " object at 0x" not in err.value.body["message"], err.value.body  # (PIL's repr of our buffer)


def test_a_source_of_a_size_the_model_cannot_make_is_400_naming_video(i2v, tmp_path):
    with pytest.raises(openai.BadRequestError) as err:  # Wan makes sides that are multiples of 16
        i2v.client().videos.edit(
            prompt="x", video=_upload(tmp_path, "odd", _flat(GREY, 0, (32, 40)))
        )
    assert err.value.body["param"] == "video" and "40x32" in err.value.body["message"], (
        err.value.body
    )
