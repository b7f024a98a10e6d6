"""POST /v1/audio/generations end to end: `omni-run --model <tiny Stable Audio Open folder>`, a real HTTP client."""

from __future__ import annotations

import io

import openai
import pytest
import requests

pytest.importorskip("diffusers")
sf = pytest.importorskip("soundfile")

from omni_actors.models.tiny import make_tiny  # noqa: E402
from tests.api.model_server import ModelRun  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
HTTP_TIMEOUT_S = 180
RATE_HZ = 8000
"""The tiny Stable Audio VAE's sample rate."""


@pytest.fixture(scope="module")
def audio_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stable-audio")
    model = make_tiny("stable_audio", tmp / "tiny-stable-audio", seed=0)
    run = ModelRun(tmp, model, tmp / "data")
    try:
        run.wait_ready()
        yield run
    finally:
        run.stop()


def generate(run: ModelRun, path: str = "/v1/audio/generations", **body) -> requests.Response:
    body = {"model": run.model, "prompt": "drums and piano", "num_inference_steps": 2, **body}
    return requests.post(f"{run.url}{path}", json=body, timeout=HTTP_TIMEOUT_S)


def test_a_clip_decodes_at_the_asked_length_and_the_seed_repeats_it(audio_server):
    first = generate(audio_server, seconds=0.5, seed=7)
    assert first.status_code == 200, first.text
    assert first.headers["Content-Type"] == "audio/wav"
    audio, rate = sf.read(io.BytesIO(first.content))
    assert (rate, audio.shape) == (RATE_HZ, (RATE_HZ // 2, 2))  # stereo, as Stable Audio Open makes
    again = generate(audio_server, "/v1/audio/generate", seconds=0.5, seed=7)
    assert again.content == first.content
    flac = generate(audio_server, seconds=0.5, seed=7, response_format="flac")
    assert sf.read(io.BytesIO(flac.content))[0].shape == (RATE_HZ // 2, 2)
    # raw pcm has no header: the answer's say its rate and channels (it gave no channel count before 2026-12-05)
    pcm = generate(audio_server, seconds=0.5, seed=7, response_format="pcm")
    assert (pcm.headers["X-Sample-Rate"], pcm.headers["X-Channels"]) == (str(RATE_HZ), "2")
    assert len(pcm.content) == RATE_HZ // 2 * 2 * 2  # 16-bit samples, two channels interleaved
    assert first.headers["X-Channels"] == "2"
    paths = requests.get(f"{audio_server.url}/openapi.json", timeout=HTTP_TIMEOUT_S).json()["paths"]
    assert {"/v1/audio/generations", "/v1/audio/generate"} <= set(paths)


@pytest.mark.parametrize(("body", "param"), [
    ({"seconds": 100}, "seconds"),
    ({"seconds": 3}, "seconds"),  # under the family's 47 s, past this checkpoint's 2.048 s window
    ({"response_format": "ogg"}, "response_format"),
    ({"colour": "red"}, "colour"),
    ({"num_inference_steps": 2**70}, "num_inference_steps"),  # (was the bus's "can't serialize ints", no param)
    ({"num_inference_steps": 0}, "num_inference_steps"),
    ({"guidance_scale": -1}, "guidance_scale"),
])  # fmt: skip
def test_bad_inputs_are_400_naming_the_field(audio_server, body, param):
    resp = generate(audio_server, **body)
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == param, resp.text


def test_a_video_route_says_what_the_model_makes(audio_server):
    with pytest.raises(openai.BadRequestError) as err:
        audio_server.client().videos.create(model=audio_server.model, prompt="x")
    assert "produces ['audio']" in err.value.body["message"]


@pytest.mark.parametrize("seconds", [0, 3])
def test_a_clip_length_out_of_range_names_this_checkpoints_window(audio_server, seconds):
    """The route's bound is the folder's 2.048 s window, not the family's 47 s: the message tells the user what
    fits, and a request past the window is the route's 400 (`invalid_value`), not one the worker sends back."""
    resp = generate(audio_server, seconds=seconds)
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert (err["param"], err["code"]) == ("seconds", "invalid_value")
    assert "0.1 to 2.048 s" in err["message"]


def test_a_blank_prompt_is_400_naming_prompt(audio_server):
    resp = generate(audio_server, prompt="  \n ")
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == "prompt"


def test_the_speech_routes_say_it_makes_sound_from_a_prompt(audio_server):
    """Text to speak means nothing to it: a 400 naming `model` and its route, before its stage sees it."""
    with pytest.raises(openai.BadRequestError) as err:
        audio_server.client().audio.speech.create(model=audio_server.model, input="hi", voice="alloy")
    body = err.value.body
    assert (body["param"], body["code"]) == ("model", "unsupported_task") and "/v1/audio/generations" in body["message"]
    socket = requests.get(f"{audio_server.url}/v1/audio/speech/stream?model={audio_server.model}",
                          timeout=HTTP_TIMEOUT_S)  # (the text-in socket's upgrade, refused before it)
    assert socket.status_code == 400 and socket.json()["error"]["code"] == "unsupported_task", socket.text
