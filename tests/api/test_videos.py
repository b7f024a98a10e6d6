"""/v1/videos end to end: the unmodified openai SDK against `omni-run --model <tiny Wan2.2 folder>`.

Waiting for a job uses the server's long-poll (`retrieve(..., extra_query={"wait_s": ...})`),
never a sleep loop. Tests run in file order against one server; the last one restarts it.
"""

from __future__ import annotations

import concurrent.futures
import io
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import openai
import pytest
import requests

pytest.importorskip("diffusers")
av = pytest.importorskip("av")

from omni_actors.bus.shm import unlink_segment  # noqa: E402
from omni_actors.media.mp4 import probe  # noqa: E402
from omni_actors.models.tiny import make_tiny  # noqa: E402
from tests.api.model_server import ModelRun  # noqa: E402
from tests.shutdown_support import runtime_dirs, segments_of  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the SDK marks its video API deprecated

JOB_WAIT_S = 180
FAST = {"num_inference_steps": 2}
LONG = {"num_inference_steps": 1000}
"""A job that cannot finish while a test looks at it (1000 denoising steps)."""
REMAKE_MEAN_LEVELS = 0.25
"""Largest mean difference, in 8-bit levels, between two videos of one seed and prompt (0 alone)."""
REMIX_MEAN_LEVELS = 2.0
"""Least mean difference between videos of one seed and two prompts (8 measured on the tiny Wan)."""
QUEUE = 2
SYNC_SIZE = "48x16"
"""The size only the deleted sync job asks for: its `video.queued` log line names it."""
SPRITE_ERROR_MAX = 12.0
"""Mean difference (of 255) between a spritesheet tile and its frame: two JPEG/H.264 generations of noise."""


@dataclass
class Served:
    tmp: Path
    model: Path
    data: Path
    run: ModelRun

    @property
    def client(self) -> openai.OpenAI:
        return self.run.client()


def serve_wan(tmp: Path, queue: int):
    """A tiny Wan2.2 folder served by `omni-run` under `tmp`, its stage queue `queue` long (a fixture's body)."""
    model = make_tiny("wan2_2", tmp / "tiny-wan", seed=0)
    served = Served(tmp, model, tmp / "data", ModelRun(tmp, model, tmp / "data", {"0": {"max_queue": queue}}))
    try:
        served.run.wait_ready()
        yield served
    finally:
        served.run.stop()


@pytest.fixture(scope="module")
def wan(tmp_path_factory):
    yield from serve_wan(tmp_path_factory.mktemp("wan"), QUEUE)


def wait_done(client: openai.OpenAI, video_id: str, past: str = "in_progress"):
    return client.videos.retrieve(video_id, extra_query={"wait_s": JOB_WAIT_S, "past": past})


