"""/v1/videos/edits on LTX-2 (LTX2Pipeline) end to end: `client.videos.edit` (the unmodified openai SDK)
against `omni-run --model <tiny LTX-2 folder>`.

An edit passes the encoded source, the tail of the schedule and the noise level it begins at to the
pipeline's own call, and keeps the source's audio track (workers/engines/video_edit_ltx2.py). With
random weights nothing can be said of the picture, so the tests show what can fail: size and frame
count kept; the same seed repeats; the result is not the source and depends on strength; two sources
make two results below strength 1 and one at 1; the source's track (or its lack of one) is what the
edit carries; bad inputs are 400s naming the field.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import openai
import pytest

pytest.importorskip("diffusers")
av = pytest.importorskip("av")

from omni_actors.media.mp4 import probe, write_mp4  # noqa: E402
from tests.api.model_server import serve_tiny  # noqa: E402
from tests.api.test_video_derive import (  # noqa: E402
    FAST,
    by_id,
    decoded,
    download,
    frame_median_error,
    mean_error,
)
from tests.api.test_video_edits import EDIT  # noqa: E402
from tests.api.test_video_edits_i2v import DIFFERENT_MIN, SAME_MAX  # noqa: E402
from tests.api.test_videos import wait_done  # noqa: E402

pytestmark = pytest.mark.filterwarnings(
    "ignore::DeprecationWarning"
)  # the SDK marks its video API deprecated

FPS = 24
FRAMES = 9
"""LTX-2 makes 8k + 1 frames at 24 fps."""
RATE = 16000
AUDIO_SAME_MAX = 0.05
"""Largest mean absolute difference between a track and its copy through one more AAC encode (a full-scale
tone: the copy is within a few percent)."""


@pytest.fixture(scope="module")
def ltx2(tmp_path_factory):
    yield from serve_tiny(tmp_path_factory.mktemp("ltx2"), "ltx2")


def _edit(
    client: openai.OpenAI, tmp: Path, name: str, **video
) -> tuple[np.ndarray, np.ndarray | None]:
    """The edit's frames and its audio track (float [C, S], None without one)."""
    job = client.videos.edit(prompt="the sea on fire", **video)
    assert (job.status, job.size, job.seconds) == ("queued", "32x32", f"{FRAMES / FPS:g}")
    done = wait_done(client, job.id)
    assert (done.status, done.progress) == ("completed", 100), done.error
    path = download(client, job.id, tmp / f"{name}.mp4")
    made = probe(path)
    assert (made.width, made.height, made.frames, made.fps) == (32, 32, FRAMES, FPS)
    return decoded(path), _audio(path)


def _audio(path: Path) -> np.ndarray | None:
    with av.open(str(path)) as f:
        if not f.streams.audio:
            return None
        return np.concatenate([a.to_ndarray() for a in f.decode(audio=0)], axis=-1)


def _upload(tmp: Path, name: str, level: int, tone: bool = False) -> tuple[str, bytes, str]:
    audio = None
    if tone:
        t = np.arange(RATE * FRAMES // FPS) / RATE
        audio = np.stack(
            [0.5 * np.sin(2 * np.pi * 440 * t), 0.5 * np.sin(2 * np.pi * 660 * t)]
        ).astype(np.float32)
    write_mp4(tmp / f"{name}.mp4", np.full((FRAMES, 32, 32, 3), level, np.uint8), FPS, audio, RATE)
    return f"{name}.mp4", (tmp / f"{name}.mp4").read_bytes(), "video/mp4"


def test_an_edit_remakes_the_picture_keeps_the_track_and_repeats_with_its_seed(ltx2, tmp_path):
    client = ltx2.client()
    job = client.videos.create(
        prompt="the sea", size="32x32", seconds=f"{FRAMES / FPS:g}", extra_body=FAST
    )
    assert wait_done(client, job.id).status == "completed"
    src = download(client, job.id, tmp_path / "src.mp4")
    track = _audio(src)
    assert track is not None and track.shape[0] == 2  # LTX-2's videos carry a stereo track
    half, half_audio = _edit(client, tmp_path, "a", **by_id(job.id, **EDIT, strength=0.5))
    again, _ = _edit(client, tmp_path, "b", **by_id(job.id, **EDIT, strength=0.5))
    assert frame_median_error(half, again) < SAME_MAX
    assert mean_error(half, decoded(src)) > DIFFERENT_MIN  # re-made, not copied
    most, _ = _edit(client, tmp_path, "c", **by_id(job.id, **EDIT, strength=0.9))
    assert mean_error(half, most) > DIFFERENT_MIN
    assert half_audio is not None and half_audio.shape[0] == 2
    n = min(track.shape[1], half_audio.shape[1])
    assert abs(track.shape[1] - half_audio.shape[1]) < RATE // 10
    assert (
        np.abs(track[:, :n] - half_audio[:, :n]).mean() < AUDIO_SAME_MAX
    )  # the source's own track


def test_the_source_shapes_the_edit_until_strength_one_and_its_track_or_none_is_kept(
    ltx2, tmp_path
):
    client = ltx2.client()
    dark, light = _upload(tmp_path, "dark", 0, tone=True), _upload(tmp_path, "light", 255)
    low = [
        _edit(client, tmp_path, f"l{i}", video=v, extra_body={**EDIT, "strength": 0.1})
        for i, v in enumerate((dark, light))
    ]
    assert mean_error(low[0][0], low[1][0]) > DIFFERENT_MIN  # two sources, two results
    full = [
        _edit(client, tmp_path, f"f{i}", video=v, extra_body={**EDIT, "strength": 1.0})
        for i, v in enumerate((dark, light))
    ]
    assert (
        frame_median_error(full[0][0], full[1][0]) < SAME_MAX
    )  # at 1.0 the source is all noise: the seed alone decides
    sent = _audio(tmp_path / "dark.mp4")
    kept = low[0][1]
    assert sent is not None and kept is not None
    n = min(sent.shape[1], kept.shape[1])
    assert np.abs(sent[:, :n] - kept[:, :n]).mean() < AUDIO_SAME_MAX and np.abs(kept).max() > 0.3
    assert low[1][1] is None  # a silent source makes a silent edit


@pytest.mark.parametrize(("frames", "size", "fps", "words"), [
    pytest.param(FRAMES, (32, 48), FPS, "48x32", id="width-not-a-multiple-of-32"),
    pytest.param(12, (32, 32), FPS, "12 frames", id="frames-not-8k+1"),
    pytest.param(FRAMES, (32, 32), 16, "16 fps", id="another-fps"),
])  # fmt: skip
def test_a_source_the_model_cannot_make_is_400_naming_video(
    ltx2, tmp_path, frames, size, fps, words
):
    write_mp4(tmp_path / "bad.mp4", np.zeros((frames, *size, 3), np.uint8), fps)
    with pytest.raises(openai.BadRequestError) as err:
        ltx2.client().videos.edit(
            prompt="x", video=("bad.mp4", (tmp_path / "bad.mp4").read_bytes(), "video/mp4")
        )
    assert err.value.body["param"] == "video" and words in err.value.body["message"], err.value.body


def test_a_first_frame_is_400_naming_input_reference(ltx2, tmp_path):
    with pytest.raises(openai.BadRequestError) as err:
        ltx2.client().videos.edit(
            prompt="x",
            video=_upload(tmp_path, "s", 0),
            extra_body={"input_reference": {"image_url": "data:image/png;base64,"}},
        )
    assert err.value.body["param"] == "input_reference" and "text only" in err.value.body["message"]
