"""A response's answer as it is made (api/responses.py): what it accumulated (`Answer`: its items,
its final object, stored when asked) and its `response.*` event stream (`answer_events`: the message
item's text deltas, function calls streamed as the parser reads them, the closing events). A response
whose run fails ends `failed` with its `error` (`failure`: the words of the error body a request failing
before its answer gets; its `code` one of the OpenAI SDK's `ResponseError.code` values, `response_error`)
and the items made so far (`Answer.so_far`, status `incomplete`). A response run in a conversation adds its
input and output items to it as it finishes (`Answer.joins`; api/conversations.py)."""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import AsyncGenerator, Iterator
from typing import Any

import msgspec

from omni_actors.api.calls import PipelineCall
from omni_actors.api.chat import Tally
from omni_actors.api.conversations_store import ConversationStore
from omni_actors.api.errors import from_exception
from omni_actors.api.responses_inputs import stage_refusal
from omni_actors.api.responses_schemas import (
    ContentPartAdded,
    ContentPartDone,
    FunctionCallArgumentsDelta,
    FunctionCallArgumentsDone,
    FunctionCallItem,
    IncompleteDetails,
    MessageItem,
    OutputItemAdded,
    OutputItemDone,
    OutputText,
    OutputTextDelta,
    OutputTextDone,
    Response,
    ResponseCompleted,
    ResponseCreated,
    ResponseError,
    ResponseIncomplete,
    ResponseInProgress,
    ResponseQueued,
    ResponseUsage,
)
from omni_actors.api.responses_store import ResponseStore
from omni_actors.api.tools import same_json, unshown
from omni_actors.orchestrator.outputs import TextOutput, ToolCallPart

SDK_ERROR_CODES = frozenset({
    "server_error", "rate_limit_exceeded", "invalid_prompt", "data_residency_mismatch", "bio_policy",
    "misalignment_policy_violation", "vector_store_timeout", "invalid_image", "invalid_image_format",
    "invalid_base64_image", "invalid_image_url", "image_too_large", "image_too_small", "image_parse_error",
    "image_content_policy_violation", "invalid_image_mode", "image_file_too_large", "unsupported_image_media_type",
    "empty_image_file", "failed_to_download_image", "image_file_not_found"})
"""The codes a failed response's `error.code` may have (the openai SDK's `ResponseError.code`, a closed set)."""


def response_error(code: str, message: str, status: int = 500) -> ResponseError:
    """A failed response's `error`: our `code` (`stage_failed`, `server_stopped`, ...) as one of
    SDK_ERROR_CODES (a refusal of the request's input, HTTP 4xx: `invalid_prompt`; a full queue:
    `rate_limit_exceeded`; any other: `server_error`), and kept at the head of the message."""
    if code in SDK_ERROR_CODES:
        return ResponseError(code, message)
    said = "rate_limit_exceeded" if status == 429 else "invalid_prompt" if 400 <= status < 500 else "server_error"
    return ResponseError(said, f"{code}: {message}")


