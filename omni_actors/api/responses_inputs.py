"""A Responses API request -> chat messages, tools and guided-decoding options, so it runs as a chat does.

    turn = read_turn(req, earlier)       # earlier: the stored conversation of previous_response_id
    turn.messages                        # chat-shaped dicts: instructions, earlier turns, this input
    turn.items                           # this request's input items as stored (each with an id)

Input items map onto chat messages: a message's `input_text`/`output_text`/`refusal` parts are
text, `input_image` (a data URL, or the `file_id` of an uploaded image: files.py, read by the
route first, `image_file_ids`) an image, `input_audio` audio, `input_file` chat's `file` part
(an upload's `file_id` or inline `file_data`, read as an image or audio, whichever its bytes
are: chat_inputs.py; the route reads the uploads, `chat_inputs.file_ids`); `developer` is `system`; a
`function_call` joins the assistant message before it as a tool call and a
`function_call_output` is a `tool` message (its `output` text, or its text parts one a line). Items this server cannot use (`item_reference`,
an image by remote URL) are 400s naming them (`input[3].content[1].image_url`), as is an `include`
this server cannot answer (`check_include`) and a field OpenAI has for a feature this server lacks
(`check_not_served`: `prompt`, `context_management`, ...). A stage's refusal is said in this API's words
(`stage_refusal`): a prompt past the context is OpenAI's `context_length_exceeded`.
`instructions` go first as a system message and, as OpenAI does, are not carried to a later
response through `previous_response_id`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import msgspec

from omni_actors.api.chat_schemas import JsonSchemaFormat, ResponseFormat
from omni_actors.api.errors import ApiError, bad_request
from omni_actors.api.responses_schemas import (
    InputAudioItemPart,
    InputFilePart,
    InputImagePart,
    InputItem,
    InputTextPart,
    OutputTextPart,
    RefusalPart,
    ResponseRequest,
)
from omni_actors.errors import CONTEXT_LENGTH_EXCEEDED


@dataclass
class Turn:
    messages: list[dict[str, Any]]
    """Chat-shaped messages: instructions, the earlier conversation, this input."""
    conversation: list[dict[str, Any]]
    """The same without the instructions: what a later `previous_response_id` continues."""
    items: list[dict[str, Any]]
    """This request's input items, with ids, as `input_items` lists them."""
    where: list[int]
    """For each message: the index of the input item it came from (-1: not from this input)."""


def image_file_ids(req: ResponseRequest) -> list[tuple[str, str]]:
    """(file id, its param) of every `input_image` part given by `file_id`."""
    found: list[tuple[str, str]] = []
    for k, item in enumerate([] if isinstance(req.input, str) else req.input):
        for j, part in enumerate(item.content if isinstance(item.content, list) else []):
            if isinstance(part, InputImagePart) and part.file_id is not None:
                found.append((part.file_id, f"input[{k}].content[{j}].file_id"))
    return found


def read_turn(req: ResponseRequest, earlier: list[dict[str, Any]], files: dict[str, str] | None = None) -> Turn:
    """`files`: file id -> a data URL of its bytes, for the parts `image_file_ids` named."""
    items = [InputItem(role="user", content=req.input)] if isinstance(req.input, str) else req.input
    conversation = list(earlier)
    where = [-1] * len(earlier)
    stored: list[dict[str, Any]] = []
    for k, item in enumerate(items):
        param = f"input[{k}]"
        stored.append(_stored(item))
        if item.type == "item_reference":
            raise bad_request("item references are not served; send the item itself", f"{param}.type",
                              "unsupported_value")
        if item.type == "function_call":
            call = {"id": _need(item.call_id, f"{param}.call_id"), "type": "function", "function": {
                "name": _need(item.name, f"{param}.name"), "arguments": item.arguments or "{}"}}
            last = conversation[-1] if conversation else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            else:
                conversation.append({"role": "assistant", "content": "", "tool_calls": [call]})
                where.append(k)
        elif item.type == "function_call_output":
            conversation.append({"role": "tool", "tool_call_id": _need(item.call_id, f"{param}.call_id"),
                                 "content": _output_text(_need(item.output, f"{param}.output"), param)})
            where.append(k)
        else:
            role = _need(item.role, f"{param}.role")
            conversation.append({"role": "system" if role == "developer" else role,
                                 "content": _content(_need(item.content, f"{param}.content"), param, files or {})})
            where.append(k)
    head = [{"role": "system", "content": req.instructions}] if req.instructions else []
    return Turn([*head, *conversation], conversation, stored, [-1] * len(head) + where)


