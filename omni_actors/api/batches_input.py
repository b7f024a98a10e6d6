"""A batch's input file read and checked line by line, as OpenAI checks one before a batch runs.

Each non-blank line of the JSONL file is one request, `{"custom_id", "method": "POST", "url", "body"}`.
What is wrong with a line is a BatchError naming its line (1-based) and field, with OpenAI's codes:

    invalid_json_line            not a JSON object (or not UTF-8)
    missing_required_parameter   no `custom_id`, `method`, `url` or `body`
    invalid_value                `method` other than POST, a field of the wrong type
    url_mismatch                 `url` other than the batch's `endpoint`
    duplicate_custom_id          a `custom_id` an earlier line has
    model_not_found              `body.model` is no model this server serves
    model_mismatch               `body.model` other than the first line's (a batch is for one model)
    empty_file                   no line at all
    too_many_tasks               more than MAX_LINES lines

A file with any of these makes a `failed` batch whose `errors` list them (the first MAX_ERRORS);
the request bodies themselves are checked when each line runs, by its route, as a direct call is.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

import msgspec

from omni_actors.api.batches_schemas import BatchError
from omni_actors.api.errors import validation_detail

MAX_LINES = 50_000
"""Most requests in one batch (OpenAI's limit)."""
MAX_ERRORS = 100
"""Most line errors a failed batch lists."""


class _Line(msgspec.Struct):
    custom_id: str | None = None
    method: str | None = None
    url: str | None = None
    body: msgspec.Raw = msgspec.Raw()


class _Body(msgspec.Struct):
    model: str | None = None


@dataclass
class ReadInput:
    lines: list[tuple[str, str]] = field(default_factory=list)
    """(custom_id, request body as JSON text), in input order."""
    model: str | None = None
    errors: list[BatchError] = field(default_factory=list)


def _error(found: ReadInput, code: str, message: str, param: str | None, line: int | None) -> None:
    if len(found.errors) < MAX_ERRORS:
        found.errors.append(BatchError(code, message, param, line))


def read_input(data: bytes, endpoint: str, models: Collection[str]) -> ReadInput:
    """The requests of an input file for a batch on `endpoint`, or what is wrong with it; `models` are the
    model names this server answers to. Blocking (a file of 50,000 lines): call it off the loop."""
    found = ReadInput()
    seen: set[str] = set()
    for number, raw in enumerate(data.removeprefix(b"\xef\xbb\xbf").split(b"\n"), start=1):  # (a BOM: not JSON)
        if not raw.strip():
            continue
        if len(found.lines) >= MAX_LINES:
            _error(found, "too_many_tasks", f"a batch holds at most {MAX_LINES} requests", None, number)
            break
        try:
            raw.decode()  # (msgspec checks the UTF-8 of the fields it reads, not of a Raw `body` nor skipped ones)
        except UnicodeDecodeError as err:
            _error(found, "invalid_json_line", f"This line is not valid UTF-8 (byte {err.start}).", None, number)
            continue
        try:
            line = msgspec.json.decode(raw, type=_Line)
        except msgspec.ValidationError as err:  # (a JSON object, a field of the wrong type)
            message, param, _ = validation_detail(err)
            if param is None:  # (valid JSON, but no object)
                _error(found, "invalid_json_line", "This line is not a JSON object.", None, number)
            else:
                _error(found, "invalid_value", message, param, number)
            continue
        except (msgspec.DecodeError, RecursionError):
            _error(found, "invalid_json_line", "This line is not parseable as valid JSON.", None, number)
            continue
        missing = next((name for name, value in (("custom_id", line.custom_id), ("method", line.method),
                                                 ("url", line.url), ("body", line.body)) if not value), None)
        if missing is not None:
            _error(found, "missing_required_parameter", f"the line has no `{missing}`", missing, number)
            continue
        assert line.custom_id is not None
        if line.method != "POST":
            _error(found, "invalid_value", f"method {line.method!r}: a batch's requests are POSTs", "method", number)
            continue
        if line.url != endpoint:
            _error(found, "url_mismatch", f"url {line.url!r} is not the batch's endpoint {endpoint!r}", "url", number)
            continue
        if line.custom_id in seen:
            _error(found, "duplicate_custom_id", f"custom_id {line.custom_id!r} is on an earlier line too",
                   "custom_id", number)
            continue
        seen.add(line.custom_id)
        try:
            model = msgspec.json.decode(line.body, type=_Body).model
        except msgspec.ValidationError as err:
            message, param, _ = validation_detail(err)
            if param is not None:  # (an object whose `model` is not a string)
                _error(found, "invalid_value", message, f"body.{param}", number)
                continue
            _error(found, "invalid_json_line", "the line's `body` is not a JSON object", "body", number)
            continue
        except (msgspec.DecodeError, RecursionError):
            _error(found, "invalid_json_line", "the line's `body` is not a JSON object", "body", number)
            continue
        if model is not None and model not in models:
            _error(found, "model_not_found", f"model {model!r} does not exist; this server serves {sorted(models)}",
                   "body.model", number)
            continue
        if model is not None:
            if found.model is None:
                found.model = model
            elif model != found.model:
                _error(found, "model_mismatch", f"model {model!r} is not the batch's model {found.model!r} "
                       "(that of its first request): a batch is for one model", "body.model", number)
                continue
        found.lines.append((line.custom_id, bytes(line.body).decode()))
    if not found.lines and not found.errors:
        _error(found, "empty_file", "the input file holds no request", None, None)
    return found
