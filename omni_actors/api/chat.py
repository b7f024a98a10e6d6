"""POST /v1/chat/completions: OpenAI chat, streaming (SSE) or not, with text and audio out.

What goes into the pipeline:

    inputs  see chat_inputs.py: {"messages": [...], "audio"/"image"/...: arrays}, plus "tools" where the
            pipeline can call them (api/tools.py says which, and the answer's `tool_calls` shapes)
    params  {temperature, top_p, top_k, max_tokens, seed, stop (list), frequency_penalty,
             presence_penalty, repetition_penalty, logit_bias, voice, audio_format, modalities}
            (only the fields the client sent; `max_completion_tokens` wins over `max_tokens`)
            `stop`, `presence_penalty`, `frequency_penalty` need a text stage on the vLLM engine; on another
            engine the penalties are a 400 naming the field (it would ignore them, as /v1/completions refuses
            them), and `stop` is applied by this route to a text-only answer without tools (api/calls.py's
            StopCut, as vLLM applies it: the text ends before the first stop string, finish_reason "stop",
            the stage's request aborted), else a 400 naming `stop` (the talker would speak past it; the
            tool parser reads the whole answer). A `max_tokens` past the stage's whole context is the
            stage's 400 naming the field sent (vllm_ar.py), `max_completion_tokens` where it was that
    stages  planner's choice, else pipeline.stages_for_outputs(set(modalities))

What comes back: StageChunks whose typed `output` is a TextOutput (delta, token
counts, finish_reason) or an AudioOutput (float32 mono, rate, transcript piece);
other outputs are not part of a chat answer and are skipped.

Streaming (chat_stream.py): `chat.completion.chunk` events, text in `delta.content`, audio in
`delta.audio` ({id, data: base64 in audio.format, transcript}) as it is made,
a last chunk with `finish_reason`, a usage chunk when
`stream_options.include_usage`, then `[DONE]`. Usage counts what the pipeline
reports, else one completion token per text delta (chat_tally.py adds an answer up).

`store: true` keeps the finished completion (a streamed one put together) and its request messages
(chat_stored.py: the routes that read, update, list and delete them); a failed or aborted one is not kept.

`n` (1-8) choices: each is its own pipeline request (with a seed, choice i gets
seed + i); choices are indexed in the answer and interleaved as they come when
streamed, each with its own finish chunk; usage counts the prompt once. Any
choice's error ends the whole answer and aborts the others.

Fields client libraries send for features no model here has (chat_schemas.py lists them): accepted with
no effect where OpenAI's models without the feature take them (`prompt_cache_key`, `prompt_cache_options` but
`prewarm`, a part's `prompt_cache_breakpoint`, `safety_identifier`, `service_tier`, answered "default",
`prediction`), a 400 naming the field where ignoring it would mislead
(`check_unserved`: a reasoning effort, a verbosity but "medium"; `web_search_options`,
`moderation`, the deprecated `functions` and `function_call`; `logit_bias` but on a vLLM text stage, which
applies it: `logit_biases`).

`logprobs: true` (and `top_logprobs` 0-20 alternatives, which needs it) on a vLLM text stage: each choice's
`logprobs.content` lists the answer's tokens ({token, logprob, bytes, top_logprobs}; streamed, each chunk's
tokens), their texts joined being the content (vllm_ar.py trims a stop string's token). A 400 naming the
field on another engine's stage, and naming `logprobs` with tools offered (the content is what the tool
parser leaves of the text).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
import uuid
from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np
from aiohttp import web

from omni_actors.api import chat_stored
from omni_actors.api.audio_codec import check_supported, encode_file, off_loop
from omni_actors.api.calls import (
    PipelineCall,
    applies_vllm_sampling,
    drop_none,
    refuse_unapplied,
    route_model,
    text_stage_of,
)
from omni_actors.api.chat_inputs import build_chat_inputs, chat_param, file_ids
from omni_actors.api.chat_schemas import (
    ChatAudio,
    ChatCompletion,
    ChatCompletionRequest,
    Choice,
    PromptCacheOptions,
    ResponseMessage,
)
from omni_actors.api.chat_stream import stream_answer
from omni_actors.api.chat_tally import (
    AUDIO_TTL_S,
    Tally,
    answer_message,
    chat_logprobs,
    chunk_audio,
    new_audio_id,
    usage_of,
)
from omni_actors.api.errors import bad_request, from_exception
from omni_actors.api.files import file_bytes
from omni_actors.api.schemas import read_body
from omni_actors.api.speech_inputs import listed_voice
from omni_actors.api.structured import guided_params
from omni_actors.api.tools import (
    check_tool_messages,
    check_tools,
    stage_tools,
    tools_refusal,
)
from omni_actors.config.pipeline import PipelineConfig, StageSpec
from omni_actors.errors import RequestRejected
from omni_actors.orchestrator.outputs import TextOutput

__all__ = ["Tally", "add_routes", "chat_completions", "check_prewarm", "check_unserved"]  # (Tally: chat_tally.py)

ROUTE = "/v1/chat/completions"


def chat_params(req: ChatCompletionRequest, modalities: list[str]) -> dict[str, Any]:
    stop = [req.stop] if isinstance(req.stop, str) else req.stop
    return drop_none({
        "temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k,
        "max_tokens": req.max_completion_tokens or req.max_tokens, "seed": req.seed, "stop": stop,
        "frequency_penalty": req.frequency_penalty, "presence_penalty": req.presence_penalty,
        "repetition_penalty": req.repetition_penalty,
        "voice": req.audio.voice if req.audio else None,
        "audio_format": req.audio.format if req.audio and "audio" in modalities else None,
        "modalities": modalities,
    })


async def chat_completions(request: web.Request) -> web.StreamResponse:
    req = await read_body(request, ChatCompletionRequest)
    if req.stream_options is not None and not req.stream:
        raise bad_request("`stream_options` is only allowed when `stream` is true", "stream_options")
    check_unserved(req.reasoning_effort, req.verbosity, None)
    for name, value, why in (("functions", req.functions, "send the functions in `tools`"),
                             ("function_call", req.function_call, "say it in `tool_choice`"),
                             ("moderation", req.moderation, "no moderation model runs here; leave it out or null")):
        if value:
            raise bad_request(f"this server does not support `{name}`: {why}", name, "unsupported_parameter")
    check_prewarm(req.prompt_cache_options)
    if req.web_search_options is not None:
        raise bad_request("web search is not served by this server; leave `web_search_options` out",
                          "web_search_options", "unsupported_parameter")
    modalities = list(dict.fromkeys(req.modalities or ["text"]))
    orch, model = route_model(request, req.model, set(modalities), outputs_param="modalities")
    if (refusal := tools_refusal(orch.pipeline, req.tools, req.tool_choice, can_force=True)) is not None:
        raise bad_request(*refusal, "unsupported_parameter")
    await check_tools(req.tools, req.tool_choice)
    check_tool_messages(req.messages)
    guided = guided_params(orch.pipeline, req.response_format, req.tools, req.tool_choice, req.parallel_tool_calls)
    stops = stops_applied_here(req, orch.pipeline, modalities)
    top = logprobs_params(req, text_stage_of(orch.pipeline))
    if req.audio is not None and req.audio.voice:
        listed_voice(orch.pipeline, req.audio.voice, "audio.voice")  # /v1/audio/speech's 400 for an unknown one
    want_audio = "audio" in modalities
    audio_format = req.audio.format if req.audio else "wav"
    if want_audio:
        check_supported("pcm" if audio_format == "pcm16" else audio_format)
    has_media = any(not isinstance(m.content, str | None) for m in req.messages)
    # Decoding media is real work (a thread); plain text is cheaper than the hop.
    files = {fid: await file_bytes(request, fid, where) for fid, where in file_ids(req.messages)}
    inputs = await off_loop(build_chat_inputs, req.messages, chat_param, files) if has_media else build_chat_inputs(
        req.messages)
    if (tools := stage_tools(req.tools, req.tool_choice)) is not None:
        inputs["tools"] = tools
    cid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
    bias = logit_biases(text_stage_of(orch.pipeline), req.logit_bias)
    params, n = {**chat_params(req, modalities), **guided, **bias, **top}, req.n or 1
    try:
        async with contextlib.AsyncExitStack() as calls_open:  # (on exit: every choice not ended is aborted)
            calls = [await calls_open.enter_async_context(PipelineCall(
                request, ROUTE, inputs, choice_params(params, i), set(modalities), cid if n == 1 else f"{cid}-{i}",
                stop=stops)) for i in range(n)]
            keep = chat_stored.keeper(request, req)  # (None unless `store`)
            if req.stream:
                include_usage = bool(req.stream_options and req.stream_options.include_usage)
                return await stream_answer(request, calls, cid, model, audio_format if want_audio else None,
                                           include_usage, hold_text=tools is not None, on_end=keep)
            return await _complete(calls, cid, model, audio_format if want_audio else None, keep)
    except RequestRejected as err:  # a stage names `max_tokens` for the budget: the field the client sent
        said = from_exception(err)
        if said.param == "max_tokens" and req.max_completion_tokens is not None:
            said.param = "max_completion_tokens"
            said.message = said.message.replace("max_tokens", said.param, 1)
        raise said from None


def stops_applied_here(req: ChatCompletionRequest, pipeline: PipelineConfig, modalities: list[str]) -> list[str] | None:
    """The stop strings this route applies itself (the text stage's engine does not: not vLLM), else None;
    a 400 naming a sampling field the text stage would ignore and this route cannot apply (module docstring)."""
    stage = text_stage_of(pipeline)
    refuse_unapplied(stage, {"presence_penalty": req.presence_penalty, "frequency_penalty": req.frequency_penalty})
    stops = [req.stop] if isinstance(req.stop, str) else req.stop
    if not stops or applies_vllm_sampling(stage):
        return None
    if modalities != ["text"] or stage_tools(req.tools, req.tool_choice) is not None:
        refuse_unapplied(stage, {"stop": stops}, {"stop": "to an answer with audio or tools offered (it is applied "
                                                  'to a text-only answer: `modalities` ["text"], no `tools`)'})
    return stops


def logprobs_params(req: ChatCompletionRequest, stage: StageSpec | None) -> dict[str, Any]:
    """{"logprobs": alternatives per token} for the text stage ({} when not asked); a 400 naming the field
    where it cannot be answered (module docstring) or `top_logprobs` without `logprobs: true` (OpenAI's)."""
    if not applies_vllm_sampling(stage):
        for name, value in (("logprobs", req.logprobs), ("top_logprobs", req.top_logprobs)):
            if value:
                raise bad_request(f"logprobs are not returned by this model's engine; leave `{name}` out", name,
                                  "unsupported_parameter")
    if not req.logprobs:
        if req.top_logprobs:
            raise bad_request("`top_logprobs` needs `logprobs` set to true", "top_logprobs", "invalid_value")
        return {}
    if stage_tools(req.tools, req.tool_choice) is not None:
        raise bad_request("logprobs are not returned with `tools` offered (the tool parser rewrites the answer's "
                          "text); leave `logprobs` out or `tools` out", "logprobs", "unsupported_parameter")
    return {"logprobs": req.top_logprobs or 0}


def logit_biases(stage: StageSpec | None, bias: dict[str, Any] | None) -> dict[str, Any]:
    """{"logit_bias": {token id: bias}} for the text stage's sampling ({} for none): vLLM adds each bias to its
    token's logit. A 400 naming `logit_bias` where the stage's engine would not apply it (not vLLM), or for a key
    that is not a token id or a bias outside OpenAI's [-100, 100] (an id past the vocabulary: the stage's 400)."""
    if not bias:
        return {}
    if not applies_vllm_sampling(stage):
        raise bad_request("`logit_bias` is not applied by this model's engine; leave it out, null or {}", "logit_bias",
                          "unsupported_parameter")
    for key, value in bias.items():
        if not (key.isascii() and key.isdigit()):
            raise bad_request(f"`logit_bias` key {key[:32]!r} is not a token id (a decimal integer)", "logit_bias")
        if isinstance(value, bool) or not isinstance(value, int | float) or not -100 <= value <= 100:
            raise bad_request(f"`logit_bias` {key}: {str(value)[:32]} is not a number from -100 to 100", "logit_bias")
    return {"logit_bias": {str(int(key)): float(value) for key, value in bias.items()}}


def check_unserved(effort: str | None, verbosity: str | None, top_logprobs: int | None,
                   names: tuple[str, str, str] = ("reasoning_effort", "verbosity", "top_logprobs")) -> None:
    """A 400 naming a field (`names`: effort, verbosity, top_logprobs) that asks for what no model here does,
    where ignoring it would mislead: a reasoning effort (none of them reasons before it answers), a verbosity
    but "medium", log-probabilities. OpenAI refuses the same for its models without the feature."""
    if effort not in (None, "none"):
        raise bad_request(f"`{names[0]}` is not supported with this model: it does not reason before it answers; "
                          'leave it out, null or "none"', names[0], "unsupported_parameter")
    if verbosity not in (None, "medium"):
        raise bad_request(f"`{names[1]}` does not support {verbosity!r} with this model; supported values are: "
                          '"medium"', names[1], "unsupported_value")
    if top_logprobs:
        raise bad_request(f"logprobs are not returned by this server; leave `{names[2]}` out or 0", names[2],
                          "unsupported_parameter")


def check_prewarm(options: PromptCacheOptions | None) -> None:
    """`prompt_cache_options.prewarm` asks for a cache warmed and no answer: a 400 naming it (no prompt cache is
    kept per request here, and every request is answered)."""
    if options is not None and options.prewarm:
        raise bad_request("this server does not prewarm a prompt cache (every request is answered); leave "
                          "`prompt_cache_options.prewarm` out or false", "prompt_cache_options.prewarm",
                          "unsupported_value")


def choice_params(params: dict[str, Any], index: int) -> dict[str, Any]:
    """Choice `index`'s params: with a seed, each choice gets its own (seed + index), reproducibly."""
    seed = params.get("seed")
    if index == 0 or seed is None:
        return params
    return {**params, "seed": seed + index if seed + index < 2**63 else seed - index}


async def _collect(call: PipelineCall, audio_format: str | None) -> Tally:
    tally = Tally.of(call.params)
    async for chunk in call:
        if isinstance(chunk.output, TextOutput):
            tally.add_text(chunk.output)
        elif audio_format is not None and (audio := chunk_audio(chunk)) is not None:
            tally.add_audio(audio)
    return tally


async def _message(tally: Tally, audio_format: str | None) -> ResponseMessage:
    audio = None
    if audio_format is not None:
        clip = np.concatenate(tally.audio) if tally.audio else np.zeros(0, np.float32)
        data = await off_loop(encode_file, clip, tally.sample_rate, audio_format)
        audio = ChatAudio(id=new_audio_id(), data=base64.b64encode(data).decode(),
                          expires_at=int(time.time()) + AUDIO_TTL_S,
                          transcript="".join(tally.transcript) or "".join(tally.text))
    return answer_message(tally, audio)


async def _complete(calls: list[PipelineCall], cid: str, model: str, audio_format: str | None,
                    keep: Callable[[ChatCompletion], None] | None = None) -> web.Response:
    tallies = await asyncio.gather(*(_collect(call, audio_format) for call in calls))
    choices = [Choice(i, await _message(t, audio_format), t.finish_reason, chat_logprobs(t.logprobs))
               for i, t in enumerate(tallies)]
    body = ChatCompletion(id=cid, created=int(time.time()), model=model, choices=choices, usage=usage_of(tallies))
    if keep is not None:
        keep(body)
    return web.Response(body=msgspec.json.encode(body), content_type="application/json")


def add_routes(app: web.Application) -> None:
    """POST /v1/chat/completions and the stored completions' routes (chat_stored.py): one line in app.py."""
    app.router.add_post(ROUTE, chat_completions)
    chat_stored.add_routes(app)