def _need(value: Any, param: str) -> Any:
    if value is None:
        raise bad_request(f"`{param}` is required for this item", param, "missing_required_parameter")
    return value


def _output_text(output: str | list[Any], param: str) -> str:
    """A function call's result as the tool message's text: its text parts, one a line."""
    if isinstance(output, str):
        return output
    texts = []
    for j, part in enumerate(output):
        if not isinstance(part, InputTextPart | OutputTextPart):
            raise bad_request("a function call's output is read as text here (input_text parts); send images, "
                              "audio and files in a user message", f"{param}.output[{j}]", "unsupported_value")
        texts.append(part.text)
    return "\n".join(texts)


def _content(content: str | list[Any], param: str, files: dict[str, str]) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        match part:
            case InputTextPart(text=text) | OutputTextPart(text=text) | RefusalPart(refusal=text):
                parts.append({"type": "text", "text": text})
            case InputImagePart(file_id=file_id) if file_id is not None:
                parts.append({"type": "image_url", "image_url": {"url": files[file_id]}})
            case InputImagePart(image_url=url):
                parts.append({"type": "image_url", "image_url": {
                    "url": _need(url, f"{param}.content[{j}].image_url")}})
            case InputAudioItemPart(input_audio=audio):
                parts.append({"type": "input_audio", "input_audio": {"data": audio.data, "format": audio.format}})
            case InputFilePart(file_url=url) if url is not None:
                raise bad_request("files are not fetched by URL: upload the file (POST /v1/files) and send its "
                                  "file_id, or send it as file_data", f"{param}.content[{j}].file_url",
                                  "unsupported_value")
            case InputFilePart(file_id=file_id, file_data=data, filename=name):
                ref = {"file_id": file_id, "file_data": data, "filename": name}
                parts.append({"type": "file", "file": {k: v for k, v in ref.items() if v is not None}})
    return parts


def _stored(item: InputItem) -> dict[str, Any]:
    """The item as `input_items` answers it (an id given, else a new one), with what the SDK's item
    types require and the request may leave out: `status`, an image's `detail`, a text's `annotations`."""
    out = msgspec.to_builtins(item)
    out.setdefault("type", "message")
    out.setdefault("status", "completed")
    if item.type == "message" and isinstance(item.content, str):
        kind = "output_text" if item.role == "assistant" else "input_text"
        out["content"] = [{"type": kind, "text": item.content}]
    for part in out.get("content") or []:
        if part["type"] == "input_image":
            part.setdefault("detail", "auto")
        elif part["type"] == "output_text":
            part.setdefault("annotations", [])
    prefix = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}.get(item.type, "item")
    if not out.get("id"):  # ("" too: an item no route could name, retrieve or delete, nor page `after`)
        out["id"] = f"{prefix}_{uuid.uuid4().hex[:24]}"
    return out


def part_param(where: list[int], req: ResponseRequest | None = None, earlier: str = "previous_response_id") -> Any:
    """`build_chat_inputs`' param namer for this turn: chat message i, part j -> `input[k].content[j]...`
    (an `input_image` given by `file_id` is named by it: `req` says which); a message from before this
    input by the field that brought it (`earlier`: previous_response_id, conversation)."""
    def name(i: int, j: int, leaf: str) -> str:
        k = where[i] if i < len(where) else -1
        base = f"input[{k}].content[{j}]" if k >= 0 else earlier
        if k < 0:
            return base
        if leaf == "image_url.url":
            return f"{base}.file_id" if _image_file_id(req, k, j) else f"{base}.image_url"
        return f"{base}.{leaf.removeprefix('file.')}" if leaf != "file" else base  # input_file: flat fields
    return name


