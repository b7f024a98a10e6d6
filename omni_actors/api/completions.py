"""POST /v1/completions: OpenAI's legacy text completions, streamed (SSE) or not, on a pipeline's AR text stage.

What goes into the pipeline, per prompt and choice:

    inputs  {"prompt": str} or {"prompt_token_ids": [...]}: the raw prompt, no chat template
    params  {max_tokens (16 when unset, as OpenAI), temperature, top_p, seed, stop (list),
             presence_penalty, frequency_penalty, and vLLM's top_k, repetition_penalty, ignore_eos,
             min_tokens: only the fields the client sent; "modalities": ["text"]}
    stages  planner's choice, else pipeline.stages_for_outputs({"text"}): the text stage and what it needs

Which models: a pipeline whose final text comes from an autoregressive stage (`LLM_AR`: the
assistant's vLLM llm, `llm` folders, the Qwen-Omni thinkers on transformers). Any other model
(speech, images, video, transcription only) is a 404 naming `model` and the models of this
server that serve completions. The penalties need the vLLM engine; on another engine's stage
they are a 400 naming the field (it would ignore them). `stop` on another engine's stage is
applied by this route as vLLM applies it (api/calls.py's StopCut: the text ends before the first
stop string, finish_reason "stop", the stage's request aborted).

`prompt` is a string, a list of strings (several prompts), a list of token ids (one prompt) or a
list of lists of token ids; empty (or an empty item) is a 400. Each prompt's `n` choices are their
own pipeline requests (with a seed, choice i gets seed + i, as chat's); choice `p * n + i` is prompt
p's choice i, as OpenAI indexes them. `echo` puts a string prompt before its choices' text (a
token-id prompt has no text here: a 400). Usage counts each prompt once and every choice's tokens.

Streaming: `text_completion` chunks, one per text delta of a choice, its last with `finish_reason`
(no empty first chunk: a benchmark's time to first token is its first chunk), a usage chunk when
`stream_options.include_usage`, then `[DONE]`. A client that leaves aborts every choice in every stage.

Not served, a 400 naming the field where ignoring it would mislead: `suffix` (but ""), `best_of`
other than `n`, `logit_bias` (but null or {}) but on the vLLM engine, which applies
it (chat's `logit_biases`), `logprobs` (but null) but on the vLLM engine and without `echo` (the prompt's
tokens are not scored). `user` is accepted, no effect.

`logprobs: k` (0-5): each choice's `logprobs` is OpenAI's {tokens, token_logprobs, top_logprobs (k
alternatives, text -> logprob), text_offset}, the tokens' texts joined being the choice's text (streamed:
each chunk's tokens, offsets counted from the choice's start).
Errors are chat's: a prompt past the context is a 400 `context_length_exceeded`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncGenerator
from typing import Any

import msgspec
from aiohttp import web

from omni_actors.api import sse
from omni_actors.api.calls import (
    PIPELINES_KEY,
    VLLM_ONLY,
    PipelineCall,
    applies_vllm_sampling,
    drop_none,
    model_id,
    refuse_unapplied,
    route_model,
    text_stage_of,
)
from omni_actors.api.chat import choice_params, logit_biases
from omni_actors.api.chat_schemas import Usage
from omni_actors.api.chat_stream import merged
from omni_actors.api.chat_tally import Tally
from omni_actors.api.completions_schemas import (
    DEFAULT_MAX_TOKENS,
    MAX_PROMPTS,
    Completion,
    CompletionChoice,
    CompletionChunk,
    CompletionLogprobs,
    CompletionRequest,
)
from omni_actors.api.errors import ApiError, bad_request, from_exception
from omni_actors.api.schemas import read_body
from omni_actors.config.pipeline import StageSpec
from omni_actors.errors import RequestRejected
from omni_actors.orchestrator.core import Orchestrator
from omni_actors.orchestrator.outputs import TextOutput, TokenLogprob

__all__ = ["ROUTE", "add_routes", "completions", "text_stage"]

ROUTE = "/v1/completions"

Prompt = str | list[int]


def text_stage(orch: Orchestrator) -> StageSpec | None:
    """The autoregressive stage whose final output is the pipeline's text, if it has one."""
    return text_stage_of(orch.pipeline)


def completion_model(request: web.Request, name: str) -> tuple[Orchestrator, StageSpec, str]:
    """The pipeline for `name` (none: the first that serves completions), its text stage and the name to
    echo; a 404 naming `model` for an unknown model or one that writes no text from a language model."""
    pipelines = request.app[PIPELINES_KEY]
    serving = [o for o in pipelines.all if text_stage(o) is not None and not o.pipeline.duplex]
    orch = pipelines.by_name.get(name) if name else (serving[0] if serving else pipelines.default)
    if orch is not None and orch not in serving:
        names = [model_id(o) for o in serving]
        where = f"the models of this server that do: {names}" if names else "no model of this server does"
        raise ApiError(404, f"model {name or model_id(orch)!r} does not write text with a language model, so it "
                            f"does not serve text completions ({ROUTE}); {where}", "model", "model_not_supported")
    orch, model = route_model(request, name or model_id(orch), {"text"})  # (an unknown name: 404 model_not_found)
    stage = text_stage(orch)
    assert stage is not None  # (in `serving`)
    return orch, stage, model


