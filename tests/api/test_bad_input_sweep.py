"""A demanding user's bad inputs over real HTTP: each is a 4xx with an OpenAI error body, none reaches a stage.

test_errors.py covers the first mistakes (a typo'd field, a bad role, broken base64 audio, 401 / 404
/ 405 / 413 basics); this sweep covers what is left: odd JSON, huge numbers, media that lies about
its format, wrong Content-Type, broken Content-Encoding, more routes and methods, streaming.
"""

from __future__ import annotations

import base64
import io
import json
import struct
import zlib
from typing import Any

import aiohttp
import numpy as np
import openai
import pytest
import soundfile as sf
from PIL import Image

from tests.api.conftest import Server, idle, post, serve

CHAT = "/v1/chat/completions"
SPEECH = "/v1/audio/speech"
IMAGES = "/v1/images/generations"
MSG = [{"role": "user", "content": "a b c"}]
JSON = {"Content-Type": "application/json"}
CALL_TIMEOUT_S = 5.0
"""A bad request must be answered at once; a hang fails the test instead of stalling it."""


@pytest.fixture(scope="module")
async def srv():
    stages = [{"stage_id": 0, "engine_extras": {"chunks": 2}}, {"stage_id": 1}, {"stage_id": 2}]
    async with serve("synthetic", stages=stages, server={"max_body_mb": 0.25}) as s:
        yield s


def _wav() -> bytes:
    buf = io.BytesIO()
    sf.write(buf, np.zeros(2400, np.float32), 24000, format="WAV")
    return buf.getvalue()


def _png(width: int = 4, height: int = 4) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height)).save(buf, format="PNG")
    return buf.getvalue()


