"""OpenAI-style error bodies, and the one mapping of our exceptions to HTTP statuses.

Every error the API returns has the body

    {"error": {"message": str, "type": str, "param": str | null, "code": str | null}}

    400  invalid_request_error   bad JSON, wrong type, unknown field, value out of range
                                 (`param` names the field), a modality the pipeline lacks,
                                 inputs or parameters a stage refused (RequestRejected)
    401  authentication_error    missing or wrong API key (when keys are configured)
    404  invalid_request_error   unknown route or model (`code` "model_not_found")
    405  invalid_request_error   wrong method for a route
    408  invalid_request_error   body not received within `server.body_timeout_s`
    413  invalid_request_error   body over `server.max_body_mb`
    415  invalid_request_error   a declared Content-Type other than JSON
    429  rate_limit_error        a stage queue is full (AdmissionError); `Retry-After` QUEUE_FULL_RETRY_AFTER_S
    500  server_error            a stage engine failed for this request (StageFailed)
    503  service_unavailable     a stage has no ready worker, a worker died, or draining
    504  timeout_error           the request passed `server.request_timeout_s`

Client mistakes are never 500. `error_middleware` turns ApiError, aiohttp's
HTTP exceptions and the orchestrator's errors into these bodies; anything else
is logged here (a connection boundary) and answered 500.
"""

from __future__ import annotations

import re
import sqlite3
from typing import Any

import msgspec
from aiohttp import web

from omni_actors import logs
from omni_actors.api.allowed_values import expected_text
from omni_actors.errors import (
    AdmissionError,
    OmniError,
    RequestAborted,
    RequestRejected,
    RequestTimeout,
    StageFailed,
    StageUnavailable,
    WorkerDied,
)

log = logs.get(__name__)

QUEUE_FULL_RETRY_AFTER_S = 1
"""A 429's `Retry-After`: a full stage queue frees a place as soon as one request ends (the OpenAI SDK
retries a 429 by itself after the time this header says)."""

RESPONSE_STARTED = web.RequestKey("response_started", bool)
"""Request key set by a handler once its (streaming) response headers are sent."""
IN_BAND_ERROR = web.RequestKey("in_band_error", str)
"""Request key: the code of an error sent in-band once the headers were out (an SSE `error` event);
metrics.py counts it in omni_http_errors_total beside the stream's status."""

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable",
    504: "timeout_error",
}