class Answer:
    """What a response accumulated, and the final object (stored when asked)."""

    def __init__(self, base: Response, message_id: str, conversation: list[dict[str, Any]],
                 items: list[dict[str, Any]] | None, store: ResponseStore) -> None:
        self.base, self.message_id, self.conversation, self.items = base, message_id, conversation, items
        self.store = store
        self.tally = Tally()
        self.shown: list[str] = []
        """Streamed with tools offered: the text sent as it came (TextOutput.shown)."""
        self.streamed: dict[int, FunctionCallItem] = {}
        """Streamed with tools offered: the calls sent in pieces as the parser read them, by index."""
        self.closed: str | None = None
        """The message's text when the stream closed its item early, for a call that followed it."""
        self.hold = False
        self.joins: tuple[ConversationStore, str, list[dict[str, Any]]] | None = None
        """(conversations, id, this input's items): the items, and the answer's, join it once it completes."""
        """Tools are offered: the text is read for calls, and only what is known not to be one is shown."""
        self._output: list[MessageItem | FunctionCallItem] | None = None
        self.begun = False
        """Stored `in_progress` as its stream began (`begin`): its end replaces that row only while it is there."""
        self.ended = False

    def output(self) -> list[MessageItem | FunctionCallItem]:
        """The response's items (made once): a call the stream sent keeps its ids and text where the
        finished reading confirms it."""
        if self._output is not None:
            return self._output
        t = self.tally
        status = "incomplete" if t.finish_reason == "length" else "completed"
        if not t.tool_calls:  # (a forced call cut before its name: no message, no call; chat.py Tally)
            self._output = [] if t.forced else [MessageItem(self.message_id, status, [OutputText("".join(t.text))])]
            return self._output
        said = self.closed if self.closed is not None else t.tool_content or "".join(self.shown)
        if self.streamed and self.closed is None and not self.shown:
            said = ""  # (the calls were streamed as the first items: no message before them)
        head = [MessageItem(self.message_id, status, [OutputText(said)])] if said else []
        calls = []
        for i, c in enumerate(t.tool_calls):
            sent = self.streamed.get(i)
            if sent is not None and sent.name == c.name and same_json(sent.arguments, c.arguments):
                calls.append(FunctionCallItem(sent.id, sent.call_id, c.name, sent.arguments))
            else:
                calls.append(FunctionCallItem(f"fc_{uuid.uuid4().hex[:24]}", c.id, c.name, c.arguments))
        self._output = [*head, *calls]
        return self._output

    def begin(self) -> None:
        """A stored response streamed in the foreground is stored `in_progress` as its stream begins, so that
        the id its first event gives can be retrieved at once, as OpenAI's can."""
        if self.items is not None:
            self.store.add(self.base, self.conversation, self.items)
            self.begun = True

    def finish(self) -> Response:
        self.ended = True
        t = self.tally
        cut = t.finish_reason == "length"
        done = msgspec.structs.replace(
            self.base, status="incomplete" if cut else "completed", output=self.output(),
            completed_at=None if cut else int(time.time()),
            usage=ResponseUsage(t.prompt_tokens, t.completion_tokens, t.prompt_tokens + t.completion_tokens),
            incomplete_details=IncompleteDetails("max_output_tokens") if cut else None)
        if self.items is not None:
            said: dict[str, Any] = {"role": "assistant",
                                    "content": (t.tool_content or "") if t.tool_calls else "".join(t.text)}
            if t.tool_calls:
                said["tool_calls"] = [{"id": c.call_id, "type": "function",
                                       "function": {"name": c.name, "arguments": c.arguments}}
                                      for c in done.output if isinstance(c, FunctionCallItem)]
            kept = self.store.add(done, [*self.conversation, said], self.items, replace=self.begun)
            if not kept and self.base.background:  # cancelled or deleted meanwhile (by another server on the
                return done  # data directory, whose next look would have stopped it): it adds nothing
        if self.joins is not None:
            conversations, cid, items = self.joins
            conversations.append(cid, [*items, *msgspec.to_builtins(done.output)])
        return done

    def so_far(self) -> list[MessageItem | FunctionCallItem]:
        """A failed run's items as far as they were made, each `incomplete` (as OpenAI's failed response
        carries what it streamed): the message's text (with tools offered, the text read as no call) and the
        calls a stream sent."""
        t = self.tally
        if t.forced:
            text = ""
        elif self.hold:
            text = self.closed if self.closed is not None else "".join(self.shown or t.shown)
        else:
            text = "".join(t.text)
        head = [MessageItem(self.message_id, "incomplete", [OutputText(text)])] if text else []
        calls = [msgspec.structs.replace(c, status="incomplete") for _, c in sorted(self.streamed.items())]
        return [*head, *calls]

    def fail(self, error: ResponseError) -> Response:
        """The response as failed, with its items so far (stored when asked: its conversation continues
        without an answer, as a failed background response's does)."""
        self.ended = True
        failed = msgspec.structs.replace(self.base, status="failed", error=error, output=self.so_far())
        if self.items is not None:
            self.store.add(failed, self.conversation, self.items, replace=self.begun)
        return failed


def failure(err: Exception, truncation: str) -> ResponseError:
    """A run's error as a failed response's `error`: the code and words of the error body it would have got
    before its answer began (this API's field names in a stage's refusal)."""
    said = stage_refusal(from_exception(err), truncation)
    return response_error(said.code or "server_error", said.message, said.status)


