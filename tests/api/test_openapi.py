"""/openapi.json agrees with the server, and schemathesis, driven by it, finds no server error.

A real synthetic server (text -> codes -> audio) with an API key: the document lists
only the routes this pipeline serves, declares auth only where it is needed, names
the content types the routes really send; a wrong method is a 405 with `Allow`.
Then a bounded schemathesis run (positive and negative data, every check but
positive_data_acceptance, see FUZZ_EXCLUDED) over real HTTP.
"""

from __future__ import annotations

import asyncio
import collections

import aiohttp
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from openapi_spec_validator import validate
from schemathesis import GenerationMode
from schemathesis.checks import CHECKS, load_all_checks

from omni_actors.api.app import build_app
from omni_actors.api.openapi_routes import ROUTES, UNDOCUMENTED
from tests.api.conftest import Server, serve

FUZZ_EXAMPLES = 10
"""Cases per operation and mode: enough to cross every field once or twice, and the run stays short."""
FUZZ_EXCLUDED = {
    "positive_data_acceptance": "a schema-valid string is rarely valid base64 audio or an image data URL, and "
                                "the server checks media itself (a 400 naming the field), as the schema cannot say",
}


ALWAYS = {"/v1/models", "/v1/models/{model}", "/v1/status", "/health", "/metrics", "/openapi.json",
          "/v1/audio/voice_consents", "/v1/audio/voice_consents/{consent_id}", "/v1/audio/voices",
          "/v1/audio/voices/{voice_id}", "/v1/files", "/v1/files/{file_id}", "/v1/files/{file_id}/content",
          "/v1/batches", "/v1/batches/{batch_id}", "/v1/batches/{batch_id}/cancel", "/v1/realtime/client_secrets"}
"""Paths every pipeline's document lists (custom voices, uploads and batches are stored whatever the pipeline
makes; every pipeline serves realtime sessions, so client secrets for them)."""
RESPONSES = {"/v1/responses", "/v1/responses/{response_id}", "/v1/responses/{response_id}/cancel",
             "/v1/responses/{response_id}/input_items", "/v1/conversations", "/v1/conversations/{conversation_id}",
             "/v1/conversations/{conversation_id}/items", "/v1/conversations/{conversation_id}/items/{item_id}"}


CHAT = {"/v1/chat/completions", "/v1/chat/completions/{completion_id}", "/v1/chat/completions/{completion_id}/messages"}
"""Chat completions, and the stored ones (chat_stored.py)."""


@pytest.fixture(scope="module")
async def srv():
    async with serve("synthetic", stages=[{"stage_id": 0, "engine_extras": {"max_chunks": 64}}, {"stage_id": 1},
                                          {"stage_id": 2}]) as s:
        yield s


async def spec_of(srv: Server) -> dict:
    async with aiohttp.ClientSession() as http, http.get(srv.url + "/openapi.json") as resp:
        assert resp.status == 200
        return await resp.json()


async def test_document_lists_what_this_pipeline_serves_with_real_content_types(srv: Server) -> None:
    spec = await spec_of(srv)
    validate(spec)
    paths = spec["paths"]
    # no images, videos, transcriptions, nor /v1/audio/generations (speech is not a sound from a prompt)
    assert set(paths) == ALWAYS | RESPONSES | CHAT | {"/v1/completions", "/v1/audio/speech"}
    speech = paths["/v1/audio/speech"]["post"]["responses"]["200"]["content"]
    assert {"audio/mpeg", "audio/wav", "audio/flac", "audio/ogg", "audio/aac", "audio/pcm", "text/event-stream"} == set(
        speech)
    assert "application/octet-stream" not in speech
    chat = paths["/v1/chat/completions"]["post"]["responses"]["200"]["content"]
    assert set(chat) == {"application/json", "text/event-stream"}
    assert "security" not in spec  # per operation only
    for path in ("/health", "/metrics", "/openapi.json"):
        op = paths[path]["get"]
        assert op["security"] == [] and "401" not in op["responses"], path
    for path, method in (("/v1/chat/completions", "post"), ("/v1/models", "get")):
        op = paths[path][method]
        assert {"bearer": []} in op["security"] and "401" in op["responses"], path
    # query strings the handlers read are documented (path parameters first)
    items = paths["/v1/responses/{response_id}/input_items"]["get"]["parameters"]
    assert [(p["name"], p["in"]) for p in items] == [
        ("response_id", "path"), ("after", "query"), ("limit", "query"), ("order", "query")]
    assert items[3]["schema"] == {"type": "string", "enum": ["asc", "desc"]}
    stored = {p["name"]: p["schema"]["type"] for p in paths["/v1/responses/{response_id}"]["get"]["parameters"]}
    assert stored == {"response_id": "string", "stream": "boolean", "starting_after": "integer"}