def prompts(prompt: str | list[Any]) -> list[Prompt]:
    """The request's prompts: a string, strings, token ids (one prompt) or lists of token ids; a 400 naming
    `prompt` (or the item) for an empty one, a mix of shapes or more than MAX_PROMPTS."""
    if isinstance(prompt, str):
        items: list[Any] = [prompt]
    elif prompt and all(isinstance(p, int) for p in prompt):
        items = [prompt]
    elif all(isinstance(p, str) for p in prompt) or all(isinstance(p, list) for p in prompt):
        items = list(prompt)
    else:
        raise bad_request("`prompt` is a string, a list of strings, a list of token ids or a list of lists of "
                          "token ids; this one mixes them", "prompt", "invalid_type")
    if not items:
        raise bad_request("`prompt` is empty; send the text (or token ids) to complete", "prompt",
                          "empty_array")
    if len(items) > MAX_PROMPTS:
        raise bad_request(f"`prompt` has {len(items)} prompts; at most {MAX_PROMPTS} in one request", "prompt",
                          "array_above_max_length")
    whole = isinstance(prompt, str) or items[0] is prompt  # (one prompt: the field itself)
    for i, item in enumerate(items):
        if not item:
            where = "prompt" if whole else f"prompt[{i}]"
            raise bad_request(f"`{where}` is empty; send the text (or token ids) to complete", where,
                              "empty_string" if isinstance(item, str) else "empty_array")
    return items


def check_unserved(req: CompletionRequest, stage: StageSpec, n: int) -> None:
    """A 400 naming a field that asks for what this server (or the model's engine) does not do."""
    if req.stream_options is not None and not req.stream:
        raise bad_request("`stream_options` is only allowed when `stream` is true", "stream_options")
    if req.suffix:
        raise bad_request("`suffix` is not supported: no model here fills in text before a suffix; leave it out, "
                          'null or ""', "suffix", "unsupported_parameter")
    if req.best_of is not None and req.best_of != n:
        raise bad_request(f"`best_of` {req.best_of} is not supported: no candidates are ranked here; leave it out "
                          f"or equal to `n` ({n})", "best_of", "unsupported_parameter")
    if req.logprobs is not None and not applies_vllm_sampling(stage):
        raise bad_request("logprobs are not returned by this model's engine; leave `logprobs` out or null",
                          "logprobs", "unsupported_parameter")
    if req.logprobs is not None and req.echo:
        raise bad_request("logprobs are not returned for an echoed prompt; leave `logprobs` or `echo` out",
                          "logprobs", "unsupported_parameter")
    refuse_unapplied(stage, {name: getattr(req, name) for name in VLLM_ONLY if name != "stop"})  # (chat's too)


def completion_params(req: CompletionRequest) -> dict[str, Any]:
    stop = [req.stop] if isinstance(req.stop, str) else req.stop
    return drop_none({
        "max_tokens": req.max_tokens or DEFAULT_MAX_TOKENS, "temperature": req.temperature, "top_p": req.top_p,
        "top_k": req.top_k, "seed": req.seed, "stop": stop or None, "presence_penalty": req.presence_penalty,
        "frequency_penalty": req.frequency_penalty, "repetition_penalty": req.repetition_penalty,
        "ignore_eos": req.ignore_eos, "min_tokens": req.min_tokens, "logprobs": req.logprobs, "modalities": ["text"],
    })


def prompt_inputs(prompt: Prompt) -> dict[str, Any]:
    return {"prompt": prompt} if isinstance(prompt, str) else {"prompt_token_ids": prompt}


