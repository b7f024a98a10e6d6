"""POST /v1/audio/generations at a rate mp3 cannot carry: the clip is resampled (audio_codec.encode_file), not refused
after the whole generation ran; every format's X-Sample-Rate is its file's rate. A real `omni-run` on a tiny folder."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import requests

pytest.importorskip("diffusers")
sf = pytest.importorskip("soundfile")

from omni_actors.models.tiny import make_tiny  # noqa: E402
from tests.api.model_server import ModelRun  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
HTTP_TIMEOUT_S = 180
ODD_RATE_HZ = 10_000
"""The tiny Stable Audio VAE's rate, set to one mp3 has not (its rates: 8, 11.025, 12, 16, 22.05 ... kHz)."""
MP3_RATE_HZ = 11_025


@pytest.fixture(scope="module")
def odd_rate_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stable-audio-10k")
    model = make_tiny("stable_audio", tmp / "tiny-stable-audio", seed=0)
    vae = model / "vae" / "config.json"
    vae.write_text(json.dumps({**json.loads(vae.read_text()), "sampling_rate": ODD_RATE_HZ}))
    run = ModelRun(tmp, model, tmp / "data")
    try:
        run.wait_ready()
        yield run
    finally:
        run.stop()


def test_an_mp3_of_a_rate_mp3_cannot_carry_is_resampled_not_refused(odd_rate_server):
    def generate(fmt: str) -> requests.Response:
        body = {"model": odd_rate_server.model, "prompt": "rain", "num_inference_steps": 2, "seconds": 0.5,
                "seed": 3, "response_format": fmt}
        return requests.post(f"{odd_rate_server.url}/v1/audio/generations", json=body, timeout=HTTP_TIMEOUT_S)

    wav = generate("wav")
    assert wav.status_code == 200, wav.text
    assert wav.headers["X-Sample-Rate"] == str(ODD_RATE_HZ)
    native, rate = sf.read(io.BytesIO(wav.content))
    assert (rate, native.shape) == (ODD_RATE_HZ, (ODD_RATE_HZ // 2, 2))
    mp3 = generate("mp3")
    assert mp3.status_code == 200, mp3.text
    assert (mp3.headers["Content-Type"], mp3.headers["X-Sample-Rate"]) == ("audio/mpeg", str(MP3_RATE_HZ))
    audio, rate = sf.read(io.BytesIO(mp3.content))
    assert rate == MP3_RATE_HZ and audio.shape[1] == 2  # channels kept
    assert abs(audio.shape[0] - MP3_RATE_HZ // 2) < 0.1 * MP3_RATE_HZ
    pcm = generate("pcm")
    assert pcm.headers["X-Sample-Rate"] == str(ODD_RATE_HZ)
    frames = np.frombuffer(pcm.content, "<i2").reshape(-1, 2)  # interleaved
    assert frames.shape == native.shape and np.abs(frames / 32767 - native).max() < 1e-3
