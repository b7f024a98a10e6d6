"""/v1/videos create fields a real client can get wrong, against `omni-run --model <tiny Wan2.2 I2V>` (the
openai SDK, and raw requests for what it cannot send): a JSON field of the wrong type was turned into text
(a prompt of `["a"]` made a video), a form field given twice kept the last silently, and a first frame
past the pixel limit was decoded whole; a job given both `seconds` and `num_frames` reported the
seconds, though num_frames made the clip; `seconds` of 1e308 was a 500; a 16-bit greyscale first frame
went in white and a phone photo's EXIF orientation was ignored.
"""

from __future__ import annotations

import base64
import io

import numpy as np
import openai
import pytest
import requests
from PIL import Image

pytest.importorskip("diffusers")
pytest.importorskip("av")
pytest.importorskip("ftfy", reason="WanImageToVideoPipeline imports ftfy unguarded (requirements/cpu.txt)")

from omni_actors.api.chat_inputs import MAX_IMAGE_PIXELS
from tests.api.model_server import serve_tiny

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the SDK marks its video API deprecated

FAST = {"num_inference_steps": 2}
JOB_WAIT_S = 180


@pytest.fixture(scope="module")
def i2v(tmp_path_factory):
    yield from serve_tiny(tmp_path_factory.mktemp("video-fields"), "wan2_2_i2v")


def _png(w: int = 32, h: int = 32) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (40, 90, 200)).save(buf, format="PNG")
    return buf.getvalue()


def _body(**kw) -> dict:
    ref = "data:image/png;base64," + base64.b64encode(_png()).decode()
    return {"prompt": "a cat", "size": "32x32", "seconds": "0.25", "input_reference": {"image_url": ref}, **FAST, **kw}


