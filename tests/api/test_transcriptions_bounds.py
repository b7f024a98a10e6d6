"""/v1/audio/transcriptions at the documented bound on an upload's length (max_input_audio_s, 3600 s by
default), checked from the file's header before decoding: FLAC from libsndfile's frame count, and WebM,
whose length Matroska writes on the container only (not on the stream), from the container's duration."""

from __future__ import annotations

import dataclasses
import io
import re

import numpy as np
import pytest
import soundfile as sf

from omni_actors import settings as settings_mod
from tests.api.conftest import Server
from tests.api.test_transcriptions import SECONDS, _encoded, asr_srv, call, form

__all__ = ["asr_srv"]  # the module-scoped synthetic_asr server


async def test_an_hour_and_a_second_of_flac_is_refused_from_its_header(asr_srv: Server) -> None:
    buf = io.BytesIO()
    sf.write(buf, np.zeros(3601 * 8000, np.int16), 8000, format="FLAC")  # ~90 kB of silence
    before = asr_srv.orch.statistics().requests_total
    status, err = await call(asr_srv, data=form(file=buf.getvalue(), model="synthetic_asr"))
    assert (status, err["param"], err["code"]) == (400, "file", "audio_too_long"), err
    assert "audio of 3601.0 s is over the limit of 3600 s (max_input_audio_s" in err["message"], err
    assert asr_srv.orch.statistics().requests_total == before


async def test_a_webm_over_the_bound_is_refused_from_its_container_duration(
        asr_srv: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """A WebM's stream has no duration, so the whole file was decoded (an hour of 48 kHz opus: ~700 MB of
    samples and half a minute of CPU for a 1.7 MB upload) until the count of decoded samples passed the
    limit, and the error said the limit's length ("audio of 1.0 s"), not the file's."""
    monkeypatch.setattr(settings_mod, "_settings", dataclasses.replace(settings_mod.settings(), max_input_audio_s=1.0))
    for container, codec, rate in (("webm", "libopus", 48_000), ("mp4", "aac", 16_000)):
        status, err = await call(asr_srv, data=form(file=_encoded(container, codec, rate), model="synthetic_asr"))
        assert (status, err["param"], err["code"]) == (400, "file", "audio_too_long"), err
        said = re.match(r"audio of ([\d.]+) s is over the limit of 1 s", err["message"])
        assert said and abs(float(said[1]) - SECONDS) <= 0.15, (container, err)  # (give or take codec padding)