class ApiError(Exception):
    """An error answered to the client with an OpenAI-style body."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 close: bool = False, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.close = close  # answer with `Connection: close`: the body's framing is lost, so is the connection
        self.headers = headers or {}

    @property
    def type(self) -> str:
        return _TYPES.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def encoded(self) -> bytes:
        """The JSON body. A message or param that echoes client bytes aiohttp kept as lone surrogates (a
        header or form part name that is not UTF-8) has them written as `\\udcff` escapes, not a 500."""
        try:
            return msgspec.json.encode(self.body())
        except UnicodeEncodeError:
            def clean(text: str | None) -> str | None:
                return None if text is None else text.encode("utf-8", "backslashreplace").decode("utf-8")
            return msgspec.json.encode({"error": {"message": clean(self.message), "type": self.type,
                                                  "param": clean(self.param), "code": clean(self.code)}})

    def response(self) -> web.Response:
        headers = {**self.headers, **({"WWW-Authenticate": "Bearer"} if self.status == 401 else {})}
        resp = web.Response(body=self.encoded(), status=self.status,
                            content_type="application/json", headers=headers)
        if self.close:
            resp.force_close()
        return resp


def bad_request(message: str, param: str | None = None, code: str | None = "invalid_value") -> ApiError:
    """A 400 whose message names the field (`param`) too, for clients that show only the message."""
    if param and param not in message:
        message = f"{message} (field `{param}`)"
    return ApiError(400, message, param, code)


_AT = re.compile(r"^(.*?)(?: - at `(key` in `)?\$\.?(.*)`)?$", re.S)
"""msgspec's "... - at `$.a.b`", or "... - at `key` in `$.metadata`" for a mapping's key."""
_UNKNOWN = re.compile(r"^Object contains unknown field `([^`]*)`")
_MISSING = re.compile(r"^Object missing required field `([^`]*)`")
_BOUND = re.compile(r"^Expected `(int|float|str|array|object)` (of length )?([<>])=? ")
_BOUND_KIND = {"int": "integer", "float": "decimal", "str": "string", "array": "array", "object": "object"}


def _bound_code(msg: str) -> str | None:
    """OpenAI's code for a value out of its range ("Expected `int` >= 1": integer_below_min_value,
    "Expected `str` of length <= 4096": string_above_max_length), None for any other message."""
    found = _BOUND.match(msg)
    if found is None:
        return None
    kind, length, op = found.groups()
    side = "below_min" if op == ">" else "above_max"
    return f"{_BOUND_KIND[kind]}_{side}_{'length' if length else 'value'}"


def validation_detail(err: msgspec.ValidationError) -> tuple[str, str | None, str]:
    """(message, param, code) of a msgspec validation failure: `param` the offending field as a
    path (`messages[0].content`), `code` unknown_parameter / missing_required_parameter / OpenAI's
    bound codes (integer_below_min_value, string_above_max_length, ...) / invalid_value (not one of
    the allowed strings; a number past a double, 1e999) / invalid_type. The one
    reading of msgspec's messages, for REST and realtime alike."""
    match = _AT.match(str(err))
    msg, path = (match.group(1), match.group(3) or "") if match else (str(err), "")
    if match and match.group(2):
        msg = f"{msg} (a key)"
    code = _bound_code(msg) or ("invalid_value" if msg.startswith(("Invalid enum value", "Invalid value",
                                                                   "Number out of range"))
                                else "invalid_type")
    for pattern, code_name in ((_UNKNOWN, "unknown_parameter"), (_MISSING, "missing_required_parameter")):
        found = pattern.match(msg)
        if found:
            path = f"{path}.{found.group(1)}" if path else found.group(1)
            code = code_name
    return msg, path.replace(".[", "[") or None, code


def from_validation(err: msgspec.ValidationError | msgspec.DecodeError, typ: Any = None) -> ApiError:
    """A msgspec decode failure as a 400 naming the field (`param` is a dotted path); with the
    request's type `typ`, a value out of a closed set also lists the set's values."""
    if not isinstance(err, msgspec.ValidationError):
        return ApiError(400, f"request body is not valid JSON: {err}", None, "invalid_json")
    msg, param, code = validation_detail(err)
    where = f" (field `{param}`)" if param else ""
    listed = expected_text(typ, param) if typ is not None and code == "invalid_value" else ""
    return ApiError(400, f"{msg}{where}{listed}", param, code)


def from_exception(exc: BaseException) -> ApiError:
    """Map an orchestrator error (or a pipeline's ValueError at submit) to its ApiError."""
    match exc:
        case ApiError():
            return exc
        case AdmissionError():
            return ApiError(429, f"server busy: {exc}; retry later", None, "queue_full",
                            headers={"Retry-After": str(QUEUE_FULL_RETRY_AFTER_S)})
        case StageUnavailable():
            return ApiError(503, f"service unavailable: {exc}", None, "stage_unavailable")
        case WorkerDied():
            return ApiError(503, f"service unavailable: {exc}", None, "worker_died")
        case RequestTimeout():
            return ApiError(504, f"request timed out: {exc}", None, "request_timeout")
        case RequestAborted():
            return ApiError(503, f"request aborted: {exc}", None, "request_aborted")
        case RequestRejected():
            reason = refusal_text(exc.detail)
            return ApiError(400, f"invalid request: {reason}", _stage_param(reason), exc.code or "rejected_by_stage")
        case StageFailed():
            return ApiError(500, f"generation failed: {exc}", None, "stage_failed")
        case msgspec.ValidationError() | msgspec.DecodeError():
            return from_validation(exc)
        case ValueError():  # a pipeline's planner refusing the request's inputs
            return ApiError(400, str(exc), None, "invalid_value")
        case OmniError():
            return ApiError(500, str(exc), None, "internal_error")
    return ApiError(500, "internal server error", None, "internal_error")