async def completions(request: web.Request) -> web.StreamResponse:
    req = await read_body(request, CompletionRequest)
    items = prompts(req.prompt)
    n = req.n or 1
    orch, stage, model = completion_model(request, req.model)
    check_unserved(req, stage, n)
    if req.echo and not all(isinstance(p, str) for p in items):
        raise bad_request("`echo` needs a text prompt: this server does not write token ids back as text",
                          "echo", "unsupported_parameter")
    echoes = [p if req.echo and isinstance(p, str) else "" for p in items for _ in range(n)]
    cid = f"cmpl-{uuid.uuid4().hex[:24]}"
    params = {**completion_params(req), **logit_biases(stage, req.logit_bias)}
    stops = None if applies_vllm_sampling(stage) else params.pop("stop", None)  # (else cut here: StopCut)
    count = len(items) * n
    deployed = orch.deploy.stage(stage.stage_id)
    if count > (room := deployed.queue_limit * deployed.num_replicas):  # (a 429 would be retried in vain)
        raise bad_request(f"{len(items)} prompts x n={n} is {count} requests; this model admits at most {room} at "
                          "once: send fewer prompts or a smaller `n`", "n" if n > 1 else "prompt",
                          "integer_above_max_value" if n > 1 else "array_above_max_length")
    try:
        async with contextlib.AsyncExitStack() as calls_open:  # (on exit: every choice not ended is aborted)
            calls = [await calls_open.enter_async_context(PipelineCall(
                request, ROUTE, prompt_inputs(prompt), choice_params(params, i), {"text"},
                cid if count == 1 else f"{cid}-{p * n + i}", orch=orch, stop=stops,
            )) for p, prompt in enumerate(items) for i in range(n)]
            if req.stream:
                include_usage = bool(req.stream_options and req.stream_options.include_usage)
                return await _stream(request, calls, cid, model, echoes, n, include_usage)
            tallies = await asyncio.gather(*(_collect(call) for call in calls))
            choices = [CompletionChoice(echoes[k] + "".join(t.text), k, t.finish_reason, legacy_logprobs(t.logprobs))
                       for k, t in enumerate(tallies)]
            body = Completion(id=cid, created=int(time.time()), model=model, choices=choices, usage=_usage(tallies, n))
            return web.Response(body=msgspec.json.encode(body), content_type="application/json")
    except RequestRejected as err:  # a stage names chat's `messages` for a prompt past the context: here `prompt`
        said = from_exception(err)
        said.param = "prompt" if said.param == "messages" else said.param
        raise said from None


def _usage(tallies: list[Tally], n: int) -> Usage:
    """Each prompt counted once (its first choice's count), every choice's completion."""
    prompt = sum(t.prompt_tokens for t in tallies[::n])
    completion = sum(t.completion_tokens for t in tallies)
    return Usage(prompt, completion, prompt + completion)


def legacy_logprobs(tokens: list[TokenLogprob] | tuple[TokenLogprob, ...] | None,
                    offset: int = 0) -> CompletionLogprobs | None:
    """OpenAI's legacy `logprobs` of these tokens, the first's text at `offset` (None: not asked)."""
    if tokens is None:
        return None
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t.token)
    return CompletionLogprobs([t.token for t in tokens], [t.logprob for t in tokens],
                              [{a.token: a.logprob for a in t.top} for t in tokens], offsets)


async def _collect(call: PipelineCall) -> Tally:
    tally = Tally.of(call.params)
    async for chunk in call:
        if isinstance(chunk.output, TextOutput):
            tally.add_text(chunk.output)
    return tally


async def _stream(request: web.Request, calls: list[PipelineCall], cid: str, model: str, echoes: list[str],
                  n: int, include_usage: bool) -> web.StreamResponse:
    created = int(time.time())
    tallies = [Tally.of(call.params) for call in calls]
    offsets = [0] * len(calls)

    def event(index: int, text: str, finish: Any = None, tokens: tuple[TokenLogprob, ...] = ()) -> CompletionChunk:
        logprobs = None
        if tallies[index].logprobs is not None:
            logprobs = legacy_logprobs(tokens, offsets[index])
            offsets[index] += sum(len(t.token) for t in tokens)
        return CompletionChunk(id=cid, created=created, model=model,
                               choices=[CompletionChoice(text, index, finish, logprobs)])

    # An error before the first output (a prompt past the context) keeps its HTTP status.
    await asyncio.gather(*(call.started() for call in calls))

    async def events() -> AsyncGenerator[CompletionChunk, None]:
        for k, echo in enumerate(echoes):
            if echo:
                yield event(k, echo)
        ended = [False] * len(calls)
        async for k, chunk in merged(calls):
            tally = tallies[k]
            if chunk is None:
                if not ended[k]:
                    yield event(k, "", tally.finish_reason)
            elif isinstance(chunk.output, TextOutput):
                text = tally.add_text(chunk.output)
                if chunk.output.finish_reason is not None:  # (the stage's last delta: it carries the finish)
                    ended[k] = True
                    yield event(k, text, tally.finish_reason, chunk.output.logprobs)
                elif text or chunk.output.logprobs:
                    yield event(k, text, tokens=chunk.output.logprobs)
        if include_usage:
            yield CompletionChunk(id=cid, created=created, model=model, choices=[], usage=_usage(tallies, n))

    return await sse.respond(request, events())


def add_routes(app: web.Application) -> None:
    """POST /v1/completions: one line in app.py."""
    app.router.add_post(ROUTE, completions)