async def test_every_route_the_app_registers_is_in_the_route_table(srv: Server) -> None:
    """A new route without a row in openapi_routes.py (or a row for a route that went) fails here."""
    app = build_app(srv.orch)
    registered = {(r.method.lower(), r.resource.canonical) for r in app.router.routes() if r.method != "HEAD"}
    documented = {(r.method, r.path) for r in ROUTES}
    assert registered - UNDOCUMENTED == documented, (registered - UNDOCUMENTED) ^ documented
    assert registered >= UNDOCUMENTED


async def test_speech_answers_the_documented_content_type(srv: Server) -> None:
    spec = await spec_of(srv)
    documented = set(spec["paths"]["/v1/audio/speech"]["post"]["responses"]["200"]["content"])
    for fmt in ("mp3", "wav", "opus"):
        resp = await srv.client().audio.speech.with_raw_response.create(
            model="synthetic", input="hello", voice="alloy", response_format=fmt)
        assert resp.headers["content-type"].split(";")[0] in documented, fmt


async def test_document_without_keys_declares_no_auth_and_other_pipelines_their_routes() -> None:
    async with serve("synthetic_asr", key=None) as srv:
        spec = await spec_of(srv)
    validate(spec)
    assert set(spec["paths"]) == ALWAYS | {"/v1/audio/transcriptions"}
    assert "securitySchemes" not in spec["components"]
    ops = [op for item in spec["paths"].values() for op in item.values()]
    assert all("security" not in op and "401" not in op["responses"] for op in ops)
    upload = spec["paths"]["/v1/audio/transcriptions"]["post"]["responses"]["200"]["content"]
    assert set(upload) == {"application/json", "text/plain", "application/x-subrip", "text/vtt", "text/event-stream"}
    assert {r["$ref"].rsplit("/", 1)[1] for r in upload["application/json"]["schema"]["anyOf"]} == {
        "Transcription", "TranscriptionVerbose"}
    form = spec["components"]["schemas"]["TranscriptionForm"]["properties"]
    assert "timestamp_granularities[]" in form and "verbose_json" in form["response_format"]["enum"]


@pytest.mark.parametrize(("method", "path", "allow"), [
    ("PUT", "/v1/chat/completions", {"GET", "HEAD", "POST"}),
    ("DELETE", "/health", {"GET", "HEAD"}),
])
async def test_wrong_method_is_405_with_allow(srv: Server, method: str, path: str, allow: set[str]) -> None:
    async with aiohttp.ClientSession(headers=srv.headers) as http, http.request(method, srv.url + path) as resp:
        body = await resp.json()
        assert resp.status == 405 and body["error"]["code"] == "method_not_allowed", body
        assert {m.strip() for m in resp.headers["Allow"].split(",")} == allow


def fuzz(url: str, key: str) -> tuple[collections.Counter, list[str]]:
    """Every operation, positive then negative data; returns (status counts, failed checks)."""
    load_all_checks()
    checks = [c for c in CHECKS.get_all() if c.__name__ not in FUZZ_EXCLUDED]
    schema = schemathesis.openapi.from_url(url + "/openapi.json")
    statuses: collections.Counter = collections.Counter()
    failures: list[str] = []

    def cases_of(op, mode: GenerationMode):
        @settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(case=op.as_strategy(generation_mode=mode))
        def run(case) -> None:
            resp = case.call(headers={"Authorization": f"Bearer {key}"}, timeout=30)
            statuses[resp.status_code // 100 * 100] += 1
            try:
                case.validate_response(resp, checks=checks)
            except Exception as err:  # a check failed: collect, report them all at the end
                failures.append(f"{op.label} {mode.value} [{resp.status_code}]: {err}"[:2000])
        return run

    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
        for result in schema.get_all_operations():
            try:
                cases_of(result.ok(), mode)()
            except Unsatisfiable:  # no negative case exists (an operation without parameters)
                pass
    return statuses, failures


async def test_schemathesis_finds_no_server_error_and_no_failed_check(srv: Server) -> None:
    statuses, failures = await asyncio.to_thread(fuzz, srv.url, srv.key)
    assert statuses[500] == 0, statuses
    assert statuses[200] > 0 and statuses[400] > 0, statuses  # it reached handlers both ways
    assert not failures, "\n\n".join(failures[:5])


@pytest.mark.slow  # (default-suite budget: the slow run, `-m slow`, keeps it)
async def test_schemathesis_on_the_upload_route() -> None:
    async with serve("synthetic_asr") as srv:
        statuses, failures = await asyncio.to_thread(fuzz, srv.url, srv.key)
    assert statuses[500] == 0, statuses
    assert statuses[400] > 0, statuses
    assert not failures, "\n\n".join(failures[:5])