REQUEST_FIELDS = frozenset({
    "input", "prompt", "negative_prompt", "image", "mask", "size", "n", "voice", "instructions", "speed",
    "seconds", "seed", "layers", "strength", "num_inference_steps", "guidance_scale", "input_reference", "file",
    "messages", "max_tokens", "temperature", "top_p", "tools", "tool_choice", "response_format", "language",
    "logit_bias",
})
"""Request fields a stage's refusal may name first ("image[0]: ..."), as engines write them."""
_STAGE_FIELD = re.compile(r"(?:^|: )([a-z_]+)(?:\[\d+\])?: ")


_ERROR_CLASS = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception): ")


def refusal_text(detail: str) -> str:
    """A stage's refusal as the client reads it: without the exception's class ("ValueError: ")."""
    return _ERROR_CLASS.sub("", detail, count=1)


_VLLM_PARAM = re.compile(r"\(parameter=([a-z_]+)")
"""How vLLM names what it refuses ("... (parameter=input_tokens, value=9000)")."""
_VLLM_FIELDS = {"input_tokens": "messages", "input_text": "messages", "max_completion_tokens": "max_tokens"}


def _stage_param(message: str) -> str | None:
    """The request field a stage's refusal names (first in its message, or as vLLM's `parameter=`);
    None otherwise. A prompt too long for the context is the `messages`' fault."""
    for match in _STAGE_FIELD.finditer(message):
        if match.group(1) in REQUEST_FIELDS:
            return match.group(1)
    found = _VLLM_PARAM.search(message)
    if found is not None:
        name = _VLLM_FIELDS.get(found.group(1), found.group(1))
        return name if name in REQUEST_FIELDS else None
    return None


def _from_http(exc: web.HTTPException) -> ApiError:
    match exc.status:
        case 404:
            return ApiError(404, "unknown route", None, "not_found")
        case 405 if isinstance(exc, web.HTTPMethodNotAllowed):
            allowed = ", ".join(sorted(exc.allowed_methods))
            return ApiError(405, f"method {exc.method} not allowed; this route allows {allowed}", None,
                            "method_not_allowed", headers={"Allow": allowed})
        case 413:
            return ApiError(413, f"request body too large: {exc.text or ''}".strip(), None, "body_too_large")
    return ApiError(exc.status, exc.reason, None, None)


STORE_BUSY_RETRY_AFTER_S = 1
"""Retry-After of the 503 a request gets when SQLite's busy timeout ran out on the state store's write lock."""


def _store_busy(exc: sqlite3.OperationalError) -> bool:
    """SQLite gave up waiting for a lock another connection held (a transient 503, not a server fault)."""
    text = str(exc).lower()
    return "database is locked" in text or "database is busy" in text or "database table is locked" in text


@web.middleware
async def error_middleware(request: web.Request, handler) -> web.StreamResponse:
    """Answer every failure with an OpenAI-style body; re-raise once a response has started."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        if request.get(RESPONSE_STARTED):
            raise
        return _from_http(exc).response()
    except (ApiError, OmniError, msgspec.ValidationError, msgspec.DecodeError) as exc:
        if request.get(RESPONSE_STARTED):
            raise
        return from_exception(exc).response()
    except sqlite3.OperationalError as exc:
        if request.get(RESPONSE_STARTED) or not _store_busy(exc):
            raise
        log.warning("api.store_busy", path=request.path, error=str(exc))
        return ApiError(503, "the server's state store is busy (another process holds its write lock); retry later",
                        None, "store_busy", headers={"Retry-After": str(STORE_BUSY_RETRY_AFTER_S)}).response()
    except Exception as exc:  # the connection boundary: log and answer 500
        if request.get(RESPONSE_STARTED):
            raise
        log.exception("api.unhandled_error", path=request.path, error_type=type(exc).__name__)
        return ApiError(500, "internal server error", None, "internal_error").response()