def test_a_video_decodes_to_the_asked_size_and_frame_count(wan, tmp_path):
    client = wan.client
    job = client.videos.create(model=wan.model.name, prompt="a cat walks on the beach", size="48x32",
                               seconds="0.5", extra_body={**FAST, "seed": 3})
    assert (job.object, job.size, job.seconds) == ("video", "48x32", "0.5")
    assert job.status in ("queued", "in_progress")
    done = wait_done(client, job.id)
    assert (done.status, done.progress, done.error) == ("completed", 100, None), done.error
    assert done.completed_at is not None and done.completed_at >= done.created_at
    path = tmp_path / "out.mp4"
    path.write_bytes(client.videos.download_content(job.id).read())
    made = probe(path)
    # 0.5 s at Wan's 16 fps is 8 frames, snapped to the 4k + 1 frames its VAE makes.
    assert (made.width, made.height, made.frames, made.fps, made.audio_channels) == (48, 32, 9, 16.0, 0)
    with av.open(str(path)) as f:
        stream = f.streams.video[0]
        assert (stream.codec_context.name, stream.codec_context.pix_fmt) == ("h264", "yuv420p")
    from PIL import Image

    thumb = Image.open(io.BytesIO(client.videos.download_content(job.id, variant="thumbnail").read()))
    assert thumb.size == (48, 32)
    with av.open(str(path)) as f:
        frames = np.stack([frame.to_ndarray(format="rgb24") for frame in f.decode(video=0)])
    # a spritesheet: all 9 frames, 3 to a row, each at the video's size; written with the MP4, and
    # made again from it when it is missing (a job finished before spritesheets existed)
    for _ in ("written", "remade"):
        sheet = np.asarray(Image.open(io.BytesIO(client.videos.download_content(job.id, variant="spritesheet").read())))
        assert sheet.shape == (96, 144, 3)
        for i in (0, 4, 8):
            tile = sheet[(i // 3) * 32 : (i // 3 + 1) * 32, (i % 3) * 48 : (i % 3 + 1) * 48]
            errors = [np.abs(tile.astype(np.int16) - f).mean() for f in frames]
            assert int(np.argmin(errors)) == i and errors[i] < SPRITE_ERROR_MAX, (i, errors)
        sprites = next((wan.data / "state" / "files" / "videos").glob(f"{job.id}.sprites.jpg"))
        sprites.unlink()
    listed = [v.id for v in client.videos.list(order="desc")]
    assert job.id in listed


def test_progress_can_be_waited_on_step_by_step_as_a_progress_bar_would(wan):
    client = wan.client
    job = client.videos.create(model=wan.model.name, prompt="waves", size="48x32", seconds="0.5",
                               extra_body={"num_inference_steps": 12, "seed": 5})
    seen: list[tuple[str, int]] = []
    while not seen or seen[-1][0] != "completed":
        after = seen[-1][1] if seen else 0
        job = client.videos.retrieve(job.id, extra_query={"wait_s": JOB_WAIT_S, "progress_past": min(after, 99)})
        assert job.status != "failed", job.error
        seen.append((job.status, job.progress))
    values = [p for _, p in seen]
    assert values == sorted(set(values)) and values[-1] == 100, seen  # each answer moved on
    assert any(status == "in_progress" and 0 < p < 100 for status, p in seen), seen  # seen mid-run
    with pytest.raises(openai.BadRequestError) as err:
        client.videos.retrieve(job.id, extra_query={"wait_s": 1, "progress_past": 100})
    assert err.value.body["param"] == "progress_past"


def test_models_says_what_the_video_route_checks(wan):
    """/v1/models: a video family's capabilities as /v1/videos serves them (its side multiple and
    frames, not the pipeline call's defaults)."""
    caps = wan.client.models.retrieve(wan.model.name).model_extra["capabilities"]
    assert (caps["output_kind"], caps["tasks"], caps["image_input"]) == ("video", ["text-to-video"], "none")
    assert caps["size_multiple"] == 16 and "image" not in caps["inputs"]
    assert caps["video"] == {"fps": 16.0, "max_frames": 257, "frame_multiple": 4}
    with pytest.raises(openai.BadRequestError) as err:  # a side off that multiple is what the route refuses
        wan.client.videos.create(model=wan.model.name, prompt="x", size="40x32")
    assert err.value.body["param"] == "size"


def test_a_video_without_a_size_is_made_at_the_models_default(wan, tmp_path):
    """832x480 (Wan's default): the tiny checkpoint's rotary table once stopped at 32 positions a side."""
    job = wan.client.videos.create(model=wan.model.name, prompt="a cat", seconds="0.25",
                                   extra_body={"num_inference_steps": 1})
    assert job.size == "832x480"
    assert wait_done(wan.client, job.id).status == "completed"
    path = tmp_path / "default.mp4"
    path.write_bytes(wan.client.videos.download_content(job.id).read())
    assert (probe(path).width, probe(path).height) == (832, 480)


def test_sync_returns_the_mp4_and_the_same_seed_makes_the_same_video(wan, tmp_path):
    def sync(seed: int) -> np.ndarray:
        resp = requests.post(f"{wan.run.url}/v1/videos/sync", json={
            "model": wan.model.name, "prompt": "rain", "size": "32x32", "num_frames": 5, "seed": seed, **FAST,
        }, timeout=JOB_WAIT_S)
        assert resp.status_code == 200, resp.text
        assert resp.headers["Content-Type"] == "video/mp4"
        path = tmp_path / f"sync-{seed}-{resp.headers['X-Video-Id']}.mp4"
        path.write_bytes(resp.content)
        made = probe(path)
        assert (made.width, made.height, made.frames) == (32, 32, 5)
        with av.open(str(path)) as f:
            return np.stack([frame.to_ndarray(format="rgb24") for frame in f.decode(video=0)])

    first = sync(5)
    assert np.array_equal(sync(5), first)
    assert not np.array_equal(sync(6), first)


def test_a_sync_call_whose_job_is_deleted_meanwhile_is_a_404_saying_so(wan):
    """It was a 500 (code `cancelled`): the client's own delete read as the server's failure."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        call = pool.submit(requests.post, f"{wan.run.url}/v1/videos/sync", timeout=JOB_WAIT_S, json={
            "model": wan.model.name, "prompt": "slow", "size": SYNC_SIZE, "num_frames": 1, **LONG})
        job_id = wan.run.wait_for(rf"video\.queued(?=.*size={SYNC_SIZE}).*?(video_[0-9a-f]+)").group(1)
        assert wait_done(wan.client, job_id, past="queued").status == "in_progress"
        assert wan.client.videos.delete(job_id).deleted
        resp = call.result(timeout=JOB_WAIT_S)
    assert (resp.status_code, resp.json()["error"]["code"]) == (404, "video_deleted"), resp.text
    assert resp.headers["X-Video-Id"] == job_id


@pytest.mark.parametrize(("fields", "param"), [
    ({"size": "30x32"}, "size"),
    ({"extra_body": {"guidance_scale": 1e300}}, "guidance_scale"),
    ({"size": "big"}, "size"),
    ({"seconds": "100"}, "seconds"),
    ({"seconds": "-1"}, "seconds"),
    ({"extra_body": {"num_frames": 6}}, "num_frames"),
    ({"extra_body": {"num_inference_steps": 0}}, "num_inference_steps"),
    ({"input_reference": ("f.png", b"\x89PNG not really", "image/png")}, "input_reference"),
    ({"extra_body": {"colour": "red"}}, "colour"),
])  # fmt: skip
def test_bad_inputs_are_400_naming_the_field(wan, fields, param):
    with pytest.raises(openai.BadRequestError) as err:
        wan.client.videos.create(model=wan.model.name, prompt="x", **fields)
    assert err.value.body["param"] == param, err.value.body


def test_unknown_video_and_model_are_404_and_audio_is_a_400_saying_what_the_model_makes(wan):
    client = wan.client
    with pytest.raises(openai.NotFoundError):
        client.videos.retrieve("video_nope")
    with pytest.raises(openai.NotFoundError):
        client.videos.create(model="sora-2", prompt="x")
    resp = requests.post(f"{wan.run.url}/v1/audio/generations", json={"prompt": "drums"}, timeout=30)
    assert resp.status_code == 400
    assert "produces ['video']" in resp.json()["error"]["message"]
    # JSON clients may name a reference by URL: only data: URLs (this server downloads nothing).
    resp = requests.post(f"{wan.run.url}/v1/videos", timeout=30, json={
        "prompt": "x", "input_reference": {"image_url": "https://example.com/a.png"}})
    assert (resp.status_code, resp.json()["error"]["param"]) == (400, "input_reference")


def test_deleting_a_running_job_stops_it_and_a_full_queue_is_429(wan):
    client = wan.client
    running = client.videos.create(model=wan.model.name, prompt="a", size="32x32", seconds="0.25",
                                   extra_body=LONG)
    assert wait_done(client, running.id, past="queued").status == "in_progress"
    queued = client.videos.create(model=wan.model.name, prompt="b", size="32x32", seconds="0.25",
                                  extra_body=LONG)
    with pytest.raises(openai.RateLimitError):
        client.videos.create(model=wan.model.name, prompt="c", size="32x32", seconds="0.25", extra_body=LONG)
    gone = client.videos.delete(running.id)
    assert (gone.id, gone.deleted, gone.object) == (running.id, True, "video.deleted")
    wan.run.wait_for(r"video\.batch_aborted")  # the engine stopped it between denoising steps
    with pytest.raises(openai.NotFoundError):
        client.videos.retrieve(running.id)
    assert client.videos.delete(queued.id).deleted
    assert not any(wan.data.rglob(f"{running.id}*")) and not any(wan.data.rglob(f"{queued.id}*"))
    after = client.videos.create(model=wan.model.name, prompt="d", size="32x32", seconds="0.25",
                                 extra_body=FAST)
    assert wait_done(client, after.id).status == "completed"


def _frames(client: openai.OpenAI, video_id: str, path: Path) -> np.ndarray:
    path.write_bytes(client.videos.download_content(video_id).read())
    with av.open(str(path)) as f:
        return np.stack([frame.to_ndarray(format="rgb24") for frame in f.decode(video=0)])


def test_a_remix_remakes_the_video_with_its_seed_and_a_new_prompt(wan, tmp_path):
    client = wan.client
    source = client.videos.create(model=wan.model.name, prompt="a red kite", size="32x32", seconds="0.25",
                                  extra_body=FAST)  # no seed: the remix must reuse the one the engine drew
    assert wait_done(client, source.id).status == "completed"
    again = client.videos.remix(source.id, prompt="a red kite")
    # one after the other: two jobs queued together share a batch, whose float sums may differ in
    # the last bits from a lone run (the source ran alone)
    assert wait_done(client, again.id).status == "completed"
    other = client.videos.remix(source.id, prompt="a green boat at night")
    assert (again.remixed_from_video_id, other.remixed_from_video_id) == (source.id, source.id)
    assert (other.size, other.seconds, other.prompt) == ("32x32", "0.25", "a green boat at night")
    assert wait_done(client, other.id).status == "completed"
    first = _frames(client, source.id, tmp_path / "source.mp4").astype(np.int16)
    # Same seed, same prompt: the same video, but for the last bits of a float sum that a batch shared
    # with another test's job can change (a pixel level or two after the encoder's rounding).
    remade = np.abs(_frames(client, again.id, tmp_path / "again.mp4") - first)
    remixed = np.abs(_frames(client, other.id, tmp_path / "other.mp4") - first)
    assert remade.shape == remixed.shape == first.shape
    assert remade.mean() < REMAKE_MEAN_LEVELS and remixed.mean() > REMIX_MEAN_LEVELS
    assert client.videos.retrieve(other.id).remixed_from_video_id == source.id


def test_a_remix_needs_a_completed_video_and_a_prompt(wan):
    client = wan.client
    running = client.videos.create(model=wan.model.name, prompt="slow", size="32x32", seconds="0.25",
                                   extra_body=LONG)
    try:
        with pytest.raises(openai.APIStatusError) as err:
            client.videos.remix(running.id, prompt="faster")
        assert err.value.status_code == 409 and err.value.body["code"] == "video_not_ready"
    finally:
        client.videos.delete(running.id)
    with pytest.raises(openai.NotFoundError):
        client.videos.remix("video_missing", prompt="x")
    done = next(v for v in client.videos.list(limit=100) if v.status == "completed")
    with pytest.raises(openai.BadRequestError) as err:
        client.videos.remix(done.id, prompt=" ")
    assert err.value.body["param"] == "prompt"
    with pytest.raises(openai.BadRequestError) as err:
        client.videos.remix(done.id, prompt="x", extra_body={"seed": 1})
    assert err.value.body["param"] == "seed"


def test_a_restarted_server_keeps_finished_jobs_and_fails_lost_ones(wan, tmp_path):
    client = wan.client
    kept = client.videos.create(model=wan.model.name, prompt="kept", size="32x32", seconds="0.25",
                                extra_body=FAST)
    assert wait_done(client, kept.id).status == "completed"
    lost = client.videos.create(model=wan.model.name, prompt="lost", size="32x32", seconds="0.25",
                                extra_body=LONG)
    assert wait_done(client, lost.id, past="queued").status == "in_progress"
    # A crash: the server and its worker are killed mid-job; clean up what they cannot.
    wan.run.kill()
    for name in segments_of(wan.run.pid):
        unlink_segment(name)
    for left in runtime_dirs(wan.run.runtime_parent) - wan.run.runtime_before:
        shutil.rmtree(wan.run.runtime_parent / left)
    wan.run = ModelRun(wan.tmp, wan.model, wan.data, {"0": {"max_queue": QUEUE}})
    wan.run.wait_ready()
    client = wan.client
    found = {v.id: v for v in client.videos.list(limit=100)}
    assert found[kept.id].status == "completed"
    assert found[lost.id].status == "failed"
    assert found[lost.id].error.code == "server_restarted", found[lost.id].error
    (tmp_path / "kept.mp4").write_bytes(client.videos.download_content(kept.id).read())
    assert probe(tmp_path / "kept.mp4").frames == 5
    with pytest.raises(openai.APIStatusError) as err:
        client.videos.download_content(lost.id)
    assert err.value.status_code == 409
    remix = client.videos.remix(kept.id, prompt="kept")  # what a remix needs survived the restart
    assert wait_done(client, remix.id).status == "completed"
    assert np.array_equal(_frames(client, remix.id, tmp_path / "remix.mp4"),
                          _frames(client, kept.id, tmp_path / "kept-again.mp4"))


@pytest.mark.slow  # (default-suite budget; test_video_edits_i2v covers a first frame by input_reference)
def test_image_to_video_takes_a_first_frame(tmp_path):
    from PIL import Image

    pytest.importorskip("ftfy", reason="WanImageToVideoPipeline imports ftfy unguarded (requirements/cpu.txt)")

    model = make_tiny("wan2_2_i2v", tmp_path / "tiny-wan-i2v", seed=0)
    run = ModelRun(tmp_path, model, tmp_path / "data")
    try:
        run.wait_ready()
        client = run.client()
        caps = client.models.retrieve(model.name).model_extra["capabilities"]
        assert (caps["tasks"], caps["image_input"]) == (["image-to-video"], "required")  # a frame or a 400
        # 160 x 160 x 3 bytes is past the bus's inline limit: the frame crosses in shared memory.
        frame = np.random.default_rng(0).integers(0, 255, (160, 160, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(frame).save(buf, format="PNG")
        job = client.videos.create(model=model.name, prompt="the sea", size="32x32", seconds="0.25",
                                   input_reference=("first.png", buf.getvalue(), "image/png"), extra_body=FAST)
        done = wait_done(client, job.id)
        assert done.status == "completed", done.error
        (tmp_path / "i2v.mp4").write_bytes(client.videos.download_content(job.id).read())
        made = probe(tmp_path / "i2v.mp4")
        assert (made.width, made.height, made.frames) == (32, 32, 5)
        remix = client.videos.remix(job.id, prompt="the sea")  # from the same first frame and seed
        assert wait_done(client, remix.id).status == "completed"
        assert np.array_equal(_frames(client, remix.id, tmp_path / "i2v-remix.mp4"),
                              _frames(client, job.id, tmp_path / "i2v-again.mp4"))
        assert sorted(p.name for p in (tmp_path / "data").rglob("*.ref.png")) == sorted(
            f"{v}.ref.png" for v in (job.id, remix.id))
        with pytest.raises(openai.BadRequestError) as err:
            client.videos.create(model=model.name, prompt="no frame", size="32x32")
        assert err.value.body["param"] == "input_reference"
    finally:
        run.stop()


@pytest.mark.slow  # (default-suite budget; test_video_edits_ltx2 covers the track)
def test_ltx2_videos_carry_their_audio_track(tmp_path):
    model = make_tiny("ltx2", tmp_path / "tiny-ltx2", seed=0)
    run = ModelRun(tmp_path, model, tmp_path / "data")
    try:
        run.wait_ready()
        client = run.client()
        caps = client.models.retrieve(model.name).model_extra["capabilities"]
        assert (caps["size_multiple"], caps["video"]["fps"], caps["video"]["frame_multiple"]) == (32, 24.0, 8)
        job = client.videos.create(model=model.name, prompt="a robot dancing", size="32x32",
                                   extra_body={**FAST, "num_frames": 9})
        done = wait_done(client, job.id)
        assert done.status == "completed", done.error
        (tmp_path / "ltx2.mp4").write_bytes(client.videos.download_content(job.id).read())
        made = probe(tmp_path / "ltx2.mp4")
        assert (made.width, made.height, made.frames, made.fps, made.audio_channels) == (32, 32, 9, 24.0, 2)
        with av.open(str(tmp_path / "ltx2.mp4")) as f:
            assert f.streams.audio[0].codec_context.name == "aac"
            assert f.streams.audio[0].duration * f.streams.audio[0].time_base > 0.3  # ~9 frames at 24 fps
    finally:
        run.stop()


def test_an_unknown_variant_is_a_400_naming_it(wan):
    job = wan.client.videos.create(model=wan.model.name, prompt="a dog", size="32x32", seconds="0.25",
                                   extra_body={"num_inference_steps": 1})
    assert wait_done(wan.client, job.id).status == "completed"
    with pytest.raises(openai.BadRequestError) as err:
        wan.client.videos.download_content(job.id, variant="gif")  # type: ignore[arg-type]
    assert err.value.body["param"] == "variant" and "spritesheet" in err.value.body["message"]
    spec = requests.get(f"{wan.run.url}/openapi.json", timeout=30).json()
    (variant,) = [p for p in spec["paths"]["/v1/videos/{video_id}/content"]["get"]["parameters"] if p["in"] == "query"]
    assert (variant["name"], variant["schema"]["enum"]) == ("variant", ["video", "thumbnail", "spritesheet"])
