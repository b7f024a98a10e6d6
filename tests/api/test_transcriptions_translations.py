"""POST /v1/audio/translations with the unmodified openai SDK: no recognizer served here translates, so the
route reads and checks OpenAI's translation form and then says the model cannot translate (a 400 naming
`model`), where it used to answer "unknown route" (404 `not_found`) to every request."""

from __future__ import annotations

import aiohttp
import openai
import pytest

from tests.api.conftest import Server
from tests.api.test_transcriptions import TONE, asr_srv, form, srv

__all__ = ["asr_srv", "srv"]  # the module-scoped servers (synthetic_asr; synthetic, with no recognizer)

ROUTE = "/v1/audio/translations"


async def test_a_recognizer_that_cannot_translate_says_so(asr_srv: Server) -> None:
    before = asr_srv.orch.statistics().requests_total
    for fmt in ("json", "text", "srt", "verbose_json", "vtt"):
        with pytest.raises(openai.BadRequestError) as caught:
            await asr_srv.client().audio.translations.create(model="synthetic_asr", file=("a.wav", TONE),
                                                             response_format=fmt, prompt="hi", temperature=0.2)
        err = caught.value.body
        assert (err["param"], err["code"]) == ("model", "unsupported_value"), err
        assert "'synthetic_asr' cannot translate" in err["message"] and "/v1/audio/transcriptions" in err["message"]
    assert asr_srv.orch.statistics().requests_total == before  # nothing reached the stage


@pytest.mark.parametrize(("fields", "status", "param", "code"), [
    pytest.param({"file": TONE, "model": "nope"}, 404, "model", "model_not_found", id="unknown-model"),
    pytest.param({"model": "synthetic_asr"}, 400, "file", "missing_required_parameter", id="no-file"),
    pytest.param({"file": TONE}, 400, "model", "missing_required_parameter", id="no-model"),
    pytest.param({"file": TONE, "model": "synthetic_asr", "language": "en"}, 400, "language", "unknown_parameter",
                 id="language-is-no-translation-field"),
])
async def test_translation_form_mistakes_are_named(asr_srv: Server, fields: dict, status: int, param: str,
                                                   code: str) -> None:
    async with aiohttp.ClientSession(headers=asr_srv.headers) as http, \
            http.post(asr_srv.url + ROUTE, data=form(**fields)) as resp:
        err = (await resp.json())["error"]
        assert (resp.status, err["param"], err["code"]) == (status, param, code), err


async def test_a_model_without_a_recognizer_and_an_oversized_upload(srv: Server) -> None:
    """The `synthetic` pipeline makes no transcript: the modality error; past the body limit: a 413."""
    with pytest.raises(openai.BadRequestError) as caught:
        await srv.client().audio.translations.create(model="synthetic", file=("a.wav", TONE[:2000]))
    assert (caught.value.body["param"], caught.value.body["code"]) == ("model", "unsupported_modality")
    with pytest.raises(openai.APIStatusError) as too_big:
        await srv.client().audio.translations.create(model="synthetic", file=("a.wav", b"x" * 100_000))
    assert too_big.value.status_code == 413 and too_big.value.body["code"] == "body_too_large"
