"""/v1/videos/extensions end to end: the unmodified openai SDK against `omni-run --model <tiny Wan2.2
TI2V folder>` (edits: test_video_edits.py and, on this family, test_video_edits_i2v.py; the text-only
model's refusal to extend: test_video_edits.py).

The pinned SDK (3.57) raises before sending on `video={"id": ...}` (its file extraction wants a
file at `video`), so a source job is named as `video=openai.omit, extra_body={"video": {"id": ...}}`,
which the SDK sends as the form field `video[id]`.
Waiting for a job uses the server's long-poll (`wait_s`), never a sleep loop. Tests run in
file order against one server; the last one that uses it restarts it.
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np
import openai
import pytest

pytest.importorskip("diffusers")
av = pytest.importorskip("av")
pytest.importorskip("ftfy", reason="WanImageToVideoPipeline imports ftfy unguarded (requirements/cpu.txt)")

from omni_actors.bus.shm import unlink_segment  # noqa: E402
from omni_actors.media.mp4 import probe, write_mp4  # noqa: E402
from omni_actors.models.tiny import make_tiny  # noqa: E402
from tests.api.model_server import ModelRun  # noqa: E402
from tests.api.test_videos import wait_done  # noqa: E402
from tests.shutdown_support import runtime_dirs, segments_of  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the SDK marks its video API deprecated

FAST = {"num_inference_steps": 2}
LONG = {"num_inference_steps": 1000}
"""A job that cannot finish while a test looks at it (1000 denoising steps)."""
FPS = 16
MEAN_ERROR_MAX = 6.0
"""Largest mean absolute difference (of 255) between frames before and after one more H.264 pass."""


class I2V:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.model = make_tiny("wan2_2_i2v", tmp / "tiny-wan-i2v", seed=0)
        self.data = tmp / "data"
        self.run = ModelRun(tmp, self.model, self.data)

    @property
    def client(self) -> openai.OpenAI:
        return self.run.client()


@pytest.fixture(scope="module")
def i2v(tmp_path_factory):
    served = I2V(tmp_path_factory.mktemp("i2v"))
    try:
        served.run.wait_ready()
        yield served
    finally:
        served.run.stop()


def by_id(video_id: str, **extra) -> dict:
    return {"video": openai.omit, "extra_body": {"video": {"id": video_id}, **extra}}


def png(frame: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(frame).save(buf, format="PNG")
    return buf.getvalue()


def smooth(count: int, height: int, width: int, seed: int) -> np.ndarray:
    """Frames of 8x8 blocks of random colour: content H.264 keeps close, unlike per-pixel noise."""
    blocks = np.random.default_rng(seed).integers(0, 255, (count, height // 8, width // 8, 3), dtype=np.uint8)
    return blocks.repeat(8, axis=1).repeat(8, axis=2)


def decoded(path: Path) -> np.ndarray:
    with av.open(str(path)) as f:
        return np.stack([frame.to_ndarray(format="rgb24") for frame in f.decode(video=0)])


def download(client: openai.OpenAI, video_id: str, path: Path) -> Path:
    path.write_bytes(client.videos.download_content(video_id).read())
    return path


def mean_error(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


def frame_median_error(a: np.ndarray, b: np.ndarray) -> float:
    """The median over frames of each frame's mean difference: how two MP4s of one video compare.
    libx264 in the server now and then codes a few frames of equal input a few levels apart
    (docs/media-video.md); a different video differs in every frame."""
    assert a.shape == b.shape, (a.shape, b.shape)
    diff = np.abs(a.astype(np.int16) - b.astype(np.int16)).reshape(a.shape[0], -1).mean(axis=1)
    return float(np.median(diff))


def make_source(i2v: I2V, steps: dict = FAST) -> str:
    frame = np.random.default_rng(1).integers(0, 255, (32, 32, 3), dtype=np.uint8)
    job = i2v.client.videos.create(model=i2v.model.name, prompt="the sea", size="32x32", seconds="0.25",
                                   input_reference=("first.png", png(frame), "image/png"), extra_body=steps)
    return job.id


def test_extending_a_completed_video_appends_the_new_frames_to_its_own(i2v, tmp_path):
    client = i2v.client
    source = make_source(i2v)
    assert wait_done(client, source).status == "completed"
    before = decoded(download(client, source, tmp_path / "source.mp4"))
    assert before.shape == (5, 32, 32, 3)
    ext = client.videos.extend(prompt="the sea at night", seconds="0.25", **by_id(source, **FAST))
    # 0.25 s more is 5 new frames, the first of which repeats the source's last: 9 in all
    assert (ext.status, ext.size, ext.seconds, ext.remixed_from_video_id) == ("queued", "32x32", f"{9 / FPS:g}",
                                                                             None)
    assert client.videos.delete(source).deleted  # the extension kept its own copy of the source
    done = wait_done(client, ext.id)
    assert (done.status, done.progress, done.seconds) == ("completed", 100, f"{9 / FPS:g}"), done.error
    path = download(client, ext.id, tmp_path / "ext.mp4")
    made = probe(path)
    assert (made.width, made.height, made.frames, made.fps, made.audio_channels) == (32, 32, 9, FPS, 0)
    after = decoded(path)
    for i in range(5):  # the source's frames, through one more H.264 encode
        assert mean_error(after[i], before[i]) < MEAN_ERROR_MAX, i
    assert mean_error(after[5:], np.repeat(before[-1:], 4, axis=0)) > 0  # and new ones after them
    assert not any(i2v.data.rglob("*.source.mp4"))  # the copy goes once the job is done
    assert not any(i2v.data.rglob(f"{ext.id}.ref.png"))  # its first frame is the source's last: not kept
    with pytest.raises(openai.BadRequestError) as err:
        client.videos.remix(ext.id, prompt="again")
    assert err.value.body["param"] == "video_id"
    assert client.videos.delete(ext.id).deleted
    assert not any(i2v.data.rglob(f"{ext.id}*"))


def test_extending_an_uploaded_mp4_keeps_its_audio_over_the_whole_video(i2v, tmp_path):
    client = i2v.client
    frames = smooth(9, 32, 48, seed=2)
    rate = 24000
    tone = (0.5 * np.sin(np.arange(rate * 9 // FPS) * 2 * np.pi * 440 / rate))[None].astype(np.float32)
    write_mp4(tmp_path / "up.mp4", frames, FPS, tone, rate)
    sent = decoded(tmp_path / "up.mp4")
    ext = client.videos.extend(prompt="more", seconds="0.25", extra_body=FAST,
                               video=("up.mp4", (tmp_path / "up.mp4").read_bytes(), "video/mp4"))
    assert (ext.size, ext.seconds) == ("48x32", f"{13 / FPS:g}")
    done = wait_done(client, ext.id)
    assert done.status == "completed", done.error
    path = download(client, ext.id, tmp_path / "ext.mp4")
    made = probe(path)
    assert (made.width, made.height, made.frames, made.audio_channels) == (48, 32, 13, 1)
    after = decoded(path)
    assert max(mean_error(after[i], sent[i]) for i in range(9)) < MEAN_ERROR_MAX
    assert mean_error(after[0], sent[1]) > 4 * MEAN_ERROR_MAX  # the bound tells frames apart
    with av.open(str(path)) as f:
        track = np.concatenate([a.to_ndarray() for a in f.decode(audio=0)], axis=-1)[0]
    covered = len(track) / rate
    assert 13 / FPS <= covered < 13 / FPS + 0.1  # one track over the whole video (AAC pads its last frame)
    assert np.abs(track[: rate * 8 // FPS]).max() > 0.3  # the source's tone ...
    assert np.abs(track[rate * 10 // FPS : rate * 13 // FPS]).max() < 0.05  # ... then silence


@pytest.mark.parametrize(("name", "size", "fps"), [("size", (32, 40), FPS), ("fps", (32, 32), 24)])
def test_an_upload_of_another_size_or_fps_is_400_naming_video(i2v, tmp_path, name, size, fps):
    frames = np.zeros((5, *size, 3), np.uint8)
    write_mp4(tmp_path / "bad.mp4", frames, fps)
    with pytest.raises(openai.BadRequestError) as err:
        i2v.client.videos.extend(prompt="x", seconds="0.25", video=("bad.mp4", (tmp_path / "bad.mp4").read_bytes(),
                                                                     "video/mp4"))
    assert err.value.body["param"] == "video", err.value.body
    assert name in err.value.body["message"]


@pytest.mark.parametrize("video", [("a.mp4", b"not a video at all", "video/mp4"), ("a.png", None, "image/png")])
def test_an_upload_that_is_not_a_video_is_400_naming_video(i2v, video):
    if video[1] is None:
        video = (video[0], png(np.zeros((32, 32, 3), np.uint8)), video[2])
    with pytest.raises(openai.BadRequestError) as err:
        i2v.client.videos.extend(prompt="x", seconds="0.25", video=video)
    assert (err.value.body["param"], err.value.body["code"]) == ("video", "invalid_video"), err.value.body
    with pytest.raises(openai.BadRequestError) as err:
        i2v.client.videos.extend(prompt="x", seconds="0.25", video=openai.omit)
    assert (err.value.body["param"], err.value.body["code"]) == ("video", "missing_required_parameter")


def test_an_unknown_source_is_404_an_unfinished_one_409_and_a_deleted_extension_leaves_nothing(i2v):
    client = i2v.client
    with pytest.raises(openai.NotFoundError) as err:
        client.videos.extend(prompt="x", seconds="0.25", **by_id("video_nope"))
    assert err.value.body["param"] == "video"
    running = make_source(i2v, LONG)
    try:
        with pytest.raises(openai.APIStatusError) as err:
            client.videos.extend(prompt="x", seconds="0.25", **by_id(running))
        assert err.value.status_code == 409 and err.value.body["code"] == "video_not_ready"
    finally:
        client.videos.delete(running)
    source = make_source(i2v)
    assert wait_done(client, source).status == "completed"
    ext = client.videos.extend(prompt="x", seconds="0.25", **by_id(source, **LONG))
    assert wait_done(client, ext.id, past="queued").status == "in_progress"
    assert any(i2v.data.rglob(f"{ext.id}.source.mp4"))  # its copy of the source, while it runs
    assert client.videos.delete(ext.id).deleted
    assert not any(i2v.data.rglob(f"{ext.id}*"))
    assert any(i2v.data.rglob(f"{source}.mp4"))  # the source's own file is untouched


@pytest.mark.slow  # (default-suite budget: the slow run, `-m slow`, keeps it)
def test_a_restarted_server_fails_a_lost_extension_and_keeps_no_copy_of_its_source(i2v, tmp_path):
    client = i2v.client
    source = make_source(i2v)
    assert wait_done(client, source).status == "completed"
    lost = client.videos.extend(prompt="x", seconds="0.25", **by_id(source, **LONG))
    assert wait_done(client, lost.id, past="queued").status == "in_progress"
    assert any(i2v.data.rglob(f"{lost.id}.source.mp4"))
    # A crash: the server and its worker are killed mid-job; clean up what they cannot.
    i2v.run.kill()
    for name in segments_of(i2v.run.pid):
        unlink_segment(name)
    for left in runtime_dirs(i2v.run.runtime_parent) - i2v.run.runtime_before:
        shutil.rmtree(i2v.run.runtime_parent / left)
    i2v.run = ModelRun(i2v.tmp, i2v.model, i2v.data)
    i2v.run.wait_ready()
    found = i2v.client.videos.retrieve(lost.id)
    assert (found.status, found.error.code) == ("failed", "server_restarted")
    assert not any(i2v.data.rglob(f"{lost.id}*"))
    again = i2v.client.videos.extend(prompt="x", seconds="0.25", **by_id(source, **FAST))  # the source survived
    assert wait_done(i2v.client, again.id).status == "completed"
    assert probe(download(i2v.client, again.id, tmp_path / "again.mp4")).frames == 9