def _bomb_png(width: int = 20000, height: int = 20000) -> bytes:
    """A valid PNG header declaring width x height pixels (20000 x 20000: PIL refuses it as a
    decompression bomb; under PIL's limit the server's own pixel cap applies)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _audio_msg(data: str, fmt: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": data, "format": fmt}}]}]


def _image_msg(url: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]


DEEP = b'{"a":' * 5000 + b"{}" + b"}" * 5000
"""JSON nested past what a decoder's stack takes (as text: an encoder's stack takes no more)."""


def _chat(**fields: Any) -> dict[str, Any]:
    return {"json": {"model": "synthetic", "messages": MSG, **fields}}


def _raw(data: bytes, content_type: str = "application/json") -> dict[str, Any]:
    return {"data": data, "headers": {"Content-Type": content_type}}


def _error(body: Any, status: int) -> dict[str, Any]:
    """The OpenAI error body: exactly {"error": {message, type, param, code}}, type per status."""
    assert isinstance(body, dict) and set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    kind = "authentication_error" if status == 401 else "invalid_request_error"
    assert err["type"] == kind and isinstance(err["message"], str) and err["message"], (status, err)
    return err


async def _call(http: aiohttp.ClientSession, srv: Server, method: str, path: str,
                **kwargs: Any) -> tuple[int, Any]:
    headers = {**srv.headers, **kwargs.pop("headers", {})}
    async with http.request(method, srv.url + path, headers=headers,
                            timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT_S), **kwargs) as resp:
        raw = await resp.read()
        assert resp.content_type == "application/json", (resp.status, raw[:200])
        return resp.status, json.loads(raw)


# (method, path, request kwargs, status, param, code)
CASES = [
    # -- bodies that are not a JSON object --
    pytest.param("POST", CHAT, _raw(b'{"model": "synthetic", "messages": [{"role": "user"}]} trailing'), 400, None, "invalid_json", id="trailing-garbage"),
    pytest.param("POST", CHAT, _raw(b'{"model": "synthetic", "messages": [{"role": "user"}], "temperature": NaN}'),
                 400, None, "invalid_json", id="nan-literal"),
    pytest.param("POST", CHAT, _raw(b'{"model": "\xff\xfe"}'), 400, None, "invalid_json", id="invalid-utf8"),
    pytest.param("POST", CHAT, _raw(b"   \n  "), 400, None, "invalid_json", id="whitespace-only"),
    pytest.param("POST", CHAT, {"json": [MSG]}, 400, None, "invalid_type", id="top-level-list"),
    pytest.param("POST", CHAT, {"json": "hello"}, 400, None, "invalid_type", id="top-level-string"),
    pytest.param("POST", CHAT, _raw(b"null"), 400, None, "invalid_type", id="top-level-null"),
    pytest.param("POST", CHAT, _raw(b"42"), 400, None, "invalid_type", id="top-level-number"),
    pytest.param("POST", SPEECH, {"json": ["synthetic", "hi"]}, 400, None, "invalid_type", id="speech-top-level-list"),
    pytest.param("POST", IMAGES, _raw(b'"a cat"'), 400, None, "invalid_type", id="images-top-level-string"),
    # -- wrong field types --
    pytest.param("POST", CHAT, {"json": {"model": 7, "messages": MSG}}, 400, "model", "invalid_type", id="model-int"),
    pytest.param("POST", CHAT, {"json": {"messages": MSG}}, 400, "model", "missing_required_parameter",
                 id="model-missing"),
    pytest.param("POST", CHAT, {"json": {"model": "synthetic", "messages": "hi"}}, 400, "messages", "invalid_type",
                 id="messages-string"),
    pytest.param("POST", CHAT, {"json": {"model": "synthetic", "messages": {"role": "user"}}}, 400, "messages",
                 "invalid_type", id="messages-object"),
    pytest.param("POST", CHAT, {"json": {"model": "synthetic", "messages": [None]}}, 400, "messages[0]",
                 "invalid_type", id="message-null"),
    pytest.param("POST", CHAT, {"json": {"model": "synthetic", "messages": [{"content": "x"}]}}, 400,
                 "messages[0].role", "missing_required_parameter", id="message-no-role"),
    pytest.param("POST", CHAT, {"json": {"model": "synthetic", "messages": [{"role": "user", "content": 5}]}}, 400,
                 "messages[0].content", "invalid_type", id="content-int"),
    pytest.param("POST", CHAT, _chat(stream="yes"), 400, "stream", "invalid_type", id="stream-string"),
    pytest.param("POST", CHAT, _chat(stop=5), 400, "stop", "invalid_type", id="stop-int"),
    pytest.param("POST", CHAT, _chat(max_tokens=1.5), 400, "max_tokens", "invalid_type", id="max-tokens-float"),
    pytest.param("POST", CHAT, _chat(max_tokens=True), 400, "max_tokens", "invalid_type", id="max-tokens-bool"),
    pytest.param("POST", CHAT, _chat(modalities="text"), 400, "modalities", "invalid_type", id="modalities-string"),
    pytest.param("POST", CHAT, _chat(metadata={"a": 1}), 400, "metadata[...]", "invalid_type", id="metadata-int"),
    pytest.param("POST", CHAT, _chat(logprobs=True), 400, "logprobs", "unsupported_parameter",
                 id="logprobs-true"),
    pytest.param("POST", SPEECH, {"json": {"model": "synthetic", "input": "x", "voice": 3}}, 400, "voice",
                 "invalid_type", id="speech-voice-int"),
    # -- numbers out of range (huge integers must never reach a stage) --
    pytest.param("POST", CHAT, _chat(max_tokens=-1), 400, "max_tokens", "integer_below_min_value", id="max-tokens-negative"),
    pytest.param("POST", CHAT, _chat(max_tokens=0), 400, "max_tokens", "integer_below_min_value", id="max-tokens-zero"),
    pytest.param("POST", CHAT, _chat(max_tokens=2**40), 400, "max_tokens", "integer_above_max_value", id="max-tokens-2e40"),
    pytest.param("POST", CHAT, _chat(max_tokens=2**63), 400, "max_tokens", "integer_above_max_value", id="max-tokens-2e63"),
    pytest.param("POST", CHAT, _chat(max_tokens=10**30), 400, "max_tokens", "integer_above_max_value", id="max-tokens-1e30"),
    pytest.param("POST", CHAT, _chat(max_completion_tokens=10**30), 400, "max_completion_tokens", "integer_above_max_value",
                 id="max-completion-tokens-1e30"),
    pytest.param("POST", CHAT, _chat(temperature=1e9), 400, "temperature", "decimal_above_max_value", id="temperature-1e9"),
    pytest.param("POST", CHAT, _raw(b'{"model": "synthetic", "messages": [{"role": "user"}], "temperature": 1e400}'), 400,
                 "temperature", "invalid_value", id="temperature-overflow"),
    pytest.param("POST", CHAT, _chat(top_p=-0.1), 400, "top_p", "decimal_below_min_value", id="top-p-negative"),
    pytest.param("POST", CHAT, _chat(top_k=-5), 400, "top_k", "integer_below_min_value", id="top-k-negative"),
    pytest.param("POST", CHAT, _chat(top_k=2**70), 400, "top_k", "integer_above_max_value", id="top-k-2e70"),
    pytest.param("POST", CHAT, _chat(seed=2**70), 400, "seed", "integer_above_max_value", id="seed-2e70"),
    pytest.param("POST", CHAT, _chat(seed=-(2**64)), 400, "seed", "integer_below_min_value", id="seed-minus-2e64"),
    pytest.param("POST", CHAT, _chat(n=100), 400, "n", "integer_above_max_value", id="n-100"),
    pytest.param("POST", CHAT, _chat(n=2**70), 400, "n", "integer_above_max_value", id="n-2e70"),
    pytest.param("POST", CHAT, _chat(presence_penalty=-3), 400, "presence_penalty", "decimal_below_min_value",
                 id="presence-penalty"),
    pytest.param("POST", CHAT, _chat(repetition_penalty=0), 400, "repetition_penalty", "decimal_below_min_value",
                 id="repetition-penalty-zero"),
    pytest.param("POST", SPEECH, _raw(b'{"model": "synthetic", "input": "x", "speed": -1e300}'), 400, "speed",
                 "decimal_below_min_value", id="speech-speed-negative"),
    pytest.param("POST", SPEECH, {"json": {"model": "synthetic", "input": "x" * 16385}}, 400, "input",
                 "string_above_max_length", id="speech-input-too-long"),
    pytest.param("POST", SPEECH, {"json": {"model": "synthetic", "input": "x", "seed": 2**64}}, 400, "seed",
                 "integer_above_max_value", id="speech-seed-2e64"),  # was the stage's 400 "can't serialize ints"
    pytest.param("POST", SPEECH, {"json": {"model": "synthetic", "input": "x", "seed": 2**63}}, 400, "seed",
                 "integer_above_max_value", id="speech-seed-2e63"),
    pytest.param("POST", SPEECH, {"json": {"model": "synthetic", "input": "x", "seed": -(2**63) - 1}}, 400, "seed",
                 "integer_below_min_value", id="speech-seed-minus-2e63"),
    pytest.param("POST", IMAGES, {"json": {"prompt": "x", "seed": 2**70}}, 400, "seed", "integer_above_max_value",
                 id="images-seed-2e70"),
    pytest.param("POST", IMAGES, {"json": {"prompt": "x", "extra_body": {"seed": 2**64}}}, 400, "extra_body.seed",
                 "integer_above_max_value", id="images-extra-body-seed"),
    pytest.param("POST", IMAGES, {"json": {"prompt": " \n"}}, 400, "prompt", "invalid_value", id="images-blank-prompt"),
    pytest.param("POST", IMAGES, {"json": {"prompt": "x", "n": 2**70}}, 400, "n", "integer_above_max_value", id="images-n-2e70"),
    # -- messages and content parts --
    pytest.param("POST", CHAT, {"json": {"model": "synthetic", "messages": [{"role": "function", "content": "x"}]}},
                 400, "messages[0].role", "invalid_value", id="role-function"),
    pytest.param("POST", CHAT, {"json": {"model": "synthetic", "messages": [{"role": 1, "content": "x"}]}},
                 400, "messages[0].role", "invalid_type", id="role-int"),
    pytest.param("POST", CHAT, {"json": {"model": "synthetic", "messages": [
        {"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}},
                 400, "messages[0].content[0].type", "invalid_value", id="part-input-image"),
    pytest.param("POST", CHAT, {"json": {"model": "synthetic", "messages": [{"role": "user", "content": [{"text": "x"}]}]}},
                 400, "messages[0].content[0].type", "missing_required_parameter", id="part-without-type"),
    pytest.param("POST", CHAT, {"json": {"model": "synthetic", "messages": [{"role": "user", "content": ["x"]}]}},
                 400, "messages[0].content[0]", "invalid_type", id="part-string"),
    pytest.param("POST", CHAT, {"json": {"model": "synthetic", "messages": [{"role": "user", "content": [{"type": "text"}]}]}},
                 400, "messages[0].content[0].text", "missing_required_parameter", id="text-part-without-text"),
    # -- media: bad base64, undecodable, or another format than declared --
    pytest.param("POST", CHAT, {"json": {"model": "synthetic", "messages": _image_msg("data:image/png;base64,@@@")}},
                 400, "messages[0].content[0].image_url.url", "invalid_base64", id="image-bad-base64"),
    pytest.param("POST", CHAT, {"json": {"model": "synthetic", "messages": _image_msg("data:image/png,abc")}},
                 400, "messages[0].content[0].image_url.url", "invalid_image", id="image-not-base64-url"),
    pytest.param("POST", CHAT, {"json": {"model": "synthetic", "messages": _image_msg(
        "data:image/png;base64," + _b64(b"plain text"))}},
                 400, "messages[0].content[0].image_url.url", "invalid_image", id="image-not-an-image"),
    pytest.param("POST", CHAT, {"json": {"model": "synthetic", "messages": _image_msg(
        "data:image/png;base64," + _b64(_png()[:40]))}},
                 400, "messages[0].content[0].image_url.url", "invalid_image", id="image-truncated"),
    pytest.param("POST", CHAT, {"json": {"model": "synthetic", "messages": _image_msg(
        "data:image/png;base64," + _b64(_bomb_png()))}},
                 400, "messages[0].content[0].image_url.url", "image_too_large", id="image-decompression-bomb"),
    pytest.param("POST", CHAT, {"json": {"model": "synthetic", "messages": _image_msg(
        "data:image/png;base64," + _b64(_bomb_png(8000, 6000)))}},
                 400, "messages[0].content[0].image_url.url", "image_too_large", id="image-over-pixel-cap"),
    pytest.param("POST", CHAT, {"json": {"model": "synthetic", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + _b64(_png()), "detail": "ultra"}}]}]}},
                 400, "messages[0].content[0].image_url.detail", "invalid_value", id="image-detail"),
    pytest.param("POST", CHAT, {"json": {"model": "synthetic", "messages": _audio_msg(_b64(_wav()), "ogg")}},
                 400, "messages[0].content[0].input_audio.format", "invalid_value", id="audio-format-unknown"),
    pytest.param("POST", CHAT, {"json": {"model": "synthetic", "messages": _audio_msg(_b64(_wav()), "mp3")}},
                 400, "messages[0].content[0].input_audio.data", "invalid_audio", id="audio-wav-sent-as-mp3"),
    pytest.param("POST", CHAT, {"json": {"model": "synthetic", "messages": _audio_msg(_b64(_wav()), "flac")}},
                 400, "messages[0].content[0].input_audio.data", "invalid_audio", id="audio-wav-sent-as-flac"),
    pytest.param("POST", CHAT, {"json": {"model": "synthetic", "messages": _audio_msg(_b64(_wav()), "pcm16")}},
                 400, "messages[0].content[0].input_audio.data", "invalid_audio", id="audio-wav-sent-as-pcm16"),
    pytest.param("POST", CHAT, {"json": {"model": "synthetic", "messages": _audio_msg(_b64(b"abc"), "pcm16")}},
                 400, "messages[0].content[0].input_audio.data", "invalid_value", id="audio-pcm16-odd-bytes"),
    pytest.param("POST", CHAT, {"json": {"model": "synthetic", "messages": _audio_msg("", "wav")}},
                 400, "messages[0].content[0].input_audio.data", "invalid_audio", id="audio-empty-wav"),
    pytest.param("POST", CHAT, {"json": {"model": "synthetic", "messages": _audio_msg(
        _b64(b"\xff\xfb" + bytes(400)), "mp3")}},
                 400, "messages[0].content[0].input_audio.data", "invalid_audio", id="audio-garbage-mp3"),
    # -- Content-Type and Content-Encoding --
    pytest.param("POST", CHAT, _raw(b'{"model": "synthetic", "messages": [{"role": "user", "content": "x"}]}',
                                    "text/plain"), 415, None, "unsupported_media_type", id="content-type-text"),
    pytest.param("POST", CHAT, _raw(b"model=synthetic&messages=x", "application/x-www-form-urlencoded"),
                 415, None, "unsupported_media_type", id="content-type-form"),
    pytest.param("POST", SPEECH, _raw(b'{"model": "synthetic", "input": "x"}', "multipart/form-data; boundary=b"),
                 415, None, "unsupported_media_type", id="speech-content-type-multipart"),
    pytest.param("POST", IMAGES, _raw(b'{"prompt": "x"}', "application/octet-stream"),
                 415, None, "unsupported_media_type", id="images-content-type-octet-stream"),
    pytest.param("POST", CHAT, {"data": b"not gzip at all", "headers": {**JSON, "Content-Encoding": "gzip"}},
                 400, None, "invalid_body", id="content-encoding-broken-gzip"),
    # -- oversized bodies on the other routes --
    pytest.param("POST", SPEECH, _raw(b'{"input": "' + b"x" * 300_000 + b'"}'), 413, None, "body_too_large",
                 id="speech-too-large"),
    pytest.param("POST", IMAGES, _raw(b'{"prompt": "' + b"x" * 300_000 + b'"}', "text/plain"), 413, None,
                 "body_too_large", id="images-too-large-and-wrong-type"),
    # -- unknown models --
    pytest.param("POST", SPEECH, {"json": {"model": "tts-1", "input": "x"}}, 404, "model", "model_not_found",
                 id="speech-unknown-model"),
    pytest.param("POST", IMAGES, {"json": {"model": "dall-e-3", "prompt": "x"}}, 404, "model", "model_not_found",
                 id="images-unknown-model"),
    pytest.param("GET", "/v1/models/synthetic%00", {}, 404, "model", "model_not_found", id="model-nul"),
    pytest.param("POST", CHAT, _raw(b'{"model": "synthetic", "messages": [{"role": "user", "content": "x"}], '
                                    b'"tools": [{"type": "function", "function": {"name": "f", "parameters": '
                                    + DEEP + b"}}]}"), 400, None, "invalid_json", id="nested-too-deeply"),
    # -- unknown routes and wrong methods --
    pytest.param("GET", "/playground/missing.js", {}, 404, None, "not_found", id="playground-missing-file"),
    pytest.param("POST", "/", {"json": {}}, 405, None, "method_not_allowed", id="post-root"),
    pytest.param("POST", "/v1/completions", _chat(), 400, "messages", "unknown_parameter", id="legacy-completions"),
    pytest.param("POST", "/v1/embeddings", {"json": {"input": "x"}}, 404, None, "not_found", id="embeddings"),
    pytest.param("GET", "/v1/models/a/b", {}, 404, "model", "model_not_found", id="models-nested"),
    pytest.param("GET", "/v1/chat/completions/extra", {}, 404, None, "not_found", id="chat-subpath"),
    pytest.param("PUT", CHAT, _chat(), 405, None, "method_not_allowed", id="put-chat"),
    pytest.param("OPTIONS", CHAT, {}, 405, None, "method_not_allowed", id="options-chat"),
    pytest.param("GET", SPEECH, {}, 405, None, "method_not_allowed", id="get-speech"),
    pytest.param("PATCH", IMAGES, {"json": {}}, 405, None, "method_not_allowed", id="patch-images"),
    pytest.param("DELETE", "/v1/models", {}, 405, None, "method_not_allowed", id="delete-models"),
    pytest.param("POST", "/v1/models/synthetic", {"json": {}}, 405, None, "method_not_allowed", id="post-model"),
    pytest.param("POST", "/health", {"json": {}}, 405, None, "method_not_allowed", id="post-health"),
    pytest.param("POST", "/v1/realtime", {"json": {}}, 405, None, "method_not_allowed", id="post-realtime"),
    pytest.param("GET", "/v1/realtime", {}, 400, None, "websocket_upgrade_required", id="realtime-without-upgrade"),
    # -- streaming requests with bad input: answered before any event is sent --
    pytest.param("POST", CHAT, {"json": {"model": "synthetic", "messages": [], "stream": True}}, 400, "messages",
                 "array_below_min_length", id="stream-empty-messages"),
    pytest.param("POST", CHAT, _chat(stream=True, temperature=1e9), 400, "temperature", "decimal_above_max_value",
                 id="stream-temperature"),
    pytest.param("POST", CHAT, _chat(stream=True, max_tokens=10**30), 400, "max_tokens", "integer_above_max_value",
                 id="stream-max-tokens-1e30"),
    pytest.param("POST", CHAT, {"json": {"model": "gpt-4o", "messages": MSG, "stream": True}}, 404, "model",
                 "model_not_found", id="stream-unknown-model"),
    pytest.param("POST", CHAT, {"json": {"model": "synthetic", "stream": True, "messages": _audio_msg("@@", "wav")}},
                 400, "messages[0].content[0].input_audio.data", "invalid_base64", id="stream-bad-audio"),
    pytest.param("POST", CHAT, _chat(stream=True, stream_options={"include_usage": "yes"}), 400,
                 "stream_options.include_usage", "invalid_type", id="stream-options-type"),
    pytest.param("POST", CHAT, _chat(stream_options={"include_usage": True}), 400, "stream_options",
                 "invalid_value", id="stream-options-without-stream"),
    pytest.param("POST", CHAT, _chat(stream=True, modalities=["audio"], audio={"format": "aac"}), 400,
                 "audio.format", "invalid_value", id="stream-audio-format"),
    pytest.param("POST", SPEECH, {"json": {"model": "synthetic", "input": "", "stream": True}}, 400, "input",
                 "string_below_min_length", id="speech-stream-empty-input"),
    pytest.param("POST", SPEECH, {"json": {"model": "synthetic", "input": "x", "stream_format": "sse",
                                           "response_format": "wma"}}, 400, "response_format", "invalid_value",
                 id="speech-sse-format"),
    pytest.param("POST", SPEECH, {"json": {"model": "synthetic", "input": "x", "stream_format": "websocket"}}, 400,
                 "stream_format", "invalid_value", id="speech-stream-format"),
]


@pytest.mark.parametrize(("method", "path", "kwargs", "status", "param", "code"), CASES)
async def test_bad_request_is_a_4xx_that_never_reaches_a_stage(
        srv: Server, method: str, path: str, kwargs: dict[str, Any], status: int, param: str | None,
        code: str) -> None:
    before = srv.orch.statistics().requests_total
    async with aiohttp.ClientSession() as http:
        got, body = await _call(http, srv, method, path, **kwargs)
    assert got == status, body
    err = _error(body, status)
    assert (err["param"], err["code"]) == (param, code), err
    if status == 400 and param is not None:
        assert f"`{param}`" in err["message"], err
    stats = srv.orch.statistics()
    assert stats.requests_total == before and stats.requests_in_flight == 0


async def test_a_broken_body_does_not_poison_the_connection(srv: Server) -> None:
    """After a body aiohttp cannot decode, the same client session still gets answers."""
    async with aiohttp.ClientSession() as http:
        status, body = await _call(http, srv, "POST", CHAT, data=b"\x1f\x8b broken",
                                   headers={**JSON, "Content-Encoding": "gzip"})
        assert status == 400 and _error(body, 400)["code"] == "invalid_body"
        assert "content-encoding" in body["error"]["message"].lower()
        status, body = await _call(http, srv, "POST", CHAT, json={"model": "synthetic", "messages": MSG})
        assert status == 200 and body["choices"][0]["message"]["content"] == "a b"
        status, body = await _call(http, srv, "POST", CHAT, data=b"x" * 300_000, headers=JSON)
        assert status == 413 and _error(body, 413)["code"] == "body_too_large"


async def test_json_content_types_are_accepted(srv: Server) -> None:
    body = b'{"model": "synthetic", "messages": [{"role": "user", "content": "x y"}], "max_tokens": 1}'
    async with aiohttp.ClientSession() as http:
        for content_type in ("application/json; charset=utf-8", "Application/JSON", "application/vnd.api+json"):
            status, out = await _call(http, srv, "POST", CHAT, data=body, headers={"Content-Type": content_type})
            assert status == 200 and out["choices"][0]["message"]["content"] == "x", (content_type, out)
        # No Content-Type at all is taken as JSON (aiohttp would add application/octet-stream: skip it).
        status, out = await _call(http, srv, "POST", CHAT, data=body, skip_auto_headers=("Content-Type",))
        assert status == 200 and out["choices"][0]["message"]["content"] == "x"


async def test_sdk_sees_bad_streaming_requests_as_errors_before_any_chunk(srv: Server) -> None:
    client = srv.client()
    with pytest.raises(openai.BadRequestError) as err:
        await client.chat.completions.create(model="synthetic", messages=MSG, stream=True, max_tokens=-1)
    assert err.value.status_code == 400 and err.value.body["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError) as err:
        await client.chat.completions.create(model="synthetic", messages=MSG, stream=True,
                                             extra_body={"top_k": 10**30})
    assert err.value.body["param"] == "top_k"
    with pytest.raises(openai.NotFoundError) as err:
        await client.chat.completions.create(model="gpt-4o-mini", messages=MSG, stream=True)
    assert err.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as err:
        await client.audio.speech.create(model="synthetic", input="hi", voice="alloy", speed=100)
    assert err.value.body["param"] == "speed"
    # and the same client's next request is served
    out = await client.chat.completions.create(model="synthetic", messages=MSG, max_tokens=2)
    assert out.choices[0].message.content == "a b"
    assert idle(srv.orch)


async def test_response_format_text_is_served_and_json_modes_are_refused_by_name(srv: Server) -> None:
    ok = {"model": "synthetic", "messages": [{"role": "user", "content": "x y"}], "max_tokens": 2}
    status, out = await post(srv, CHAT, {**ok, "response_format": {"type": "text"}})
    assert status == 200 and out["choices"][0]["message"]["content"]
    for kind in ("json_object", "json_schema"):
        status, out = await post(srv, CHAT, {**ok, "response_format": {"type": kind}})
        assert status == 400 and out["error"]["param"] == "response_format.type", out
        assert "text" in out["error"]["message"]


async def test_a_value_out_of_a_closed_set_lists_the_set(srv: Server) -> None:
    """The message says what the field takes, read from the request's type (a Literal, a tagged union)."""
    client = srv.client()
    with pytest.raises(openai.BadRequestError) as err:
        await client.chat.completions.create(model="synthetic", messages=[{"role": "robot", "content": "x"}])
    assert err.value.body["message"].endswith("expected one of 'assistant', 'developer', 'system', 'tool', 'user'")
    with pytest.raises(openai.BadRequestError) as err:
        await client.chat.completions.create(model="synthetic", messages=[
            {"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}])
    assert "'image_url'" in err.value.body["message"] and "'text'" in err.value.body["message"], err.value.body
