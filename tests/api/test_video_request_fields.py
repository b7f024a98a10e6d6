"""/v1/videos create fields a real client can get wrong, against `omni-run --model <tiny Wan2.2 I2V>` (the
openai SDK, and raw requests for what it cannot send): a JSON field of the wrong type was turned into text
(a prompt of `["a"]` made a video), a form field given twice kept the last silently, and a first frame
past the pixel limit was decoded whole; a job given both `seconds` and `num_frames` reported the
seconds, though num_frames made the clip.
"""

from __future__ import annotations

import base64
import io

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


@pytest.mark.parametrize("size", ["\u00b2x32", "\u0663\u0662x32", "3" * 5000 + "x32", "32x32x32", "32 x 32"])
def test_a_size_that_is_not_ascii_widthxheight_is_a_400_naming_it(i2v, size: str) -> None:
    # superscript and Arabic-Indic digits passed str.isdigit(), then int() raised (a 500) or read them as 32
    r = requests.post(f"{i2v.url}/v1/videos", json=_body(size=size), timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "size", r.text
