"""The dia family end to end: a tiny Dia folder (decoder + DAC codec workers) served as `omni-run --model DIR` serves it.

The checks are the shared ones (speech_family.py), driven by the openai SDK; one server for the module.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from omni_actors.models.tiny import make_tiny
from tests.api.conftest import Server
from tests.models.speech_family import (  # noqa: F401 - the shared tests, collected here
    Family,
    serve_family,
    test_audio_at_the_family_rate_deterministic_for_a_seed,
    test_bad_voice_instructions_and_sizes_are_400s,
    test_custom_voices_clone_and_survive_a_restart,
    test_detected_served_and_voices_listed,
    test_every_format_decodes,
    test_plain_streaming_sends_encoded_bytes,
    test_speed_changes_duration,
    test_sse_deltas_arrive_before_done,
    test_text_in_socket_closed_mid_text_leaves_nothing_running,
    test_text_in_socket_speaks_before_done_in_order,
)

FAMILY = Family("dia", rate=44100, frame=512, voices=("S1", "S2"))


@pytest.fixture(scope="module")
def fam() -> Family:
    return FAMILY


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_tiny(FAMILY.pipeline, tmp_path_factory.mktemp("models") / FAMILY.model, seed=0)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="module")
async def srv(model_dir, data_dir) -> AsyncIterator[Server]:
    async with serve_family(model_dir, data_dir) as server:
        yield server