@pytest.mark.parametrize(("field", "value"), [
    ("prompt", ["a cat"]), ("prompt", {"text": "a cat"}), ("prompt", 5), ("negative_prompt", 5),
    ("size", [32, 32]), ("seed", True), ("num_inference_steps", [2]), ("model", 1),
])
def test_a_json_field_of_the_wrong_type_is_a_400_naming_it(i2v, field: str, value) -> None:
    r = requests.post(f"{i2v.url}/v1/videos", json=_body(**{field: value}), timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field, r.text


def test_json_numbers_are_taken_where_numbers_are_meant(i2v) -> None:
    r = requests.post(f"{i2v.url}/v1/videos", json=_body(seconds=0.25, seed=7, guidance_scale=1.5), timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["seconds"] == "0.25"


def test_a_form_field_given_twice_is_a_400_naming_it(i2v) -> None:
    form = [("prompt", (None, "a cat")), ("prompt", (None, "a dog")), ("size", (None, "32x32")),
            ("seconds", (None, "0.25")), ("input_reference", ("r.png", _png(), "image/png"))]
    r = requests.post(f"{i2v.url}/v1/videos", files=form, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
    twice = [*form[:1], *form[2:], ("input_reference", ("s.png", _png(), "image/png"))]
    r = requests.post(f"{i2v.url}/v1/videos", files=twice, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "input_reference", r.text


def test_a_first_frame_past_the_pixel_limit_is_a_400_before_it_is_decoded(i2v) -> None:
    side = int(MAX_IMAGE_PIXELS**0.5) + 16
    buf = io.BytesIO()
    Image.new("L", (side, side)).save(buf, format="PNG")  # a few hundred KB; decoded, 3 x side^2 bytes
    with pytest.raises(openai.BadRequestError) as err:
        i2v.client().videos.create(prompt="a cat", size="32x32", seconds="0.25",
                                 input_reference=("big.png", buf.getvalue(), "image/png"), extra_body=FAST)
    assert err.value.body["param"] == "input_reference" and err.value.body["code"] == "image_too_large"


def test_num_frames_sets_the_seconds_the_job_reports(i2v) -> None:
    # 5 frames at the family's 16 fps; the job said "4" (the `seconds` given) for a 0.3125 s clip
    job = i2v.client().videos.create(prompt="a cat", size="32x32", seconds="4",
                                     input_reference=("r.png", _png(), "image/png"),
                                     extra_body={**FAST, "num_frames": 5})
    assert job.seconds == "0.3125"


def test_a_first_frame_without_a_size_sets_the_aspect_at_the_default_area(i2v) -> None:
    # Without `size` a job was made at the family's default 832x480 whatever its first frame, so a portrait
    # photo was squeezed into a landscape video; now its aspect at that area, sides multiples of 16, as
    # diffusers' Wan image-to-video recipe sizes it. (Checked at create: the jobs are deleted unmade.)
    client = i2v.client()
    made = {}
    for w, h in ((48, 96), (64, 64), (832, 480)):
        job = client.videos.create(prompt="a cat", seconds="0.25", input_reference=("r.png", _png(w, h), "image/png"),
                                   extra_body={"num_inference_steps": 1})
        made[(w, h)] = job.size
        assert client.videos.delete(job.id).deleted
    assert made == {(48, 96): "432x880", (64, 64): "624x624", (832, 480): "832x480"}


@pytest.mark.parametrize("size", ["\u00b2x32", "\u0663\u0662x32", "3" * 5000 + "x32", "32x32x32", "32 x 32"])
def test_a_size_that_is_not_ascii_widthxheight_is_a_400_naming_it(i2v, size: str) -> None:
    # superscript and Arabic-Indic digits passed str.isdigit(), then int() raised (a 500) or read them as 32
    r = requests.post(f"{i2v.url}/v1/videos", json=_body(size=size), timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "size", r.text


@pytest.mark.parametrize("route", ["/v1/videos", "/v1/videos/extensions"])
def test_seconds_too_large_to_count_frames_in_is_a_400_naming_it(i2v, route: str) -> None:
    # round(1e308 x fps) raised OverflowError: a 500 (extensions count the new segment's frames the same way)
    form = {"prompt": (None, "a cat"), "seconds": (None, "1e308")}
    form.update({"size": (None, "32x32"), "input_reference": ("r.png", _png(), "image/png")} if route == "/v1/videos"
                else {"video[id]": (None, "video_unknown")})
    r = requests.post(f"{i2v.url}{route}", files=form, timeout=30)
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["param"], r.json()["error"]["code"]) == ("seconds", "too_many_frames"), r.text


def test_a_16_bit_phone_photo_is_the_first_frame_upright_and_at_its_level(i2v) -> None:
    # 16-bit greyscale was clipped to white by PIL's convert, and the EXIF orientation was ignored
    level = 100
    exif = Image.Exif()
    exif[0x0112] = 6  # shown turned 90 degrees clockwise: 32 wide as stored, 48 as shown
    buf = io.BytesIO()
    Image.fromarray(np.full((48, 32), level * 257, np.uint16)).save(buf, format="PNG", exif=exif.tobytes())
    client = i2v.client()
    job = client.videos.create(prompt="a cat", size="32x32", seconds="0.25",
                               input_reference=("photo.png", buf.getvalue(), "image/png"), extra_body=FAST)
    done = client.videos.retrieve(job.id, extra_query={"wait_s": JOB_WAIT_S, "past": "in_progress"})
    assert done.status == "completed", done.error
    kept = i2v.runtime_parent.parent / "data" / "state" / "files" / "videos" / f"{job.id}.ref.png"  # (serve_tiny's)
    frame = np.asarray(Image.open(kept))
    assert frame.shape == (32, 48, 3) and np.all(frame == level), (frame.shape, frame.min(), frame.max())


def test_a_job_that_fails_outside_the_engine_stops_its_request_there(i2v) -> None:
    """A first frame that could not be kept (here: a file where the videos folder was) failed the job, but its
    request ran on in the engine (1000 steps) with no one to take the frames."""
    videos = i2v.runtime_parent.parent / "data" / "state" / "files" / "videos"
    assert videos.is_dir()
    aborted = requests.get(f"{i2v.url}/v1/status", timeout=30).json()["requests_aborted"]
    away = videos.with_name("videos.away")
    videos.rename(away)
    videos.write_bytes(b"")
    try:
        r = requests.post(f"{i2v.url}/v1/videos", json=_body(num_inference_steps=1000), timeout=30)
        assert r.status_code == 200, r.text
        job = i2v.client().videos.retrieve(r.json()["id"], extra_query={"wait_s": JOB_WAIT_S, "past": "in_progress"})
    finally:
        videos.unlink()
        away.rename(videos)
    assert job.status == "failed" and job.error.code == "storage_error", job
    status = requests.get(f"{i2v.url}/v1/status", timeout=30).json()
    assert status["requests_aborted"] == aborted + 1, status
