"""`truncation: "auto"`: a response whose input is past the model's context runs again without the
conversation's oldest items (OpenAI's reading), instead of failing.

    async with FittingCall(request, ROUTE, inputs, params, {"text"}, rid, keep=1) as call:
        async for chunk in call: ...        # as a PipelineCall; call.dropped: messages left out

`keep`: the leading messages that always stay (the instructions); None (truncation "disabled"): a
plain PipelineCall.

Only the text stage knows its tokens and its window, so this process does not count them: the
call is submitted whole, and a refusal typed as a prompt past the context (code
`context_length_exceeded`: the worker's ContextLengthError) before any output is answered by
submitting it again from a later message. How many go is estimated from the refusal's numbers
(the prompt's size against the window, by the messages' characters); a try still too long drops
at least as much again (`fits_after`), so a long conversation fits in a few tries. The `keep` leading messages (the instructions) and the last one always
stay; a `tool` result whose call went goes too. Media that only the dropped messages carried leave
the inputs with them. When nothing more can go, the refusal stands (the 400 that `"disabled"` gives).
"""

from __future__ import annotations

import json
import re
from typing import Any

from omni_actors import logs
from omni_actors.api.calls import PipelineCall
from omni_actors.errors import CONTEXT_LENGTH_EXCEEDED, RequestRejected
from omni_actors.orchestrator.requests import StageChunk

log = logs.get(__name__)

_SIZES = (  # (prompt size, window) as each refusal past the context writes them (for the estimate only)
    re.compile(r"maximum context length is (?P<limit>\d+) tokens\. However, your prompt contains (?:at least )?"
               r"(?P<size>\d+) input tokens"),
    re.compile(r"contains (?P<size>\d+) characters \(more than (?P<limit>\d+) characters"),
    re.compile(r"\(length (?P<size>\d+)\) is longer than the maximum model length of (?P<limit>\d+)"),
    re.compile(r"needs (?P<size>\d+) KV positions; the stage's max_model_len is (?P<limit>\d+)"),
)
MEDIA_KEY = re.compile(r"^(audio|image)(_\d+)?$")
"""The inputs' media arrays (chat_inputs.build_chat_inputs: a part names its array)."""
FIT_MARGIN = 0.9
"""Share of the window an estimate aims at (chat templates add tokens per message)."""


def fits_after(messages: list[dict[str, Any]], start: int, keep: int, refusal: str) -> int | None:
    """The first message to send next after `refusal` (sending messages[:keep] + messages[start:]
    was too long); None when only the last one is left. The drop is the refusal's estimate, and at
    least as much again as the tries before dropped (the drops double: a few tries where the numbers
    are a bound, vLLM's "at least 513", or missing)."""
    if len(messages) - start <= 1:
        return None
    sizes = [len(json.dumps(m.get("content"), default=str)) + 8 for m in messages]
    fixed, rest = sum(sizes[:keep]), sum(sizes[start:])
    ratio = 1.0
    for pattern in _SIZES:
        if (found := pattern.search(refusal)) is not None and int(found["size"]) > 0:
            ratio = min(1.0, int(found["limit"]) / int(found["size"]))
            break
    want = max(rest - ((fixed + rest) * ratio * FIT_MARGIN - fixed), sum(sizes[keep:start]), 1)
    nxt, shed = start, 0
    while nxt < len(messages) - 1 and shed < want:
        shed += sizes[nxt]
        nxt += 1
    while nxt < len(messages) - 1 and messages[nxt].get("role") == "tool":
        nxt += 1  # (a result whose call was dropped)
    return nxt


def without(inputs: dict[str, Any], keep: int, start: int) -> dict[str, Any]:
    """`inputs` with messages[keep:start] left out, and the media arrays only they carried."""
    messages = inputs["messages"]
    kept = [*messages[:keep], *messages[start:]]
    named = {p["array"] for m in kept if isinstance(m.get("content"), list)
             for p in m["content"] if isinstance(p, dict) and "array" in p}
    out = {k: v for k, v in inputs.items() if not MEDIA_KEY.match(k) or k in named}
    if "audio" not in out:
        out.pop("sample_rate", None)
    out["messages"] = kept
    return out


class FittingCall(PipelineCall):
    """A PipelineCall that, refused for its context before its first output, is submitted again
    without the conversation's oldest messages (after the `keep` leading ones; None: never)."""

    def __init__(self, *args: Any, keep: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.keep = keep
        self.whole = self.inputs
        self.dropped = 0
        """Messages this call left out to fit."""
        self._first_id = self.request_id
        self._tries = 0
        self._yielded = False

    async def __anext__(self) -> StageChunk:
        while True:
            try:
                chunk = await super().__anext__()
            except RequestRejected as err:
                if self._yielded or err.code != CONTEXT_LENGTH_EXCEEDED or not self._refit(str(err)):
                    raise
                await super().__aenter__()  # the shorter conversation, submitted as the first was
                continue
            self._yielded = True
            return chunk

    def _refit(self, refusal: str) -> bool:
        """Whether a shorter input is ready to submit after `refusal` (a prompt past the context)."""
        if self.keep is None:
            return False
        messages = self.whole["messages"]
        start = self.keep + self.dropped
        nxt = fits_after(messages, start, self.keep, refusal)
        if nxt is None:
            return False
        self.dropped = nxt - self.keep
        self.inputs = without(self.whole, self.keep, nxt)
        self._tries += 1
        self.request_id = f"{self._first_id}-fit{self._tries}"  # (a new run: a new id)
        log.info("responses.truncated", request_id=self._first_id, dropped=self.dropped, tries=self._tries)
        return True
