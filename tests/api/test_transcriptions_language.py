"""/v1/audio/transcriptions' `language`, one form each way for every recognizer: a client's ISO-639-1 code
(any case, a region subtag dropped) or Whisper's name is given to the recognizer as the code, anything else
is a 400 naming `language` before any stage sees it; verbose_json names the language as OpenAI does
("english"). Before 2026-12-05 the value went to the stage as sent: synthetic_asr took "xx" and reported
"xx", Whisper tiny.en refused "English" (it compared "english" with "en"), Qwen3-ASR refused "tl" (Whisper's
code for the language it calls Filipino) and Voxtral refused "English".

Servers: synthetic_asr (tests/api/test_transcriptions.py) and the assistant's Whisper tiny.en stage alone
(tests/api/test_transcriptions_probe.py); Qwen3-ASR's adapter in process on a tiny checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import openai
import pytest

from omni_actors.models.qwen3_asr.asr import Qwen3AsrAdapter
from omni_actors.workers.engine import EngineContext
from omni_actors.workers.engines.hf_ar_adapter import ARSeq
from tests.api.conftest import Server
from tests.api.test_transcriptions import TONE, asr_srv, call, form
from tests.api.test_transcriptions_probe import RECORDING, whisper

__all__ = ["asr_srv", "whisper"]  # module-scoped servers shared with those modules

BAD = ["xx", "e", "english1", "en-XX-", "Klingon", "eng"]
"""Not an ISO-639-1 code, nor a name, of a language any recognizer here knows ("eng" is ISO-639-2)."""


@pytest.mark.parametrize("language", BAD)
async def test_a_bad_language_is_a_400_naming_it_before_any_stage(asr_srv: Server, language: str) -> None:
    before = asr_srv.orch.statistics().requests_total
    status, err = await call(asr_srv, data=form(file=TONE, model="synthetic_asr", language=language,
                                                response_format="verbose_json"))
    assert (status, err["param"], err["code"]) == (400, "language", "invalid_value"), err
    assert repr(language) in err["message"] and "ISO-639-1" in err["message"], err
    assert asr_srv.orch.statistics().requests_total == before


async def test_codes_in_any_form_are_named_as_openai_names_them(asr_srv: Server) -> None:
    client = asr_srv.client()
    for asked, named in (("en", "english"), ("EN", "english"), ("en-US", "english"), ("pt_BR", "portuguese"),
                         ("zh", "chinese"), ("jv", "javanese"), ("fil", "tagalog"), ("Hungarian", "hungarian")):
        said = await client.audio.transcriptions.create(model="synthetic_asr", file=("a.wav", TONE),
                                                        language=asked, response_format="verbose_json")
        assert said.language == named, (asked, said.language)


async def test_whisper_takes_english_however_it_is_named(whisper: Server) -> None:
    """tiny.en transcribes "en": "English" and "en-US" are that language, and a bad code is refused as a bad
    code (not as a language tiny.en lacks)."""
    client = whisper.client()
    data = RECORDING.read_bytes()
    for asked in ("en", "EN", "English", "en-US"):
        said = await client.audio.transcriptions.create(model="assistant", file=("a.wav", data), language=asked,
                                                        response_format="verbose_json")
        assert said.language == "english" and "young man" in said.text.lower(), (asked, said)
    with pytest.raises(openai.BadRequestError) as caught:
        await client.audio.transcriptions.create(model="assistant", file=("a.wav", data), language="xx")
    assert caught.value.body["param"] == "language" and "ISO-639-1" in caught.value.body["message"]


def test_qwen3_asr_takes_the_code_the_api_gives_for_filipino(tiny_model: Callable[[str], Path]) -> None:
    """The API gives Whisper's code, "tl", for the language Qwen3-ASR's processor knows as "fil" / "Filipino":
    the adapter forces that language (its prefill names it) instead of refusing the request."""
    ctx = EngineContext(stage_id=0, replica=0, model_stage="asr", model_path=tiny_model("qwen3_asr"), device="cpu",
                        max_num_seqs=2, dtype="float32", gpu_memory_utilization=0.5, tensor_parallel_size=1)
    adapter = Qwen3AsrAdapter(ctx)
    adapter.load()
    audio = {"audio": np.zeros(1600, np.float32), "sample_rate": 16_000}
    for language in ("tl", "fil", "Filipino"):
        seq = ARSeq("r", {"language": language}, streaming=False)
        adapter.start(seq, audio)
        prompt = adapter.tokenizer.decode(seq.data["batch"]["input_ids"][0], skip_special_tokens=False)
        assert prompt.endswith("language Filipino<asr_text>"), (language, prompt[-80:])