def _image_file_id(req: ResponseRequest | None, k: int, j: int) -> bool:
    """Whether input item k's part j is an `input_image` given by `file_id`."""
    item = req.input[k] if req is not None and not isinstance(req.input, str) and k < len(req.input) else None
    parts = item.content if item is not None and isinstance(item.content, list) else []
    return j < len(parts) and isinstance(parts[j], InputImagePart) and parts[j].file_id is not None


def check_unique_ids(req: ResponseRequest) -> None:
    """A 400 for an input item whose id an earlier one has (OpenAI's "Duplicate item found"): the stored items
    would page by `after` ambiguously (the SDK, reading a page past the second, would go back to the first
    and list the same items forever). A conversation's items are given new ids instead (conversations_store)."""
    seen: set[str] = set()
    for k, item in enumerate([] if isinstance(req.input, str) else req.input):
        if item.id:
            if item.id in seen:
                raise bad_request(f"Duplicate item found with id {item.id!r}; remove duplicate items from the input",
                                  f"input[{k}].id", "invalid_value")
            seen.add(item.id)


def check_include(req: ResponseRequest) -> None:
    """A 400 for an `include` value this server cannot answer: logprobs, which it never returns (as chat)."""
    for i, value in enumerate(req.include or []):
        if value == "message.output_text.logprobs":
            raise bad_request("logprobs are not returned by this server; leave it out of `include`",
                              f"include[{i}]", "unsupported_value")


NOT_SERVED = {
    "prompt": "stored prompt templates are not served here; send the prompt in `instructions` and `input`",
    "context_management": "context compaction is not served here; `truncation: \"auto\"` drops a long "
                          "conversation's oldest items instead",
    "logit_bias": "token biases are not applied by this server",
    "moderation": "no moderation model runs here",
}
"""OpenAI's request fields for features this server does not have: a 400 naming the field (null or empty:
the field left out), never an unknown field, nor ignored where that would mislead."""


def check_not_served(req: ResponseRequest) -> None:
    """A 400 (`unsupported_parameter`) for a NOT_SERVED field that asks for something."""
    asked = {"prompt": req.prompt, "context_management": req.context_management,
             "logit_bias": req.logit_bias, "moderation": req.moderation}
    for name, why in NOT_SERVED.items():
        if asked[name]:
            raise bad_request(f"this server does not support `{name}`: {why}; leave it out or null", name,
                              "unsupported_parameter")


def response_format(req: ResponseRequest) -> ResponseFormat | None:
    """`text.format` as chat's `response_format` (api/structured.py serves both)."""
    fmt = req.text.format if req.text is not None else None
    if fmt is None or fmt.type != "json_schema":
        return None if fmt is None else ResponseFormat(type=fmt.type)
    if fmt.name is None:
        raise bad_request("text.format of type json_schema needs a `name`", "text.format.name",
                          "missing_required_parameter")
    return ResponseFormat(type="json_schema", json_schema=JsonSchemaFormat(
        name=fmt.name, schema=fmt.schema, description=fmt.description, strict=fmt.strict))


def renamed(err: ApiError, old: str, new: str) -> ApiError:
    """A chat helper's 400 with its param (and the field in its message) in this API's words."""
    if err.param is not None and err.param.startswith(old):
        err.param = new + err.param[len(old):]
        err.message = err.message.replace(old, new)
    return err


def stage_refusal(err: ApiError, truncation: str | None = None) -> ApiError:
    """A stage's refusal (it names chat's fields) in this API's words; one for a prompt past the context
    is OpenAI's `context_length_exceeded` on `input`, saying what `truncation` can do."""
    if err.code == CONTEXT_LENGTH_EXCEEDED:  # (typed by the stage: errors.ContextLengthError)
        err.param = "input"
        err.message += (" (truncation \"auto\": even its last item alone is past the context)" if truncation == "auto"
                        else " (send truncation: \"auto\" to drop the conversation's oldest items to fit)")
        return err
    return renamed(renamed(err, "response_format", "text.format"), "messages", "input")