async def answer_events(call: PipelineCall, answer: Answer, hold: bool, queued: bool = False) -> AsyncGenerator[Any, None]:
    """The response's stream; `queued` (a background one): `response.queued` first, `response.in_progress`
    with its first output."""
    answer.hold = hold
    seq = itertools.count()
    yield ResponseCreated(sequence_number=next(seq), response=answer.base)
    if queued:
        yield ResponseQueued(sequence_number=next(seq), response=answer.base)
    else:
        yield ResponseInProgress(sequence_number=next(seq), response=answer.base)
    mid, opened = answer.message_id, False
    async for chunk in call:
        if queued:
            queued = False
            yield ResponseInProgress(sequence_number=next(seq),
                                     response=msgspec.structs.replace(answer.base, status="in_progress"))
        if not isinstance(chunk.output, TextOutput):
            continue
        delta = answer.tally.add_text(chunk.output)
        if hold:
            delta = chunk.output.shown if answer.closed is None else ""  # (after a call began, prose waits)
            answer.shown.append(delta)
        if delta:
            if not opened:
                opened = True
                for event in _message_opened(seq, mid, 0):
                    yield event
            yield OutputTextDelta(sequence_number=next(seq), item_id=mid, output_index=0, content_index=0,
                                  delta=delta)
        if hold:
            for event in _call_pieces(seq, answer, answer.tally.parts, opened):
                yield event
    final = answer.finish()
    streamed = {c.id for c in answer.streamed.values()}
    for index, item in enumerate(final.output):
        if isinstance(item, MessageItem) and answer.closed is not None:
            continue  # (closed when the first call began)
        if isinstance(item, FunctionCallItem) and item.id in streamed:
            yield FunctionCallArgumentsDone(sequence_number=next(seq), item_id=item.id, output_index=index,
                                            name=item.name, arguments=item.arguments)
            yield OutputItemDone(sequence_number=next(seq), output_index=index, item=item)
            continue
        if isinstance(item, MessageItem):
            text = item.content[0].text
            if not opened:
                for event in _message_opened(seq, mid, index):
                    yield event
            if rest := (unshown(text, answer.shown) if hold else "" if opened else text):
                yield OutputTextDelta(sequence_number=next(seq), item_id=mid, output_index=index,
                                      content_index=0, delta=rest)
            yield OutputTextDone(sequence_number=next(seq), item_id=mid, output_index=index, content_index=0,
                                 text=text)
            yield ContentPartDone(sequence_number=next(seq), item_id=mid, output_index=index, content_index=0,
                                  part=item.content[0])
        else:
            yield OutputItemAdded(sequence_number=next(seq), output_index=index,
                                  item=msgspec.structs.replace(item, arguments="", status="in_progress"))
            yield FunctionCallArgumentsDelta(sequence_number=next(seq), item_id=item.id, output_index=index,
                                             delta=item.arguments)
            yield FunctionCallArgumentsDone(sequence_number=next(seq), item_id=item.id, output_index=index,
                                            name=item.name, arguments=item.arguments)
        yield OutputItemDone(sequence_number=next(seq), output_index=index, item=item)
    end = ResponseIncomplete if final.status == "incomplete" else ResponseCompleted
    yield end(sequence_number=next(seq), response=final)


def _call_pieces(seq: Iterator[int], answer: Answer, parts: tuple[ToolCallPart, ...], opened: bool) -> list[Any]:
    """A streamed answer's calls as the parser reads them: the message item closed when the first one
    begins (with the text shown so far), each call's item added, then its arguments as they come."""
    events: list[Any] = []
    for p in parts:
        item = answer.streamed.get(p.index)
        if item is None:
            if p.id is None or p.name is None:
                continue  # (a piece of a call whose start was not read: the end sends that call whole)
            if opened and answer.closed is None:
                answer.closed = text = "".join(answer.shown)
                part = OutputText(text)
                events += [OutputTextDone(sequence_number=next(seq), item_id=answer.message_id, output_index=0,
                                          content_index=0, text=text),
                           ContentPartDone(sequence_number=next(seq), item_id=answer.message_id, output_index=0,
                                           content_index=0, part=part),
                           OutputItemDone(sequence_number=next(seq), output_index=0,
                                          item=MessageItem(answer.message_id, "completed", [part]))]
            elif answer.closed is None:
                answer.closed = ""
            item = answer.streamed[p.index] = FunctionCallItem(f"fc_{uuid.uuid4().hex[:24]}", p.id, p.name, "")
            events.append(OutputItemAdded(sequence_number=next(seq), output_index=_index(answer, p.index),
                                          item=msgspec.structs.replace(item, status="in_progress")))
        if p.arguments:
            item.arguments += p.arguments
            events.append(FunctionCallArgumentsDelta(sequence_number=next(seq), item_id=item.id,
                                                     output_index=_index(answer, p.index), delta=p.arguments))
    return events


def _index(answer: Answer, call: int) -> int:
    return call + (1 if answer.closed else 0)


def _message_opened(seq: Iterator[int], mid: str, index: int) -> list[Any]:
    """The events that open the answer's message item (output `index`) and its text part."""
    return [OutputItemAdded(sequence_number=next(seq), output_index=index, item=MessageItem(mid, "in_progress", [])),
            ContentPartAdded(sequence_number=next(seq), item_id=mid, output_index=index, content_index=0,
                             part=OutputText(""))]
